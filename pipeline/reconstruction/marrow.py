"""Marrow inside bone, slice by slice: holes enclosed by bone, and marrow behind a cortex broken by partial volume.

A slice of bone (an in-plane mask on the working grid, arrays ``[k, j, i]``, LPS mm) encloses
marrow: the cancellous interior of a vertebral body, the medullary cavity of a long bone. Holes
of the slice are marrow when dense enough (mean above ``MARROW_HU``; the spinal canal's CSF is
below) or, for fatty marrow of any HU, away from the body's x mid-line (a long bone, not the
spinal canal); see :func:`fill_marrow`.

Where pixels are wider than the cortex (about 1 mm), the cortex around a vertebral body holds
only part of each pixel it crosses and its ring breaks into pieces: the marrow inside is no
longer a hole but joins the tissue outside through the gaps. :func:`fill_rimmed_marrow` takes
such marrow from its own density and the bone around it: a region of the slice denser than
soft tissue (in-plane 3x3 mean above ``MARROW_LOW_HU``) whose in-plane rim is at least
``MARROW_RIM_MIN`` bone. An intervertebral disc (fibrocartilage, 70-95 HU) in a slice rimmed by its
vertebrae's endplates is as dense, but it is smooth: a region below ``MARROW_HU`` whose HU spreads
less than ``DISC_SPREAD`` times the image noise (over at least ``DISC_MIN_MM2``) is a disc, not fatty
marrow, whose trabeculae spread its HU well beyond the noise (fatty marrow of an elderly vertebra,
50-150 HU, stays marrow).

Fatty marrow (a sacral ala's, an iliac wing's: 30-60 HU, like muscle) behind such a broken cortex is
below ``MARROW_LOW_HU``: :func:`fill_fatty_marrow` takes a region of the slice above ``FATTY_MARROW_HU``
(the spinal canal's CSF and fat are below) whose in-plane rim is at least ``FATTY_RIM_MIN`` bone, whose
trabeculae spread its HU beyond the noise (muscle, as smooth as a disc, stays out), and whose centre lies
more than ``CANAL_CLEAR_MM`` from the body's mid-line (the spinal canal, whose cord and nerve roots are as
dense and as spread, lies on it).

A slice where no cortex was found at all (a low-density vertebral level on pixels too wide for
its cortex to fill half of them) has no ring to enclose its marrow, but bone lies in the slices just above and below
it: :func:`fill_between_slices` takes a region of the slice denser than soft tissue (in-plane 3x3
mean above ``MARROW_LOW_HU``) whose mean is that of marrow (above ``MARROW_HU``; intervertebral
discs, 70-90 HU, and the spinal canal are below) and whose voxels mostly have bone within
``MARROW_GAP_MM`` both above and below them along the slice axis.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from . import morph

MARROW_HU = 100.0  # mean HU of marrow enclosed by bone (the spinal canal is below)
MARROW_MAX_MM2 = 3000.0  # largest enclosed marrow area per slice (mm²): not the chest cavity
CANAL_FRACTION = 0.2  # the spinal canal lies within this share of the body's x extent of its mid-line
SPECK_MM2 = 12.0  # holes in a slice of bone up to this area (mm²) are noise, filled whatever their HU
MIDLINE_FREE_SHARE = 0.25  # share of a slice's body clear of the image's x edges that still tells its mid-line
MARROW_LOW_HU = 75.0  # marrow behind a broken cortex is denser than this (in-plane 3x3 mean, HU): muscle, CSF are below
MARROW_RIM_MIN = 0.5  # share of its in-plane rim on bone above which a dense region is marrow behind a broken cortex
DISC_SPREAD = 1.7  # a region below MARROW_HU whose HU spreads less than this times the image noise is a disc
DISC_MIN_MM2 = 150.0  # a region this large (mm²) or larger has a spread that tells a disc (fewer pixels: too few to tell)
FATTY_MARROW_HU = 25.0  # fatty marrow behind a broken cortex is denser than this (in-plane 3x3 mean, HU): CSF, fat are below
FATTY_RIM_MIN = 0.7  # share of its in-plane rim on bone above which a fatty region is marrow behind a broken cortex
CANAL_CLEAR_MM = 20.0  # a region whose centre lies this far (mm) from the body's mid-line is not the spinal canal
MARROW_GAP_MM = 6.0  # marrow between bone this close above and below along the slice axis (mm) is a level the cortex missed
MARROW_BETWEEN_MIN = 0.5  # share of a dense region of a slice with bone above and below it for the region to be marrow


def _label_mean(flat: np.ndarray, values: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per label ``0..n`` (``size``: its voxel count, ``n + 1`` long): the mean of ``values`` over its voxels (0 if none).

    ``flat`` is the raveled label array, ``values`` an array of its shape (HU, mm, or 0/1 for a share).
    """
    return np.bincount(flat, weights=values.ravel(), minlength=size.size) / np.maximum(size, 1)


