"""Organ measurements: volume (mL), surface area (mm²), bounding box (LPS mm), lung figures.

Volumes come from the masks (voxel count × voxel volume); surface areas from
the meshes when there is one. Bounding boxes enclose the voxel *cells* (centres
± half a voxel) in patient coordinates (LPS, mm).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..intensity import EMPHYSEMA_HU
from ..volume import Geometry
from .mesh import Mesh

log = logging.getLogger(__name__)


def bbox_lps(mask: np.ndarray, geometry: Geometry) -> tuple[list[float], list[float]]:
    """LPS (min, max) corners in mm of the box enclosing the mask's voxel cells."""
    nz = [np.nonzero(mask.any(axis=tuple(a for a in range(3) if a != ax)))[0] for ax in range(3)]
    lo = np.array([nz[2][0], nz[1][0], nz[0][0]], dtype=float) - 0.5  # (i, j, k)
    hi = np.array([nz[2][-1], nz[1][-1], nz[0][-1]], dtype=float) + 0.5
    corners = np.array([[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])])
    pts = geometry.index_to_lps(corners)
    return pts.min(axis=0).round(3).tolist(), pts.max(axis=0).round(3).tolist()


def organ_measurements(mask: np.ndarray, geometry: Geometry, *, mesh: Mesh | None = None) -> dict[str, Any]:
    """``volume_ml``, ``voxels``, ``surface_area_mm2`` (mesh; None without one), ``bbox_lps_mm`` {min, max}."""
    voxels = int(np.count_nonzero(mask))
    voxel_mm3 = float(np.prod(geometry.spacing))
    out: dict[str, Any] = {"voxels": voxels, "volume_ml": round(voxels * voxel_mm3 / 1000.0, 4)}
    out["surface_area_mm2"] = round(mesh.area(), 2) if mesh is not None else None
    out["mesh_volume_ml"] = round(mesh.volume() / 1000.0, 4) if mesh is not None else None
    if voxels:
        lo, hi = bbox_lps(mask, geometry)
        out["bbox_lps_mm"] = {"min": lo, "max": hi}
    return out


def lung_measurements(
    hu: np.ndarray, masks: Mapping[str, np.ndarray], geometry: Geometry, *, one_lung: bool = False
) -> dict[str, Any]:
    """Left, right and total lung volume (mL) and the emphysema index (% of lung voxels below :data:`EMPHYSEMA_HU`),
    per lung and of both.

    The totals (``lungs_total_volume_ml``, ``emphysema_index_pct``) are ``None`` unless both lungs were segmented (one
    lung asked for is not the lungs), except that with ``one_lung`` (both lungs were looked for and only one found: the
    quality flag ``one_lung``, a pneumonectomy) they are the remaining lung's: the patient's lung volume and the index
    over the lung tissue the patient has. ``lungs_total_covers`` says which lungs they cover: ``"both"``, the remaining
    lung's side (``"left"`` or ``"right"``), or ``None`` without totals."""
    voxel_ml = float(np.prod(geometry.spacing)) / 1000.0
    out: dict[str, Any] = {}
    total = 0
    low = 0
    for side in ("lung_left", "lung_right"):
        m = masks.get(side)
        if m is None:
            out[f"{side}_volume_ml"] = None
            continue
        n = int(np.count_nonzero(m))
        n_low = int(np.count_nonzero(hu[m] < EMPHYSEMA_HU))
        out[f"{side}_volume_ml"] = round(n * voxel_ml, 4)
        out[f"{side}_emphysema_index_pct"] = round(100.0 * n_low / n, 3) if n else None
        total += n
        low += n_low
    present = [side for side in ("lung_left", "lung_right") if masks.get(side) is not None]
    stated = bool(total) and (len(present) == 2 or (one_lung and len(present) == 1))
    out["lungs_total_volume_ml"] = round(total * voxel_ml, 4) if stated else None
    out["emphysema_index_pct"] = round(100.0 * low / total, 3) if stated else None
    out["lungs_total_covers"] = None if not stated else "both" if len(present) == 2 else present[0].removeprefix("lung_")
    out["emphysema_threshold_hu"] = EMPHYSEMA_HU
    return out
