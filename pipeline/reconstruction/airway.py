"""Airway (trachea and main bronchi) by region growing from a trachea seed.

The seed is the air blob nearest the body's LPS x mid-line in the most superior
slices of the lung/airway air. The airway is the connected region of voxels darker
than a threshold half-way between the trachea lumen and the lung parenchyma; if
the growth leaks into the lungs (more than ``airway_leak_fraction`` of the air)
the threshold moves towards the lumen value and the growth is redone.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy import ndimage

from ..errors import ReconstructionError
from ..volume import Geometry
from . import morph
from .organs import SegmentParams

log = logging.getLogger(__name__)


def _superior_order(geometry: Geometry, axis: int) -> np.ndarray:
    """Slice indices along array ``axis`` from the most superior (largest LPS z) down."""
    c = 2 - axis
    n = geometry.shape[axis]
    idx = np.arange(n)
    return idx[::-1] if geometry.direction[2, c] > 0 else idx


def find_trachea_seed(air: np.ndarray, cand: np.ndarray, body: np.ndarray, geometry: Geometry,
                      hu: np.ndarray) -> np.ndarray:
    """Boolean seed mask: the central air blob of the top-most slice that has one.

    The blob must hold air clearly darker than the lung parenchyma (its darkest voxel at
    least 100 HU below the lungs' median), so a lung apex near the mid-line is not taken.
    """
    axis = geometry.array_axis(2)
    per_slice = air.sum(axis=tuple(a for a in range(3) if a != axis))
    order = [s for s in _superior_order(geometry, axis) if per_slice[s] > 0]
    if not order:
        raise ReconstructionError("no air inside the body to seed the airway")
    x = np.broadcast_to(geometry.lps_coordinate(0), air.shape)
    body_x = x[body]
    mid = float(np.median(body_x))
    width = float(body_x.max() - body_x.min()) or 1.0
    span = max(1, int(0.4 * len(order)))
    lung_median = float(np.median(hu[cand]))
    for s in order[:span]:
        sl = [slice(None)] * 3
        sl[axis] = s
        plane = air[tuple(sl)]
        labels, n = ndimage.label(plane)
        if n == 0:
            continue
        xs = x[tuple(sl)]
        idx = np.arange(1, n + 1)
        cx = ndimage.mean(xs, labels, idx)
        best = int(np.argmin(np.abs(np.asarray(cx) - mid)))
        blob = labels == idx[best]
        if abs(cx[best] - mid) < 0.12 * width and float(hu[tuple(sl)][blob].min()) < lung_median - 100.0:
            seed = np.zeros_like(air)
            seed[tuple(sl)] = blob
            return seed
    raise ReconstructionError("no trachea found: no air blob near the mid-line at the top of the lungs",
                              fix="check that the scan includes the upper chest")


def _grow(hu: np.ndarray, allowed: np.ndarray, seed: np.ndarray, thr: float) -> np.ndarray:
    dark = (hu < thr) & allowed | seed
    labels, n = ndimage.label(dark, structure=morph.CONN6)
    ids = np.unique(labels[seed])
    return morph.keep_labels(labels, ids[ids > 0], n)


def grow_airway(hu: torch.Tensor, air: np.ndarray, cand: np.ndarray, body: np.ndarray, geometry: Geometry,
                p: SegmentParams) -> tuple[np.ndarray, dict[str, float | str]]:
    """Airway mask (working grid) and the values used; raises ReconstructionError without a trachea.

    The threshold is the highest one (from ``lung_hu`` down to -975 HU in 25 HU steps, by bisection)
    whose region grown from the trachea seed stays below ``airway_leak_fraction`` of the lung air.
    """
    hu_np = hu.cpu().numpy()
    seed = find_trachea_seed(air, cand, body, geometry, hu_np)
    # air inside the body with a margin: the growth cannot go elsewhere
    allowed = morph.dilate(morph.to_tensor(air, hu.device), (1, 1, 1)).cpu().numpy() & body
    limit = p.airway_leak_fraction * float(cand.sum())
    levels = np.arange(p.lung_hu, -975.0 - 1e-6, -25.0)
    lo, hi = 0, len(levels) - 1  # find the first (highest) level that does not leak
    best: np.ndarray | None = None
    best_t = float(levels[-1])
    while lo <= hi:
        mid = (lo + hi) // 2
        grown = _grow(hu_np, allowed, seed, float(levels[mid]))
        if grown.sum() <= limit:
            best, best_t = grown, float(levels[mid])
            hi = mid - 1
        else:
            lo = mid + 1
    if best is None:
        raise ReconstructionError(
            f"airway growth leaked into the lungs at every threshold down to {levels[-1]:.0f} HU",
            fix="the airway wall is not visible at this resolution; lungs are still reported",
        )
    lumen = float(np.median(hu_np[best]))
    return best, {"airway_threshold_hu": best_t, "airway_lumen_hu": round(lumen, 1),
                  "airway_edge_hu": round(0.5 * (lumen + p.tissue_hu), 1)}


def add_edge_ring(airway: np.ndarray, hu: np.ndarray, edge_hu: float) -> np.ndarray:
    """Add the one-voxel ring around the grown airway whose HU is below ``edge_hu``.

    The growth threshold must stay low to avoid leaking into the lungs, which leaves
    out the lumen's partial-volume rim; half-way between lumen and wall puts it back.
    """
    ring = ndimage.binary_dilation(airway, structure=ndimage.generate_binary_structure(3, 3)) & ~airway
    return airway | (ring & (hu < edge_hu))
