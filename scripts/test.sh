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
bash scripts/install_monitoring_tools.sh || echo "prometheus/promtool unavailable: their checks in tests/test_runner_prometheus.py will be skipped" >&2
# bytecode caches on (__pycache__, ignored by git) even where the environment turns them off: the suite starts
# many Python processes (workers, command-line runs), and each would otherwise compile the package and pytest
# rewrite every test module again
unset PYTHONDONTWRITEBYTECODE
# glibc malloc keeps freed memory in the process instead of returning it to the kernel (every process the suite
# starts inherits these): by default a large array (from 128 kB up, and always over 32 MB) gets a fresh mapping whose
# pages the kernel faults in and zeroes on every allocation, about a third of the suite's system time. The suite's
# processes are short-lived, so holding their peak memory until they exit costs little (a whole run's summed peak
# resident memory rose by about 3 %).
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}" MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}" \
  MALLOC_TOP_PAD_="${MALLOC_TOP_PAD_:-268435456}"
# pytest-xdist workers: one per core, plus one kept for the test modules that mostly wait on a PACS (see
# tests/_support/scheduling.py); CTPIPE_TEST_WORKERS=0 runs the tests in this process. Each test module stays
# on one worker, so its module fixtures are built once.
cores=$(nproc 2>/dev/null || echo 1)
default_workers=$(( cores >= 2 ? cores + 1 : 1 ))
# --durations: the 30 slowest test phases end the output, where the suite's time is to be cut (it is to stay well
# under 15 minutes on 2 cores; tests/_support/scheduling.py starts the longest modules first)
.venv/bin/python -m pytest -n "${CTPIPE_TEST_WORKERS:-$default_workers}" --dist loadscope --durations=30 "$@"
