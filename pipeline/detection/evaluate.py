"""LUNA16 FROC evaluation of nodule findings, as LUNA16's evaluation script (``noduleCADEvaluationLUNA16.py``) scores them.

Protocol: a candidate is a hit when its centre lies strictly within the radius
(diameter / 2) of a reference nodule's centre (LPS mm). Each nodule counts once, with
the highest score among its hits; further hits on the same nodule are neither true nor
false positives. "Irrelevant findings" (reference nodules smaller than ``min_diameter_mm``,
3 mm as LUNA16's cut, and any given in ``irrelevant``, e.g. LUNA16's
``annotations_excluded.csv``) are not counted as nodules to find, and candidates that hit
only them are ignored. Every other candidate is a false positive. Every scan of the test
set counts (``scans``; default: every scan named by the predictions or the truth), so scans
without nodules add their false positives and scans without candidates their misses.
Findings are scored on their full candidate list (:attr:`.findings.Findings.candidates`),
whatever threshold they were reported at. Optionally (``max_marks_per_scan``, LUNA16's
script uses 100) only the candidates scoring above the (N+1)-th highest score of each scan
are kept, as the script does.

The FROC curve has one operating point per distinct score (ties move together), starting
at (0, 0). Sensitivity at 1/8, 1/4, 1/2, 1, 2, 4 and 8 false positives per scan is read,
by default (``reading="interpolate"``), as the official script reads it: linear
interpolation of that curve (``np.interp``; where the curve rises vertically at exactly a
rate, the top of the rise; beyond the last point, its sensitivity). The script samples the
interpolated curve on 10,001 points from 1/8 to 8 FPs/scan; the value at each rate is the
same curve read at the rate itself. ``reading="step"`` gives instead the best operating
point with at most that many false positives per scan (a threshold one can actually set).
CPM is the mean of the seven; 95 % intervals come from bootstrap resampling of scans
(1000 samples by default), each sample read the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .findings import Findings
from .froc_result import FrocResult

log = logging.getLogger(__name__)

FP_RATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
#: upper edges (mm, exclusive) of the nodule size bands of :func:`found_by_size`: under 6, 6-10, 10-20, 20 mm and over
SIZE_EDGES_MM = (6.0, 10.0, 20.0)

Truth = dict[str, list[tuple[np.ndarray, float]]]  # scan id → [(centre LPS mm, diameter mm)]
Candidates = dict[str, list[tuple[np.ndarray, float]]]  # scan id → [(centre LPS mm, score)]
Point = Sequence[float] | np.ndarray  # a centre (x, y, z) in LPS mm


READINGS = ("interpolate", "step")


@dataclass(frozen=True)
class Matched:
    """Candidates matched to nodules (:func:`match_predictions`).

    per_scan: per scan of the test set (sorted ids), the best score of each relevant nodule (``-inf`` when missed)
        and the false positives' scores.
    per_nodule: one record per relevant nodule (scan, centre LPS mm, diameter mm, best score or ``None``).
    n_candidates: candidates evaluated (after the per-scan cap), in the test set's scans.
    """

    per_scan: list[tuple[np.ndarray, np.ndarray]]
    n_scans: int
    per_nodule: list[dict[str, Any]]
    n_candidates: int


def _keep_top_marks(cands: list[tuple[np.ndarray, float]], cap: int | None) -> list[tuple[np.ndarray, float]]:
    """LUNA16's per-scan cap: with more than ``cap`` candidates, those scoring above the (cap+1)-th highest score."""
    if cap is None or len(cands) <= cap:
        return cands
    limit = sorted((s for _, s in cands), reverse=True)[cap]
    return [(c, s) for c, s in cands if s > limit]


def _match_scan(
    cands: Sequence[tuple[np.ndarray, float]],
    relevant: Sequence[tuple[np.ndarray, float]],
    irrelevant: Sequence[tuple[np.ndarray, float]],
) -> tuple[np.ndarray, np.ndarray]:
    """Per scan: (best score per relevant nodule or -inf, FP scores)."""
    best = np.full(len(relevant), -np.inf)
    fps = []
    for centre, score in cands:
        hit = False
        for n, (c, d) in enumerate(relevant):
            if np.linalg.norm(centre - c) < d / 2.0:
                best[n] = max(best[n], score)
                hit = True
        if hit:
            continue
        if any(np.linalg.norm(centre - c) < d / 2.0 for c, d in irrelevant):
            continue
        fps.append(score)
    return best, np.asarray(fps, dtype=np.float64)


