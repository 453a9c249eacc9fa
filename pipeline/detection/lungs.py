"""Lung region for the detector: a coarse lung mask, its box, and a "near the lungs" test.

The detector only needs the lungs' extent (to crop the network input) and a
tolerant inside/outside test (to drop findings outside the lungs), so it works
on a coarse grid (about 4 mm voxels). :func:`quick_lung_mask` thresholds the air
inside the body (bowel gas included); the segmented lungs limit the findings, as
the quick mask's ``limit`` (:meth:`LungRegion.limited_to`): a full-resolution mask
(the reconstruction stage's, or a phantom's) becomes a region with
:func:`region_from_mask`; without one, :func:`segmented_lung_region` segments the
lungs on the coarse grid itself. On a tilt-corrected grid, both read the unmeasured wedge as the image continued past
its edge, never as air, and leave it out of their masks (:func:`_searched`; the reconstruction reads it so too).

All index triples are (i, j, k) of the source series; arrays are ``[k, j, i]``. The coarse grid counts each axis
from its end lowest in LPS (:meth:`~pipeline.geometry.Geometry.descending_axes`), so that the voxels it samples, and
the box the network sees, do not depend on the order in which the scanner stored the slices, rows and columns.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

from ..ingest.measured import continued_past_edge, measured_mask
from ..intensity import LUNG_AIR_HU
from ..volume import CTVolume, LabelMap

log = logging.getLogger(__name__)

MIN_LUNG_ML = 2.0
#: Median HU below which an air region touching the image's in-plane border is the air around the patient (about
#: -1000 HU); a lung cut by a small field of view touches the border too, with a median well above it (about -850 HU).
OUTSIDE_AIR_MAX_MEDIAN_HU = -950.0
_IN_SLICE_CROSS = np.zeros((3, 3, 3), bool)
_IN_SLICE_CROSS[1] = ndimage.generate_binary_structure(2, 1)


class HoldsMasks(Protocol):
    """What holds organ masks by name as ``masks`` (a :class:`~pipeline.reconstruction.Reconstruction`)."""

    @property
    def masks(self) -> Mapping[str, LabelMap]: ...


@dataclass(frozen=True)
class LungRegion:
    """Coarse lung mask ``[k, j, i]`` sampled every ``stride`` (k, j, i) voxels of the source grid.

    ``mask`` is where candidates are searched. ``limit`` (optional, same coarse grid) is where findings must also
    lie (:meth:`keeps`): a case's segmented lungs within ``mask``, so that a search limited to them finds the same
    candidates, scored the same, as one without them (the search the operating point was calibrated with).
    """

    mask: np.ndarray
    stride: tuple[int, int, int]
    source_spacing: tuple[float, float, float]  # (si, sj, sk) mm
    limit: np.ndarray | None = None
    #: (i, j, k): source axes the coarse grid counts from their other end (they run towards decreasing LPS), with the
    #: source grid's size (i, j, k), which those need
    flips: tuple[bool, bool, bool] = (False, False, False)
    size_ijk: tuple[int, int, int] | None = None

    @property
    def empty(self) -> bool:
        return not bool(self.mask.any())

    def bbox_ijk(self, margin_mm: float, size_ijk: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Source index box ``lo <= (i, j, k) < hi`` around the lungs, grown by ``margin_mm``."""
        kji = np.argwhere(self.mask)
        st = np.asarray(self.stride[::-1])  # (i, j, k)
        lo = kji.min(0)[::-1] * st
        hi = (kji.max(0)[::-1] + 1) * st
        grow = np.ceil(margin_mm / np.asarray(self.source_spacing)).astype(int)
        size = np.asarray(size_ijk)
        lo = np.maximum(lo - grow, 0)
        hi = np.minimum(hi + grow, size)
        flips = np.asarray(self.flips)
        return np.where(flips, size - hi, lo), np.where(flips, size - lo, hi)  # counted from the source's own ends

    @property
    def _coarse_spacing_kji(self) -> np.ndarray:
        return np.asarray(self.source_spacing)[::-1] * np.asarray(self.stride)  # (k, j, i) mm

    @cached_property
    def _mask_distance(self) -> _Distance:
        """Distances (mm) to the lungs (``mask``); built once per region."""
        return _Distance(self.mask, self._coarse_spacing_kji)

    @cached_property
    def _limit_distance(self) -> _Distance | None:
        return None if self.limit is None else _Distance(self.limit, self._coarse_spacing_kji)

    def _lookup(self, dist: _Distance, ijk: np.ndarray, margin_mm: float) -> np.ndarray:
        ijk = self._from_source(np.atleast_2d(np.asarray(ijk, dtype=np.float64)))
        idx = np.round(ijk[:, ::-1] / np.asarray(self.stride)).astype(int)
        idx = np.clip(idx, 0, np.asarray(self.mask.shape) - 1)
        return dist.at(idx) <= margin_mm

    def _from_source(self, ijk: np.ndarray) -> np.ndarray:
        """Source indices ``(n, 3)`` (i, j, k) counted as the coarse grid counts them (flipped axes from their end)."""
        if not any(self.flips):
            return ijk
        if self.size_ijk is None:
            raise ValueError("a lung region with flipped axes needs the source grid's size_ijk")
        last = np.asarray(self.size_ijk, dtype=np.float64) - 1.0
        return np.where(np.asarray(self.flips), last - ijk, ijk)

    def near(self, ijk: np.ndarray, margin_mm: float) -> np.ndarray:
        """True for source indices ``(n, 3)`` within ``margin_mm`` of the searched lungs (``mask``)."""
        return self._lookup(self._mask_distance, ijk, margin_mm)

    def keeps(self, ijk: np.ndarray, margin_mm: float, *, radius_mm: np.ndarray | None = None) -> np.ndarray:
        """True for source indices ``(n, 3)`` within ``margin_mm`` of the lungs and of the ``limit`` if any.

        With ``radius_mm`` (each finding's radius, mm), a finding is kept only where it reaches the ``limit``: its
        centre lies within its own radius (and ``margin_mm``) of the limit's coarse voxels, each taken as the block of
        source voxels it stands for (:meth:`limit_distance_mm`). A nodule bulging from the pleura reaches the lungs;
        a blob in the mediastinum or chest wall, its centre farther from the lungs than its radius, does not, whatever
        the voxel size (a fixed margin of 8 mm is two pixels of a 4 mm series, one at most beyond a nodule's edge)."""
        near = self.near(ijk, margin_mm)
        if self._limit_distance is None:
            return near
        if radius_mm is None:
            return near & self._lookup(self._limit_distance, ijk, margin_mm)
        reach = np.minimum(float(margin_mm), np.broadcast_to(np.asarray(radius_mm, dtype=np.float64), near.shape))
        return near & (self.limit_distance_mm(ijk) <= reach)

    def limit_distance_mm(self, ijk: np.ndarray) -> np.ndarray:
        """Distance (mm) from source indices ``(n, 3)`` (i, j, k; fractional) to the ``limit`` (0 inside; infinite
        without a limit or for an empty one): to the nearest limit voxel's block, the source voxels ``n * stride`` to
        ``(n + 1) * stride - 1`` along each axis that the coarse voxel ``n`` stands for (their outer faces), in the
        source grid's mm."""
        ijk = self._from_source(np.atleast_2d(np.asarray(ijk, dtype=np.float64)))
        if self._limit_distance is None:
            return np.full(len(ijk), np.inf)
        src = np.asarray(self.source_spacing)[::-1]  # (k, j, i) mm
        st = np.asarray(self.stride, dtype=np.float64)
        return self._limit_distance.to_blocks(ijk[:, ::-1] * src, -0.5 * src, (st - 0.5) * src)

    def limited_to(self, other: LungRegion) -> LungRegion:
        """This region searched as it is, its findings limited to ``other`` (within this mask; same coarse grid, as
        :func:`quick_lung_mask` and :func:`region_from_mask` give for one volume). A small lung of ``other`` (at least
        :data:`MIN_LUNG_ML`, under half the lungs both hold, clear of the image border) this mask mostly leaves out (a lung collapsed to a few percent of the other, which the threshold mask's largest
        components leave out) is searched too, and its findings kept."""
        if self.mask.shape != other.mask.shape or self.stride != other.stride or self.flips != other.flips:
            raise ValueError(
                f"lung regions on different coarse grids: {self.mask.shape} every {self.stride} voxels "
                f"(axes counted from the end: {self.flips}) vs {other.mask.shape} every {other.stride} ({other.flips})"
            )
        limit = self.mask & other.mask
        voxel_ml = float(np.prod(self._coarse_spacing_kji)) / 1000.0
        # none in common: the caller decides what to search
        missed = None
        if limit.any():  # a collapsed lung: smaller than half the lungs both masks hold
            missed = _parts_outside(other.mask, self.mask, MIN_LUNG_ML / voxel_ml, 0.5 * float(limit.sum()))
        if missed is None:
            return replace(self, limit=limit)
        log.info(
            "a lung the threshold mask leaves out (%d coarse voxels, a small or collapsed lung) is searched too",
            int(missed.sum()),
        )
        return replace(self, mask=self.mask | missed, limit=limit | missed)

    def unlimited(self) -> LungRegion:
        """This region without its ``limit``."""
        return self if self.limit is None else replace(self, limit=None)