def midline_x(body: np.ndarray, x: np.ndarray, slice_axis: int, tol_mm: float) -> np.ndarray:
    """Per slice ``(n, 2)``: the body's median LPS x and half its x extent (mm).

    Where the body reaches the image's x edges (within ``tol_mm``: arms at the sides, a small
    field of view), only the lines of the slice along x that stay inside the image count
    (the trunk in front of and behind the arms), when they hold at least
    :data:`MIDLINE_FREE_SHARE` of the slice's body. NaN where the slice holds no body or too
    little of it is clear of the x edges: there the mid-line is unknown. ``x`` is the LPS x
    (mm) of every voxel, shaped like ``body``.
    """
    n = body.shape[slice_axis]
    out = np.full((n, 2), np.nan)
    lo, hi = float(x.min()), float(x.max())
    # slices as views (x is often a broadcast array: np.take would copy all of it for every slice)
    body_by_slice, x_by_slice = np.moveaxis(body, slice_axis, 0), np.moveaxis(x, slice_axis, 0)
    for k in range(n):
        b = body_by_slice[k]
        if not b.any():
            continue
        xs = x_by_slice[k]
        cut = b & ((xs <= lo + tol_mm) | (xs >= hi - tol_mm))
        if cut.any():
            steps = [float(np.abs(np.diff(xs, axis=a)).mean()) if xs.shape[a] > 1 else 0.0 for a in (0, 1)]
            along = int(np.argmax(steps))  # the in-plane array axis along which x runs
            free = b & ~cut.any(axis=along, keepdims=True)
            if free.sum() < MIDLINE_FREE_SHARE * b.sum():
                continue
            b = free
        bx = xs[b]
        out[k] = float(np.median(bx)), 0.5 * float(bx.max() - bx.min())
    return out


