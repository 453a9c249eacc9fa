"""The patient's body on the working grid: without the table, couch, mattress or blankets; with the arms.

Tissue is everything above ``body_hu``. What lies under the patient (the table, a couch, a mattress,
blankets) is found by its shape and its constancy along z (:func:`pipeline.reconstruction.table.table_zone`)
and left out of the body. The table is
looked for on pixels of about ``TABLE_PIXEL_MM`` whatever the working grid: on a coarser one
(6 or 8 mm) the mattress, the shells and the foam blur together; there a working voxel is tissue
by what lies beside the table zone only (the zone read as air), so that a voxel holding the edge
of a bright shell and the air above it does not join the patient. After an opening
(``body_open_mm``) that detaches what still touches, the largest component is the trunk;
other components are kept when they look like a patient (soft-tissue HU, and thick or cut by
the image edge): arms at the sides, separated from the chest wall by air, or raised arms in
the top slices.

Air inside the outline is filled per slice (lungs, bowel gas), also where a small field of
view cuts the patient and the lungs touch the image edge: an air region that touches the
image edge belongs to the body when the patient encloses most of it along the rows or the
columns of the slice.

Masks are boolean ``[k, j, i]`` arrays on the grid's geometry (LPS mm); HU thresholds,
sizes in mm and mL.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy import ndimage

from ..intensity import AIR_HU
from . import morph
from .grid import Grid
from .organs import SegmentParams
from .table import table_zone

log = logging.getLogger(__name__)

PART_MIN_ML = 1.0  # body parts apart from the trunk (arms) smaller than this are dropped
PART_THICK_MM = 4.0  # an arm survives an in-plane erosion by this radius (mm)
PART_HU = (-250.0, 200.0)  # median HU of an arm (skin, fat, muscle, some bone)
CUT_AIR_ENCLOSED = 0.5  # share of an edge-touching air region the patient must enclose to be inside
# the table is looked for on in-plane pixels of about this size (mm): on coarser ones (a 6 or 8 mm working grid)
# the mattress and the upper shell blur into one layer under the patient and the lower shell into the foam
TABLE_PIXEL_MM = 2.0


def _inplane(radius_kji: tuple[int, int, int], slice_axis: int) -> tuple[int, int, int]:
    r = list(radius_kji)
    r[slice_axis] = 0
    return r[0], r[1], r[2]


def _patient_like(
    labels: np.ndarray, sizes: np.ndarray, trunk: int, grid: Grid, hu: torch.Tensor, zone: torch.Tensor | None = None
) -> list[int]:
    """Components besides the trunk that look like body parts: large enough, soft-tissue HU, thick or cut by the
    image edge; a thin part cut by the image edge that touches the table ``zone`` (bool like ``hu``) is the
    table's own edge, where it leaves the field of view beside the patient, not a body part."""
    voxel_ml = grid.voxel_ml
    cand = [n for n in np.nonzero(sizes * voxel_ml >= PART_MIN_ML)[0] if n != trunk]
    if not cand:
        return []
    sa = grid.geometry.array_axis(2)
    lab_t = morph.to_tensor(labels, hu.device)
    keep_lut = np.zeros(sizes.size, dtype=bool)
    keep_lut[cand] = True
    cand_mask = morph.to_tensor(keep_lut[labels], hu.device)
    thick = morph.erode(cand_mask, _inplane(grid.radius(PART_THICK_MM), sa)) & cand_mask
    edge = torch.zeros_like(cand_mask)  # parts cut by the field of view need not be thick
    for ax in range(3):
        if ax != sa:
            edge.narrow(ax, 0, 1).copy_(cand_mask.narrow(ax, 0, 1))
            n_ax = cand_mask.shape[ax]
            edge.narrow(ax, n_ax - 1, 1).copy_(cand_mask.narrow(ax, n_ax - 1, 1))
    if zone is not None and bool(zone.any()):  # thin, cut by the edge and touching the table: the table's edge
        near_table = morph.dilate(zone, _inplane((1, 1, 1), sa)) & cand_mask
        table_edge = np.intersect1d(torch.unique(lab_t[edge]).cpu().numpy(), torch.unique(lab_t[near_table]).cpu().numpy())
        edge &= ~morph.to_tensor(np.isin(labels, table_edge), hu.device)
    thick_ids = torch.unique(lab_t[thick | edge]).cpu().numpy()
    out = []
    flat_labels = labels.ravel()
    flat_hu = hu.cpu().numpy().ravel()
    for n in cand:
        if n not in thick_ids:
            continue
        values = flat_hu[flat_labels == n]
        med = float(np.median(values))
        if PART_HU[0] <= med <= PART_HU[1]:
            out.append(int(n))
    return out


def _enclosed(mask: np.ndarray, axes: list[int]) -> np.ndarray:
    """Voxels with ``mask`` on both sides along at least one of ``axes`` (same line, any distance)."""
    out = np.zeros(mask.shape, dtype=bool)
    for ax in axes:
        n = mask.shape[ax]
        hit = mask.any(axis=ax, keepdims=True)
        first = np.argmax(mask, axis=ax)
        last = n - 1 - np.argmax(np.flip(mask, axis=ax), axis=ax)
        shape = [1, 1, 1]
        shape[ax] = n
        idx = np.arange(n).reshape(shape)
        out |= hit & (idx > np.expand_dims(first, ax)) & (idx < np.expand_dims(last, ax))
    return out


