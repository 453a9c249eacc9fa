#!/usr/bin/env python
"""The candidate stage's ceiling: how many phantom nodules any candidate of the demo pipeline reaches.

The false-positive classifier can only report nodules some candidate hits, so the share of nodules with a candidate
within their radius (LUNA16's hit rule) bounds the pipeline's sensitivity at every false-positive rate, whatever the
classifier. For each phantom (``scripts/train_detector.py``'s ``training_phantom`` protocol; by default the
classifier's validation seeds 3000-3039, never evaluation seeds) this runs the demo RetinaNet once and makes the
candidates as the pipeline makes them (:func:`pipeline.detection.fp_reduction.candidate_findings`: every network
candidate and the strongest ``--blobs`` small-blob candidates, centres refined) for each cap given, and counts the
nodules hit, by diameter. Centres are DICOM patient coordinates (LPS, mm).

    python scripts/candidate_recall.py --blobs 200 400 800 1600
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import torch
from train_detector import HELDOUT_SEEDS, training_phantom

from pipeline.detection.bundle import load_model
from pipeline.detection.fp_reduction import candidate_findings
from pipeline.detection.infer import Detector
from pipeline.detection.lungs import quick_lung_mask
from pipeline.detection.model_config import DEMO_MODEL_JSON

BANDS_MM = ((3.0, 6.0), (6.0, 10.0), (10.0, 40.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed0", type=int, default=3000, help="first phantom seed (training_phantom protocol)")
    ap.add_argument("--n", type=int, default=40, help="phantoms")
    ap.add_argument("--blobs", type=int, nargs="+", default=[200, 400, 800, 1600], help="small-blob candidates per scan")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    seeds = list(range(args.seed0, args.seed0 + args.n))
    if set(seeds) & set(HELDOUT_SEEDS):
        ap.error(f"seeds {seeds[0]}..{seeds[-1]} overlap the held-out seeds {HELDOUT_SEEDS[0]}..{HELDOUT_SEEDS[-1]}")
    if any(b < 0 for b in args.blobs):
        ap.error(f"--blobs {args.blobs}: give counts of 0 or more")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    det = Detector(model=load_model(DEMO_MODEL_JSON), device="cpu", postprocess=False, all_candidates=True)
    t0 = time.time()
    diameters: list[float] = []
    hit = {b: [] for b in args.blobs}  # per cap: whether each nodule is hit
    per_scan = {b: 0 for b in args.blobs}
    for seed in seeds:
        ph = training_phantom(seed, np.random.default_rng(seed))
        region = quick_lung_mask(ph.volume)
        found = det.detect(ph.volume, lung_mask=region)
        diameters += [n.diameter_mm for n in ph.nodules]
        for b in args.blobs:
            items, _ = candidate_findings(ph.volume, found, region, blobs=b)
            centres = np.array([f.center_lps for f in items]).reshape(-1, 3)
            per_scan[b] += len(items)
            for nod in ph.nodules:
                d = np.linalg.norm(centres - np.asarray(nod.center_lps), axis=1)
                hit[b].append(bool(len(d)) and bool(d.min() <= nod.diameter_mm / 2.0))
    diam = np.asarray(diameters)
    print(f"{len(seeds)} phantoms (seeds {seeds[0]}-{seeds[-1]}), {len(diam)} nodules, {(time.time() - t0) / 60:.1f} min")
    print("blobs/scan  candidates/scan  nodules hit  " + "  ".join(f"{lo:g}-{hi:g} mm" for lo, hi in BANDS_MM))
    for b in args.blobs:
        h = np.asarray(hit[b], dtype=bool)
        bands = "  ".join(
            f"{int(h[(diam >= lo) & (diam < hi)].sum())}/{int(((diam >= lo) & (diam < hi)).sum())}" for lo, hi in BANDS_MM
        )
        print(f"{b:10d}  {per_scan[b] / len(seeds):15.0f}  {int(h.sum())}/{len(h)} ({h.mean():.3f})  {bands}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
