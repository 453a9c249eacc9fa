#!/usr/bin/env bash
# Train the demo detector on realistic synthetic phantoms, both stages, then evaluate it on held-out
# realistic phantoms: scripts/train_detector.py (RetinaNet), scripts/train_fp_reducer.py (false-positive
# reduction classifier, then the operating point: the score threshold at 1 false positive per scan on its
# validation phantoms), scripts/train_detector.py --eval-only.
# Writes pipeline/detection/weights/demo_phantom_{retinanet.json,retinanet.pt,fpr.pt}.
#
# Phantoms: generate_phantom with realistic_confounders(seed) (table, blanket, arms, IV contrast, bowel gas,
# partial coverage, small/large field of view, emphysema, effusion, atelectasis, sharp kernel, thick slices,
# metal) over bifurcating, tapering vessel trees from the hila; 20 % of the training and validation phantoms
# have no nodule at all, and half of the RetinaNet's negative patches are centred on a lung vessel.
# Seeds, never overlapping: RetinaNet training 1000-1079, classifier training 2000-2039, validation and
# operating point 3000-3039 (with the first 40 thick-slice seeds from 3040 for the thick-slice score
# calibration), held-out evaluation 1-48 (1..999 is never trained on; the segmentation
# scenarios 5000-5099 neither).
#
# Both stages start from the plain-phantom demo model of commit f001359 (trained from scratch on plain
# phantoms by this script's previous version) and are fine-tuned on the realistic phantoms: on 2 CPU cores
# without bfloat16 support a RetinaNet step takes about 2.5 s, so training from scratch does not fit the
# budget. Measured on 2 shared CPU cores (Xeon, AVX-512, no bfloat16: float32), others' jobs running: RetinaNet
# stage 20.7 min (phantom cache 5.7, 600 steps 14.9), classifier stage 20.6 min (candidates and patches 7.4,
# 1,200 steps 7.2, validation and operating point 5.1, the rest phantom generation): 41.5 minutes in all;
# then the evaluation (48 held-out phantoms, 20-40 minutes depending on the machine's load).
# The classifier's validation also chooses whether candidates sharing one candidate's box (several candidates on
# the rim of one large nodule) are merged into one finding (fp_reduction.box_merge; on a CPM tie, merged).
# scripts/train_fp_reducer.py --anatomy-negatives N adds negatives from each phantom's own vessels and pleura; the
# shipped classifier is trained without them (with 80 or 120 per phantom: validation CPM 0.826/0.825 against 0.811,
# held-out CPM 0.903, but more hilar and vessel findings on the real planning chest CT).
# WORK (default /tmp/ctpipe_demo_training) holds the caches, the initial weights and the checkpoint; a rerun
# resumes from them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WORK=${WORK:-/tmp/ctpipe_demo_training}
INIT_COMMIT=f001359
mkdir -p "$WORK/init"
for f in retinanet.pt fpr.pt; do
  [ -f "$WORK/init/plain_$f" ] || git show "$INIT_COMMIT:pipeline/detection/weights/demo_phantom_$f" > "$WORK/init/plain_$f"
done
start=$(date +%s)
.venv/bin/python scripts/train_detector.py --work "$WORK/detector" --seed0 1000 --n-train 80 \
  --steps 600 --minutes 20 --lr 5e-4 --warmup 20 --threads 1 --init "$WORK/init/plain_retinanet.pt"
.venv/bin/python scripts/train_fp_reducer.py --work "$WORK/fp_reduction" --seed0 2000 --n-train 40 \
  --val-seed0 3000 --n-val 40 --steps 1200 --lr 1e-3 --hard-negatives 0.5 --threads 1 \
  --init "$WORK/init/plain_fpr.pt"
.venv/bin/python scripts/calibrate_operating_point.py --work "$WORK/calibration" --threads 1
echo "training took $(( ($(date +%s) - start) / 60 )) min"
.venv/bin/python scripts/train_detector.py --eval-only --eval-seeds 48 --threads 1 --work "$WORK/detector"
