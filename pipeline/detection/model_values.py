"""The values of a ctpipe model JSON (:mod:`.model_config`), each checked with its key path.

A value that is not of its key's form is a :class:`~pipeline.errors.BundleError` naming the file, the key path
(``sliding_window.roi_size``), the value and the form allowed, with an example (``three positive integers in
voxels, e.g. [192, 192, 160]``) and where to get a good file, as the model JSON's other errors give it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import BundleError

#: A form a value may take: (check returning the value as read, or None when it is not of the form; its words; an example)
Form = tuple[Callable[[Any], Any], str, str]


def _number(value: Any) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool, not a string); else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is a whole JSON number (``4`` or ``4.0``); else None."""
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def number_in(lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False) -> Callable[[Any], Any]:
    """A check of a number in ``lo..hi`` (an end left out when ``lo_open``/``hi_open``)."""

    def check(value: Any) -> float | None:
        x = _number(value)
        if x is None or x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi):
            return None
        return x

    return check


def integer_at_least(lo: int) -> Callable[[Any], Any]:
    """A check of a whole number of at least ``lo``."""

    def check(value: Any) -> int | None:
        x = _integer(value)
        return x if x is not None and x >= lo else None

    return check


def list_of(item: Callable[[Any], Any], n: int | None = None) -> Callable[[Any], Any]:
    """A check of a JSON list (of ``n`` items where given; at least one) whose every item passes ``item``."""

    def check(value: Any) -> list[Any] | None:
        if not isinstance(value, (list, tuple)) or not value or (n is not None and len(value) != n):
            return None
        items = [item(v) for v in value]
        return None if any(v is None for v in items) else items

    return check


def one_of(*choices: Any) -> Callable[[Any], Any]:
    """A check of one of ``choices``."""
    return lambda value: value if isinstance(value, str) and value in choices else None


def text(value: Any) -> str | None:
    """A check of a JSON string."""
    return value if isinstance(value, str) else None


def flag(value: Any) -> bool | None:
    """A check of ``true`` or ``false``."""
    return value if isinstance(value, bool) else None


POSITIVE = number_in(0.0, lo_open=True)
MARGIN_MM: Form = (number_in(0.0), "a number of mm, 0 or more", "10.0")
THREE_MM: Form = (list_of(POSITIVE, 3), "three positive numbers in mm (x, y, z)", "[1.0, 1.0, 1.25]")
THREE_VOXELS: Form = (list_of(integer_at_least(1), 3), "three positive integers in voxels (x, y, z)", "[192, 192, 160]")
PROBABILITY: Form = (number_in(0.0, 1.0), "a number from 0 to 1", "0.22")
COUNT: Form = (integer_at_least(1), "a positive integer", "300")
HU: Form = (number_in(-math.inf), "a number of HU", "-1024.0")

#: The form of each value of a model JSON that :func:`checked` reads, by key path; a key path not here takes any value
FORMS: dict[str, Form] = {
    "name": (text, "a string", '"my_detector"'),
    "description": (text, "a string", '"RetinaNet trained on ..."'),
    "spacing_mm_ras": THREE_MM,
    "size_divisible": THREE_VOXELS,
    "intensity_window.a_min": HU,
    "intensity_window.a_max": (HU[0], "a number of HU above a_min", "300.0"),
    "intensity_window.b_min": (number_in(-math.inf), "a number (model input units)", "0.0"),
    "intensity_window.b_max": (number_in(-math.inf), "a number (model input units)", "1.0"),
    "intensity_window.clip": (flag, "true or false", "true"),
    "anchors.feature_map_scales": (list_of(integer_at_least(1)), "a list of positive integers", "[1, 2, 4]"),
    "anchors.base_anchor_shapes": (
        list_of(list_of(POSITIVE, 3)),
        "a list of anchor sizes, each three positive numbers in voxels (x, y, z)",
        "[[4, 4, 3], [6, 6, 5], [10, 10, 8]]",
    ),
    "box_selector.score_thresh": PROBABILITY,
    "box_selector.nms_thresh": PROBABILITY,
    "box_selector.topk_candidates_per_level": COUNT,
    "box_selector.detections_per_img": COUNT,
    "sliding_window.roi_size": THREE_VOXELS,
    "sliding_window.overlap": (number_in(0.0, 1.0, hi_open=True), "a number from 0 to under 1", "0.25"),
    "sliding_window.mode": (one_of("constant", "gaussian"), '"constant" or "gaussian"', '"constant"'),
    "sliding_window.sw_batch_size": (integer_at_least(1), "a positive integer", "1"),
    "lung_crop_margin_mm": MARGIN_MM,
    "lung_filter_margin_mm": (MARGIN_MM[0], MARGIN_MM[1], "8.0"),
    "weights": (lambda v: v if isinstance(v, str) and v.strip() else None, "a file name or null", '"model.pt"'),
}

#: How many views of each patch the false-positive reducer may average (the keys of
#: :data:`pipeline.detection.fp_classifier.FLIP_VIEWS`, which imports torch)
FLIP_VIEW_COUNTS = (1, 4, 8)
OPTIONAL_MM: Form = (POSITIVE, "a positive number of mm or null", "2.5")
FPS: Form = (number_in(0.0), "a number of false positives per scan, 0 or more, or null", "1.0")