def _parts_outside(mask: np.ndarray, searched: np.ndarray, min_voxels: float, max_voxels: float) -> np.ndarray | None:
    """The connected parts of ``mask`` (coarse ``[k, j, i]``) that ``searched`` leaves out (less than half of each in
    it: the in-slice growth of the threshold mask may touch a small lung beside the other) and that are a small
    lung: ``min_voxels`` to ``max_voxels``, clear of the in-plane image border (air around the patient is not); or
    None."""
    labels, n = ndimage.label(mask)
    if n == 0:
        return None
    size = np.bincount(labels.ravel(), minlength=n + 1)
    inside = np.bincount(labels[searched & mask], minlength=n + 1)
    border = np.unique(np.concatenate([labels[:, [0, -1], :].ravel(), labels[:, :, [0, -1]].ravel()]))
    small = (size >= min_voxels) & (size <= max_voxels) & ~np.isin(np.arange(n + 1), border)
    missed = np.nonzero((inside < 0.5 * size) & small)[0]
    missed = missed[missed > 0]
    return np.isin(labels, missed) if missed.size else None


class _Distance:
    """Euclidean distance (mm) from voxels of a coarse grid ``[k, j, i]`` (voxel sides ``spacing_kji`` mm) to the
    nearest voxel of ``mask`` (0 inside; infinite when ``mask`` is empty), as ``distance_transform_edt(~mask)``
    gives, for the few voxels asked: the nearest mask voxel to one outside is always on the mask's surface (one of
    its six neighbours is nearer otherwise), so a k-d tree holds the surface voxels only."""

    def __init__(self, mask: np.ndarray, spacing_kji: np.ndarray) -> None:
        self._mask = np.asarray(mask, bool)
        self._spacing = np.asarray(spacing_kji, dtype=np.float64)
        surface = self._mask & ~ndimage.binary_erosion(self._mask, border_value=0)
        points = np.argwhere(surface) * self._spacing
        self._tree = cKDTree(points) if len(points) else None

    def to_blocks(self, points_kji_mm: np.ndarray, lo_mm: np.ndarray, hi_mm: np.ndarray) -> np.ndarray:
        """Distance (mm) from points ``(n, 3)`` (k, j, i mm, as voxel ``n`` sits at ``n * spacing``) to the nearest
        block of ``mask``: voxel ``n`` fills ``n * spacing + lo_mm`` to ``n * spacing + hi_mm`` (``hi_mm - lo_mm`` is
        the spacing: the blocks tile the grid). 0 inside a block of the mask; infinite for an empty mask."""
        q = np.asarray(points_kji_mm, dtype=np.float64).reshape(-1, 3)
        lo, hi = np.asarray(lo_mm, dtype=np.float64), np.asarray(hi_mm, dtype=np.float64)
        out = np.full(len(q), np.inf)
        if self._tree is None:
            return out
        cell = np.floor((q - lo) / self._spacing).astype(int)
        inside_grid = np.all((cell >= 0) & (cell < np.asarray(self._mask.shape)), axis=1)
        held = np.zeros(len(q), bool)
        held[inside_grid] = self._mask[tuple(cell[inside_grid].T)]
        out[held] = 0.0
        centre = 0.5 * (lo + hi)
        half = 0.5 * (hi - lo)
        points = self._tree.data  # surface voxels, n * spacing: the nearest block is a surface voxel's
        for n in np.flatnonzero(~held):
            p = q[n] - centre
            d0 = self._tree.query(p)[0]
            near = points[self._tree.query_ball_point(p, d0 + float(np.linalg.norm(half)) + 1e-9)]
            gap = np.maximum(np.abs(near - p) - half, 0.0)
            out[n] = float(np.sqrt((gap**2).sum(axis=1)).min())
        return out

    def at(self, kji: np.ndarray) -> np.ndarray:
        """Distance (mm) of the voxels ``kji`` (n, 3; integer indices within the grid)."""
        kji = np.asarray(kji, dtype=int).reshape(-1, 3)
        out = np.zeros(len(kji))
        outside = ~self._mask[kji[:, 0], kji[:, 1], kji[:, 2]]
        if self._tree is None:
            out[outside] = np.inf
        elif outside.any():
            out[outside] = self._tree.query(kji[outside] * self._spacing)[0]
        return out


