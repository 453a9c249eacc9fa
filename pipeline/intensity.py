"""Hounsfield units shared by the package: tissue levels and thresholds, and the HU window of a model input.

The constants below are the HU levels and thresholds that more than one step uses (lung
segmentation, the detector's lung region, airway growth, measurements); each is defined here
once. A threshold with another meaning keeps its own name where it is used (e.g. the lung
boundary half-way between the parenchyma and soft tissue, which depends on the scan).

:class:`HUWindow` maps Hounsfield units ``a_min..a_max`` linearly to model units
``b_min..b_max`` (e.g. -1024..300 HU → 0..1), clamped to the output range when
``clip`` is set. The loader's :class:`pipeline.load.PreprocessSpec`, the detector's
model settings and the bundle reader (:mod:`pipeline.bundle`) all use it.

:func:`not_hu_hint` says when a volume's values cannot be Hounsfield units (stored pixel values
before the rescale, or intensities normalised to 0..1); detection and reconstruction add it to
their "no lungs" messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "AIR_HU",
    "BODY_HU",
    "EMPHYSEMA_HU",
    "HUWindow",
    "LUNG_AIR_HU",
    "LUNG_PARENCHYMA_HU",
    "SOFT_TISSUE_HU",
    "not_hu_hint",
]

AIR_HU = -1000.0
"""Air, by the definition of the Hounsfield scale (HU): the level of calibrated air outside the patient
and of pure gas inside it (trachea, stomach and bowel gas)."""

LUNG_AIR_HU = -500.0
"""Air-filled vs soft tissue (HU): a voxel darker than this is air or aerated lung (parenchyma about
-900..-700 HU, airways and gas about -1000 HU); soft tissue, fluid, vessels and dense (collapsed or
consolidated) lung are brighter. The threshold of every "air inside the patient" mask: lung air,
airway growth's highest level, the detector's quick lung region."""

LUNG_PARENCHYMA_HU = -850.0
"""Typical level (HU) of normally aerated lung parenchyma, used where a scan's own level cannot be
measured (no lung interior)."""

BODY_HU = -500.0
"""The patient vs the air around it (HU): the body outline is what is brighter than this (skin, fat
at about -100 HU and everything inside). Not a lung threshold, though it has the same value today."""

SOFT_TISSUE_HU = 40.0
"""Typical level (HU) of soft tissue (muscle, airway wall, mediastinum): the far side of the
partial-volume boundaries between air-filled structures and tissue."""

EMPHYSEMA_HU = -950.0
"""Low-attenuation lung (HU): the emphysema index is the share of lung voxels below this (LAA-950)."""


def not_hu_hint(values: np.ndarray) -> str:
    """A note (starting with a space, in parentheses) for voxel values that cannot be Hounsfield units, else ``""``.

    ``values`` is a volume's array ``[k, j, i]``; a few slices (every ``k // 16``-th) are looked at. A CT in HU
    has air (-1000 HU) around and inside the patient and fat (-100 HU), so nothing below 0 means the values are
    stored pixel values before RescaleSlope/RescaleIntercept, or intensities normalised to 0..1 (when none
    is above 1). Used where a step found no lungs, to say why.
    """
    import numpy as np

    arr = np.asarray(values)
    if arr.size == 0:
        return ""
    sample = arr[:: max(1, arr.shape[0] // 16)] if arr.ndim else arr
    low, high = float(np.nanmin(sample)), float(np.nanmax(sample))
    if not low >= 0.0:  # negative (HU has air and fat below 0) or NaN
        return ""
    if high <= 1.0:
        return (
            f" (its values lie in {low:.3g}..{high:.3g}: normalised intensities, not HU; pass the volume in HU "
            "(air -1000, water 0) as load_series returns it, before any normalisation)"
        )
    return (
        f" (its lowest value is {low:.0f}: no air or fat, the values look like stored pixel values, not HU; "
        "apply RescaleSlope/RescaleIntercept, as load_series does)"
    )


_FIELDS = ("a_min", "a_max", "b_min", "b_max", "clip")


def _number(value: Any, name: str, where: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}", where=where) from None
    if not math.isfinite(out):
        raise ConfigError(f"{name} must be finite, got {value!r}", where=where)
    return out


@dataclass(frozen=True)
class HUWindow:
    """``(hu - a_min) / (a_max - a_min) * (b_max - b_min) + b_min``, clamped to ``b_min..b_max`` when ``clip``.

    ``a_min < a_max`` in HU; ``b_min``, ``b_max`` in model input units (any finite pair).
    Defaults: the lung-nodule detector's -1024..300 HU → 0..1, clipped. Validated on
    construction (:class:`ConfigError` naming the bad value).
    """

    a_min: float = -1024.0
    a_max: float = 300.0
    b_min: float = 0.0
    b_max: float = 1.0
    clip: bool = True

    def __post_init__(self) -> None:
        a0 = _number(self.a_min, "intensity_window a_min (HU)", "intensity_window")
        a1 = _number(self.a_max, "intensity_window a_max (HU)", "intensity_window")
        if a1 <= a0:
            raise ConfigError(
                f"intensity_window must be (a_min, a_max) with a_min < a_max HU, got ({self.a_min!r}, {self.a_max!r})",
                where="intensity_window",
            )
        b0 = _number(self.b_min, "output_range b_min", "output_range")
        b1 = _number(self.b_max, "output_range b_max", "output_range")
        object.__setattr__(self, "a_min", a0)
        object.__setattr__(self, "a_max", a1)
        object.__setattr__(self, "b_min", b0)
        object.__setattr__(self, "b_max", b1)
        object.__setattr__(self, "clip", bool(self.clip))

    @property
    def hu_range(self) -> tuple[float, float]:
        """``(a_min, a_max)`` in HU."""
        return self.a_min, self.a_max

    @property
    def output_range(self) -> tuple[float, float]:
        """``(b_min, b_max)`` in model input units."""
        return self.b_min, self.b_max

    def scale_params(self) -> tuple[float, float, float, float]:
        """``(a_min, a_range, b_min, b_range)`` of ``(hu - a_min) / a_range * b_range + b_min``."""
        return self.a_min, self.a_max - self.a_min, self.b_min, self.b_max - self.b_min

    def to_json(self) -> dict[str, Any]:
        """``{"a_min": ..., "a_max": ..., "b_min": ..., "b_max": ..., "clip": ...}`` (MONAI's argument names)."""
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HUWindow:
        """Inverse of :meth:`to_json`; all five keys are required."""
        missing = [name for name in _FIELDS if name not in data]
        if missing:
            raise ConfigError(
                f"intensity window has no {', '.join(missing)}", where="intensity_window", fix=f"give all of {', '.join(_FIELDS)}"
            )
        return cls(data["a_min"], data["a_max"], data["b_min"], data["b_max"], bool(data["clip"]))