FORMS.update(
    {
        "fp_reduction.weights": (lambda v: v if isinstance(v, str) and v.strip() else None, "a file name", '"fpr.pt"'),
        "fp_reduction.patch": (
            lambda v: v if (x := _integer(v)) is not None and x > 0 and x % 8 == 0 else None,
            "a positive multiple of 8 (voxels)",
            "24",
        ),
        "fp_reduction.spacing_mm": (POSITIVE, "a positive number of mm", "1.0"),
        "fp_reduction.channels": (list_of(integer_at_least(1), 3), "three positive integers", "[8, 16, 32]"),
        "fp_reduction.hidden": (integer_at_least(1), "a positive integer", "64"),
        "fp_reduction.blob_candidates": (integer_at_least(0), "an integer, 0 or more", "200"),
        "fp_reduction.detector_weight": (number_in(0.0, 1.0), "a number from 0 to 1", "0.5"),
        "fp_reduction.duplicate_radius_factor": (POSITIVE, "a positive number", "2.0"),
        "fp_reduction.context_spacing_mm": OPTIONAL_MM,
        "fp_reduction.flip_views": (
            lambda v: v if _integer(v) in FLIP_VIEW_COUNTS else None,
            f"one of {', '.join(map(str, FLIP_VIEW_COUNTS))}",
            "4",
        ),
        "fp_reduction.flip_min_probability": (number_in(0.0, 1.0, hi_open=True), "a number from 0 to under 1", "0.02"),
        "fp_reduction.box_merge": (flag, "true or false", "true"),
        "fp_reduction.blob_support": (flag, "true or false", "false"),
        "fp_reduction.members": (integer_at_least(1), "a positive integer", "1"),
        "operating_point.score_threshold": (number_in(0.0, 1.0), "a score from 0 to 1", "0.4"),
        "operating_point.fps_per_scan": FPS,
        "operating_point.sensitivity": (number_in(0.0, 1.0), "a number from 0 to 1 or null", "0.76"),
        "operating_point.network_only.score_threshold": (number_in(0.0, 1.0), "a score from 0 to 1", "0.97"),
        "operating_point.thick_slice_calibration.min_slice_thickness_mm": (POSITIVE, "a positive number of mm", "2.5"),
    }
)

#: The key paths of :data:`FORMS` whose value may also be null (not set), as their words say ("... or null"): a form's
#: check gives None for a value not of it, so a null is let through here rather than by the check (:func:`of_form`)
NULLABLE = frozenset(
    {"weights", "fp_reduction.context_spacing_mm", "operating_point.fps_per_scan", "operating_point.sensitivity"}
)

#: The sections of a model JSON that are JSON objects
SECTIONS = ("intensity_window", "network", "anchors", "box_selector", "sliding_window")
#: The sections of a model JSON that may be left out, JSON objects where given (read by the detector as it starts)
OPTIONAL_SECTIONS = ("fp_reduction", "operating_point", "operating_point.network_only", "operating_point.thick_slice_calibration")


def given(data: Mapping[str, Any], key: str) -> bool:
    """Whether the model JSON ``data`` holds the key path ``key`` (each section on the way a JSON object)."""
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


def checked(data: Mapping[str, Any], key: str, *, where: Path, fix: Callable[[str], str]) -> Any:
    """The value at ``key`` (a key path: ``sliding_window.roi_size``) of the model JSON ``data`` (read from ``where``),
    as its form reads it (:data:`FORMS`: floats, ints, lists); a :class:`BundleError` naming the file, the key path,
    the value and the form when it is not of it. ``fix(what)``: the fix of a file whose ``what`` is to be mended."""
    value = section_value(data, key)
    form = FORMS.get(key)
    if form is None:
        return value
    ok, out = of_form(key, value)
    if not ok:
        raise value_error(key, value, form[1], form[2], where=where, fix=fix)
    return out


def of_form(key: str, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` is of the form of ``key`` (a key path of :data:`FORMS`), and the value as the form reads it:
    a null is of it where the form allows one (:data:`NULLABLE`)."""
    if value is None and key in NULLABLE:
        return True, None
    out = FORMS[key][0](value)
    return out is not None, out


def section_value(data: Mapping[str, Any], key: str) -> Any:
    """The value at the key path ``key`` of the model JSON ``data``."""
    value: Any = data
    for part in key.split("."):
        value = value[part]
    return value


def section(data: Mapping[str, Any], key: str, *, where: Path, fix: Callable[[str], str]) -> dict[str, Any]:
    """The section ``key`` of the model JSON ``data`` as a dict; a :class:`BundleError` when it is not a JSON object."""
    value = section_value(data, key)
    if not isinstance(value, Mapping):
        raise value_error(key, value, "a JSON object", "{...}", where=where, fix=fix)
    return dict(value)


def value_error(
    key: str, value: Any, words: str, example: str, *, where: Path | str, fix: Callable[[str], str], file: str | None = None
) -> BundleError:
    """The error of ``value`` at ``key`` not being ``words``, in the model JSON ``where`` (``file``: the name its fix
    gives it, default ``where``'s file name)."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return BundleError(
        f"{shown} is not {words}",
        where=f"{where}: {key}",
        fix=fix(f"{key} in {file or Path(where).name}: {words}, e.g. {example}"),
    )