def _ascending(volume: CTVolume, array: np.ndarray) -> tuple[np.ndarray, tuple[bool, bool, bool]]:
    """``array`` ``[k, j, i]`` on ``volume``'s grid as a view whose axes run towards increasing LPS, and which source
    axes (i, j, k) that view reverses: a coarse grid sampled or binned from it is the same set of positions whatever
    the storage order."""
    flips = volume.geometry.descending_axes()
    axes = tuple(2 - c for c in range(3) if flips[c])
    return (np.flip(array, axis=axes) if axes else array), flips


def _searched(volume: CTVolume) -> tuple[np.ndarray, np.ndarray | None]:
    """``volume``'s HU array ``[k, j, i]`` as the lung search reads it, and the voxels some image measured (None when
    all were: the array is then the volume's own, and the search is unchanged).

    On a tilt-corrected grid (:func:`pipeline.ingest.measured.measured_mask`) each slice's unmeasured wedge reads as
    the image continued past its edge (:func:`~pipeline.ingest.measured.continued_past_edge`); the search then leaves
    the wedge out of its masks."""
    array = np.asarray(volume.array)
    measured = measured_mask(volume.geometry, volume.metadata)
    if measured is None:
        return array, None
    return continued_past_edge(array, measured), measured


def _region(mask: np.ndarray, stride: tuple[int, int, int], volume: CTVolume, flips: tuple[bool, bool, bool]) -> LungRegion:
    return LungRegion(mask, stride, volume.spacing, flips=flips, size_ijk=volume.geometry.size_ijk)


