"""Air regions of a CT on the working grid: which air is inside the patient, and what each region looks like.

Air is every voxel darker than ``lung_hu``; its 3-D connected components (6-connectivity)
of at least :data:`MIN_REGION_ML` are the regions. A region is *internal* (lungs, airways,
bowel gas) or *outside* (around the patient, under the table, beyond the reconstruction
circle, inside the table) by enclosure: from an internal air voxel, rays along the four in-plane
directions (± row, ± column) meet the body in at least three of them (the fourth may leave the
image where a small field of view cuts the chest); from outside air, the table's foam core or a
gap beside an arm at most two do. A region is internal when most of its voxels are enclosed
and it lies inside the body mask, or touches the in-plane image edge (a lung cut by the field of
view lies outside a body mask that could not be closed there).

Per region: size (voxels, mL), the median HU of its interior (voxels whose whole 3×3×3
neighbourhood is air: parenchyma is denser than pure gas there, whatever the partial volume
at the rim), its LPS z range (mm), LPS centroid (mm) and whether it touches the image's side
edges. ``air_level_hu`` is the median HU of the outside air's interior (the scanner's air
value, from its voxels within :data:`AIR_RANGE_HU`), :data:`~pipeline.intensity.AIR_HU` when the body fills
the field of view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from ..intensity import AIR_HU
from . import morph
from .grid import Grid
from .organs import SegmentParams

log = logging.getLogger(__name__)

_HIST_LO, _HIST_STEP = -1100.0, 5.0  # interior-HU histogram (HU), clipped at both ends
ENCLOSED_DIRECTIONS = 3  # of the four in-plane rays, how many must meet tissue
DEFAULT_AIR_HU = AIR_HU  # the air level when no outside air can be measured
MIN_REGION_ML = 0.02  # air components smaller than this (mL) are not regions (a neonate's trachea is larger)
# outside-air HU counted for the air level: calibrated air, not foam pads (denser) or padding beyond the scan circle
AIR_RANGE_HU = (AIR_HU - 15.0, AIR_HU + 35.0)
PARENCHYMA_MARGIN_HU = 50.0  # lung interior is at least this much denser than air (gas: 0..45 HU)


@dataclass
class AirRegions:
    """Air regions on the working grid; per-region arrays are indexed by label (index 0 unused).

    labels: int32 ``[k, j, i]``, 0 for tissue and for air regions below the size floor.
    size: voxels; internal: bool; interior_hu: median HU of the interior (NaN without one);
    interior_fraction: share of the region's voxels that are interior; z_lo, z_hi: LPS z range (mm)
    of the region's bounding box; centroid: LPS mm ``(n, 3)`` of internal regions (NaN for outside air); touches_side: reaches the in-plane image edge.
    """

    labels: np.ndarray
    size: np.ndarray
    internal: np.ndarray
    interior_hu: np.ndarray
    interior_fraction: np.ndarray
    z_lo: np.ndarray
    z_hi: np.ndarray
    centroid: np.ndarray
    touches_side: np.ndarray
    air_level_hu: float
    voxel_ml: float

    @property
    def n(self) -> int:
        """Number of regions (labels run 1..n)."""
        return int(self.size.size - 1)

    def mask(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Boolean ``[k, j, i]`` mask of the regions ``ids``."""
        return morph.keep_labels(self.labels, np.asarray(ids, dtype=np.int64), self.n)

    def internal_mask(self) -> np.ndarray:
        """All internal air (lungs, airways, bowel gas), bool ``[k, j, i]``."""
        return self.mask(np.nonzero(self.internal)[0])

    def ml(self, label: int) -> float:
        return float(self.size[label]) * self.voxel_ml

    def parenchyma(self) -> np.ndarray:
        """Per region (bool, index 0 False): internal air whose interior is at least
        :data:`PARENCHYMA_MARGIN_HU` denser than the scan's air (lung, not pure gas)."""
        out = self.internal & (self.interior_hu > self.air_level_hu + PARENCHYMA_MARGIN_HU)
        out[0] = False
        return out


def enclosure(body: np.ndarray, slice_axis: int) -> np.ndarray:
    """For every voxel, how many of the four in-plane rays (± each in-plane array axis) meet the body (0..4).

    A voxel of the body counts as met in every direction.
    """
    tissue = body
    hits = np.zeros(body.shape, dtype=np.uint8)
    for ax in (a for a in range(3) if a != slice_axis):
        hits += np.logical_or.accumulate(tissue, axis=ax)
        hits += np.flip(np.logical_or.accumulate(np.flip(tissue, axis=ax), axis=ax), axis=ax)
    return hits


