"""The lung surface: what a lung takes in at its boundary (masks ``[k, j, i]``, LPS geometry, HU).

:func:`fill_lung` closes small gaps and fills what the lung surrounds (vessels, nodules inside it);
:func:`pleural_notches` finds the tissue of nodules on the pleura, which LUNA16-style lung masks
hold; :func:`boundary_threshold` and :func:`adjust_boundary` put the boundary where a voxel is
half parenchyma, half soft tissue.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from ..volume import Geometry
from . import morph
from .grid import bbox
from .organs import SegmentParams

BOUNDARY_MAX_HU = -350.0  # the lung boundary threshold (half-way to soft tissue, not an air threshold) never goes above this
NOTCH_GRID_MM = 2.0  # notches are looked for on a grid of about this voxel size
NOTCH_CLOSE_MM = 15.0  # a ball closing of this radius finds the notches juxtapleural nodules make
NOTCH_MAX_ML = 15.0  # a notch holds at most this much tissue (a 3 cm nodule)
NOTCH_MIN_ML = 0.05  # and at least this much (not the gaps between vessels at the lung surface)
NOTCH_WRAPPED = 0.6  # and lung makes at least this share of its outer shell
NOTCH_MAX_EXTENT_MM = 40.0  # and spans at most this much along every axis (not a wedge along the aorta)
NOTCH_AIRWAY_MM = 15.0  # nor comes this close to the airway (the hilum's vessels and bronchi)
HOLE_MAX_MM2 = 300.0  # a lung's in-plane hole larger than this (mm²) is filled only where enclosed in 3-D or at the hilum
HILUM_MM = 20.0  # a large in-plane hole this close to the airway is a hilar vessel (filled)


def boundary_threshold(hu: np.ndarray, lungs: np.ndarray, p: SegmentParams) -> float:
    """The HU half-way between the lungs' parenchyma (median of their interior) and soft tissue (``tissue_hu``).

    That is where a partial-volume voxel is half lung; clipped to ``lung_hu`` .. :data:`BOUNDARY_MAX_HU`.
    """
    core = morph.erode(morph.to_tensor(lungs, "cpu"), (1, 1, 1)).numpy()
    values = hu[core] if core.any() else hu[lungs]
    if values.size == 0:
        return p.lung_hu
    level = float(np.median(values))
    return float(np.clip(0.5 * (level + p.tissue_hu), p.lung_hu, BOUNDARY_MAX_HU))


def adjust_boundary(mask: np.ndarray, hu: np.ndarray, threshold: float, allowed: np.ndarray) -> np.ndarray:
    """Re-decide the one-voxel band either side of the mask's boundary by ``threshold`` (within ``allowed``)."""
    box = bbox(mask, 2)
    if box is None:
        return mask
    t = morph.to_tensor(mask[box], "cpu")
    band = (morph.dilate(t, (1, 1, 1)) & ~morph.erode(t, (1, 1, 1))).numpy()
    out = mask.copy()
    sub = out[box]
    sub[band] = (hu[box][band] < threshold) & allowed[box][band]
    out[box] = sub
    return out


def _pool(mask: np.ndarray, f: tuple[int, int, int], any_voxel: bool) -> np.ndarray:
    """Down-sample a bool mask by integer factors (k, j, i): a coarse voxel is set by majority (or by any)."""
    t = torch.from_numpy(np.ascontiguousarray(mask)).to(torch.float32)[None, None]
    mean = F.avg_pool3d(t, kernel_size=f, stride=f, ceil_mode=True)[0, 0].numpy()
    return mean > 0 if any_voxel else mean >= 0.5


def _unpool(coarse: np.ndarray, f: tuple[int, int, int], shape: tuple[int, ...]) -> np.ndarray:
    out = coarse
    for axis, n in enumerate(f):
        if n > 1:
            out = np.repeat(out, n, axis=axis)
    return out[: shape[0], : shape[1], : shape[2]]


