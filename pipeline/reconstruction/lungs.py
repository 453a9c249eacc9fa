"""Lung candidates and the left/right split (masks ``[k, j, i]``, LPS geometry).

The patient's left lung is the one at larger LPS x; this is decided from the
voxels' patient coordinates, so flipped or permuted index axes cannot swap them.
A lung pair merged at the anterior/posterior junction is separated by erosion
(and, when erosion does not split it, at the LPS x mid-line of the junction).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..errors import ReconstructionError
from ..volume import Geometry
from . import morph
from .grid import Grid, bbox
from .organs import SegmentParams

log = logging.getLogger(__name__)

_MAX_SPLIT_EROSIONS = 12


def lung_candidates(air: np.ndarray, geometry: Geometry, p: SegmentParams) -> np.ndarray:
    """Air inside the body that belongs to the lungs or airways: the large air components."""
    labels, sizes = morph.label(air)
    if sizes.size <= 1 or sizes.max() == 0:
        raise ReconstructionError(
            f"no lungs found: no air below {p.lung_hu:g} HU inside the body",
            fix="check that the series covers the chest (and is in HU); lungs and airways are then skipped",
        )
    voxel_ml = float(np.prod(geometry.spacing)) / 1000.0
    largest = sizes.max()
    keep = np.nonzero((sizes >= 0.08 * largest) & (sizes * voxel_ml >= p.min_lung_ml))[0]
    if keep.size == 0:
        raise ReconstructionError(
            f"no lungs found: the largest air region inside the body is {largest * voxel_ml:.2f} mL "
            f"(less than {p.min_lung_ml} mL)",
            fix="check that the series covers the chest; lungs and airways are then skipped",
        )
    return morph.keep_labels(labels, keep, sizes.size - 1)


def _two_largest(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    labels, sizes = morph.label(mask)
    order = np.argsort(sizes)[::-1]
    a = labels == order[0]
    if sizes.size < 3 or sizes[order[1]] == 0:
        return a, np.zeros_like(a), 0.0
    return a, labels == order[1], float(sizes[order[1]] / sizes[order[0]])


def _grow_back(cores: list[torch.Tensor], mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Dilate competing cores inside ``mask`` one voxel at a time (first come, first served) until it is claimed."""
    taken = cores[0] | cores[1]
    for _ in range(max(steps + 2, 500)):  # until nothing is left to claim
        grown = [morph.dilate(c, (1, 1, 1)) & mask & ~taken for c in cores]
        both = grown[0] & grown[1]
        grown[1] &= ~both
        if not (grown[0].any() or grown[1].any()):
            break
        cores = [cores[0] | grown[0], cores[1] | grown[1]]
        taken = cores[0] | cores[1]
    return cores


def _midline_split(mask: np.ndarray, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Split at the LPS x with the fewest lung voxels between the 30th and 70th x percentiles."""
    x = np.broadcast_to(geometry.lps_coordinate(0), mask.shape)
    xs = x[mask]
    lo, hi = np.percentile(xs, [30, 70])
    bins = np.linspace(lo, hi, 41)
    hist, _ = np.histogram(xs, bins=bins)
    cut = 0.5 * (bins[np.argmin(hist)] + bins[np.argmin(hist) + 1])
    return mask & (x < cut), mask & (x >= cut)


def split_lungs(mask: np.ndarray, grid: Grid, p: SegmentParams) -> tuple[np.ndarray, np.ndarray]:
    """Left and right lung masks (working grid) from the lung air without airways.

    Returns ``(left, right)`` where left has the larger mean LPS x. Vessels and
    nodules inside each lung are filled in (closing + per-slice hole filling).
    """
    geometry = grid.geometry
    a, b, ratio = _two_largest(mask)
    if ratio < 0.2:  # one merged region (or one lung only): try erosion
        dev = grid.hu.device
        m = morph.to_tensor(a, dev)
        cur = m
        split = None
        for step in range(1, _MAX_SPLIT_EROSIONS + 1):
            cur = morph.erode(cur, (0, 1, 1))
            ca, cb, r = _two_largest(cur.cpu().numpy())
            if not ca.any():
                break
            if r >= 0.2:
                ta, tb = morph.to_tensor(ca, dev), morph.to_tensor(cb, dev)
                ga, gb = _grow_back([ta, tb], m, step)
                split = (ga.cpu().numpy(), gb.cpu().numpy())
                log.debug("lungs split after %d erosions", step)
                break
        if split is None:
            ma, mb = _midline_split(a, geometry)
            if ma.sum() >= 0.2 * mb.sum() and mb.sum() >= 0.2 * ma.sum():
                split = (ma, mb)
                log.debug("lungs split at the mid-line")
        if split is None:
            raise ReconstructionError(
                "found only one lung-sized air region and could not split it into left and right",
                fix="check that the scan covers both lungs; a pneumonectomy case needs a user segmentation (--seg-bundle)",
            )
        a, b = split
    xa = _centroid_x(a, geometry)
    xb = _centroid_x(b, geometry)
    left, right = (a, b) if xa > xb else (b, a)
    left = fill_lung(left, geometry, p, grid.hu.device, other=right)
    right = fill_lung(right, geometry, p, grid.hu.device, other=left)
    return left, right


def _centroid_x(mask: np.ndarray, geometry: Geometry) -> float:
    return float(geometry.centroid_lps(mask)[0])


def fill_lung(mask: np.ndarray, geometry: Geometry, p: SegmentParams, device: torch.device | str,
              other: np.ndarray | None = None) -> np.ndarray:
    """Close and fill one lung so vessels and nodules inside it belong to it (never into ``other``)."""
    r = morph.radius_vox(p.lung_close_mm, geometry.spacing)
    box = bbox(mask, max(r) + 1)
    out = np.zeros_like(mask)
    if box is None:
        return out
    sub = mask[box]
    closed = morph.closing(morph.to_tensor(sub, device), r).cpu().numpy()
    out[box] = morph.fill_holes(closed | sub, slice_axis=geometry.array_axis(2))
    if other is not None:
        out &= ~other
    return out
