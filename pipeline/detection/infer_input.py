"""What the :class:`~pipeline.detection.infer.Detector` checks and prepares on a case's volume before the network runs.

Inputs too small to hold a nodule with context are refused by name (:func:`refuse_small`), NaN or infinite voxels
set to air or, when too many, refused (:func:`clean_volume`), and the lungs to search found (:func:`lung_region`:
the threshold mask of the air-filled lungs limited to the given or segmented lungs) with the box the network input
is cropped to (:func:`lung_box`, source indices).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from ..cache import MAX_NONFINITE_FRACTION, NONFINITE_HU, NONFINITE_SET_TO_AIR_KEY, nonfinite_set_to_air
from ..errors import InputTooSmallError, InvalidVolumeError
from ..ingest.geometry import check_extent
from ..load import Roi
from ..volume import CTVolume, LabelMap, float3
from .lungs import HoldsMasks, LungRegion, quick_lung_mask, region_from_mask, segmented_lung_region

log = logging.getLogger(__name__)

MIN_INPUT_MM = 16.0  # inputs smaller than this on any axis cannot hold a nodule with context
MAX_BAD_VOXEL_FRACTION = MAX_NONFINITE_FRACTION  # the limit up to which the case cache sets them to air too

LungMask = np.ndarray | LabelMap | Mapping[str, np.ndarray] | HoldsMasks | LungRegion


def refuse_small(extent_mm: np.ndarray, where: str, what: str, axes: str) -> None:
    """Raise :class:`InputTooSmallError` when ``extent_mm`` (mm along ``axes`` of the ``what``) is
    under :data:`MIN_INPUT_MM` on an axis: a single slice or a tiny crop is refused by name, not left to fail in a
    later step (the lung mask's coarse grid needs a few voxels per axis)."""
    if np.any(extent_mm < MIN_INPUT_MM):
        raise InputTooSmallError(
            f"the {what} covers only {np.round(extent_mm, 1).tolist()} mm ({axes}); the detector needs at least {MIN_INPUT_MM} mm per axis",
            where=where,
            fix="pass the whole chest series (not a single slice or a tiny crop)",
        )


def volume_extent_mm(volume: CTVolume) -> np.ndarray:
    """The volume's size in mm along its columns, rows and slices."""
    return np.asarray(volume.geometry.size_ijk) * np.asarray(volume.spacing)


def check_volume_extent(volume: CTVolume, where: str) -> None:
    """Refuse a volume too small for the detector (:func:`refuse_small`) or larger than any CT scanner's field of
    view (:func:`pipeline.ingest.geometry.check_extent`: wrong spacing, which resampled to the model's grid would
    exhaust the memory) by name, before any work."""
    extent = volume_extent_mm(volume)
    refuse_small(extent, where, "volume", "columns, rows, slices")
    size, spacing = volume.geometry.size_ijk, volume.spacing
    how = ", ".join(f"{n} × {s:g} mm" for n, s in zip(size, spacing))
    check_extent(extent, where=where, how=f"columns, rows, slices: {how}")


def clean_volume(volume: CTVolume, where: str) -> CTVolume:
    """``volume`` with its NaN or infinite voxels set to -1024 HU (air), with a warning, their count in its metadata
    (:func:`~pipeline.cache.nonfinite_set_to_air`); refused (:class:`InvalidVolumeError`) when more than
    :data:`MAX_BAD_VOXEL_FRACTION` of them are. A volume the case cache cleaned when it wrote it (its metadata holds
    the count) is warned about alike: its findings come from a volume with those voxels set to air."""
    cached = nonfinite_set_to_air(volume.metadata)
    if cached:
        log.warning("%s: %d NaN/infinite voxels set to %g HU (air) when the case was cached", where, cached, NONFINITE_HU)
    arr = volume.array
    if arr.dtype.kind != "f":
        return volume
    bad = ~np.isfinite(arr)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return volume
    frac = n_bad / arr.size
    if frac > MAX_BAD_VOXEL_FRACTION:
        raise InvalidVolumeError(
            f"{n_bad} of {arr.size} voxels ({frac:.1%}) are NaN or infinite, more than the {MAX_BAD_VOXEL_FRACTION:.0%} "
            f"that are set to {NONFINITE_HU:g} HU (air)",
            where=where,
            fix="the series' pixel data is corrupt: ingest it again from its DICOM files, or export its image file "
            "(NIfTI/NRRD) again from the original series, or exclude it",
        )
    log.warning("%s: %d NaN/infinite voxels set to -1024 HU (air)", where, n_bad)
    metadata = {**volume.metadata, NONFINITE_SET_TO_AIR_KEY: cached + n_bad}
    return CTVolume(np.where(bad, np.float32(NONFINITE_HU), arr).astype(arr.dtype), volume.geometry, metadata=metadata)


def lung_region(volume: CTVolume, lung_mask: LungMask | None, *, device: str) -> LungRegion:
    """The lungs to search in ``volume``: the threshold mask of the air-filled lungs (:func:`quick_lung_mask`) limited
    to ``lung_mask`` (the lungs :func:`segmented_lung_region` finds on ``device`` when it is ``None``); a
    :class:`LungRegion` is taken as it is, and the given mask alone is searched when the two do not overlap."""
    if isinstance(lung_mask, LungRegion):
        return lung_mask
    quick = quick_lung_mask(volume)
    if lung_mask is None:  # the threshold mask holds bowel gas too: findings limited to the segmented lungs
        given, source = segmented_lung_region(volume, device=device), "segmented"
    else:
        given, source = region_from_mask(lung_mask, volume), "given"
    if given.empty:  # no lungs: no search (the caller records why)
        return given
    limited = quick.limited_to(given)
    if limited.limit is None or not limited.limit.any():
        if source == "given":  # a mask that misses the air of the lungs may lie on another grid or be mirrored
            log.warning(
                "the lung mask given does not overlap the air in the body; searching it as given (check that it was made "
                "on this series' grid: same shape and orientation)"
            )
        else:  # the largest air pockets are bowel gas, and the lungs are only their bases: an expected case
            log.info("the largest air in the body is not the segmented lungs (bowel gas?); searching the segmented lungs")
        return given
    return limited


def lung_box(region: LungRegion, volume: CTVolume, margin_mm: float) -> Roi:
    """The box (source indices) of ``region``'s lungs in ``volume``, grown by ``margin_mm``: the network input's crop."""
    lo, hi = region.bbox_ijk(margin_mm, volume.geometry.size_ijk)
    return Roi(lo=float3(lo), hi=float3(v - 1 for v in hi), space="index")