def _off_midline(
    labels: np.ndarray, size: np.ndarray, slice_axis: int, midline: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per label ``0..n`` of the in-plane ``labels`` (``size``: voxel counts): how far its centre lies from its
    slice's mid-line, and half the body's x extent there (mm; NaN where the mid-line is unknown).

    ``midline``: per slice, :func:`midline_x`; ``x``: the LPS x (mm) of every voxel, broadcastable to ``labels``.
    """
    flat = labels.ravel()
    k = np.broadcast_to(
        np.arange(labels.shape[slice_axis]).reshape([-1 if a == slice_axis else 1 for a in range(3)]), labels.shape
    ).ravel()
    cx = _label_mean(flat, np.broadcast_to(x, labels.shape), size)
    ks = np.zeros(size.size, dtype=np.int64)
    ks[flat] = k
    return np.abs(cx - midline[ks, 0]), midline[ks, 1]


def fill_marrow(
    mask: np.ndarray,
    hu: np.ndarray,
    slice_axis: int,
    pixel_mm2: float,
    *,
    midline: np.ndarray | None = None,
    x: np.ndarray | None = None,
    speck_mm2: float = 0.0,
) -> np.ndarray:
    """Fill per-slice holes of ``mask`` that are marrow or noise (mean HU, area, position; see the module docstring).

    With ``midline`` (per slice of ``mask``: :func:`midline_x`) and ``x`` (LPS x of every voxel,
    mm, shaped like ``mask``), a hole of any HU more than :data:`CANAL_FRACTION` of the body's x
    extent from its mid-line is marrow too (where the mid-line is known).
    """
    structure = morph.in_plane_cross(slice_axis)
    labels, n = ndimage.label(~mask, structure=structure)
    if n == 0:
        return mask
    outside = morph.labels_on_border(labels, n, slice_axis=slice_axis)
    flat = labels.ravel()
    size = np.bincount(flat, minlength=n + 1)
    mean = _label_mean(flat, hu, size)
    area = size * pixel_mm2
    fill = ~outside & (area <= MARROW_MAX_MM2) & (mean >= MARROW_HU)
    fill |= ~outside & (area <= speck_mm2)
    if midline is not None and x is not None:
        off, half = _off_midline(labels, size, slice_axis, midline, x)
        with np.errstate(invalid="ignore"):
            lateral = off > CANAL_FRACTION * 2.0 * half
        fill |= ~outside & (area <= MARROW_MAX_MM2) & lateral
    fill[0] = False
    return mask | fill[labels]


def fill_rimmed_marrow(
    mask: np.ndarray,
    dense: np.ndarray,
    slice_axis: int,
    pixel_mm2: float,
    *,
    hu: np.ndarray | None = None,
    noise_hu: float = 0.0,
    rim_min: float = MARROW_RIM_MIN,
) -> np.ndarray:
    """``mask`` with the marrow behind a broken cortex added (bool ``[k, j, i]``, like ``mask``).

    ``dense``: the voxels that may be marrow (in-plane 3x3 mean above :data:`MARROW_LOW_HU`,
    blood pools left out). Each in-plane connected region of ``dense`` outside ``mask`` (4-connected
    in its slice; ``slice_axis`` is the array axis across the slices) of at most
    :data:`MARROW_MAX_MM2` (``pixel_mm2``: one pixel's area, mm²) whose in-plane rim (its
    4-neighbours outside it) is at least ``rim_min`` (default :data:`MARROW_RIM_MIN`) on ``mask`` is marrow. A region
    of the slice that is mostly surrounded by something other than bone (muscle, an organ,
    the spinal canal's CSF) stays out.

    With ``hu`` (the unsmoothed HU of every voxel, shaped like ``mask``) and ``noise_hu`` (the
    image noise, HU: :func:`.local_hu.image_noise`), a region whose mean is below :data:`MARROW_HU`
    and whose HU standard deviation is below :data:`DISC_SPREAD` times ``noise_hu``, over at least
    :data:`DISC_MIN_MM2` (too few pixels do not tell their spread), is smooth
    fibrocartilage, an intervertebral disc between two endplates, and stays out too.
    """
    structure = morph.in_plane_cross(slice_axis)
    labels, n = ndimage.label(dense & ~mask, structure=structure)
    if n == 0:
        return mask
    footprint = structure.astype(bool)
    ring = np.where(labels > 0, 0, ndimage.grey_dilation(labels, footprint=footprint))  # a neighbour's label
    on_ring = ring > 0
    ring_n = np.bincount(ring[on_ring], minlength=n + 1)
    rim_n = np.bincount(ring[on_ring & mask], minlength=n + 1)
    area = np.bincount(labels.ravel(), minlength=n + 1) * pixel_mm2
    fill = (rim_n >= rim_min * np.maximum(ring_n, 1)) & (area <= MARROW_MAX_MM2)
    if hu is not None and noise_hu > 0.0:
        flat = labels.ravel()
        size = np.bincount(flat, minlength=n + 1)
        mean = _label_mean(flat, hu, size)
        spread = np.sqrt(np.maximum(_label_mean(flat, hu.astype(np.float64) ** 2, size) - mean**2, 0.0))
        fill &= (mean >= MARROW_HU) | (spread >= DISC_SPREAD * noise_hu) | (area < DISC_MIN_MM2)
    fill[0] = False
    return mask | fill[labels]


def fill_fatty_marrow(
    mask: np.ndarray,
    fatty: np.ndarray,
    slice_axis: int,
    pixel_mm2: float,
    *,
    hu: np.ndarray,
    noise_hu: float,
    midline: np.ndarray,
    x: np.ndarray,
) -> np.ndarray:
    """``mask`` with the fatty marrow behind a broken cortex added, away from the spinal canal (bool ``[k, j, i]``).

    ``fatty``: the voxels that may be fatty marrow (in-plane 3x3 mean above :data:`FATTY_MARROW_HU`, blood
    pools left out). As :func:`fill_rimmed_marrow` (``hu``: unsmoothed HU, ``noise_hu``: the image noise, HU),
    with at least :data:`FATTY_RIM_MIN` of the region's in-plane rim on ``mask``, smooth regions (muscle, a
    disc) left out; of those, the regions whose centre lies more than :data:`CANAL_CLEAR_MM` from their slice's
    mid-line (``midline``: per slice, :func:`midline_x`; ``x``: the LPS x of every voxel, mm) are marrow.
    """
    added = fill_rimmed_marrow(mask, fatty, slice_axis, pixel_mm2, hu=hu, noise_hu=noise_hu, rim_min=FATTY_RIM_MIN) & ~mask
    labels, n = ndimage.label(added, structure=morph.in_plane_cross(slice_axis))
    if n == 0:
        return mask
    off, _ = _off_midline(labels, np.bincount(labels.ravel(), minlength=n + 1), slice_axis, midline, x)
    with np.errstate(invalid="ignore"):
        fill = off > CANAL_CLEAR_MM
    fill[0] = False
    return mask | fill[labels]


def _bone_within(mask: np.ndarray, slice_axis: int, steps: int, direction: int) -> np.ndarray:
    """Voxels with a voxel of ``mask`` 1..``steps`` slices away along ``slice_axis`` (``direction`` +1 or -1)."""
    out = np.zeros_like(mask)
    n = mask.shape[slice_axis]
    for s in range(1, min(steps, n - 1) + 1):
        src = [slice(None)] * 3
        dst = [slice(None)] * 3
        if direction > 0:
            src[slice_axis], dst[slice_axis] = slice(s, n), slice(0, n - s)
        else:
            src[slice_axis], dst[slice_axis] = slice(0, n - s), slice(s, n)
        out[tuple(dst)] |= mask[tuple(src)]
    return out


def fill_between_slices(
    mask: np.ndarray, dense: np.ndarray, hu: np.ndarray, slice_axis: int, pixel_mm2: float, slice_mm: float
) -> np.ndarray:
    """``mask`` with the marrow of slices between bone above and below added (bool ``[k, j, i]``, like ``mask``).

    ``dense``: the voxels that may be marrow (in-plane 3x3 mean above :data:`MARROW_LOW_HU`, blood
    pools left out); ``hu``: the HU of every voxel. Each in-plane connected region of ``dense``
    outside ``mask`` (4-connected in its slice; ``slice_axis`` is the array axis across the slices,
    ``slice_mm`` their spacing in mm) of at most :data:`MARROW_MAX_MM2` (``pixel_mm2``: one pixel's
    area, mm²), with a mean above :data:`MARROW_HU` (intervertebral discs and the spinal canal are
    below), of whose voxels at least :data:`MARROW_BETWEEN_MIN` have ``mask`` within
    :data:`MARROW_GAP_MM` both above and below is marrow: bone runs on along the body's axis, so a
    level between bone whose cortex no slice showed is bone too. The liver or a bowel loop is
    larger than the area limit, or not between bone.
    """
    steps = max(1, int(round(MARROW_GAP_MM / slice_mm)))
    between = _bone_within(mask, slice_axis, steps, +1) & _bone_within(mask, slice_axis, steps, -1)
    labels, n = ndimage.label(dense & ~mask, structure=morph.in_plane_cross(slice_axis))
    if n == 0:
        return mask
    flat = labels.ravel()
    size = np.bincount(flat, minlength=n + 1)
    n_between = np.bincount(flat, weights=between.ravel(), minlength=n + 1)
    mean = _label_mean(flat, hu, size)
    fill = (n_between >= MARROW_BETWEEN_MIN * np.maximum(size, 1)) & (size * pixel_mm2 <= MARROW_MAX_MM2)
    fill &= mean >= MARROW_HU
    fill[0] = False
    return mask | fill[labels]
