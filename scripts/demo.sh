#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job, `ctpipe run`, on data_samples/.
# Extra arguments go to `ctpipe run`, e.g. `bash scripts/demo.sh --device cpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ctpipe run data_samples/ --out runs/demo "$@"
