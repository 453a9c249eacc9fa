"""The numbers of a LUNA16 FROC evaluation (:func:`.evaluate.evaluate_froc`) and the ways they are written.

:class:`FrocResult` holds the sensitivities at the false-positive rates, the CPM, their bootstrap intervals
and one record per reference nodule (centre in DICOM patient coordinates, LPS mm; diameter mm); it gives
them as a table and JSON, and writes them as JSON, CSV and a PNG of the curve.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes


def _finite(v: float) -> float | None:
    """``v``, or None (JSON null) where it is NaN or infinite: JSON has no NaN."""
    return float(v) if math.isfinite(v) else None


def _csv_number(v: float) -> str:
    """``v`` with 4 decimals, or an empty cell where it is not a number (no bootstrap, say)."""
    return f"{v:.4f}" if math.isfinite(v) else ""


def _ci_text(ci: tuple[float, float]) -> str:
    """A 95 % interval as ``[lo, hi]``, or a dash of the same width where there is none."""
    lo, hi = ci
    return f"[{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else f"{'-':^14}"


@dataclass(repr=False)
class FrocResult:
    """FROC numbers; sensitivities are fractions of the reference nodules (≥ min diameter). ``per_nodule``: one
    record per relevant nodule (scan, centre in DICOM patient coordinates (LPS) mm, diameter mm, best score or
    ``None``)."""

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
    reading: str = "interpolate"
    max_marks_per_scan: int | None = None
    #: per FP rate: (score threshold, sensitivity, FPs/scan) of the lowest threshold with at most that many FPs/scan
    thresholds: list[tuple[float, float, float]] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line, as a notebook echoes it: CPM (with its 95 % CI when bootstrapped), the sensitivity at each FP rate
        and the counts; :meth:`table` gives the table, :attr:`per_nodule` and the curve the detail."""
        ci = f" {_ci_text(self.cpm_ci)} (95% CI)" if self.n_bootstrap else ""
        sens = ", ".join(f"{v:.3f}" for v in self.sensitivity)
        rates = (
            f"{self.fp_rates[0]:g}..{self.fp_rates[-1]:g}" if len(self.fp_rates) > 1 else "".join(f"{r:g}" for r in self.fp_rates)
        )
        return (
            f"FrocResult(CPM {self.cpm:.3f}{ci}, sensitivity {sens} at {rates} FPs/scan, {self.n_scans} scans, "
            f"{self.n_nodules} nodules, {self.n_detected} detected, {self.n_candidates} candidates, "
            f"reading={self.reading!r}; .table() for the table)"
        )

    def table(self) -> str:
        """A plain-text table: FP/scan, sensitivity, 95 % CI; then CPM."""
        lines = [f"FPs/scan  sensitivity  95% CI          score threshold (reading: {self.reading})"]
        thr = self.thresholds or [(float("nan"), float("nan"), float("nan"))] * len(self.fp_rates)
        for r, s, ci, (t, _, _) in zip(self.fp_rates, self.sensitivity, self.sensitivity_ci, thr):
            lines.append(f"{r:8.3f}  {s:11.3f}  {_ci_text(ci)}  {t:.4g}")
        lines.append(f"CPM       {self.cpm:11.3f}  {_ci_text(self.cpm_ci)}".rstrip())
        if self.n_bootstrap == 0:
            lines.append("(no confidence intervals: bootstrap resampling was turned off, --bootstrap 0)")
        lines.append(
            f"({self.n_scans} scans, {self.n_nodules} nodules, {self.n_detected} detected, {self.n_candidates} candidates)"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": "LUNA16 FROC (hit = candidate centre within nodule radius; CPM = mean sensitivity at 1/8..8 FPs/scan)",
            "reading": self.reading,
            "reading_note": (
                "sensitivity read by linear interpolation of the FROC curve from (0, 0), as LUNA16's script"
                if self.reading == "interpolate"
                else "best operating point at or below each FP rate"
            ),
            "max_marks_per_scan": self.max_marks_per_scan,
            "fp_rates": list(self.fp_rates),
            "sensitivity": self.sensitivity,
            "sensitivity_ci95": [[_finite(v) for v in c] for c in self.sensitivity_ci],
            "cpm": self.cpm,
            "cpm_ci95": [_finite(v) for v in self.cpm_ci],
            "n_scans": self.n_scans,
            "n_nodules": self.n_nodules,
            "n_detected": self.n_detected,
            "n_candidates": self.n_candidates,
            "n_bootstrap": self.n_bootstrap,
            "curve": {"fps_per_scan": self.curve_fps, "sensitivity": self.curve_sensitivity},
            "operating_points": [
                {"fps_per_scan": r, "score_threshold": _finite(t), "sensitivity": s, "measured_fps_per_scan": f}
                for r, (t, s, f) in zip(self.fp_rates, self.thresholds)
            ],
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
        for r, s, ci in zip(self.fp_rates, self.sensitivity, self.sensitivity_ci):
            w.writerow([r, f"{s:.4f}", *(_csv_number(v) for v in ci)])
        w.writerow(["CPM", f"{self.cpm:.4f}", *(_csv_number(v) for v in self.cpm_ci)])
        atomic_write_bytes(paths["csv"], buf.getvalue().encode())
        atomic_write_bytes(paths["png"], self._png())
        return paths

    def _png(self) -> bytes:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 4.5), dpi=100)
        ax = fig.add_subplot(111)
        if self.reading == "step":
            ax.step(np.maximum(self.curve_fps, 1e-3), self.curve_sensitivity, where="post", label="FROC")
        else:  # the curve LUNA16 reads: straight lines between operating points
            ax.plot(np.maximum(self.curve_fps, 1e-3), self.curve_sensitivity, label="FROC")
        if self.n_bootstrap:
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
