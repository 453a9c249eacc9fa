#!/usr/bin/env bash
# Regenerate data_samples/: three small, deterministic chest CT phantom cases with ground truth.
# Needs the virtual environment (bash scripts/setup.sh). Every run gives the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
CTPIPE=${CTPIPE:-.venv/bin/ctpipe}
OUT=data_samples
rm -rf "$OUT"/phantom_*
COMMON=(--pixel-spacing 1.0 --slice-spacing 2.0 --nodule-diameter 4 20)
# case 1: JPEG 2000 lossless, head first supine, 3 nodules
"$CTPIPE" phantom "$OUT" --seed 1 --matrix 192 --slices 80 --nodules 3 "${COMMON[@]}" \
  --transfer-syntax jpeg2000
# case 2: RLE lossless, unsigned storage (RescaleIntercept -1024), feet first supine, 2 nodules
"$CTPIPE" phantom "$OUT" --seed 2 --matrix 160 --slices 80 --nodules 2 "${COMMON[@]}" \
  --transfer-syntax rle --unsigned --patient-position FFS
# case 3: uncompressed, shuffled file names in nested folders, reversed instance numbers, 4 nodules
"$CTPIPE" phantom "$OUT" --seed 3 --matrix 128 --slices 64 --nodules 4 "${COMMON[@]}" \
  --quirk shuffled_names --quirk reversed_order
du -sh "$OUT"