def fill_cut_air(mask: np.ndarray, slice_axis: int) -> np.ndarray:
    """Fill air inside ``mask`` per slice, also where it touches the image edge (a small field of view).

    A background region of a slice that does not touch the image edge is filled; one that
    does is filled when ``mask`` encloses at least :data:`CUT_AIR_ENCLOSED` of its pixels
    along the rows or the columns of the slice (mask on both sides).
    """
    structure = morph.in_plane_cross(slice_axis)
    labels, n = ndimage.label(~mask, structure=structure)
    if n == 0:
        return mask
    axes = [a for a in range(3) if a != slice_axis]
    edge = morph.labels_on_border(labels, n, slice_axis=slice_axis)
    size = np.bincount(labels.ravel(), minlength=n + 1)
    take = ~edge
    if edge[1:].any():
        inside = np.bincount(labels[_enclosed(mask, axes)], minlength=n + 1)
        take |= inside >= CUT_AIR_ENCLOSED * np.maximum(size, 1)
    take[0] = False
    return mask | take[labels]


def _table_grid(grid: Grid) -> Grid:
    """The grid the table is looked for on: the volume pooled in-plane to pixels of about :data:`TABLE_PIXEL_MM` (as
    the default working grid pools it), or less where the working grid pools less, and across the slices as the
    working grid does; ``grid`` itself where that is the working grid (the default)."""
    sa = grid.geometry.array_axis(2)
    spacing_kji = grid.full.geometry.spacing[::-1]
    factors = tuple(f if d == sa else min(f, max(1, round(TABLE_PIXEL_MM / spacing_kji[d]))) for d, f in enumerate(grid.factors))
    if factors == grid.factors:
        return grid
    return Grid(grid.full, grid.hu.device, (factors[0], factors[1], factors[2]))


def _zone_full(zone: np.ndarray, src: Grid) -> np.ndarray:
    """The 2-D table ``zone`` found on ``src`` (in-plane axes in array order) on the volume's own in-plane pixels."""
    sa = src.geometry.array_axis(2)
    z = np.asarray(zone, dtype=bool)
    for ax, d in enumerate(d for d in range(3) if d != sa):
        z = np.repeat(z, src.factors[d], axis=ax).take(np.arange(src.full.geometry.shape[d]), axis=ax)
    return z


def _zone_on(zone_full: np.ndarray, dst: Grid) -> np.ndarray:
    """The table zone on the volume's own in-plane pixels (:func:`_zone_full`) on ``dst``'s pixels: those at least
    half in it."""
    sa = dst.geometry.array_axis(2)
    kernel = tuple(f for d, f in enumerate(dst.factors) if d != sa)
    z = torch.from_numpy(np.ascontiguousarray(zone_full)).to(torch.float32)
    share = torch.nn.functional.avg_pool2d(z[None, None], kernel_size=kernel, stride=kernel, ceil_mode=True)[0, 0]
    return (share >= 0.5).numpy()


def _tissue_beside(zone_full: np.ndarray, grid: Grid, body_hu: float) -> torch.Tensor:
    """Tissue on ``grid``'s (pooled) voxels as above ``body_hu`` once the table ``zone_full`` (the volume's own in-plane
    pixels) reads as air: a working voxel that takes in a bright shell's edge and the air above it is not tissue."""
    sa = grid.geometry.array_axis(2)
    hu = morph.to_tensor(grid.full.array, grid.hu.device).to(torch.float32)
    hu = hu.masked_fill(morph.to_tensor(np.ascontiguousarray(zone_full), hu.device).unsqueeze(sa), AIR_HU)
    pooled = torch.nn.functional.avg_pool3d(hu[None, None], kernel_size=grid.factors, stride=grid.factors, ceil_mode=True)
    return pooled[0, 0] > body_hu


def body_and_table(grid: Grid, p: SegmentParams) -> tuple[np.ndarray, np.ndarray | None]:
    """The patient's body on the working grid (bool ``[k, j, i]``; all False when nothing is above ``body_hu``) and the
    table zone on the volume's own in-plane pixels (2-D bool, in-plane axes in array order; None without a table).

    Table, couch, mattress and blankets are left out, arms kept, air inside the outline
    filled per slice (see the module docstring). The table is looked for on pixels of about
    :data:`TABLE_PIXEL_MM` in-plane (:func:`_table_grid`), also when the working grid is coarser: a working pixel is
    in its zone when at least half of it is.
    """
    sa = grid.geometry.array_axis(2)
    tissue = grid.hu > p.body_hu
    fine = _table_grid(grid)
    found = table_zone(tissue if fine is grid else fine.hu > p.body_hu, fine)
    zone, zone_full = found, None
    if found is not None:
        zone_full = _zone_full(found, fine)
        if fine is not grid:
            zone = _zone_on(zone_full, grid)
            tissue = _tissue_beside(zone_full, grid, p.body_hu)
    zone_t = None
    if zone is not None:
        zone_t = morph.to_tensor(zone, tissue.device).unsqueeze(sa).expand_as(tissue)
        log.debug("table zone: %d pixels per slice", int(zone.sum()))
        tissue = tissue & ~zone_t
    opened = morph.opening(tissue, grid.radius(p.body_open_mm))
    labels, sizes = morph.label(opened.cpu().numpy())
    if sizes.size <= 1 or sizes.max() == 0:
        return np.zeros(tuple(grid.hu.shape), dtype=bool), zone_full
    trunk = int(np.argmax(sizes))
    keep = [trunk, *_patient_like(labels, sizes, trunk, grid, grid.hu, zone_t)]
    body = morph.keep_labels(labels, keep, sizes.size - 1)
    return fill_cut_air(body, sa), zone_full


def segment_body(grid: Grid, p: SegmentParams) -> np.ndarray:
    """The patient's body on the working grid (bool ``[k, j, i]``), without the table: :func:`body_and_table`."""
    return body_and_table(grid, p)[0]