def _as_candidates(pred: Findings | Sequence[tuple[Point, float]]) -> list[tuple[np.ndarray, float]]:
    if isinstance(pred, Findings):
        return [(np.asarray(f.center_lps, float), float(f.score)) for f in pred.candidates]
    return [(np.asarray(c, float), float(s)) for c, s in pred]


def match_predictions(
    predictions: Mapping[str, Findings | Sequence[tuple[Point, float]]],
    truth: Mapping[str, Sequence[tuple[Point, float]]],
    *,
    scans: Iterable[str] | None = None,
    min_diameter_mm: float = 3.0,
    irrelevant: Mapping[str, Sequence[tuple[Point, float]]] | None = None,
    max_marks_per_scan: int | None = None,
) -> Matched:
    """Match candidates to nodules per scan (see the module docstring and :class:`Matched`).

    Raises :class:`ConfigError` when there is no scan or no relevant nodule.
    """
    cands = {sid: _keep_top_marks(_as_candidates(pred), max_marks_per_scan) for sid, pred in predictions.items()}
    gt = {sid: [(np.asarray(c, float), float(d)) for c, d in nods] for sid, nods in truth.items()}
    # as LUNA16's script: an irrelevant finding without a diameter (negative) counts as 10 mm
    excl = {
        sid: [(np.asarray(c, float), float(d) if d >= 0 else 10.0) for c, d in nods] for sid, nods in (irrelevant or {}).items()
    }
    scan_ids = sorted(set(scans) if scans is not None else set(gt) | set(cands))
    if not scan_ids:
        raise ConfigError(
            "no scans to evaluate (scans, predictions and truth are all empty)",
            where="match_predictions(predictions, truth, scans=...)",
            fix="pass predictions and ground truth for at least one scan",
        )
    for name, keys in (("predictions", cands), ("ground truth", gt)):
        outside = sorted(set(keys) - set(scan_ids))
        if outside:
            log.warning("%s for %d scans outside the test set are ignored: %s", name, len(outside), outside[:5])
    per_scan = []
    per_nodule = []
    for sid in scan_ids:
        nods = gt.get(sid, [])
        relevant = [(c, d) for c, d in nods if d >= min_diameter_mm]
        small = [(c, d) for c, d in nods if d < min_diameter_mm]
        best, fps = _match_scan(cands.get(sid, []), relevant, small + excl.get(sid, []))
        per_scan.append((best, fps))
        for (c, d), b in zip(relevant, best):
            per_nodule.append(
                {"scan": sid, "center_lps": c.tolist(), "diameter_mm": d, "best_score": float(b) if np.isfinite(b) else None}
            )
    if not per_nodule:
        raise ConfigError(
            f"the ground truth holds no nodule of at least {min_diameter_mm} mm in the {len(scan_ids)} scans evaluated",
            where="match_predictions(truth, scans=..., min_diameter_mm=...)",
            fix="check the truth file and the scan list",
        )
    n_cands = sum(len(cands.get(sid, [])) for sid in scan_ids)
    return Matched(per_scan=per_scan, n_scans=len(scan_ids), per_nodule=per_nodule, n_candidates=n_cands)


def _nodules_hit(cands: Mapping[str, Sequence[tuple[Point, float]]], truth: Truth, flip: np.ndarray) -> int:
    """How many nodules of ``truth`` some candidate hits once its centre is multiplied by ``flip``."""
    hit = 0
    for sid, nods in truth.items():
        if not nods or not cands.get(sid):
            continue
        pts = np.asarray([c for c, _ in cands[sid]], float) * flip
        for c, d in nods:
            hit += bool(np.any(np.linalg.norm(pts - np.asarray(c, float), axis=1) < float(d) / 2.0))
    return hit


