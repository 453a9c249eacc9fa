"""Measurements of a case as flat rows: ``(dotted.name, value, unit, reliable, reason)``.

The reconstruction writes nested measurements (``organs.<organ>.<figure>``,
``lungs.<figure>``, ``nodules.<n>.<figure>``); the run store keeps one row per
numeric leaf, with its unit taken from the name's suffix (``_ml`` → mL, ``_mm``
→ mm, ``_hu`` → HU, ...).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from .stage import Measurement

_UNITS = (
    ("_ml", "mL"),
    ("_mm3", "mm3"),
    ("_mm2", "mm2"),
    ("_mm", "mm"),
    ("_pct", "%"),
    ("_percent", "%"),
    ("_hu", "HU"),
    ("_fraction", "fraction"),
    ("_count", "count"),
)


def flatten_measurements(tree: Mapping[str, Any], prefix: str = "") -> Iterator[Measurement]:
    """Numeric leaves of a nested measurements dict as :class:`Measurement` ``(dotted.name, value, unit, reliable,
    reason)``; units from name suffixes.

    A figure that a quality flag makes meaningless is written ``{"value": x, "reliable": false, "reason": ...}``
    (:func:`pipeline.reconstruction.quality.mark_unreliable`): it keeps its name and value, marked unreliable.
    """
    for key, value in tree.items():
        name = f"{prefix}{key}"
        unit = next((u for suf, u in _UNITS if key.lower().endswith(suf)), "")
        if isinstance(value, Mapping) and "value" in value and "reliable" in value:
            v = value["value"]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                reliable = bool(value["reliable"])
                yield Measurement(name, float(v), unit, reliable, None if reliable else str(value.get("reason") or ""))
        elif isinstance(value, Mapping):
            yield from flatten_measurements(value, name + ".")
        elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            for n, item in enumerate(value):
                yield from flatten_measurements(item, f"{name}.{n}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            yield Measurement(name, float(value), unit)
