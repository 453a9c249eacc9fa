"""Would hand-made shape features, stacked on the demo detector's score, rank its candidates better?

A measurement, not part of the pipeline. The two-stage demo detector (RetinaNet, then the patch classifier)
learns from phantoms alone; a hand-made shape measure might carry over to real CT better. For each candidate
scoring at least ``--floor`` on validation phantoms (``scripts/train_detector.py`` ``training_phantom``, seeds
``--seed0``.. that no training script uses), the Hessian of the HU cube around it (1 mm grid, L/P/S axes,
Gaussian scales 0.7 and 1 times r/sqrt(3), r the candidate's radius in mm) gives the ratios of its eigenvalues
(sorted by magnitude: about 1, 1 for a ball, 0, 1 for a tube, 0, 0 for a sheet), the sign of the largest and the
scale-normalised magnitude. An L2-regularised logistic regression on those, the logit of the score and the log
diameter replaces the score of those candidates (below the floor, scores are only scaled down, so they stay
last). Both columns come from the same run:

- the shipped score against the stacked one, cross-validated over phantoms (``--folds``), LUNA16 FROC (official
  interpolated reading), with the sensitivity at each rate and the ratio of the CPMs;
- with ``--real DIR``: the regression fitted on every validation phantom, its threshold at 1 false positive per
  scan on them, and the number of findings at that threshold on the real series against the shipped model's
  count at its operating point.

Candidates and features are cached in ``--work``; a rerun only refits.

    python scripts/shape_stacking.py --real ../shared/real_ct/chest_ct_rt_planning_dicom
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage
from scipy.optimize import minimize
from train_detector import training_phantom

from pipeline.detection.bundle import load_model
from pipeline.detection.evaluate import evaluate_froc
from pipeline.detection.findings import Findings
from pipeline.detection.froc_result import FrocResult
from pipeline.detection.infer import Detector
from pipeline.detection.lungs import quick_lung_mask
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.detection.patches import extract_patches
from pipeline.volume import CTVolume

log = logging.getLogger("shape_stacking")

CUBE = 40  # voxels of 1 mm: the Hessian's neighbourhood
SCALES = (0.7, 1.0)  # Gaussian scales, times r / sqrt(3) (the blob scale of a ball of radius r)
N_SHAPE = 4 * len(SCALES)


def shape_features(volume: CTVolume, center_lps: np.ndarray, diameter_mm: float) -> list[float]:
    """Per scale: eigenvalue ratios |l1|/|l3| and |l2|/|l3| with their signs (ordered by magnitude), the sign of
    l3 and its scale-normalised magnitude, from the Hessian of the windowed HU cube around ``center_lps`` (LPS mm)."""
    cube = extract_patches(volume, np.asarray([center_lps]), patch=CUBE, spacing_mm=1.0)[0].astype(np.float64)
    mid = CUBE // 2
    row: list[float] = []
    for factor in SCALES:
        sigma = max(0.8, diameter_mm / 2.0 / np.sqrt(3.0)) * factor
        hess = np.zeros((3, 3))
        for i in range(3):
            for j in range(i, 3):
                order = [0, 0, 0]
                order[i] += 1
                order[j] += 1
                value = ndimage.gaussian_filter(cube, sigma, order=order, truncate=3.0)[mid, mid, mid] * sigma**2
                hess[i, j] = hess[j, i] = value
        ev = np.linalg.eigvalsh(hess)
        ev = ev[np.argsort(np.abs(ev))]
        top = max(abs(ev[2]), 1e-9)
        row += [ev[0] / top, ev[1] / top, float(np.sign(ev[2])), top]
    return row


def candidate_rows(volume: CTVolume, findings: Findings, *, scan: int, floor: float) -> np.ndarray:
    """One row per candidate: scan, centre (LPS mm), diameter (mm), score, then :func:`shape_features` (NaN below
    ``floor``)."""
    rows = []
    for f in findings.candidates:
        feats = shape_features(volume, np.asarray(f.center_lps), f.diameter_mm) if f.score >= floor else [np.nan] * N_SHAPE
        rows.append([scan, *f.center_lps, f.diameter_mm, f.score, *feats])
    return np.asarray(rows, dtype=np.float64).reshape(-1, 6 + N_SHAPE)


def collect(work: Path, seeds: list[int], floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(candidate rows of every seed, truth rows: seed, centre LPS mm, diameter mm), cached per seed in ``work``."""
    model = load_model(DEMO_MODEL_JSON)
    net = Detector(model=model, device="cpu", postprocess=False, all_candidates=True)
    full = Detector(model=model, device="cpu", all_candidates=True)
    rows, truth = [], []
    work.mkdir(parents=True, exist_ok=True)
    for n, seed in enumerate(seeds):
        path = work / f"phantom_{seed}_floor{floor:g}.npz"
        if not path.is_file():
            t0 = time.time()
            ph = training_phantom(seed, np.random.default_rng(seed))
            region = quick_lung_mask(ph.volume)
            found = full.postprocess(ph.volume, net.detect(ph.volume, lung_mask=region), region=region)
            nods = [[seed, *nod.center_lps, nod.diameter_mm] for nod in ph.nodules]
            np.savez(path, rows=candidate_rows(ph.volume, found, scan=seed, floor=floor), truth=np.asarray(nods).reshape(-1, 5))
            log.info(
                "phantom %d (%d/%d): %d candidates, %.1f s", seed, n + 1, len(seeds), len(found.candidates), time.time() - t0
            )
        data = np.load(path)
        rows.append(data["rows"])
        truth.append(data["truth"])
    return np.concatenate(rows), np.concatenate(truth)


