"""LUNA16-style FROC evaluation of nodule findings.

Protocol (as LUNA16's evaluation script): a candidate is a hit when its centre
lies within the radius (diameter / 2) of a reference nodule's centre (LPS mm).
Each nodule counts once, with the highest score among its hits; further hits on
the same nodule are neither true nor false positives. Reference nodules smaller
than ``min_diameter_mm`` (3 mm, LUNA16's cut) are "irrelevant findings": hits on
them are ignored and they are not counted as nodules to find. Every other
candidate is a false positive. Sensitivity is read at 1/8, 1/4, 1/2, 1, 2, 4 and
8 false positives per scan (the best operating point with at most that many),
CPM is their mean, and 95 % intervals come from bootstrap resampling of scans
(1000 samples by default).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes
from ..errors import ConfigError
from .findings import Findings

log = logging.getLogger(__name__)

FP_RATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

Truth = dict[str, list[tuple[np.ndarray, float]]]  # scan id → [(centre LPS mm, diameter mm)]
Candidates = dict[str, list[tuple[np.ndarray, float]]]  # scan id → [(centre LPS mm, score)]
Point = Sequence[float] | np.ndarray  # a centre (x, y, z) in LPS mm


@dataclass
class FrocResult:
    """FROC numbers; sensitivities are fractions of the reference nodules (≥ min diameter)."""

    fp_rates: tuple[float, ...]
    sensitivity: list[float]
    cpm: float
    sensitivity_ci: list[tuple[float, float]]
    cpm_ci: tuple[float, float]
    curve_fps: list[float]
    curve_sensitivity: list[float]
    n_scans: int
    n_nodules: int
    n_detected: int
    n_candidates: int
    n_bootstrap: int
    per_nodule: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        """A plain-text table: FP/scan, sensitivity, 95 % CI; then CPM."""
        lines = ["FPs/scan  sensitivity  95% CI"]
        for r, s, (lo, hi) in zip(self.fp_rates, self.sensitivity, self.sensitivity_ci):
            lines.append(f"{r:8.3f}  {s:11.3f}  [{lo:.3f}, {hi:.3f}]")
        lines.append(f"CPM       {self.cpm:11.3f}  [{self.cpm_ci[0]:.3f}, {self.cpm_ci[1]:.3f}]")
        lines.append(f"({self.n_scans} scans, {self.n_nodules} nodules, {self.n_detected} detected, {self.n_candidates} candidates)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": "LUNA16 FROC (hit = candidate centre within nodule radius; CPM = mean sensitivity at 1/8..8 FPs/scan)",
            "fp_rates": list(self.fp_rates),
            "sensitivity": self.sensitivity,
            "sensitivity_ci95": [list(c) for c in self.sensitivity_ci],
            "cpm": self.cpm,
            "cpm_ci95": list(self.cpm_ci),
            "n_scans": self.n_scans,
            "n_nodules": self.n_nodules,
            "n_detected": self.n_detected,
            "n_candidates": self.n_candidates,
            "n_bootstrap": self.n_bootstrap,
            "curve": {"fps_per_scan": self.curve_fps, "sensitivity": self.curve_sensitivity},
            "per_nodule": self.per_nodule,
        }

    def write(self, out_dir: str | Path, *, stem: str = "froc") -> dict[str, Path]:
        """Write ``froc.json``, ``froc.csv`` and ``froc.png`` (atomically) into ``out_dir``."""
        out = Path(out_dir)
        paths = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv", "png": out / f"{stem}.png"}
        atomic_write_bytes(paths["json"], (json.dumps(self.to_json(), indent=1) + "\n").encode())
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["fps_per_scan", "sensitivity", "ci95_low", "ci95_high"])
        for r, s, (lo, hi) in zip(self.fp_rates, self.sensitivity, self.sensitivity_ci):
            w.writerow([r, f"{s:.4f}", f"{lo:.4f}", f"{hi:.4f}"])
        w.writerow(["CPM", f"{self.cpm:.4f}", f"{self.cpm_ci[0]:.4f}", f"{self.cpm_ci[1]:.4f}"])
        atomic_write_bytes(paths["csv"], buf.getvalue().encode())
        atomic_write_bytes(paths["png"], self._png())
        return paths

    def _png(self) -> bytes:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 4.5), dpi=100)
        ax = fig.add_subplot(111)
        ax.step(np.maximum(self.curve_fps, 1e-3), self.curve_sensitivity, where="post", label="FROC")
        lo = [c[0] for c in self.sensitivity_ci]
        hi = [c[1] for c in self.sensitivity_ci]
        ax.fill_between(self.fp_rates, lo, hi, alpha=0.25, label="95% CI (bootstrap)")
        ax.plot(self.fp_rates, self.sensitivity, "o")
        ax.set_xscale("log", base=2)
        ax.set_xlim(0.1, 10)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("false positives per scan")
        ax.set_ylabel("sensitivity")
        ax.set_title(f"FROC — CPM {self.cpm:.3f} [{self.cpm_ci[0]:.3f}, {self.cpm_ci[1]:.3f}]")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()


def _match_scan(cands: Sequence[tuple[np.ndarray, float]], nodules: Sequence[tuple[np.ndarray, float]], min_d: float):
    """Per scan: (best score per relevant nodule or -inf, FP scores)."""
    relevant = [(c, d) for c, d in nodules if d >= min_d]
    irrelevant = [(c, d) for c, d in nodules if d < min_d]
    best = np.full(len(relevant), -np.inf)
    fps = []
    for centre, score in cands:
        hit = False
        for n, (c, d) in enumerate(relevant):
            if np.linalg.norm(centre - c) <= d / 2.0:
                best[n] = max(best[n], score)
                hit = True
        if hit:
            continue
        if any(np.linalg.norm(centre - c) <= d / 2.0 for c, d in irrelevant):
            continue
        fps.append(score)
    return best, np.asarray(fps, dtype=np.float64)


def _froc(tp_scores: np.ndarray, fp_scores: np.ndarray, n_nodules: int, n_scans: int) -> tuple[np.ndarray, np.ndarray]:
    """Operating points (FPs/scan, sensitivity) for every threshold, loosest last."""
    found = tp_scores[np.isfinite(tp_scores)]
    scores = np.concatenate([found, fp_scores])
    is_tp = np.concatenate([np.ones(len(found)), np.zeros(len(fp_scores))])
    order = np.argsort(-scores, kind="stable")
    scores, is_tp = scores[order], is_tp[order]
    if len(scores) == 0:
        return np.zeros(1), np.zeros(1)
    last_of_tie = np.r_[scores[1:] != scores[:-1], True]
    ctp = np.cumsum(is_tp)[last_of_tie]
    cfp = np.cumsum(1 - is_tp)[last_of_tie]
    fps = np.r_[0.0, cfp / max(n_scans, 1)]
    sens = np.r_[0.0, ctp / max(n_nodules, 1)]
    return fps, sens


def _sens_at(fps: np.ndarray, sens: np.ndarray, rates: Sequence[float]) -> np.ndarray:
    return np.asarray([sens[fps <= r].max() if np.any(fps <= r) else 0.0 for r in rates])


def evaluate_froc(
    predictions: Mapping[str, Findings | Sequence[tuple[Point, float]]],
    truth: Mapping[str, Sequence[tuple[Point, float]]],
    *,
    scans: Iterable[str] | None = None,
    min_diameter_mm: float = 3.0,
    n_bootstrap: int = 1000,
    seed: int = 0,
    fp_rates: Sequence[float] = FP_RATES,
) -> FrocResult:
    """LUNA16 FROC/CPM of ``predictions`` (scan id → :class:`Findings` or [(centre LPS mm, score)])
    against ``truth`` (scan id → [(centre LPS mm, diameter mm)]).

    ``scans``: all scan ids of the test set (default: the union of both mappings' keys).
    """
    cands: Candidates = {}
    for sid, pred in predictions.items():
        if isinstance(pred, Findings):
            cands[sid] = [(np.asarray(f.center_lps, float), float(f.score)) for f in pred]
        else:
            cands[sid] = [(np.asarray(c, float), float(s)) for c, s in pred]
    gt: Truth = {sid: [(np.asarray(c, float), float(d)) for c, d in nods] for sid, nods in truth.items()}
    scan_ids = sorted(set(scans) if scans is not None else set(gt) | set(cands))
    if not scan_ids:
        raise ConfigError("no scans to evaluate", fix="pass predictions and ground truth for at least one scan")
    unknown = sorted(set(cands) - set(scan_ids))
    if unknown:
        log.warning("predictions for %d scans outside the test set are ignored: %s", len(unknown), unknown[:5])
    per_scan = []
    per_nodule = []
    for sid in scan_ids:
        best, fps = _match_scan(cands.get(sid, []), gt.get(sid, []), min_diameter_mm)
        per_scan.append((best, fps))
        rel = [(c, d) for c, d in gt.get(sid, []) if d >= min_diameter_mm]
        for (c, d), b in zip(rel, best):
            per_nodule.append({"scan": sid, "center_lps": c.tolist(), "diameter_mm": d,
                               "best_score": float(b) if np.isfinite(b) else None})
    n_nodules = sum(len(b) for b, _ in per_scan)
    if n_nodules == 0:
        raise ConfigError(f"the ground truth holds no nodule of at least {min_diameter_mm} mm", fix="check the truth file")
    tp = np.concatenate([b for b, _ in per_scan])
    fp = np.concatenate([f for _, f in per_scan]) if per_scan else np.zeros(0)
    fps, sens = _froc(tp, fp, n_nodules, len(scan_ids))
    at = _sens_at(fps, sens, fp_rates)
    rng = np.random.default_rng(seed)
    boot = np.zeros((n_bootstrap, len(fp_rates)))
    for b in range(n_bootstrap):
        pick = rng.integers(0, len(per_scan), len(per_scan))
        tp_b = np.concatenate([per_scan[p][0] for p in pick])
        fp_b = np.concatenate([per_scan[p][1] for p in pick])
        if len(tp_b) == 0:
            boot[b] = np.nan
            continue
        f_b, s_b = _froc(tp_b, fp_b, len(tp_b), len(pick))
        boot[b] = _sens_at(f_b, s_b, fp_rates)
    ci = [(float(np.nanpercentile(boot[:, r], 2.5)), float(np.nanpercentile(boot[:, r], 97.5))) for r in range(len(fp_rates))]
    cpm_boot = np.nanmean(boot, axis=1)
    return FrocResult(
        fp_rates=tuple(float(r) for r in fp_rates),
        sensitivity=[float(v) for v in at],
        cpm=float(np.mean(at)),
        sensitivity_ci=ci,
        cpm_ci=(float(np.nanpercentile(cpm_boot, 2.5)), float(np.nanpercentile(cpm_boot, 97.5))),
        curve_fps=[float(v) for v in fps],
        curve_sensitivity=[float(v) for v in sens],
        n_scans=len(scan_ids),
        n_nodules=n_nodules,
        n_detected=int(np.isfinite(tp).sum()),
        n_candidates=int(sum(len(v) for v in cands.values())),
        n_bootstrap=n_bootstrap,
        per_nodule=per_nodule,
    )
