"""Airway (trachea and main bronchi): a trachea seed, then region growing (working grid, LPS geometry).

The seed is a trachea cross-section in the upper part of the internal air: an in-plane air
blob whose area is within :data:`SEED_AREA` of the body's squared width (40–1,200 mm² in a
320 mm wide adult), round enough (:func:`_round`), that holds pure air (its darkest voxel below half-way between the air
level and the lung parenchyma), continues downwards as a tube of similar cross-section for at
least :data:`TUBE_LENGTH` of the body's width (24 mm in an adult), and lies near the body's
LPS x mid-line (unless the field of view cuts the body at that level, where the mid-line is
unknown). A trachea also leads somewhere: its air region either holds lung parenchyma (the
bronchi join the lungs) or its tube continues upwards, at least 0.4 of the seed's cross-section
in every slice, to the scan's top (or ends within :data:`TOP_MARGIN_MM` of it; towards the larynx);
a pocket of pure gas closed above does neither. Bowel gas fails these tests
(stomach: too wide, or a gas pocket whose dome narrows and closes under the diaphragm; colon: not a
vertical tube near the mid-line), so a scan without a trachea (an abdomen scan with the lung bases, a small
field of view below the carina) has no seed:
:func:`grow_airway` then returns None, which the caller records as "airway not in scan".

The airway is the connected region of voxels darker than a threshold half-way between the
trachea lumen and the lung parenchyma; if the growth leaks into the lungs (more than
``airway_leak_fraction`` of the internal air) the threshold moves towards the lumen value and
the growth is redone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from ..errors import ReconstructionError
from ..intensity import AIR_HU, LUNG_PARENCHYMA_HU
from ..volume import Geometry
from . import morph
from .air import AirRegions
from .organs import SegmentParams

log = logging.getLogger(__name__)

SEED_AREA = (0.0004, 0.012)  # trachea cross-section / body width², at the working threshold
TUBE_LENGTH = 0.075  # the seed continues downwards as a tube at least this share of the body width
MIN_SEED_PIXELS = 3
ROUND_ASPECT = 3.0  # longest / shortest side of the seed blob's box
ROUND_FILL = 0.45  # share of the seed blob's box that it fills (a disc fills 0.79)
MIDLINE_FRACTION = 0.2  # seed within this share of the body's width from its x mid-line
SEARCH_FRACTION = 0.45  # search the top share of the slices that hold internal air
LEVEL_STEP_HU = 25.0  # growth thresholds tried, from lung_hu down in this step
LOWEST_LEVEL_HU = AIR_HU + LEVEL_STEP_HU  # the lowest growth threshold: just above the lumen's air
TOP_MARGIN_MM = 5.0  # a trachea's air region reaches this close to the scan's top (mm), unless it holds lung


@dataclass
class Airway:
    """A grown airway: mask (bool ``[k, j, i]``, working grid) and the values used (HU, LPS mm)."""

    mask: np.ndarray
    info: dict[str, float | str]
    seed_x_mm: float


def _superior_order(geometry: Geometry, axis: int) -> np.ndarray:
    """Slice indices along array ``axis`` from the most superior (largest LPS z) down."""
    c = 2 - axis
    idx = np.arange(geometry.shape[axis])
    return idx[::-1] if geometry.direction[2, c] > 0 else idx


def _plane(a: np.ndarray, axis: int, s: int) -> np.ndarray:
    sl: list[slice | int] = [slice(None)] * 3
    sl[axis] = int(s)
    return a[tuple(sl)]


def _overlapping(air: np.ndarray, axis: int, s: int, cur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The in-plane air blobs of slice ``s`` (labels) and the labels of those overlapping ``cur`` (a blob of
    the neighbouring slice, bool like the plane)."""
    plane = _plane(air, axis, s)
    labels, _ = ndimage.label(plane)
    ids = np.unique(labels[cur & plane])
    return labels, ids[ids > 0]


def _tube_length(
    air: np.ndarray,
    blob: np.ndarray,
    order: np.ndarray,
    start: int,
    axis: int,
    area_mm2: float,
    pixel_mm2: float,
    step_mm: float,
    enough_mm: float,
    max_area_mm2: float,
) -> float:
    """How far (mm, up to ``enough_mm``) the blob continues downwards as one tube of similar cross-section."""
    cur = blob
    length = 0.0
    for s in order[start + 1 :]:
        labels, ids = _overlapping(air, axis, s, cur)
        if ids.size != 1:
            break
        nxt = labels == ids[0]
        area = float(nxt.sum()) * pixel_mm2
        if not 0.4 * area_mm2 <= area <= 2.5 * area_mm2 or area > 2.0 * max_area_mm2:
            break
        cur = nxt
        length += step_mm
        if length >= enough_mm:
            break
    return length