def hit_labels(rows: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """1: the candidate's centre lies within a nodule of 3 mm or more; -1: only within a smaller one; else 0."""
    labels = np.zeros(len(rows), int)
    for n, row in enumerate(rows):
        nods = truth[truth[:, 0] == row[0]]
        inside = np.linalg.norm(nods[:, 1:4] - row[1:4], axis=1) < nods[:, 4] / 2.0
        if (inside & (nods[:, 4] >= 3.0)).any():
            labels[n] = 1
        elif inside.any():
            labels[n] = -1
    return labels


def design(rows: np.ndarray) -> np.ndarray:
    """Regression inputs: logit of the score, the shape features, log diameter."""
    p = np.clip(rows[:, 5], 1e-4, 1 - 1e-4)
    shape = rows[:, 6:].copy()
    shape[:, 3::4] = np.log(shape[:, 3::4] + 1e-3)
    return np.column_stack([np.log(p / (1 - p)), shape, np.log(rows[:, 4])])


def fit_logistic(x: np.ndarray, y: np.ndarray, *, l2: float) -> Callable[[np.ndarray], np.ndarray]:
    """Probability function of an L2-regularised logistic regression on standardised ``x``."""
    mu, sd = x.mean(0), x.std(0) + 1e-9

    def with_bias(a: np.ndarray) -> np.ndarray:
        return np.column_stack([(a - mu) / sd, np.ones(len(a))])

    z1 = with_bias(x)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = z1 @ w
        per = np.logaddexp(0.0, z) - y * z
        grad = z1.T @ (1.0 / (1.0 + np.exp(-z)) - y) / len(y) + 2 * l2 * np.r_[w[:-1], 0.0]
        return float(per.mean() + l2 * (w[:-1] ** 2).sum()), grad

    w = minimize(loss, np.zeros(z1.shape[1]), jac=True, method="L-BFGS-B").x
    return lambda a: 1.0 / (1.0 + np.exp(-(with_bias(a) @ w)))


def stacked_scores(rows: np.ndarray, prob: Callable[[np.ndarray], np.ndarray], *, floor: float, where: np.ndarray) -> np.ndarray:
    """Scores of ``rows`` where ``where``: the regression's above ``floor``, below it the score scaled down."""
    out = rows[:, 5] * 1e-3
    m = where & (rows[:, 5] >= floor)
    out[m] = floor * 1e-3 + prob(design(rows[m])) * (1 - floor * 1e-3)
    return out[where]


def froc(rows: np.ndarray, truth: np.ndarray, scores: np.ndarray) -> FrocResult:
    scans = [int(s) for s in np.unique(np.r_[rows[:, 0], truth[:, 0]])]
    preds = {str(s): [(rows[i, 1:4], float(scores[i])) for i in np.flatnonzero(rows[:, 0] == s)] for s in scans}
    nods = {str(s): [(t[1:4], float(t[4])) for t in truth[truth[:, 0] == s]] for s in scans}
    return evaluate_froc(preds, nods, n_bootstrap=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ctpipe_shape_stacking"))
    ap.add_argument("--seed0", type=int, default=3000, help="first validation phantom seed")
    ap.add_argument("--n", type=int, default=40, help="validation phantoms")
    ap.add_argument("--floor", type=float, default=0.01, help="candidates scoring below this keep their order, last")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument("--real", type=Path, help="a real DICOM series folder: findings at the 1-FP/scan threshold")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    rows, truth = collect(args.work, list(range(args.seed0, args.seed0 + args.n)), args.floor)
    labels = hit_labels(rows, truth)
    x, usable = design(rows), (rows[:, 5] >= args.floor) & (labels >= 0)
    cv = rows[:, 5] * 1e-3
    for fold in np.array_split(np.unique(rows[:, 0]), args.folds):
        test = np.isin(rows[:, 0], fold)
        prob = fit_logistic(x[usable & ~test], (labels[usable & ~test] == 1).astype(float), l2=args.l2)
        cv[test] = stacked_scores(rows, prob, floor=args.floor, where=test)
    base, stacked = froc(rows, truth, rows[:, 5]), froc(rows, truth, cv)
    print(
        f"{args.n} validation phantoms (seeds {args.seed0}..{args.seed0 + args.n - 1}), {base.n_nodules} nodules; "
        f"stacking cross-validated over {args.folds} folds of phantoms"
    )
    print("FPs/scan              " + " ".join(f"{r:6.3f}" for r in base.fp_rates) + "    CPM")
    for name, res in (("shipped score (peer)", base), ("stacked shape score", stacked)):
        print(f"{name:22s}" + " ".join(f"{s:6.3f}" for s in res.sensitivity) + f"  {res.cpm:.3f}")
    print(f"CPM ratio stacked / shipped: {stacked.cpm / base.cpm:.3f}")
    if args.real is not None:
        from pipeline.ingest import load_series

        prob = fit_logistic(x[usable], (labels[usable] == 1).astype(float), l2=args.l2)
        everywhere = np.ones(len(rows), bool)
        threshold = froc(rows, truth, stacked_scores(rows, prob, floor=args.floor, where=everywhere)).thresholds[3][0]
        model = load_model(DEMO_MODEL_JSON)
        volume = load_series(args.real)
        found = Detector(model=model, device="cpu").detect(volume)  # at the shipped operating point
        real = candidate_rows(volume, found, scan=0, floor=args.floor)
        ours = stacked_scores(real, prob, floor=args.floor, where=np.ones(len(real), bool))
        print(
            f"{args.real.name}: shipped model {len(found.findings)} findings at its operating point "
            f"{found.score_threshold:.4f}; stacked {int((ours >= threshold).sum())} at its 1-FP/scan threshold {threshold:.4f}"
        )
        for i in np.argsort(-ours)[:8]:
            print(
                f"  stacked {ours[i]:.3f}  shipped {real[i, 5]:.3f}  {real[i, 4]:.1f} mm at LPS {np.round(real[i, 1:4], 1).tolist()}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
