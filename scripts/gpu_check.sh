#!/usr/bin/env bash
# GPU check: runs the `gpu`-marked tests and the GPU benchmarks on a machine with a CUDA GPU, writing six files
# under $OUT (default ./gpu_check_out): each benchmark's JSON, every command's output in gpu_check.log, and the
# summary gpu_check.json (the device, then each step's exit status and seconds).
#
# Budget: the steps' timeouts below sum to 660 s, so the check ends within 11 minutes (a full run took about
# 6: tests 54 s, loader 22 s, detection 98 s, reconstruction 31 s, runner 155 s). With --device cuda: the loader
# and reconstruction benchmarks in --quick mode; detection with medians of 3 rounds (lung crop, whole volume, float32
# and MONAI per round); the runner on 20 small cases, medians of 3 (enough cases that filling and draining the
# pipeline weigh little in its efficiency).
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

LOG=$OUT/gpu_check.log
: > "$LOG"
DEVICE_JSON=$($PY - <<'PYEOF'
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
)
DEVICE_JSON=${DEVICE_JSON:-null}
echo "$DEVICE_JSON" | tee -a "$LOG"

declare -A status
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.part" 2>&1
  local rc=$?
  status[$name]="$rc $((SECONDS - t0))"
  cat "$OUT/$name.part" >> "$LOG"
  tail -n 25 "$OUT/$name.part"
  rm -f "$OUT/$name.part"
}

run gpu_tests 120 $PY -m pytest -m gpu -q -p no:cacheprovider $(grep -l 'mark.gpu' tests/test_*.py)
if $PY -c "import nvidia.dali" 2>/dev/null; then
  run bench_loader 60 $PY scripts/bench_loader.py --quick --device cuda --json "$OUT/bench_loader.json"
else
  echo "=== bench_loader: DALI is not installed here; its GPU mode was skipped (torch loader measured instead)" | tee -a "$LOG"
  run bench_loader 60 $PY scripts/bench_loader.py --quick --device cuda --skip-dali --json "$OUT/bench_loader.json"
fi
run bench_detect 180 $PY scripts/bench_detect.py --repeats 3 --device cuda --json "$OUT/bench_detect.json"
run bench_recon 60 $PY scripts/bench_recon.py --quick --device cuda --json "$OUT/bench_recon.json"
run bench_runner 240 $PY scripts/bench_runner.py --cases 20 --matrix 64 --slices 32 --repeats 3 --device cuda \
  --json "$OUT/bench_runner.json"

{
  echo "{"
  echo "  \"device\": $DEVICE_JSON,"
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