def hu_histograms(hu: np.ndarray, labels: np.ndarray, n: int, top_hu: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-label HU histograms ``(n + 1, bins)`` of paired voxel values (5 HU bins from -1100 HU to ``top_hu``).

    Values outside the range fall into the end bins. Returns the histograms and the bin centres (HU).
    """
    nb = int(round((top_hu - _HIST_LO) / _HIST_STEP)) + 1
    b = np.clip(((hu - _HIST_LO) / _HIST_STEP).astype(np.int64), 0, nb - 1)
    hist = np.bincount(labels.astype(np.int64) * nb + b, minlength=(n + 1) * nb).reshape(n + 1, nb)
    return hist, _HIST_LO + _HIST_STEP * np.arange(nb)


def histogram_medians(hist: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """The median (bin centre, HU) of each histogram row; NaN for empty rows."""
    count = hist.sum(axis=1)
    out = np.full(hist.shape[0], np.nan)
    has = count > 0
    cum = np.cumsum(hist[has], axis=1)
    out[has] = centres[np.argmax(cum >= (count[has, None] + 1) / 2.0, axis=1)]
    return out


def _side_faces(shape: tuple[int, ...], slice_axis: int) -> np.ndarray:
    face = np.zeros(shape, dtype=bool)
    for ax in (a for a in range(3) if a != slice_axis):
        for end in (0, -1):
            sl: list[slice | int] = [slice(None)] * 3
            sl[ax] = end
            face[tuple(sl)] = True
    return face


def air_regions(grid: Grid, body: np.ndarray, p: SegmentParams) -> AirRegions:
    """Label and describe the air of the working grid (see the module docstring)."""
    g = grid.geometry
    axis = g.array_axis(2)
    hu_t = grid.hu
    air_t = hu_t < p.lung_hu
    air = air_t.cpu().numpy()
    labels, sizes = morph.label(air)
    min_vox = max(1, int(np.ceil(MIN_REGION_ML / grid.voxel_ml)))
    keep = np.nonzero(sizes >= min_vox)[0]
    lut = np.zeros(sizes.size, dtype=np.int32)
    lut[keep] = np.arange(1, keep.size + 1, dtype=np.int32)
    labels = lut[labels]
    n = int(keep.size)
    size = np.concatenate([[0], sizes[keep]]).astype(np.int64)
    flat = labels.ravel()

    enclosed = enclosure(body, axis) >= ENCLOSED_DIRECTIONS
    enclosed_frac = np.bincount(flat[enclosed.ravel()], minlength=n + 1) / np.maximum(size, 1)
    body_frac = np.bincount(flat[body.ravel()], minlength=n + 1) / np.maximum(size, 1)
    side = np.zeros(n + 1, dtype=bool)
    side[np.unique(labels[_side_faces(labels.shape, axis)])] = True
    side[0] = False
    internal = (enclosed_frac >= 0.5) & ((body_frac >= 0.5) | side)
    internal[0] = False

    interior = morph.erode(air_t, (1, 1, 1)).cpu().numpy() & (labels > 0)
    hu = hu_t.cpu().numpy()
    hist, centres = hu_histograms(hu[interior], labels[interior], n, p.lung_hu)
    interior_n = hist.sum(axis=1)
    interior_hu = histogram_medians(hist, centres)
    outside = ~internal
    outside[0] = False
    out_hist = hist[outside].sum(axis=0)
    out_hist[(centres < AIR_RANGE_HU[0]) | (centres > AIR_RANGE_HU[1])] = 0
    if out_hist.sum() > 0:
        c = np.cumsum(out_hist)
        air_level = float(centres[int(np.argmax(c >= c[-1] / 2.0))])
    else:
        air_level = DEFAULT_AIR_HU

    z_lo = np.full(n + 1, np.nan)
    z_hi = np.full(n + 1, np.nan)
    centroid = np.full((n + 1, 3), np.nan)
    for lab, sl in enumerate(ndimage.find_objects(labels), start=1):
        if sl is None:
            continue
        corners = np.array(
            [
                [i, j, k]
                for i in (sl[2].start, sl[2].stop - 1)
                for j in (sl[1].start, sl[1].stop - 1)
                for k in (sl[0].start, sl[0].stop - 1)
            ],
            dtype=np.float64,
        )
        z = g.index_to_lps(corners)[:, 2]
        z_lo[lab], z_hi[lab] = float(z.min()), float(z.max())
        if internal[lab]:
            idx = np.argwhere(labels[sl] == lab).mean(axis=0) + [s.start for s in sl]
            centroid[lab] = g.index_to_lps(idx[::-1])
    regions = AirRegions(
        labels=labels,
        size=size,
        internal=internal,
        interior_hu=interior_hu,
        interior_fraction=interior_n / np.maximum(size, 1),
        z_lo=z_lo,
        z_hi=z_hi,
        centroid=centroid,
        touches_side=side,
        air_level_hu=air_level,
        voxel_ml=grid.voxel_ml,
    )
    log.debug("air: %d regions, %d internal, air level %.0f HU", n, int(internal.sum()), air_level)
    return regions
