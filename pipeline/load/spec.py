"""The preprocessing a model expects: target spacing, HU window, orientation, divisibility, crop.

A :class:`PreprocessSpec` is built from the model's configuration (plain keyword
arguments, :meth:`PreprocessSpec.from_window` for an :class:`~pipeline.intensity.HUWindow`,
or a MONAI bundle config via :meth:`PreprocessSpec.from_bundle_config`); the loaders
never hard-code these values.

Axis order: every per-axis value (``spacing``, ``size_divisible``) is given in the
model input's axis order ``(x, y, z)``, i.e. MONAI's channel-first ``(C, x, y, z)``
after ``Orientationd(axcodes="RAS")``. For an axial CT series this is
(column, row, slice) re-oriented so that x runs to the patient's Right,
y to Anterior and z to Superior.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..bundle import BundleConfig
from ..errors import BundleError, ConfigError
from ..intensity import HUWindow

__all__ = ["PreprocessSpec", "Roi", "BUNDLE_LUNG_NODULE"]


def _triple(value: Any, name: str, *, allow_none: bool = False, positive: bool = True) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value, value, value)
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(f"{name} must be 3 numbers (x, y, z), got {value!r}", where=name) from None
    if len(items) != 3:
        raise ConfigError(f"{name} must have 3 values (x, y, z), got {len(items)}: {value!r}", where=name)
    out: list[float | None] = []
    for v in items:
        if v is None and allow_none:
            out.append(None)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} holds a non-number {v!r}", where=name) from None
        if not math.isfinite(f) or (positive and f <= 0):
            raise ConfigError(f"{name} values must be finite{' and > 0' if positive else ''}, got {v!r}", where=name)
        out.append(f)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Roi:
    """A region of interest to crop the model input to (e.g. the lungs' bounding box).

    ``lo``/``hi`` are two opposite corners, in LPS mm (``space="lps"``) or in source
    voxel indices (i, j, k) of the cached array (``space="index"``). The box is
    grown by ``margin_mm`` on every side, clipped to the image, and then grown
    further to the spec's size divisibility using real image voxels where there are
    any (constant padding only beyond the image).
    """

    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    space: Literal["lps", "index"] = "lps"
    margin_mm: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lo", _triple(self.lo, "roi.lo", positive=False))
        object.__setattr__(self, "hi", _triple(self.hi, "roi.hi", positive=False))
        if self.space not in ("lps", "index"):
            raise ConfigError(f"roi.space must be 'lps' or 'index', got {self.space!r}", where="roi.space")
        if not math.isfinite(self.margin_mm) or self.margin_mm < 0:
            raise ConfigError(f"roi.margin_mm must be >= 0, got {self.margin_mm!r}", where="roi.margin_mm")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Roi:
        """Build from ``{"lo": [...], "hi": [...], "space": "lps", "margin_mm": 10}``."""
        try:
            return cls(lo=data["lo"], hi=data["hi"], space=data.get("space", "lps"), margin_mm=float(data.get("margin_mm", 0.0)))
        except KeyError as exc:
            raise ConfigError(f"ROI needs 'lo' and 'hi', missing {exc}", where="roi") from None

    def to_json(self) -> dict[str, Any]:
        return {"lo": list(self.lo), "hi": list(self.hi), "space": self.space, "margin_mm": self.margin_mm}


@dataclass(frozen=True, kw_only=True)
class PreprocessSpec:
    """What the model needs its input to look like. Validated on construction.

    Attributes
    ----------
    spacing: output voxel size in mm along the model axes (x, y, z) (RAS); ``None``
        on an axis keeps the source spacing. MONAI bundle: (0.703125, 0.703125, 1.25).
    intensity_window: ``(a_min, a_max)`` in HU mapped linearly to ``output_range``
        (as MONAI's ``ScaleIntensityRange``). Bundle: (-1024, 300).
    output_range: ``(b_min, b_max)``; bundle: (0, 1).
    clip: clamp the scaled values to ``output_range`` (bundle: True). These three
        are validated, and read back together, as one :class:`~pipeline.intensity.HUWindow`
        (:attr:`window`).
    size_divisible: each output size along (x, y, z) is padded up to a multiple of
        these (bundle network: (16, 16, 8)); 1 means no padding.
    pad_method: ``"symmetric"`` (MONAI ``DivisiblePad`` default; extra voxel at the
        end) or ``"end"``.
    pad_value: value of padded voxels, in output units (after windowing).
    orientation: axis codes of the model input; only ``"RAS"`` (MONAI's) is supported.
    roi: optional fixed crop box for every case (per-case boxes go to ``load(..., rois=)``).
    roi_key: optional key in the cache sidecar's ``extra`` holding a per-case ROI as
        JSON (see :meth:`Roi.from_json`), used when no explicit ROI is given.
    """

    spacing: tuple[float | None, float | None, float | None] = (0.703125, 0.703125, 1.25)
    intensity_window: tuple[float, float] = (-1024.0, 300.0)
    output_range: tuple[float, float] = (0.0, 1.0)
    clip: bool = True
    size_divisible: tuple[int, int, int] = (1, 1, 1)
    pad_method: Literal["symmetric", "end"] = "symmetric"
    pad_value: float = 0.0
    orientation: str = "RAS"
    roi: Roi | None = None
    roi_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "spacing", _triple(self.spacing, "spacing", allow_none=True))
        win, rng = tuple(self.intensity_window), tuple(self.output_range)
        if len(win) != 2:
            raise ConfigError(
                f"intensity_window must be (a_min, a_max) with a_min < a_max HU, got {self.intensity_window!r}",
                where="intensity_window",
            )
        if len(rng) != 2:
            raise ConfigError(
                f"output_range must be 2 finite numbers (b_min, b_max), got {self.output_range!r}", where="output_range"
            )
        window = HUWindow(win[0], win[1], rng[0], rng[1], self.clip)  # validates
        div = self.size_divisible
        if isinstance(div, int):
            div = (div, div, div)
        div_t = tuple(int(d) for d in div)
        if len(div_t) != 3 or min(div_t) < 1 or any(float(a) != float(b) for a, b in zip(div_t, div)):
            raise ConfigError(
                f"size_divisible must be 3 positive integers (x, y, z), got {self.size_divisible!r}", where="size_divisible"
            )
        if self.pad_method not in ("symmetric", "end"):
            raise ConfigError(f"pad_method must be 'symmetric' or 'end', got {self.pad_method!r}", where="pad_method")
        if not math.isfinite(float(self.pad_value)):
            raise ConfigError(f"pad_value must be finite, got {self.pad_value!r}", where="pad_value")
        if str(self.orientation).upper() != "RAS":
            raise ConfigError(
                f"orientation {self.orientation!r} is not supported",
                where="orientation",
                fix="use 'RAS' (MONAI's Orientationd(axcodes='RAS'), which the detector bundle expects)",
            )
        if self.roi is not None and not isinstance(self.roi, Roi):
            object.__setattr__(self, "roi", Roi.from_json(self.roi))
        object.__setattr__(self, "intensity_window", window.hu_range)
        object.__setattr__(self, "output_range", window.output_range)
        object.__setattr__(self, "clip", window.clip)
        object.__setattr__(self, "size_divisible", div_t)
        object.__setattr__(self, "pad_value", float(self.pad_value))
        object.__setattr__(self, "orientation", "RAS")

    # -- intensity ---------------------------------------------------------------------
    @property
    def window(self) -> HUWindow:
        """``intensity_window``, ``output_range`` and ``clip`` as one :class:`~pipeline.intensity.HUWindow`."""
        (a0, a1), (b0, b1) = self.intensity_window, self.output_range
        return HUWindow(a0, a1, b0, b1, self.clip)

    @classmethod
    def from_window(cls, window: HUWindow, **fields: Any) -> PreprocessSpec:
        """A spec whose intensity settings are ``window``; other fields by keyword (these win over ``window``)."""
        values: dict[str, Any] = {"intensity_window": window.hu_range, "output_range": window.output_range, "clip": window.clip}
        values.update(fields)
        return cls(**values)

    def scale_params(self) -> tuple[float, float, float, float]:
        """``(a_min, a_range, b_min, b_range)`` of ``(hu - a_min) / a_range * b_range + b_min``."""
        return self.window.scale_params()

    def replace(self, **changes: Any) -> PreprocessSpec:
        """A copy with some fields replaced (validated again)."""
        values = {k: getattr(self, k) for k in self.__dataclass_fields__ if not k.startswith("_")}
        values.update(changes)
        return PreprocessSpec(**values)

    def to_json(self) -> dict[str, Any]:
        return {
            "spacing": list(self.spacing),
            "intensity_window": list(self.intensity_window),
            "output_range": list(self.output_range),
            "clip": self.clip,
            "size_divisible": list(self.size_divisible),
            "pad_method": self.pad_method,
            "pad_value": self.pad_value,
            "orientation": self.orientation,
            "roi": self.roi.to_json() if self.roi else None,
            "roi_key": self.roi_key,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreprocessSpec:
        known = {k for k in cls.__dataclass_fields__ if not k.startswith("_")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown preprocessing keys {unknown}", where="preprocess", fix=f"use only {sorted(known)}")
        values = dict(data)
        if values.get("roi") is not None:
            values["roi"] = Roi.from_json(values["roi"])
        return cls(**values)

    # -- MONAI bundle --------------------------------------------------------------------
    @classmethod
    def from_bundle_config(cls, config: Mapping[str, Any] | str | Path, **overrides: Any) -> PreprocessSpec:
        """Read spacing, window, clip and size divisibility from a MONAI bundle config.

        ``config`` is the parsed ``configs/inference.json`` (a dict) or its path, or a
        bundle folder; it is read by :class:`pipeline.bundle.BundleConfig` without running
        any expression (``"@key"`` references are followed). The values come from the
        preprocessing chain's ``Orientationd`` (RAS only), ``Spacingd`` and
        ``ScaleIntensityRanged``, and ``size_divisible`` from the network's setting or
        ``DivisiblePadd``. ``overrides`` replace fields afterwards (e.g. ``roi_key=...``).
        Problems raise :class:`ConfigError` naming the file and the key.
        """
        try:
            bundle = BundleConfig.read(config) if isinstance(config, (str, Path)) else BundleConfig(config)
            bundle.require_ras()
            spacing, window, size_divisible = bundle.spacing(), bundle.hu_window(), bundle.size_divisible()
        except BundleError as exc:
            raise ConfigError(exc.problem, where=exc.where, fix=exc.fix) from exc
        missing = [name for name, value in (("pixdim", spacing), ("window", window)) if value is None]
        if spacing is None or window is None:
            raise ConfigError(
                f"no {' / '.join(missing)} found (looked for Spacingd and ScaleIntensityRanged)",
                where=bundle.where,
                fix="pass the inference config of the detection bundle, or build PreprocessSpec(...) by hand",
            )
        values: dict[str, Any] = {"spacing": spacing}
        if size_divisible is not None:
            values["size_divisible"] = size_divisible
        values.update(overrides)
        return cls.from_window(window, **values)


#: The MONAI ``lung_nodule_ct_detection`` bundle's preprocessing (Orientation RAS →
#: Spacing 0.703125 × 0.703125 × 1.25 mm → ScaleIntensityRange -1024..300 → 0..1, clip)
#: and its network's size divisibility (16, 16, 8).
BUNDLE_LUNG_NODULE = PreprocessSpec.from_window(
    HUWindow(-1024.0, 300.0, 0.0, 1.0, clip=True),
    spacing=(0.703125, 0.703125, 1.25),
    size_divisible=(16, 16, 8),
)


def normalise_rois(rois: Mapping[str, Roi | Mapping[str, Any]] | None) -> dict[str, Roi]:
    """Per-case ROIs as :class:`Roi` objects (JSON dicts accepted)."""
    out: dict[str, Roi] = {}
    for case_id, roi in (rois or {}).items():
        out[case_id] = roi if isinstance(roi, Roi) else Roi.from_json(roi)
    return out
