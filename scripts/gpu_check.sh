#!/usr/bin/env bash
# GPU check: runs the `gpu`-marked tests and the GPU benchmarks on a machine with a CUDA GPU,
# writing every result under $OUT (default ./gpu_check_out) and a summary $OUT/gpu_check.json.
#
# Budget: under 8 minutes in all. Each benchmark runs in --quick mode with --device cuda.
# Python packages missing on the machine (monai, pydicom, ...) may be supplied as wheels in .whl/
# (bash scripts/gpu_wheels.sh, see README.md); DALI's wheels are too large to carry, so where DALI is not
# importable its GPU mode is reported as skipped and everything else still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python

if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ctpipe-site .whl/*.whl \
    && export PYTHONPATH=/tmp/ctpipe-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

$PY - <<'PYEOF' > "$OUT/device.json"
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if info["available"]:
    info["name"] = torch.cuda.get_device_name(0)
    info["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
try:
    import nvidia.dali as dali
    info["dali"] = dali.__version__
except ImportError:
    info["dali"] = None
print(json.dumps(info))
PYEOF
cat "$OUT/device.json"

declare -A status
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  status[$name]="$rc $((SECONDS - t0))"
  tail -n 25 "$OUT/$name.log"
}

run gpu_tests 120 $PY -m pytest -m gpu -q -p no:cacheprovider $(grep -l 'mark.gpu' tests/test_*.py)
if $PY -c "import nvidia.dali" 2>/dev/null; then
  run bench_loader 60 $PY scripts/bench_loader.py --quick --device cuda --json "$OUT/bench_loader.json"
else
  echo "=== bench_loader: DALI is not installed here; its GPU mode was skipped (torch loader measured instead)"
  run bench_loader 60 $PY scripts/bench_loader.py --quick --device cuda --skip-dali --json "$OUT/bench_loader.json"
fi
run bench_detect 120 $PY scripts/bench_detect.py --quick --device cuda --json "$OUT/bench_detect.json"
run bench_recon 60 $PY scripts/bench_recon.py --quick --device cuda --json "$OUT/bench_recon.json"
run bench_runner 100 $PY scripts/bench_runner.py --quick --device cuda --json "$OUT/bench_runner.json"

{
  echo "{"
  first=1
  for k in "${!status[@]}"; do
    read -r rc secs <<< "${status[$k]}"
    [ $first = 1 ] || echo ","
    first=0
    printf '  "%s": {"exit": %s, "seconds": %s}' "$k" "$rc" "$secs"
  done
  echo ""
  echo "}"
} > "$OUT/gpu_check.json"
cat "$OUT/gpu_check.json"
