#!/usr/bin/env python
"""Where the demo pipeline's misses and false positives at its operating point come from.

For each phantom (``scripts/train_detector.py``'s ``training_phantom`` protocol; by default the classifier's
validation seeds 3000-3039, never evaluation seeds) this runs the demo pipeline as ``ctpipe detect`` does (lung crop,
both stages, thick-slice calibration, the model's operating point) and, from the same network pass, the candidates
the false-positive classifier scores (:func:`pipeline.detection.fp_reduction.candidate_findings`) with the
classifier's probability and the network's score of each. Hits follow LUNA16's rule (a finding or candidate centre
within the nodule's radius; centres in DICOM patient coordinates, LPS mm).

Each nodule the pipeline does not report at the operating point falls in one of three classes:

- no candidate: neither the network nor the small-blob search proposes it, so no classifier can report it;
- classifier: a candidate hits it, but the classifier gives every such candidate less than 0.5;
- combined score: the classifier gives one 0.5 or more, yet the final score (combined with the network's, then
  calibrated for thick slices) stays below the threshold.

Each reported finding that hits no nodule is counted by its source: a box the network proposed, or a small-blob
candidate alone.

    python scripts/miss_breakdown.py --seed0 3000 --n 40
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

import numpy as np
import torch
from train_detector import HELDOUT_SEEDS, training_phantom

from pipeline.detection.bundle import load_model
from pipeline.detection.fp_reduction import candidate_findings
from pipeline.detection.infer import Detector
from pipeline.detection.model_config import DEMO_MODEL_JSON

MISS_CLASSES = ("no candidate", "classifier", "combined score")


def _hits(centres: np.ndarray, nodule_lps: np.ndarray, radius_mm: float) -> np.ndarray:
    """Which of ``centres`` (N, 3; LPS mm) lie strictly within ``radius_mm`` of ``nodule_lps`` (the hit rule of
    :mod:`pipeline.detection.evaluate`, LUNA16's)."""
    return np.linalg.norm(centres.reshape(-1, 3) - nodule_lps, axis=1) < radius_mm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed0", type=int, default=3000, help="first phantom seed (training_phantom protocol)")
    ap.add_argument("--n", type=int, default=40, help="phantoms")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    seeds = list(range(args.seed0, args.seed0 + args.n))
    if set(seeds) & set(HELDOUT_SEEDS):
        ap.error(f"seeds {seeds[0]}..{seeds[-1]} overlap the held-out seeds {HELDOUT_SEEDS[0]}..{HELDOUT_SEEDS[-1]}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    det = Detector(model=load_model(DEMO_MODEL_JSON), device="cpu")
    raw = Detector(model=det.model, device="cpu", postprocess=False, all_candidates=True)
    reducer = det.fp_reducer
    if reducer is None or det.score_threshold is None:
        raise SystemExit(f"{DEMO_MODEL_JSON} names no false-positive classifier or operating point to break down")
    t0 = time.time()
    n_nodules = reported = 0
    misses: Counter[str] = Counter()
    by_kind: Counter[tuple[str, str]] = Counter()
    false_pos: Counter[str] = Counter()
    for seed in seeds:
        ph = training_phantom(seed, np.random.default_rng(seed))
        region, _ = det.lung_roi(ph.volume)
        network = raw.detect(ph.volume)  # the network pass detect() makes: the same lung crop
        final = det.apply_operating_point(det.postprocess(ph.volume, network, region=region))
        items, network_score = candidate_findings(ph.volume, network, region, blobs=reducer.config.blob_candidates)
        centres = np.array([f.center_lps for f in items]).reshape(-1, 3)
        prob = reducer.probabilities(ph.volume, centres)
        shown = np.array([f.center_lps for f in final.findings]).reshape(-1, 3)
        for nod in ph.nodules:
            c, r = np.asarray(nod.center_lps), nod.diameter_mm / 2.0
            n_nodules += 1
            if _hits(shown, c, r).any():
                reported += 1
                continue
            near = _hits(centres, c, r)
            why = MISS_CLASSES[0] if not near.any() else MISS_CLASSES[1] if prob[near].max() < 0.5 else MISS_CLASSES[2]
            misses[why] += 1
            by_kind[(why, f"{nod.kind}/{nod.attached_to or 'free'}")] += 1
        for f in final.findings:
            c = np.asarray(f.center_lps)
            if any(_hits(c, np.asarray(n.center_lps), n.diameter_mm / 2.0).any() for n in ph.nodules):
                continue
            source = network_score[int(np.argmin(np.linalg.norm(centres - c, axis=1)))] if len(centres) else 0.0
            false_pos["network box" if source >= 0 else "small blob alone"] += 1
    scans = len(seeds)
    print(f"{scans} phantoms (seeds {seeds[0]}-{seeds[-1]}), {n_nodules} nodules, {(time.time() - t0) / 60:.1f} min")
    print(f"operating point {det.score_threshold:.4g}: {reported}/{n_nodules} nodules reported")
    for why in MISS_CLASSES:
        kinds = ", ".join(f"{k} {v}" for (w, k), v in sorted(by_kind.items()) if w == why)
        print(f"  missed, {why}: {misses[why]}" + (f" ({kinds})" if kinds else ""))
    total_fp = sum(false_pos.values())
    print(f"false positives: {total_fp} ({total_fp / scans:.2f} per scan)")
    for source in ("network box", "small blob alone"):
        print(f"  {source}: {false_pos[source]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