def coordinate_warnings(predictions: Mapping[str, Sequence[tuple[Point, float]]], truth: Truth) -> list[str]:
    """Signs that the candidates' centres are not LPS millimetres (as the truth's): whole non-negative numbers that
    hit no nodule (voxel indices), or centres that hit more nodules with x and y negated (RAS world coordinates)."""
    common = {sid: list(predictions[sid]) for sid in set(predictions) & set(truth) if predictions[sid]}
    if not common or not any(truth[sid] for sid in common):
        return []
    pts = np.concatenate([np.asarray([c for c, _ in cands], float) for cands in common.values()])
    hits = _nodules_hit(common, truth, np.ones(3))
    warnings = []
    if hits == 0 and np.all(pts >= 0) and np.all(pts == np.round(pts)):
        warnings.append(
            f"the {len(pts)} candidates of the scans with truth hit no nodule and every coordinate is a whole number "
            ">= 0: they look like voxel indices (i, j, k). ctpipe evaluate takes world coordinates in mm (LPS, as "
            "the MHD/ITK world coordinates of LUNA16's CSVs): convert them with the scan's origin, spacing and direction"
        )
    mirrored = _nodules_hit(common, truth, np.array([-1.0, -1.0, 1.0]))
    if mirrored >= 2 and mirrored > 2 * hits:  # not one chance hit of a mirrored candidate
        warnings.append(
            f"with x and y negated the candidates hit {mirrored} nodules instead of {hits}: their coordinates look "
            "like RAS (x to the patient's right, y anterior). ctpipe evaluate takes LPS mm, as DICOM, ITK and "
            "LUNA16's CSVs: negate coordX and coordY"
        )
    return warnings


