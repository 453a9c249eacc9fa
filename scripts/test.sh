#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, check formatting, type-check and run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check pipeline scripts tests
.venv/bin/ruff format --check pipeline scripts tests
.venv/bin/mypy
bash scripts/install_dicom_tools.sh || echo "dciodvfy/dsrdump unavailable: their checks in tests/test_dicom_out_* will be skipped" >&2
bash scripts/install_pacs_tools.sh || echo "Orthanc/dcmtk unavailable: the pacs-marked tests in tests/test_pacs_* will be skipped" >&2
.venv/bin/python -m pytest "$@"