def find_trachea_seed(hu: np.ndarray, regions: AirRegions, body: np.ndarray, geometry: Geometry) -> np.ndarray | None:
    """Boolean seed mask (one in-plane blob) of the trachea, or None when the scan has no trachea."""
    axis = geometry.array_axis(2)
    air = regions.internal_mask()
    if not air.any():
        return None
    per_slice = air.sum(axis=tuple(a for a in range(3) if a != axis))
    superior = _superior_order(geometry, axis)
    order = superior[per_slice[superior] > 0]
    sp = list(geometry.spacing)
    c = 2 - axis
    pixel_mm2 = float(np.prod([sp[i] for i in range(3) if i != c]))
    step_mm = float(sp[c])
    largest = int(np.argmax(regions.size * regions.internal))
    lung_level = regions.interior_hu[largest] if np.isfinite(regions.interior_hu[largest]) else LUNG_PARENCHYMA_HU
    dark = 0.5 * (regions.air_level_hu + min(lung_level, regions.air_level_hu + 150.0))
    x = np.broadcast_to(geometry.lps_coordinate(0), air.shape)
    bx = x[body] if body.any() else x[air]
    width = float(bx.max() - bx.min()) or 1.0
    area_lo = max(SEED_AREA[0] * width**2, MIN_SEED_PIXELS * pixel_mm2)
    area_hi = SEED_AREA[1] * width**2
    tube_mm = TUBE_LENGTH * width
    parenchyma = regions.parenchyma()
    top_band = _top_band(geometry)
    span = max(1, int(np.ceil(SEARCH_FRACTION * len(order))))
    for n, s in enumerate(order[:span]):
        plane = _plane(air, axis, s)
        labels, count = ndimage.label(plane)
        if count == 0:
            continue
        hu_p = _plane(hu, axis, s)
        xs = _plane(x, axis, s)
        body_p = _plane(body, axis, s)
        idx = np.arange(1, count + 1)
        area = np.bincount(labels.ravel(), minlength=count + 1)[1:] * pixel_mm2
        darkest = np.asarray(ndimage.minimum(hu_p, labels, idx))
        cx = np.asarray(ndimage.mean(xs, labels, idx))
        region = np.asarray(ndimage.maximum(_plane(regions.labels, axis, s), labels, idx)).astype(np.int64)
        ok = (area >= area_lo) & (area <= area_hi) & (darkest < dark) & _round(labels, count)
        if not ok.any():
            continue
        if body_p.any() and not _touches_x_edges(body_p, xs, 0.5 * max(sp)):
            mid = float(np.median(xs[body_p]))
            dist = np.abs(cx - mid)
            ok &= dist <= MIDLINE_FRACTION * width
        else:
            dist = np.zeros_like(cx)
        for b in np.argsort(np.where(ok, dist, np.inf)):
            if not ok[b]:
                break
            blob = labels == idx[b]
            if not (parenchyma[region[b]] or _open_above(air, blob, s, axis, float(area[b]), pixel_mm2, superior, top_band)):
                continue
            length = _tube_length(air, blob, order, n, axis, float(area[b]), pixel_mm2, step_mm, tube_mm, area_hi)
            if length >= tube_mm - 1e-6:
                seed = np.zeros_like(air)
                sl: list[slice | int] = [slice(None)] * 3
                sl[axis] = int(s)
                seed[tuple(sl)] = blob
                return seed
    return None


def _top_band(geometry: Geometry) -> int:
    """How many of the most superior slices lie within :data:`TOP_MARGIN_MM` of the scan's top (at least one)."""
    step = float(geometry.spacing_lps()[2])
    return max(1, 1 + int(np.floor(TOP_MARGIN_MM / step + 1e-6)))