def pleural_notches(
    mask: np.ndarray, geometry: Geometry, airway: np.ndarray | None, other: np.ndarray | None = None
) -> np.ndarray:
    """Tissue in the notches that juxtapleural nodules make in a lung's surface (bool, same grid).

    A closing with a ball of :data:`NOTCH_CLOSE_MM` (exact, by distance transforms, on a grid of
    about :data:`NOTCH_GRID_MM`) fills every concavity narrower than the ball; of what it adds, a
    connected piece is a notch when it is nodule-sized (:data:`NOTCH_MIN_ML` to :data:`NOTCH_MAX_ML`,
    at most :data:`NOTCH_MAX_EXTENT_MM` along each axis), wrapped by lung (at least
    :data:`NOTCH_WRAPPED` of its outer shell) and away from the airway; the wide concavities of the
    mediastinum, the hilum, the diaphragm's dome and the long wedges beside the aorta are left out.
    LUNA16-style lung masks hold such nodules.
    """
    spacing = np.asarray(geometry.spacing, dtype=np.float64)[::-1]  # (k, j, i) mm
    f = tuple(max(1, int(round(NOTCH_GRID_MM / s))) for s in spacing)
    fk, fj, fi = f
    sp = spacing * np.asarray(f)
    pad = (int(np.ceil(NOTCH_CLOSE_MM / sp.min())) + 1) * max(f)
    box = bbox(mask, pad)
    out = np.zeros_like(mask)
    if box is None:
        return out
    fine = mask[box]
    sub = _pool(fine, (fk, fj, fi), any_voxel=False)
    grown = ndimage.distance_transform_edt(~sub, sampling=sp) <= NOTCH_CLOSE_MM
    added = (ndimage.distance_transform_edt(grown, sampling=sp) > NOTCH_CLOSE_MM) & ~sub
    if other is not None:
        added &= ~_pool(other[box], (fk, fj, fi), any_voxel=True)
    if airway is not None and airway.any():
        aw = _pool(airway[box], (fk, fj, fi), any_voxel=True)
        added &= ~(ndimage.distance_transform_edt(~aw, sampling=sp) <= NOTCH_AIRWAY_MM)
    labels, sizes = morph.label(added)
    n = sizes.size - 1
    if n == 0:
        return out
    # share of each piece's outer shell that is lung: a nodule bulging into the lung is mostly wrapped by it
    shell = ndimage.grey_dilation(labels, size=(3, 3, 3)) * (labels == 0)
    lung_shell = np.bincount(shell[sub], minlength=n + 1)
    all_shell = np.bincount(shell[shell > 0], minlength=n + 1)
    wrapped = lung_shell >= NOTCH_WRAPPED * np.maximum(all_shell, 1)
    voxel_ml = float(np.prod(sp)) / 1000.0
    keep = []
    for lab, sl in enumerate(ndimage.find_objects(labels), start=1):
        if sl is None or not wrapped[lab] or not NOTCH_MIN_ML <= sizes[lab] * voxel_ml <= NOTCH_MAX_ML:
            continue
        if max((s.stop - s.start) * d for s, d in zip(sl, sp)) <= NOTCH_MAX_EXTENT_MM:
            keep.append(lab)
    notch = _unpool(morph.keep_labels(labels, keep, n), (fk, fj, fi), fine.shape) & ~fine
    if other is not None:
        notch &= ~other[box]
    out[box] = notch
    return out


def fill_slice_holes(mask: np.ndarray, geometry: Geometry, airway: np.ndarray | None = None) -> np.ndarray:
    """``mask`` (one lung, bool ``[k, j, i]``) with what it surrounds in each slice: vessels and nodules.

    A hole of more than :data:`HOLE_MAX_MM2` in a slice is filled only where the lung also encloses it in
    3-D (a large nodule) or where it comes within :data:`HILUM_MM` of ``airway`` (a hilar vessel beside
    its bronchus; same grid as ``mask``): the dome of the liver or of the spleen, surrounded by a lung base
    in the slices at its top, continues below the diaphragm (or past the scan's end) and is not lung.
    """
    sa = geometry.array_axis(2)
    holes = morph.fill_holes(mask, slice_axis=sa) & ~mask
    if not holes.any():
        return mask.copy()
    labels, n = ndimage.label(holes, structure=morph.in_plane_cross(sa))
    pixel_mm2 = float(np.prod([geometry.spacing[2 - a] for a in range(3) if a != sa]))
    big = np.bincount(labels.ravel(), minlength=n + 1) * pixel_mm2 > HOLE_MAX_MM2
    big[0] = False
    if big.any():
        keep = morph.fill_holes(mask)  # enclosed in 3-D
        if airway is not None and airway.any():
            near = morph.dilate(morph.to_tensor(airway, "cpu"), morph.radius_vox(HILUM_MM, geometry.spacing)).numpy()
            hilar = np.zeros(n + 1, dtype=bool)
            hilar[np.unique(labels[near & (labels > 0)])] = True
            keep |= hilar[labels]
        holes &= ~big[labels] | keep
    return mask | holes


def fill_lung(
    mask: np.ndarray,
    geometry: Geometry,
    device: torch.device | str,
    other: np.ndarray | None = None,
    close_mm: float = 3.0,
    airway: np.ndarray | None = None,
) -> np.ndarray:
    """Close and fill one lung so vessels and nodules inside it belong to it (never into ``other``).

    A closing of ``close_mm`` takes in the small concavities vessels make at the lung surface;
    per-slice hole filling takes in what the lung surrounds (:func:`fill_slice_holes`).
    """
    r = morph.radius_vox(close_mm, geometry.spacing)
    box = bbox(mask, max(r) + 1)
    out = np.zeros_like(mask)
    if box is None:
        return out
    sub = mask[box]
    closed = morph.closing(morph.to_tensor(sub, device), r).cpu().numpy()
    out[box] = fill_slice_holes(closed | sub, geometry, None if airway is None else airway[box])
    if other is not None:
        out &= ~other
    return out
