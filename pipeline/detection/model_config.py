"""ctpipe's own model description (the demo model's JSON) and the common :class:`ModelConfig`.

A :class:`ModelConfig` carries everything inference needs and nothing is
hard-coded elsewhere: network architecture, model spacing (mm along RAS x, y, z),
intensity window, anchors (voxels), box-selector and sliding-window settings.
It is built either from ctpipe's JSON (``weights/demo_phantom_retinanet.json``)
or from a MONAI bundle's ``configs/inference.json`` (see :mod:`.bundle`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BundleError
from ..intensity import HUWindow
from .model_values import FORMS, OPTIONAL_SECTIONS, SECTIONS, checked, given, section, section_value, value_error

if TYPE_CHECKING:
    from ..load.spec import PreprocessSpec

log = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEMO_MODEL_JSON = WEIGHTS_DIR / "demo_phantom_retinanet.json"
FORMAT = "ctpipe-detector/1"
#: The keys of a model JSON that :func:`model_config_from_dict` reads into a :class:`ModelConfig`; the others
#: (training record, ``fp_reduction``, ``operating_point``...) are kept as its ``extra``.
MODEL_KEYS = frozenset(
    {
        "format",
        "name",
        "description",
        "spacing_mm_ras",
        "intensity_window",
        "network",
        "anchors",
        "box_selector",
        "sliding_window",
        "size_divisible",
        "lung_crop_margin_mm",
        "lung_filter_margin_mm",
        "weights",
    }
)


@dataclass(frozen=True)
class ModelConfig:
    """Inference settings of one detector model.

    spacing: model voxel size (mm) along RAS x, y, z.
    window: HU intensity window applied after resampling (MONAI's ``ScaleIntensityRange``).
    arch: network description for :func:`.network.build_network` (``None`` for TorchScript-only models).
    anchors: ``{"feature_map_scales": [...], "base_anchor_shapes": [[x, y, z], ...]}`` in voxels.
    selector: box-selector parameters (score_thresh, topk_candidates_per_level, nms_thresh, detections_per_img).
    sliding_window: ``{"roi_size": [x, y, z], "overlap": f, "mode": "constant"}``; inputs larger than
        ``roi_size`` on any axis go through the sliding-window inferer.
    weights: path of the state dict (``.pt``) or TorchScript file (``.ts``).
    """

    name: str
    spacing: tuple[float, float, float]
    window: HUWindow
    arch: Mapping[str, Any] | None
    anchors: Mapping[str, Any]
    selector: Mapping[str, Any]
    sliding_window: Mapping[str, Any]
    size_divisible: tuple[int, int, int]
    weights: Path | None
    source: str = "ctpipe"
    lung_crop_margin_mm: float = 10.0
    lung_filter_margin_mm: float = 8.0
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def roi_size(self) -> tuple[int, int, int]:
        r = self.sliding_window["roi_size"]
        return (int(r[0]), int(r[1]), int(r[2]))

    @property
    def overlap(self) -> float:
        return float(self.sliding_window.get("overlap", 0.25))

    def preprocess_spec(self, **options: Any) -> PreprocessSpec:
        """The loader's :class:`pipeline.load.PreprocessSpec` for this model (spacing, window, divisibility).

        ``options`` are passed on (e.g. ``roi=``); a loader built with it feeds :meth:`Detector.detect_loaded`.
        """
        from ..load.spec import PreprocessSpec

        values: dict[str, Any] = {"spacing": self.spacing, "size_divisible": self.size_divisible}
        values.update(options)
        return PreprocessSpec.from_window(self.window, **values)

    def to_json(self) -> dict[str, Any]:
        """The JSON form read by :func:`load_model_config` (weights stored as a file name)."""
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "spacing_mm_ras": list(self.spacing),
            "intensity_window": self.window.to_json(),
            "network": dict(self.arch or {}),
            "anchors": dict(self.anchors),
            "box_selector": dict(self.selector),
            "sliding_window": dict(self.sliding_window),
            "size_divisible": list(self.size_divisible),
            "lung_crop_margin_mm": self.lung_crop_margin_mm,
            "lung_filter_margin_mm": self.lung_filter_margin_mm,
            "weights": self.weights.name if self.weights else None,
            **dict(self.extra),
        }


def _need(data: Mapping[str, Any], key: str, where: Path, *, path: str | None = None) -> Any:
    """``data[key]``; else a :class:`BundleError` naming the entry missing by its key ``path`` (default ``key``)."""
    if key not in data:
        raise BundleError(
            f"model config has no {path or key!r} entry", where=where, fix="regenerate it with scripts/train_detector.py"
        )
    return data[key]


def model_config_from_dict(data: Mapping[str, Any], *, where: Path, weights_dir: Path | None = None) -> ModelConfig:
    """Validate and convert a ctpipe model JSON dict (see :meth:`ModelConfig.to_json`) read from the file ``where``:
    a value not of its key's form is a :class:`BundleError` naming the file, the key path, the value and the form
    (:mod:`.model_values`)."""

    def fix(what: str) -> str:
        return _model_json_fix(where, what)

    def value(key: str) -> Any:
        return checked(data, key, where=where, fix=fix)

    if data.get("format") != FORMAT:
        raise value_error("format", data.get("format"), f'"{FORMAT}"', f'"format": "{FORMAT}"', where=where, fix=fix)
    for key in ("spacing_mm_ras", "size_divisible", *SECTIONS):
        _need(data, key, where)
    sections = {key: section(data, key, where=where, fix=fix) for key in SECTIONS}
    for key in (
        "intensity_window.a_min",
        "intensity_window.a_max",
        "intensity_window.b_min",
        "intensity_window.b_max",
        "intensity_window.clip",
        "sliding_window.roi_size",
    ):
        head, _, rest = key.partition(".")
        _need(sections[head], rest, where, path=key)
    for key in OPTIONAL_SECTIONS:  # read as the detector starts: refused now, with the file's name
        if given(data, key) and section_value(data, key) not in (None, {}, []):
            section(data, key, where=where, fix=fix)
    # every value of the form its key takes (those left out take their defaults), read as the detector reads it
    for key in FORMS:
        if given(data, key):
            value(key)
    spacing = value("spacing_mm_ras")
    size_div = value("size_divisible")
    iw = sections["intensity_window"]
    window_values = [value(f"intensity_window.{k}") for k in ("a_min", "a_max", "b_min", "b_max")]
    if window_values[1] <= window_values[0]:
        raise value_error(
            "intensity_window.a_max", iw["a_max"], f"a number of HU above a_min ({iw['a_min']!r})", "300.0", where=where, fix=fix
        )
    a_min, a_max, b_min, b_max = window_values
    window = HUWindow(a_min, a_max, b_min, b_max, clip=value("intensity_window.clip"))
    weights_name = data.get("weights")
    weights = (weights_dir or where.parent) / weights_name if weights_name else None
    return ModelConfig(
        name=str(data.get("name", where.stem)),
        spacing=(spacing[0], spacing[1], spacing[2]),
        window=window,
        arch=sections["network"],
        anchors=sections["anchors"],
        selector=sections["box_selector"],
        sliding_window=sections["sliding_window"],
        size_divisible=(size_div[0], size_div[1], size_div[2]),
        weights=weights,
        source="ctpipe",
        lung_crop_margin_mm=value("lung_crop_margin_mm") if "lung_crop_margin_mm" in data else 10.0,
        lung_filter_margin_mm=value("lung_filter_margin_mm") if "lung_filter_margin_mm" in data else 8.0,
        description=str(data.get("description", "")),
        extra={k: v for k, v in data.items() if k not in MODEL_KEYS},
    )


def load_model_config(path: str | Path = DEMO_MODEL_JSON) -> ModelConfig:
    """Read a ctpipe model JSON (default: the embedded demo model)."""
    path = Path(path)
    if not path.is_file():
        raise BundleError(
            "model config file does not exist",
            where=path,
            fix="reinstall ctpipe (the demo model ships with it) or pass --bundle PATH",
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise BundleError(
            f"model config cannot be read ({exc.strerror or exc})",
            where=path,
            fix="check the file's permissions (it is read by the user running ctpipe)",
        ) from exc
    try:
        data = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError(
            f"model config is not valid JSON: byte {exc.start} is not UTF-8 text ({exc.object[exc.start : exc.start + 1]!r})",
            where=path,
            fix=_model_json_fix(path, f"{path.name} (a JSON object in UTF-8 text)"),
        ) from exc
    except json.JSONDecodeError as exc:
        raise BundleError(
            f"model config is not valid JSON ({exc})",
            where=path,
            fix=_model_json_fix(path, f"{path.name} at line {exc.lineno}, column {exc.colno}"),
        ) from exc
    if not isinstance(data, dict):
        raise BundleError(
            f"model config must hold a JSON object, got {type(data).__name__}",
            where=path,
            fix=_model_json_fix(path, f"{path.name} (a JSON object: {{...}})"),
        )
    return model_config_from_dict(data, where=path)


def _model_json_fix(path: Path, what: str) -> str:
    """The fix for a model JSON ``path`` that cannot be read as one: mend ``what`` (the file, where it went wrong), or
    get a good one from where it comes from (the demo model's from ctpipe's installation, another from its training)."""
    if path.resolve() == DEMO_MODEL_JSON.resolve():
        again = "or reinstall ctpipe, which ships the demo model's (scripts/train_demo.sh trains it again)"
    else:
        again = (
            f"or write it again: scripts/train_detector.py --out {path} regenerates a model JSON with its weights, or copy "
            "the model again from where it came; leave out --bundle for the embedded demo model"
        )
    return f"mend {what}, {again}"