def _open_above(
    air: np.ndarray, blob: np.ndarray, s: int, axis: int, area_mm2: float, pixel_mm2: float, superior: np.ndarray, top_band: int
) -> bool:
    """Whether the blob's air (in slice ``s``) continues upwards as a tube to the scan's top (``superior``: every
    slice index from the most superior down, :func:`_superior_order`).

    Every slice above the blob's holds air overlapping the tube with at least 0.4 of the blob's
    cross-section, up to the top slice or up to the most superior ``top_band`` slices, where the tube may
    have ended: a trachea leaves through the top of a chest scan, while the dome of a gas pocket (the
    stomach's fundus under the diaphragm) narrows towards its apex, also where the apex is just under the top.
    """
    pos = int(np.flatnonzero(superior == s)[0])
    cur = blob
    for n in range(pos - 1, -1, -1):  # from the slice above the blob up to the top
        labels, ids = _overlapping(air, axis, int(superior[n]), cur)
        if ids.size == 0:
            return n < top_band
        nxt = np.isin(labels, ids)
        if float(nxt.sum()) * pixel_mm2 < 0.4 * area_mm2:
            return False
        cur = nxt
    return True


def _round(labels: np.ndarray, count: int) -> np.ndarray:
    """Per blob (labels 1..count of a plane): round enough for an airway cross-section.

    A trachea is round, oval or D-shaped (a sabre-sheath trachea about 2:1); an air gap between
    an arm and the chest wall or a crescent of gas is long and thin.
    """
    out = np.zeros(count, dtype=bool)
    for n, sl in enumerate(ndimage.find_objects(labels)):
        if sl is None:
            continue
        h, w = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        fill = float((labels[sl] == n + 1).sum()) / float(h * w)
        out[n] = max(h, w) <= ROUND_ASPECT * min(h, w) and fill >= ROUND_FILL
    return out


def _touches_x_edges(body_plane: np.ndarray, xs: np.ndarray, tol_mm: float) -> bool:
    """Whether the body reaches the image edge on either LPS x side of the slice (within ``tol_mm``)."""
    lo, hi = float(xs.min()), float(xs.max())
    bx = xs[body_plane]
    return bool(bx.min() <= lo + tol_mm or bx.max() >= hi - tol_mm)


def _grow(hu: np.ndarray, allowed: np.ndarray, seed: np.ndarray, thr: float) -> np.ndarray:
    dark = (hu < thr) & allowed | seed
    labels, n = ndimage.label(dark, structure=morph.CONN6)
    ids = np.unique(labels[seed])
    return morph.keep_labels(labels, ids[ids > 0], n)


def grow_airway(hu: torch.Tensor, regions: AirRegions, body: np.ndarray, geometry: Geometry, p: SegmentParams) -> Airway | None:
    """The airway on the working grid, or None when the scan holds no trachea.

    The threshold is the highest one (from ``lung_hu`` down to :data:`LOWEST_LEVEL_HU` in :data:`LEVEL_STEP_HU`
    steps, by bisection) whose region grown from the trachea seed stays below ``airway_leak_fraction`` of
    the internal air.
    Raises :class:`ReconstructionError` when every threshold leaks.
    """
    hu_np = hu.cpu().numpy()
    seed = find_trachea_seed(hu_np, regions, body, geometry)
    if seed is None:
        return None
    internal = regions.internal_mask()
    # air inside the patient with a margin: the growth cannot go elsewhere
    allowed = morph.dilate(morph.to_tensor(internal, hu.device), (1, 1, 1)).cpu().numpy() & (body | internal)
    limit = p.airway_leak_fraction * float(internal.sum())
    levels = np.arange(p.lung_hu, LOWEST_LEVEL_HU - 1e-6, -LEVEL_STEP_HU)
    best: np.ndarray | None = None
    best_t = float(levels[-1])
    first = _grow(hu_np, allowed, seed, float(levels[0]))  # the usual case: a visible wall at lung_hu
    if first.sum() <= limit:
        best, best_t = first, float(levels[0])
    lo, hi = (1, len(levels) - 1) if best is None else (1, 0)  # else find the highest level that does not leak
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
    seed_x = float(geometry.centroid_lps(seed)[0])
    info: dict[str, float | str] = {
        "airway_threshold_hu": best_t,
        "airway_lumen_hu": round(lumen, 1),
        "airway_edge_hu": round(0.5 * (lumen + p.tissue_hu), 1),
    }
    return Airway(mask=best, info=info, seed_x_mm=seed_x)


def add_edge_ring(airway: np.ndarray, hu: np.ndarray, edge_hu: float) -> np.ndarray:
    """Add the one-voxel ring around the grown airway whose HU is below ``edge_hu``.

    The growth threshold must stay low to avoid leaking into the lungs, which leaves
    out the lumen's partial-volume rim; half-way between lumen and wall puts it back.
    """
    ring = ndimage.binary_dilation(airway, structure=ndimage.generate_binary_structure(3, 3)) & ~airway
    return airway | (ring & (hu < edge_hu))
