"""Operating points: the score threshold at which a detector reports findings, and where it came from.

Each model carries one threshold chosen on validation data, recorded with how it was chosen:

* ctpipe's own models (the demo model) hold an ``operating_point`` entry in their model JSON, written
  by ``scripts/calibrate_operating_point.py`` with the existing weights: the lowest score at which the
  two-stage pipeline makes at most ``fps_per_scan`` false positives per scan on the validation phantoms
  (LUNA16 counting, :func:`calibrate`; thick-slice series' scores mapped first, :mod:`.score_calibration`),
  with the sensitivity reached there, the seeds, the number format and the command. Its ``network_only``
  entry is the same for the RetinaNet's own scores (``postprocess=False``, ``ctpipe detect --raw``).
* MONAI bundles ship no operating point: ctpipe uses :data:`BUNDLE_SCORE_THRESHOLD` (see there why),
  overridden by ``detector.score_threshold``. ``ctpipe evaluate`` reports the score at each false-positive
  rate of the FROC (``froc.json``), the way to choose a threshold for a bundle on one's own validation scans.

:func:`resolve_threshold` applies the precedence: ``all_candidates`` (report every candidate) > an explicit
``score_threshold`` > the model's operating point. Scores are the detector's final scores (0..1).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BundleError
from .evaluate import Point, froc_curve, match_predictions, threshold_at
from .findings import Findings
from .model_config import ModelConfig

log = logging.getLogger(__name__)

#: Score threshold ctpipe uses for MONAI detection bundles (``lung_nodule_ct_detection``), which ship no
#: operating point and no validation scans. The bundle's classifier is trained with binary cross-entropy on
#: anchors drawn by a hard-negative sampler (64 per image, 30 % positive; ``train.json``), so its scores are
#: not the probability of a nodule at a location: 0.5 is the boundary that objective puts between a nodule and
#: the hardest background (vessels, wall), well above the box selector's 0.02 (which keeps up to 300 boxes
#: per scan, far beyond LUNA16's 1-8 false positives per scan), and where CAD systems' "probability ≥ 0.5"
#: convention sits. Set ``detector.score_threshold`` to the score ``ctpipe evaluate`` reports at the
#: false-positive rate wanted on one's own validation scans.
BUNDLE_SCORE_THRESHOLD = 0.5
BUNDLE_CHOSEN_ON = (
    "ctpipe default for MONAI detection bundles (the bundle ships no operating point): 0.5, the decision "
    "boundary of the bundle's classifier (BCE on hard-negative-sampled anchors, 30% positive); "
    "set detector.score_threshold to override"
)

SOURCE_ALL = "none: every candidate reported (all_candidates)"
#: The fix for a ctpipe model JSON's invalid operating-point entries
RECOMPUTE = "recompute it: python scripts/calibrate_operating_point.py"


@dataclass(frozen=True)
class OperatingPoint:
    """A score threshold (0..1) and how it was chosen.

    fps_per_scan: the false-positive rate it was chosen for (``None`` when not chosen by rate).
    sensitivity / measured_fps_per_scan: what the validation data gave at the threshold.
    details: the rest of the record (seeds, scans, nodules, number format, command).
    """

    score_threshold: float
    chosen_on: str
    fps_per_scan: float | None = None
    sensitivity: float | None = None
    measured_fps_per_scan: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str) -> OperatingPoint:
        """Validate a model JSON's ``operating_point`` (or its ``network_only``) entry."""
        try:
            t = float(data["score_threshold"])
            out = cls(
                score_threshold=t,
                chosen_on=str(data.get("chosen_on", "")),
                fps_per_scan=None if data.get("fps_per_scan") is None else float(data["fps_per_scan"]),
                sensitivity=None if data.get("sensitivity") is None else float(data["sensitivity"]),
                measured_fps_per_scan=None if data.get("measured_fps_per_scan") is None else float(data["measured_fps_per_scan"]),
                details={k: v for k, v in data.items() if k not in _FIELDS},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"invalid operating_point entry ({type(exc).__name__}: {exc})",
                where=where,
                fix=RECOMPUTE,
            ) from exc
        if not math.isfinite(t) or not 0.0 <= t <= 1.0:
            raise BundleError(
                f"operating_point score_threshold {t} is not in [0, 1]",
                where=where,
                fix=RECOMPUTE,
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "score_threshold": self.score_threshold,
            "chosen_on": self.chosen_on,
            "fps_per_scan": self.fps_per_scan,
            "sensitivity": self.sensitivity,
            "measured_fps_per_scan": self.measured_fps_per_scan,
            **dict(self.details),
        }

    def describe(self) -> str:
        """One line for logs and findings JSONs."""
        text = f"model operating point {self.score_threshold:.4g}"
        if self.fps_per_scan is not None:
            text += f" ({self.fps_per_scan:g} FP/scan"
            text += f", sensitivity {self.sensitivity:.3f})" if self.sensitivity is not None else ")"
        return f"{text}: {self.chosen_on}" if self.chosen_on else text


_FIELDS = {"score_threshold", "chosen_on", "fps_per_scan", "sensitivity", "measured_fps_per_scan"}


def model_operating_point(config: ModelConfig, *, postprocess: bool = True) -> OperatingPoint | None:
    """The operating point of the model ``config`` describes, for its default pipeline (``postprocess``) or for
    the network's own scores; ``None`` for a ctpipe model JSON that records none."""
    if config.source == "monai_bundle":
        return OperatingPoint(BUNDLE_SCORE_THRESHOLD, BUNDLE_CHOSEN_ON)
    entry = config.extra.get("operating_point")
    if not entry:
        return None
    where = f"{config.weights.parent if config.weights else config.name}: {config.name} operating_point"
    if not isinstance(entry, Mapping):
        raise BundleError(f"operating_point is a {type(entry).__name__}, not a mapping", where=where)
    if not postprocess:
        raw = entry.get("network_only")
        if not isinstance(raw, Mapping):
            return None
        return OperatingPoint.from_json(raw, where=where + ".network_only")
    return OperatingPoint.from_json(entry, where=where)