def froc_curve(
    tp_scores: np.ndarray, fp_scores: np.ndarray, n_nodules: int, n_scans: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FROC operating points ``(fps_per_scan, sensitivity, threshold)``, one per distinct score, highest threshold
    first, preceded by (0, 0) at threshold +inf. ``tp_scores``: best score of each nodule (``-inf`` = missed)."""
    found = tp_scores[np.isfinite(tp_scores)]
    scores = np.concatenate([found, fp_scores])
    is_tp = np.concatenate([np.ones(len(found)), np.zeros(len(fp_scores))])
    order = np.argsort(-scores, kind="stable")
    scores, is_tp = scores[order], is_tp[order]
    last_of_tie = np.r_[scores[1:] != scores[:-1], True] if len(scores) else np.zeros(0, bool)
    ctp = np.cumsum(is_tp)[last_of_tie]
    cfp = np.cumsum(1 - is_tp)[last_of_tie]
    fps = np.r_[0.0, cfp / max(n_scans, 1)]
    sens = np.r_[0.0, ctp / max(n_nodules, 1)]
    return fps, sens, np.r_[np.inf, scores[last_of_tie]]


def sensitivity_at(fps: np.ndarray, sens: np.ndarray, rates: Sequence[float], *, reading: str = "interpolate") -> np.ndarray:
    """Sensitivity of the FROC curve ``(fps, sens)`` (:func:`froc_curve`) at each false-positive rate in ``rates``:
    ``"interpolate"`` (LUNA16's script) or ``"step"`` (best operating point at or below the rate)."""
    if reading == "interpolate":
        return np.interp(np.asarray(rates, float), fps, sens)
    if reading == "step":
        return np.asarray([sens[fps <= r].max() if np.any(fps <= r) else 0.0 for r in rates])
    raise ConfigError(
        f"FROC reading {reading!r} is not one of {READINGS}",
        where="sensitivity_at(reading=...)",
        fix="use 'interpolate' (LUNA16) or 'step'",
    )


def at_score_threshold(matched: Matched, threshold: float) -> dict[str, Any]:
    """What reporting every candidate scoring at or above ``threshold`` gives on ``matched`` (:func:`match_predictions`,
    LUNA16's counting): ``sensitivity``, ``nodules_found`` of ``n_nodules`` and ``fps_per_scan`` (false positives per
    scan of the test set), with ``score_threshold``, and the nodules found by size (``by_size``, :func:`found_by_size`).
    The figures of a model's operating point on a test set."""
    found = sum(int(np.sum(best >= threshold)) for best, _ in matched.per_scan)
    false = sum(int(np.sum(fps >= threshold)) for _, fps in matched.per_scan)
    n_nodules = len(matched.per_nodule)
    return {
        "score_threshold": float(threshold),
        "sensitivity": found / max(n_nodules, 1),
        "nodules_found": found,
        "n_nodules": n_nodules,
        "fps_per_scan": false / max(matched.n_scans, 1),
        "by_size": found_by_size(matched.per_nodule, threshold),
    }


def found_by_size(
    per_nodule: Sequence[Mapping[str, Any]], threshold: float, *, edges_mm: Sequence[float] = SIZE_EDGES_MM
) -> list[dict[str, Any]]:
    """Reference nodules found at score ``threshold`` (a hit scoring at or above it) per size band: one record per band
    ``min_mm <= diameter < max_mm`` (``max_mm`` None for the last, open band) with ``nodules_found``, ``n_nodules`` and
    ``sensitivity`` (None for a band without nodules). ``per_nodule``: :attr:`Matched.per_nodule` (diameters in mm).
    Small nodules are where detectors differ most (LUNA16's smallest are 3 mm); the bands show it. Raises
    :class:`ConfigError` unless ``edges_mm`` are positive and increasing."""
    bounds = [0.0, *(float(e) for e in edges_mm)]
    if any(not b < a for b, a in zip(bounds, bounds[1:])):
        raise ConfigError(
            f"size band edges {list(edges_mm)} are not positive and increasing",
            where="found_by_size(edges_mm=...)",
            fix="pass the bands' upper edges in mm, smallest first, e.g. (6.0, 10.0, 20.0)",
        )
    out = []
    for n, lo in enumerate(bounds):
        hi = bounds[n + 1] if n + 1 < len(bounds) else None
        band = [p for p in per_nodule if p["diameter_mm"] >= lo and (hi is None or p["diameter_mm"] < hi)]
        found = sum(1 for p in band if p["best_score"] is not None and p["best_score"] >= threshold)
        out.append(
            {
                "min_mm": lo,
                "max_mm": hi,
                "nodules_found": found,
                "n_nodules": len(band),
                "sensitivity": found / len(band) if band else None,
            }
        )
    return out


def size_band_text(bands: Sequence[Mapping[str, Any]]) -> str:
    """``found_by_size``'s bands on one line, e.g. ``under 6 mm 9/20, 6-10 mm 18/19, 20 mm and over 3/3`` (bands
    without nodules left out)."""
    parts = []
    for b in bands:
        if not b["n_nodules"]:
            continue
        lo, hi = b["min_mm"], b["max_mm"]
        name = f"under {hi:g} mm" if lo == 0 else f"{lo:g} mm and over" if hi is None else f"{lo:g}-{hi:g} mm"
        parts.append(f"{name} {b['nodules_found']}/{b['n_nodules']}")
    return ", ".join(parts)


def threshold_at(fps: np.ndarray, sens: np.ndarray, thresholds: np.ndarray, rate: float) -> tuple[float, float, float]:
    """``(score threshold, sensitivity, fps/scan)`` of the lowest threshold on the curve with at most ``rate`` false
    positives per scan (reporting every candidate scoring at or above it). With none, the threshold lies just above the
    highest score."""
    ok = np.flatnonzero(fps <= rate + 1e-12)
    n = int(ok[-1])
    t = float(thresholds[n])
    if not np.isfinite(t):
        t = float(np.nextafter(thresholds[1], np.inf)) if len(thresholds) > 1 else 1.0
    return t, float(sens[n]), float(fps[n])


def evaluate_froc(
    predictions: Mapping[str, Findings | Sequence[tuple[Point, float]]],
    truth: Mapping[str, Sequence[tuple[Point, float]]],
    *,
    scans: Iterable[str] | None = None,
    min_diameter_mm: float = 3.0,
    n_bootstrap: int = 1000,
    seed: int = 0,
    fp_rates: Sequence[float] = FP_RATES,
    reading: str = "interpolate",
    irrelevant: Mapping[str, Sequence[tuple[Point, float]]] | None = None,
    max_marks_per_scan: int | None = None,
) -> FrocResult:
    """LUNA16 FROC/CPM of ``predictions`` (scan id → :class:`Findings`, scored on all candidates, or
    [(centre LPS mm, score)]) against ``truth`` (scan id → [(centre LPS mm, diameter mm)]).

    ``scans``: all scan ids of the test set (default: the union of both mappings' keys); ``reading``:
    ``"interpolate"`` (LUNA16) or ``"step"``; ``irrelevant``: further findings whose hits are ignored (scan id →
    [(centre, diameter)]); ``max_marks_per_scan``: LUNA16's cap (100 in its script; default none).
    """
    if reading not in READINGS:
        raise ConfigError(
            f"FROC reading {reading!r} is not one of {READINGS}",
            where="evaluate_froc(reading=...)",
            fix="use 'interpolate' (LUNA16) or 'step'",
        )
    if max_marks_per_scan is not None and max_marks_per_scan < 1:
        raise ConfigError(
            f"max_marks_per_scan is {max_marks_per_scan}; it must be at least 1",
            where="evaluate_froc(max_marks_per_scan=...)",
            fix="pass None (no cap) or a positive number of marks per scan (LUNA16's script uses 100)",
        )
    matched = match_predictions(
        predictions,
        truth,
        scans=scans,
        min_diameter_mm=min_diameter_mm,
        irrelevant=irrelevant,
        max_marks_per_scan=max_marks_per_scan,
    )
    return froc_of_matched(
        matched, n_bootstrap=n_bootstrap, seed=seed, fp_rates=fp_rates, reading=reading, max_marks_per_scan=max_marks_per_scan
    )


def froc_of_matched(
    matched: Matched,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    fp_rates: Sequence[float] = FP_RATES,
    reading: str = "interpolate",
    max_marks_per_scan: int | None = None,
) -> FrocResult:
    """The FROC/CPM of :func:`evaluate_froc` from candidates already matched to nodules (:func:`match_predictions`,
    which ``max_marks_per_scan`` capped, recorded here), so one matching also serves :func:`at_score_threshold`."""
    per_scan, n_scans, per_nodule = matched.per_scan, matched.n_scans, matched.per_nodule
    n_nodules = len(per_nodule)
    tp = np.concatenate([b for b, _ in per_scan])
    fp = np.concatenate([f for _, f in per_scan])
    fps, sens, thr = froc_curve(tp, fp, n_nodules, n_scans)
    at = sensitivity_at(fps, sens, fp_rates, reading=reading)
    rng = np.random.default_rng(seed)
    boot = np.zeros((n_bootstrap, len(fp_rates)))
    for b in range(n_bootstrap):
        pick = rng.integers(0, len(per_scan), len(per_scan))
        tp_b = np.concatenate([per_scan[p][0] for p in pick])
        fp_b = np.concatenate([per_scan[p][1] for p in pick])
        if len(tp_b) == 0:
            boot[b] = np.nan
            continue
        f_b, s_b, _ = froc_curve(tp_b, fp_b, len(tp_b), len(pick))
        boot[b] = sensitivity_at(f_b, s_b, fp_rates, reading=reading)
    if n_bootstrap:
        ci = [(float(np.nanpercentile(boot[:, r], 2.5)), float(np.nanpercentile(boot[:, r], 97.5))) for r in range(len(fp_rates))]
        cpm_boot = np.nanmean(boot, axis=1)
        cpm_ci = (float(np.nanpercentile(cpm_boot, 2.5)), float(np.nanpercentile(cpm_boot, 97.5)))
    else:
        ci = [(float("nan"), float("nan"))] * len(fp_rates)
        cpm_ci = (float("nan"), float("nan"))
    return FrocResult(
        fp_rates=tuple(float(r) for r in fp_rates),
        sensitivity=[float(v) for v in at],
        cpm=float(np.mean(at)),
        sensitivity_ci=ci,
        cpm_ci=cpm_ci,
        curve_fps=[float(v) for v in fps],
        curve_sensitivity=[float(v) for v in sens],
        n_scans=n_scans,
        n_nodules=n_nodules,
        n_detected=int(np.isfinite(tp).sum()),
        n_candidates=matched.n_candidates,
        n_bootstrap=n_bootstrap,
        per_nodule=per_nodule,
        reading=reading,
        max_marks_per_scan=max_marks_per_scan,
        thresholds=[threshold_at(fps, sens, thr, r) for r in fp_rates],
    )
