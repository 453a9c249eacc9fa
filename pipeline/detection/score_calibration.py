"""Score calibration for thick-slice series: one operating point for every slice thickness.

Slices thicker than :data:`pipeline.volume.THICK_SLICE_MM` (2.5 mm, LUNA16's limit) blur vessels seen end-on
into round blobs, so at the same score a thick-slice scan makes many more false positives than a thin-slice one.
A model JSON's ``operating_point.thick_slice_calibration`` entry (written by ``scripts/calibrate_operating_point.py``)
maps the final score of a thick-slice series onto the thin-slice scale: a thick-slice score
``s`` becomes the thin-slice score that gives the same number of false positives per scan on the validation
phantoms as ``s`` gives on the thick-slice ones (matched at the FROC rates, linear in between). The model's single
operating point then means the same false-positive rate on both, and FROC evaluation pools comparable scores.

:meth:`pipeline.detection.Detector.postprocess` applies it (the network's own scores, ``postprocess=False``, are
never mapped); the findings JSON names it in ``score_calibration``. Scores stay in 0..1 and keep their order within
a series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import BundleError
from .evaluate import FP_RATES, Point
from .findings import Findings
from .model_config import ModelConfig
from .operating_point import RECOMPUTE, Froc


@dataclass(frozen=True)
class ScoreCalibration:
    """A monotone piecewise-linear map of final scores (0..1) of series whose slices are thicker than
    ``min_slice_thickness_mm`` (mm) onto the thin-slice score scale.

    knots: ``(thick-slice score, thin-slice score)`` pairs, the first ``(0, 0)``, the last ``(1, 1)``, the first
        coordinates increasing and the second never decreasing.
    chosen_on / details: how the knots were chosen (validation seeds, scans, rates, command).
    """

    min_slice_thickness_mm: float
    knots: tuple[tuple[float, float], ...]
    chosen_on: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        xs, ys = self._xy()
        if not (math.isfinite(self.min_slice_thickness_mm) and self.min_slice_thickness_mm > 0):
            raise ValueError(f"min_slice_thickness_mm {self.min_slice_thickness_mm!r} is not a positive length in mm")
        if len(xs) < 2 or (xs[0], ys[0]) != (0.0, 0.0) or (xs[-1], ys[-1]) != (1.0, 1.0):
            raise ValueError(f"knots {list(self.knots)} do not run from (0, 0) to (1, 1)")
        if np.any(np.diff(xs) <= 0) or np.any(np.diff(ys) < 0):
            raise ValueError(
                f"knots {list(self.knots)} are not increasing (thick-slice scores) and non-decreasing (thin-slice scores)"
            )

    def _xy(self) -> tuple[np.ndarray, np.ndarray]:
        arr = np.asarray(self.knots, dtype=np.float64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def applies_to(self, slice_thickness_mm: float) -> bool:
        """Whether a series with slices ``slice_thickness_mm`` thick (mm) has its scores mapped."""
        return float(slice_thickness_mm) > self.min_slice_thickness_mm

    def __call__(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
        """The thin-slice-scale scores (float64, 0..1) of thick-slice ``scores``."""
        xs, ys = self._xy()
        return np.interp(np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0), xs, ys)

    def apply(self, findings: Findings, slice_thickness_mm: float) -> Findings:
        """``findings`` of a series with slices ``slice_thickness_mm`` thick (mm): when :meth:`applies_to` it, every
        candidate's score mapped (highest first) and :attr:`Findings.score_calibration` set; else as they are."""
        every = findings.candidates
        if not self.applies_to(slice_thickness_mm) or not every:
            return findings
        scores = self([f.score for f in every])
        mapped = sorted((replace(f, score=float(s)) for f, s in zip(every, scores)), key=lambda f: -f.score)
        return replace(findings.with_candidates(mapped), score_calibration=self.describe(slice_thickness_mm))

    def describe(self, slice_thickness_mm: float) -> str:
        """One line for the findings JSON and logs."""
        text = (
            f"{slice_thickness_mm:.3g} mm slices (> {self.min_slice_thickness_mm:g} mm): scores mapped onto the thin-slice "
            "scale at equal false positives per scan"
        )
        return f"{text} ({self.chosen_on})" if self.chosen_on else text

    def to_json(self) -> dict[str, Any]:
        return {
            "min_slice_thickness_mm": self.min_slice_thickness_mm,
            "knots": [[round(x, 6), round(y, 6)] for x, y in self.knots],
            "chosen_on": self.chosen_on,
            **dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str) -> ScoreCalibration:
        """Validate a model JSON's ``thick_slice_calibration`` entry."""
        try:
            knots = tuple((float(x), float(y)) for x, y in data["knots"])
            return cls(
                min_slice_thickness_mm=float(data["min_slice_thickness_mm"]),
                knots=knots,
                chosen_on=str(data.get("chosen_on", "")),
                details={k: v for k, v in data.items() if k not in ("min_slice_thickness_mm", "knots", "chosen_on")},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"invalid thick_slice_calibration entry ({type(exc).__name__}: {exc})", where=where, fix=RECOMPUTE
            ) from exc


def model_score_calibration(config: ModelConfig) -> ScoreCalibration | None:
    """The thick-slice score calibration of the model ``config`` describes (its ``operating_point`` entry's
    ``thick_slice_calibration``); ``None`` for MONAI bundles and models that record none."""
    entry = config.extra.get("operating_point")
    if config.source == "monai_bundle" or not isinstance(entry, Mapping):
        return None
    cal = entry.get("thick_slice_calibration")
    if cal is None:
        return None
    where = f"{config.weights.parent if config.weights else config.name}: {config.name} operating_point.thick_slice_calibration"
    if not isinstance(cal, Mapping):
        raise BundleError(f"thick_slice_calibration is a {type(cal).__name__}, not a mapping", where=where, fix=RECOMPUTE)
    return ScoreCalibration.from_json(cal, where=where)


Predictions = Mapping[str, Findings | Sequence[tuple[Point, float]]]
Truth = Mapping[str, Sequence[tuple[Point, float]]]


def fit_knots(
    thin: tuple[Predictions, Truth],
    thick: tuple[Predictions, Truth],
    *,
    fp_rates: Sequence[float] = FP_RATES,
    min_diameter_mm: float = 3.0,
) -> tuple[tuple[float, float], ...]:
    """Knots for :class:`ScoreCalibration`: at each false-positive rate of ``fp_rates`` (per scan), the lowest
    score with at most that rate on the thick-slice scans ``thick`` (predictions scored on all their candidates,
    truth) paired with the same on the thin-slice scans ``thin`` (:class:`.operating_point.Froc`, LUNA16
    counting, as :func:`.operating_point.calibrate` chooses an operating point); pairs that would break
    monotonicity are dropped, (0, 0) and (1, 1) added."""
    curves = [Froc.of(p, t, min_diameter_mm=min_diameter_mm) for p, t in (thick, thin)]
    pairs = [tuple(c.threshold_at(rate)[0] for c in curves) for rate in sorted(fp_rates, reverse=True)]
    knots = [(0.0, 0.0)]
    for x, y in pairs:
        if knots[-1][0] < x < 1.0 and knots[-1][1] <= y < 1.0:
            knots.append((x, y))
    knots.append((1.0, 1.0))
    return tuple(knots)
