#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, type-check and run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check pipeline scripts tests
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