def strides(spacing_ijk: tuple[float, float, float], step_mm: float) -> tuple[int, int, int]:
    si, sj, sk = spacing_ijk
    return (max(1, int(round(step_mm / sk))), max(1, int(round(step_mm / sj))), max(1, int(round(step_mm / si))))


def _spanning(air: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Labels of the 3-D components of ``air`` ``[k, j, i]`` that, within one slice, reach from one side of the image
    to the other (a table's foam core, air around the patient); lungs never do: the mediastinum parts them."""
    flat, _ = ndimage.label(air, structure=_IN_SLICE_CROSS)
    across = np.union1d(np.intersect1d(flat[:, :, 0], flat[:, :, -1]), np.intersect1d(flat[:, 0, :], flat[:, -1, :]))
    across = across[across > 0]
    return np.unique(labels[np.isin(flat, across)]) if len(across) else np.zeros(0, labels.dtype)


def _label_medians(values: np.ndarray, labels: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Median of ``values`` over each label of ``index`` (as ``ndimage.median``, which sorts every labelled voxel;
    this reads each label's bounding box only)."""
    boxes = ndimage.find_objects(labels, max_label=int(index.max()))
    return np.array([np.median(values[boxes[n - 1]][labels[boxes[n - 1]] == n]) for n in index])


def quick_lung_mask(volume: CTVolume, *, step_mm: float = 4.0) -> LungRegion:
    """Threshold lung mask on a ~``step_mm`` grid: air inside the body (and lung cut by the field of view: air
    touching the image border whose median is above :data:`OUTSIDE_AIR_MAX_MEDIAN_HU` and that does not span the image
    from side to side), largest components, holes filled per slice, grown by one coarse voxel in each slice."""
    sk, sj, si = strides(volume.spacing, step_mm)
    searched, measured = _searched(volume)
    ascending, flips = _ascending(volume, searched)
    arr = np.asarray(ascending[::sk, ::sj, ::si], dtype=np.float32)
    air = arr < LUNG_AIR_HU  # air-filled lung (and the air around the patient)
    labels, n = ndimage.label(air)
    if n == 0:
        return _region(np.zeros_like(air), (sk, sj, si), volume, flips)
    # components touching the in-plane border are the air around the patient, unless they are lung parenchyma
    # cut by a small field of view: outside air has a median of about -1000 HU, aerated lung well above it
    border = np.unique(
        np.concatenate([labels[:, 0, :].ravel(), labels[:, -1, :].ravel(), labels[:, :, 0].ravel(), labels[:, :, -1].ravel()])
    )
    border = border[border > 0]
    sizes = ndimage.sum_labels(np.ones_like(labels), labels, index=np.arange(1, n + 1))
    if len(border):
        median_hu = _label_medians(arr, labels, border)
        sizes[border[(median_hu < OUTSIDE_AIR_MAX_MEDIAN_HU) | np.isin(border, _spanning(air, labels))] - 1] = 0
    voxel_ml = float(np.prod(volume.spacing)) * sk * sj * si / 1000.0
    keep = np.flatnonzero((sizes * voxel_ml >= MIN_LUNG_ML) & (sizes >= 0.1 * sizes.max()))
    keep = keep[np.argsort(sizes[keep])[::-1][:3]] + 1
    mask = np.isin(labels, keep)
    for z in range(mask.shape[0]):
        if mask[z].any():
            mask[z] = ndimage.binary_fill_holes(mask[z])
    # sampled every stride, the mask's edge lies up to one coarse voxel inside the lungs' (a nodule against the
    # mediastinum or chest wall would fall that much further out): grown by one coarse voxel in each slice
    mask = ndimage.binary_dilation(mask, structure=_IN_SLICE_CROSS)
    if measured is not None:  # the sampled voxels no image measured are never lung
        mask &= _ascending(volume, measured)[0][::sk, ::sj, ::si]
    log.debug("quick lung mask: %d components kept, %.0f mL", len(keep), mask.sum() * voxel_ml)
    return _region(mask, (sk, sj, si), volume, flips)


def block_means(array: np.ndarray, step_kji: tuple[int, int, int]) -> np.ndarray:
    """``array`` ``[k, j, i]`` averaged over blocks of ``step_kji`` voxels (float32; a last, partial block over the
    voxels it has): a thin diaphragm between a lung base and bowel gas stays denser than air, where sampling every
    step-th voxel could skip it."""
    import torch

    x = torch.tensor(np.ascontiguousarray(array), dtype=torch.float32)[None, None]  # a copy: read-only or flipped arrays
    return torch.nn.functional.avg_pool3d(x, step_kji, step_kji, ceil_mode=True)[0, 0].numpy()


def segmented_lung_region(volume: CTVolume, *, device: str | None = None, step_mm: float = 4.0) -> LungRegion:
    """The lungs the reconstruction's segmentation finds in ``volume``, as a :class:`LungRegion` on the grid of
    :func:`quick_lung_mask` (every ``step_mm`` or so; empty when it finds none): the segmentation runs on that grid,
    each coarse voxel the mean of the block of voxels it stands for (about half a second for a 512 × 512 × 141
    chest on 2 CPU cores).

    Unlike :func:`quick_lung_mask`, it tells lung parenchyma from pure gas (bowel, stomach, colon) and keeps the
    lungs apart from air below the diaphragm (:mod:`pipeline.reconstruction.lungs`): the detector limits its
    findings to it when no lung mask is given (:meth:`pipeline.detection.infer.Detector.lung_roi`).
    """
    from ..reconstruction.organs import SegmentParams
    from ..reconstruction.segment import segment_organs

    st = strides(volume.spacing, step_mm)
    searched, measured = _searched(volume)
    ascending, flips = _ascending(volume, searched)
    coarse = CTVolume(block_means(ascending, st), volume.geometry.flipped(flips).binned(st))
    seg = segment_organs(coarse, organs=("lung_left", "lung_right"), device=device, params=SegmentParams(cpu_threads=None))
    for organ, error in seg.errors.items():
        log.info("lung segmentation: %s: %s", organ, error)
    lungs = [seg.masks[o] for o in ("lung_left", "lung_right") if o in seg.masks]
    mask = np.logical_or.reduce(lungs) if lungs else np.zeros(coarse.shape, bool)
    if measured is not None:  # a block mostly unmeasured is not lung
        mask &= block_means(_ascending(volume, measured)[0], st) > 0.5
    return _region(np.asarray(mask, bool), st, volume, flips)


def _lung_voxels(mask: np.ndarray | LabelMap) -> np.ndarray:
    """Bool ``[k, j, i]``: a :class:`LabelMap`'s labels whose name contains "lung" (all its labels when none does),
    or an array's non-zero voxels."""
    if isinstance(mask, LabelMap):
        names = [v for v in mask.labels.values() if "lung" in v.lower()]
        return np.logical_or.reduce([mask.mask(n) for n in names]) if names else mask.array > 0
    return np.asarray(mask) > 0


def _whole_values(array: np.ndarray) -> bool:
    """Whether every value of the float ``array`` is a whole number (a 0/1 mask read as floats, e.g. by nibabel)."""
    return bool(np.all(np.mod(array, 1.0) == 0.0))


def region_from_mask(
    mask: np.ndarray | LabelMap | Mapping[str, np.ndarray | LabelMap] | HoldsMasks, volume: CTVolume, *, step_mm: float = 4.0
) -> LungRegion:
    """A :class:`LungRegion` from a full-resolution mask on ``volume``'s grid.

    ``mask`` is a bool/int array ``[k, j, i]``, a :class:`LabelMap` (labels whose
    name contains "lung") or a dict of masks (keys containing "lung", arrays or
    :class:`LabelMap`; e.g. a phantom's or a reconstruction's ``masks``), or what holds such a dict as ``masks``
    (the :class:`~pipeline.reconstruction.Reconstruction` of ``volume``).
    """
    from ..errors import GeometryError

    held = getattr(mask, "masks", None)
    holder = None
    if not isinstance(mask, (Mapping, np.ndarray, LabelMap)) and isinstance(held, Mapping):
        holder, mask = type(mask).__name__, dict(held)
    items: list[tuple[str, Any]] = list(mask.items()) if isinstance(mask, Mapping) else [("mask", mask)]
    if isinstance(mask, Mapping):
        items = [(name, m) for name, m in items if "lung" in str(name).lower()]
        if not items and holder is not None:
            raise GeometryError(
                f"the {holder} given as lung mask holds no lung mask (its masks: {sorted(map(str, mask))})",
                where="lung_mask",
                fix="reconstruct the lungs too, e.g. reconstruct(volume, organs=['lung_left', 'lung_right', ...]), or "
                "leave lung_mask out (the detector then segments the lungs itself)",
            )
        if not items:
            raise GeometryError(
                f"no key of the lung mask dict names a lung (keys: {sorted(map(str, mask))})",
                fix="name the lung masks with 'lung' in their keys (e.g. lung_left, lung_right), or pass one mask",
            )
    for name, m in items:
        if isinstance(m, np.ndarray) and m.dtype.kind == "f" and not _whole_values(m):
            finite = m[np.isfinite(m)]
            span = f"{float(finite.min()):g}..{float(finite.max()):g}" if finite.size else "no finite value"
            raise GeometryError(
                f"the lung mask {name!r} holds fractional values ({m.dtype}, {span}): a probability map, not a mask "
                "(every voxel above 0 would count as lung)",
                where="lung_mask",
                fix="pass a bool mask, e.g. lung_mask=probabilities > 0.5",
            )
        if isinstance(m, LabelMap) and not m.geometry.same_grid(volume.geometry):
            raise GeometryError(
                f"the lung mask {name!r} lies on another grid than the volume (origin {m.geometry.origin} vs "
                f"{volume.geometry.origin} mm LPS, spacing {m.geometry.spacing} vs {volume.geometry.spacing} mm)",
                fix="resample the mask onto the volume's grid (nearest neighbour) before passing it",
            )
        if not isinstance(m, (np.ndarray, LabelMap)):
            raise GeometryError(
                f"the lung mask {name!r} is a {type(m).__name__}, not an array [k, j, i] or a LabelMap",
                fix="read it first, e.g. LabelMap(sitk.GetArrayFromImage(img), volume.geometry) for an image file",
            )
    parts = [_lung_voxels(m) for _, m in items]
    for part in parts:
        if part.shape != volume.shape:
            raise GeometryError(
                f"lung mask shape {part.shape} differs from the volume's {volume.shape}",
                fix="pass a mask on the same grid as the volume ([k, j, i])",
            )
    full = np.logical_or.reduce(parts) if parts else np.zeros(volume.shape, bool)
    st = strides(volume.spacing, step_mm)
    ascending, flips = _ascending(volume, full)
    pad = [(0, (-n) % s) for n, s in zip(ascending.shape, st)]
    padded = np.pad(ascending, pad)
    shp = [padded.shape[d] // st[d] for d in range(3)]
    coarse = np.asarray(padded.reshape(shp[0], st[0], shp[1], st[1], shp[2], st[2]).any(axis=(1, 3, 5)))
    return _region(coarse, st, volume, flips)
