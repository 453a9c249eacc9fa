"""A MONAI bundle folder's files and the checked plain values read from its config.

The config files' paths in the bundle (:data:`INFERENCE_JSON`, :data:`METADATA_JSON`), reading them
(:func:`read_json`, :func:`read_metadata`), finding the model file (:func:`model_file`), and the values
:class:`~pipeline.bundle.BundleConfig` answers with: a config :class:`Component`, the :class:`SlidingWindow`
settings and number triples (:func:`int3_value`, :func:`mm3_value`). Every problem raises
:class:`~pipeline.errors.BundleError` naming the file or the config key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BundleError

INFERENCE_JSON = "configs/inference.json"
METADATA_JSON = "configs/metadata.json"


@dataclass(frozen=True)
class Component:
    """One ``{"_target_": ...}`` entry of a config: its id (``"preprocessing#transforms#3"``),
    its class name (the last part of ``_target_``) and its raw, unresolved arguments."""

    id: str
    name: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class SlidingWindow:
    """Sliding-window inference: patch size ``roi_size`` (voxels along x, y, z), overlap (fraction
    of the patch), patches per batch and MONAI's blend mode."""

    roi_size: tuple[int, int, int]
    overlap: float = 0.25
    sw_batch_size: int = 1
    mode: str = "constant"


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`BundleError` when it cannot be read or is not an object."""
    fix = "mend the file (a JSON object: {...}) or copy the bundle again from where it came, e.g. MONAI's model zoo"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise BundleError(f"{path.name} is not valid JSON ({exc})", where=path, fix=fix) from exc
    if not isinstance(data, dict):
        raise BundleError(f"{path.name} must hold a JSON object, got {type(data).__name__}", where=path, fix=fix)
    return data


def read_metadata(root: str | Path) -> dict[str, Any]:
    """The bundle's ``configs/metadata.json``; :class:`BundleError` when it is missing or not a JSON object."""
    path = Path(root) / METADATA_JSON
    if not path.is_file():
        raise BundleError(f"{METADATA_JSON} is missing", where=root, fix="pass the bundle's root folder")
    return read_json(path)


def model_file(root: str | Path, *names: str, fix: str = "copy the bundle's models folder too") -> Path:
    """The first of ``models/<name>`` (e.g. ``"model.pt", "model.ts"``) that exists in the bundle ``root``."""
    models = Path(root) / "models"
    for name in names:
        if (models / name).is_file():
            return models / name
    wanted = " nor ".join(f"models/{name}" for name in names)
    raise BundleError(f"bundle has {'neither ' if len(names) > 1 else 'no '}{wanted}", where=models, fix=fix)


def int3_value(value: Any, key: str, where: str) -> tuple[int, int, int]:
    """Three positive integers (x, y, z); one number stands for all three."""
    items = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    try:
        out = [int(v) for v in items]
        exact = len(out) == 3 and all(float(v) == o and o >= 1 for v, o in zip(items, out))
    except (TypeError, ValueError):
        exact = False
    if not exact:
        raise BundleError(f"{key} must be 3 positive integers (x, y, z), got {value!r}", where=where)
    return out[0], out[1], out[2]


def mm3_value(value: Any, key: str, where: str) -> tuple[float, float, float]:
    """Three positive finite sizes in mm (x, y, z); one number stands for all three."""
    items = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    try:
        out = [float(v) for v in items]
        ok = len(out) == 3 and all(math.isfinite(v) and v > 0 for v in out)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise BundleError(f"{key} must be 3 positive sizes in mm (x, y, z), got {value!r}", where=where)
    return out[0], out[1], out[2]
