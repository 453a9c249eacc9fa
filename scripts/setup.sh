#!/usr/bin/env bash
# Create .venv (if needed) and install ctpipe with its dev tools and the cluster extra (Ray) into it.
# Idempotent: re-installs only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv; then
    # Debian and Ubuntu ship venv's pip bootstrap apart from Python (python3-venv)
    rm -rf .venv
    . scripts/_apt_install.sh
    apt_install setup.sh python3-venv
    "$PY" -m venv .venv
  fi
fi
stamp=.venv/.ctpipe-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch and torchvision first, pinned together so that torchvision's operators match torch
  .venv/bin/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1" \
    || { echo "setup.sh: torch 2.14.1 / torchvision 0.29.1 not installable here; installing the newest matching pair" >&2
         .venv/bin/python -m pip install --quiet torch torchvision; }
  # dev tools, and Ray for runner.engine = ray (its tests start a small cluster on this machine)
  .venv/bin/python -m pip install --quiet -e ".[dev,cluster]"
  echo "$want" > "$stamp"
fi
