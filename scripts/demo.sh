#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job, `ctpipe run`, on data_samples/.
# Extra arguments go to `ctpipe run`, e.g. `bash scripts/demo.sh --device cpu`; the results go to runs/demo unless
# they give --out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=(--out runs/demo)
for arg in "$@"; do
  case "$arg" in --out | --out=*) out=() ;; esac
done
.venv/bin/ctpipe run data_samples/ "${out[@]}" "$@"
