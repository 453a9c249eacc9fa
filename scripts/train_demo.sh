#!/usr/bin/env bash
# Train the demo detector from scratch on synthetic phantoms, both stages, then evaluate it on
# held-out phantoms: scripts/train_detector.py (RetinaNet), scripts/train_fp_reducer.py
# (false-positive reduction classifier, then the operating point: the score threshold at 1 false positive
# per scan on its validation phantoms), scripts/train_detector.py --eval-only.
# Writes pipeline/detection/weights/demo_phantom_{retinanet.json,retinanet.pt,fpr.pt}.
# About 41 minutes on 2 CPU cores with bfloat16 support, plus 4 for the evaluation (48 held-out phantoms). WORK (default /tmp/ctpipe_demo_training)
# holds the caches and the checkpoint; a rerun resumes from them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WORK=${WORK:-/tmp/ctpipe_demo_training}
start=$(date +%s)
.venv/bin/python scripts/train_detector.py --work "$WORK/detector"
.venv/bin/python scripts/train_fp_reducer.py --work "$WORK/fp_reduction"
echo "training took $(( ($(date +%s) - start) / 60 )) min"
.venv/bin/python scripts/train_detector.py --eval-only --eval-seeds 48 --work "$WORK/detector"