def check_score_threshold(value: Any, *, where: str = "detector.score_threshold", none: str = "null") -> float:
    """``value`` as a score threshold (a probability, 0..1); :class:`BundleError` naming ``where`` (the setting or the
    argument) otherwise, whose fix names ``none`` (how the caller says "the model's operating point")."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        t = float("nan")
    if not math.isfinite(t) or not 0.0 <= t <= 1.0:
        raise BundleError(
            f"score threshold {value!r} is not in [0, 1]",
            where=where,
            fix=f"pass a probability between 0 and 1, or {none} for the model's operating point",
        )
    return t


def resolve_threshold(
    config: ModelConfig, *, score_threshold: float | None = None, all_candidates: bool = False, postprocess: bool = True
) -> tuple[float | None, str]:
    """``(threshold, source)``: the score threshold findings are reported at (``None``: every candidate) and a
    description of where it came from (see the module docstring for the precedence)."""
    if all_candidates:
        return None, SOURCE_ALL
    if score_threshold is not None:
        t = check_score_threshold(score_threshold)
        return t, f"configured: {t:g} (detector.score_threshold)"
    op = model_operating_point(config, postprocess=postprocess)
    if op is None:
        log.warning(
            "model %s records no operating point%s: every candidate is reported",
            config.name,
            "" if postprocess else " for the network's own scores",
        )
        return (
            None,
            f"none: model {config.name} records no operating point{'' if postprocess else ' for --raw'}; every candidate reported",
        )
    return op.score_threshold, op.describe()


@dataclass(frozen=True)
class Calibration:
    """The result of :func:`calibrate`: the threshold, and what it gives on the calibration scans."""

    score_threshold: float
    fps_per_scan: float
    sensitivity: float
    measured_fps_per_scan: float
    n_scans: int
    n_nodules: int
    n_false_positives: int

    def to_json(self) -> dict[str, Any]:
        return {
            "score_threshold": self.score_threshold,
            "fps_per_scan": self.fps_per_scan,
            "sensitivity": round(self.sensitivity, 4),
            "measured_fps_per_scan": round(self.measured_fps_per_scan, 4),
            "n_scans": self.n_scans,
            "n_nodules": self.n_nodules,
            "n_false_positives": self.n_false_positives,
        }


def calibrate(
    predictions: Mapping[str, Findings | Sequence[tuple[Point, float]]],
    truth: Mapping[str, Sequence[tuple[Point, float]]],
    *,
    fps_per_scan: float = 1.0,
    scans: Iterable[str] | None = None,
    min_diameter_mm: float = 3.0,
) -> Calibration:
    """The lowest score threshold at which every candidate scoring at or above it makes at most ``fps_per_scan``
    false positives per scan over ``scans`` (default: all scans of both mappings), counted as LUNA16 counts them
    (:func:`.evaluate.match_predictions`: further hits on a found nodule and hits on irrelevant findings are no
    false positives; :func:`.evaluate.threshold_at` on the FROC curve). Findings are scored on their full candidate
    list. When even the highest-scoring candidate is a false positive beyond the budget, the threshold lies just
    above it (nothing reported).
    """
    froc = Froc.of(predictions, truth, scans=scans, min_diameter_mm=min_diameter_mm)
    t, s, f = froc.threshold_at(fps_per_scan)
    return Calibration(
        score_threshold=t,
        fps_per_scan=float(fps_per_scan),
        sensitivity=s,
        measured_fps_per_scan=f,
        n_scans=froc.n_scans,
        n_nodules=len(froc.tp_scores),
        n_false_positives=int(np.count_nonzero(froc.fp_scores >= t)),
    )


@dataclass(frozen=True)
class Froc:
    """The FROC curve of a set of predictions (:func:`.evaluate.froc_curve`, LUNA16 counting), with the best score
    of each nodule (``-inf``: missed) and the false positives' scores it was made from."""

    fps: np.ndarray
    sensitivity: np.ndarray
    thresholds: np.ndarray
    tp_scores: np.ndarray
    fp_scores: np.ndarray
    n_scans: int

    @classmethod
    def of(
        cls,
        predictions: Mapping[str, Findings | Sequence[tuple[Point, float]]],
        truth: Mapping[str, Sequence[tuple[Point, float]]],
        *,
        scans: Iterable[str] | None = None,
        min_diameter_mm: float = 3.0,
    ) -> Froc:
        """The curve of ``predictions`` against ``truth`` (as :func:`calibrate` takes them)."""
        m = match_predictions(predictions, truth, scans=scans, min_diameter_mm=min_diameter_mm)
        tp = np.concatenate([b for b, _ in m.per_scan])
        fp = np.concatenate([f for _, f in m.per_scan])
        fps, sens, thr = froc_curve(tp, fp, len(tp), m.n_scans)
        return cls(fps, sens, thr, tp, fp, m.n_scans)

    def threshold_at(self, fps_per_scan: float) -> tuple[float, float, float]:
        """``(score threshold, sensitivity, fps/scan)`` of the lowest threshold with at most ``fps_per_scan``
        false positives per scan (:func:`.evaluate.threshold_at`)."""
        return threshold_at(self.fps, self.sensitivity, self.thresholds, fps_per_scan)
