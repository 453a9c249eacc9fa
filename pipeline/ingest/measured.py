"""Which voxels of a volume some image measured: the grown grid of a gantry-tilt correction.

A tilted-gantry series accepted with ``allow_gantry_tilt`` is resampled onto an orthogonal grid grown along the
shear (:mod:`pipeline.ingest.geometry`): each slice's image is shifted in-plane, and the voxels of the grid it does
not reach (a wedge before or after it along the shear) hold the fill value -1024 HU, air that no detector measured.
Ingest records each slice's shift in the volume's metadata (:data:`TILT_SHIFTS_KEY`, pixels along i and j, volume
order), which the case cache keeps with the volume; :func:`measured_mask` gives back, from that and the grid, the
voxels some image measured. Segmentation keeps its masks within them, the ``fov_cuts_body`` quality flag counts the
body meeting their edge as the field of view's edge, and the MPRs show the rest as outside the scan, not as air.

A volume made from such a volume by a spatial operation (:meth:`CTVolume.resample <pipeline.volume.CTVolume.resample>`,
:meth:`CTVolume.crop <pipeline.volume.CTVolume.crop>`) carries its mask on the new grid instead of the shifts
(:data:`MEASURED_BOXES_KEY`, :func:`with_measured`), which the case cache keeps too.

A volume whose every voxel was measured (any untilted series, a tilt whose drift stayed under a quarter of a pixel
and kept the images' grid) has no mask: :func:`measured_mask` returns None, and nothing downstream changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..geometry import Geometry

log = logging.getLogger(__name__)

#: Metadata key: per slice of a tilt-corrected volume whose grid grew (volume order), its image's in-plane shift on
#: the grid, ``[along i, along j]`` in pixels (image pixel ``(i, j)`` lies at grid voxel ``(i + si, j + sj)``).
TILT_SHIFTS_KEY = "GantryTiltShiftsPx"
#: Metadata key of the columns and rows the grid grew by (written by ingest with every tilt correction).
GROWN_KEY = "GantryTiltGrownColumnsRows"
#: A grid voxel whose sampling point lies within this many pixels outside its image still counts as measured (the
#: positions are written as decimal text, their last digits rounded). A voxel further out blends the image's border
#: pixel with the fill value and counts as not measured.
EDGE_TOLERANCE_PX = 0.01
#: Metadata key of a volume resampled onto patient axes for display (``pipeline.reconstruction.render_planes``):
#: its grid is not the one the shifts describe.
DISPLAY_RESAMPLED_KEY = "DisplayResampledFromObliqueDeg"
#: Metadata key: per slice k of a volume resampled or cropped from a tilt-corrected one, the grid voxels some image
#: measured, ``[j0, j1, i0, i1]`` (rows ``j0 <= j < j1`` and columns ``i0 <= i < i1``; ``[0, 0, 0, 0]`` none). Each
#: slice's measured voxels are a rectangle of rows and columns after ingest, a crop and a resampling alike.
MEASURED_BOXES_KEY = "MeasuredVoxelBoxesJI"
#: Decimals kept of each shift in the metadata (a ten-thousandth of a pixel).
SHIFT_DECIMALS = 4


def shifts_metadata(shifts: np.ndarray) -> list[list[float]]:
    """The per-slice shifts (``(n, 2)``, pixels along i and j) as :data:`TILT_SHIFTS_KEY` stores them."""
    return [[round(float(si), SHIFT_DECIMALS), round(float(sj), SHIFT_DECIMALS)] for si, sj in np.asarray(shifts)]


def measured_mask(geometry: Geometry, metadata: Mapping[str, Any]) -> np.ndarray | None:
    """Bool ``[k, j, i]`` on ``geometry``: the voxels some source image measured, or None when every voxel was (no
    gantry-tilt correction grew the grid).

    ``metadata``: the volume's (ingest's :data:`TILT_SHIFTS_KEY` and :data:`GROWN_KEY`). A tilt-corrected volume of
    an earlier ctpipe's cache entry has no shifts: None, with a warning that its unmeasured voxels are taken for air
    until the case is ingested again. Shifts that do not fit ``geometry`` (a volume resampled onto another grid with
    its metadata) give None too, logged.
    """
    if DISPLAY_RESAMPLED_KEY in metadata:
        return None
    if MEASURED_BOXES_KEY in metadata:
        return _from_boxes(geometry, metadata[MEASURED_BOXES_KEY])
    grown = _grown(metadata)
    if grown is None or grown == (0, 0):
        return None
    raw = metadata.get(TILT_SHIFTS_KEY)
    if raw is None:
        log.warning(
            "the gantry-tilt corrected volume (grid grown by %d column(s) and %d row(s)) does not say which voxels its "
            "images measured (a case-cache entry of an earlier ctpipe): the grown wedge counts as air, and a body cut "
            "there is not flagged; ingest the case again to have it known",
            *grown,
        )
        return None
    shifts = np.asarray(raw, dtype=np.float64)
    nk, nj, ni = geometry.shape
    cols, rows = ni - grown[0], nj - grown[1]
    if shifts.shape != (nk, 2) or cols < 1 or rows < 1:
        log.info(
            "the volume's %s (%s) does not fit its grid %s (resampled since its ingest): every voxel counts as measured",
            TILT_SHIFTS_KEY,
            shifts.shape,
            geometry.shape,
        )
        return None
    return _inside(shifts, (nj, ni), (rows, cols))


def with_measured(metadata: Mapping[str, Any], measured: np.ndarray) -> dict[str, Any]:
    """``metadata`` of a volume resampled or cropped from a tilt-corrected one, with ``measured`` (bool ``[k, j, i]``
    on the new grid, e.g. :func:`pipeline.resample.resample_measured` of the source's :func:`measured_mask`) in it as
    :data:`MEASURED_BOXES_KEY`, for :func:`measured_mask` to give back; the source grid's shifts are left out."""
    out = {k: v for k, v in metadata.items() if k not in (TILT_SHIFTS_KEY, MEASURED_BOXES_KEY)}
    out[MEASURED_BOXES_KEY] = measured_boxes(measured)
    return out


def measured_boxes(measured: np.ndarray) -> list[list[int]]:
    """``measured`` (bool ``[k, j, i]``) as :data:`MEASURED_BOXES_KEY` stores it: per slice k, the rows and columns
    ``[j0, j1, i0, i1]`` (half-open) its measured voxels span (a rectangle on every grid this module describes)."""
    boxes = []
    for plane in np.asarray(measured, dtype=bool):
        rows, cols = np.flatnonzero(plane.any(axis=1)), np.flatnonzero(plane.any(axis=0))
        if len(rows) and len(cols):
            boxes.append([int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1])
        else:
            boxes.append([0, 0, 0, 0])
    return boxes


def _from_boxes(geometry: Geometry, raw: Any) -> np.ndarray | None:
    """The mask :data:`MEASURED_BOXES_KEY` describes on ``geometry``; None when every voxel was measured, or (logged)
    when the boxes do not fit the grid."""
    nk, nj, ni = geometry.shape
    try:
        boxes = np.asarray(raw, dtype=np.int64).reshape(-1, 4)
    except (TypeError, ValueError):
        boxes = np.zeros((0, 4), np.int64)
    if boxes.shape != (nk, 4) or boxes.min(initial=0) < 0 or np.any(boxes[:, 1] > nj) or np.any(boxes[:, 3] > ni):
        log.info(
            "the volume's %s does not fit its grid %s (resampled since): every voxel counts as measured",
            MEASURED_BOXES_KEY,
            geometry.shape,
        )
        return None
    in_j = (np.arange(nj)[None, :] >= boxes[:, 0:1]) & (np.arange(nj)[None, :] < boxes[:, 1:2])
    in_i = (np.arange(ni)[None, :] >= boxes[:, 2:3]) & (np.arange(ni)[None, :] < boxes[:, 3:4])
    mask = in_j[:, :, None] & in_i[:, None, :]
    return None if mask.all() else mask


def _grown(metadata: Mapping[str, Any]) -> tuple[int, int] | None:
    tilt = metadata.get("GantryTiltCorrectedDeg")
    grown = metadata.get(GROWN_KEY)
    if not (isinstance(tilt, (int, float)) and tilt) or not (isinstance(grown, Sequence) and len(grown) == 2):
        return None
    return int(grown[0]), int(grown[1])


def _inside(shifts: np.ndarray, grid_ji: tuple[int, int], image_ji: tuple[int, int]) -> np.ndarray:
    """Per slice k, the grid voxels ``(j, i)`` whose sampling point ``(j - sj, i - si)`` lies on image k's pixels
    (``image_ji`` rows and columns), within :data:`EDGE_TOLERANCE_PX`."""
    nj, ni = grid_ji
    rows, cols = image_ji
    ii = np.arange(ni, dtype=np.float64)[None, :] - shifts[:, 0:1]  # [k, i] image column sampled
    jj = np.arange(nj, dtype=np.float64)[None, :] - shifts[:, 1:2]  # [k, j] image row sampled
    in_i = (ii >= -EDGE_TOLERANCE_PX) & (ii <= cols - 1 + EDGE_TOLERANCE_PX)
    in_j = (jj >= -EDGE_TOLERANCE_PX) & (jj <= rows - 1 + EDGE_TOLERANCE_PX)
    return in_j[:, :, None] & in_i[:, None, :]


def continued_past_edge(array: np.ndarray, measured: np.ndarray, *, box: tuple[slice, slice, slice] | None = None) -> np.ndarray:
    """``array`` (``[k, j, i]``, HU) with each slice's unmeasured voxels (``measured``: bool, same shape, from
    :func:`measured_mask`) set to the value of the nearest measured row or column of that slice, as if the image
    went on past its edge; a slice with no measured voxel is kept as it is.

    ``box``: ``(k, j, i)`` slices (step 1) of the array: only that sub-box is returned, reading only the voxels it
    needs (``array`` may be memory-mapped).

    Searches that tell lungs from the air around the patient read a tilt-corrected grid so: read as the -1024 HU
    fill, the wedge would join lungs that the field of view cuts at the image's edge to the outside air, and the
    whole would be dropped as outside air. They then leave the wedge out of their masks. The detector's network
    reads it so too: lung meeting a -1024 HU edge gave it candidates there."""
    ks, js, is_ = (range(n)[b] for b, n in zip(box or (slice(None),) * 3, array.shape))
    filled = np.empty((len(ks), len(js), len(is_)), dtype=array.dtype)
    for n, k in enumerate(ks):
        rows, cols = np.flatnonzero(measured[k].any(axis=1)), np.flatnonzero(measured[k].any(axis=0))
        if not len(rows) or not len(cols):
            filled[n] = array[k, js.start : js.stop, is_.start : is_.stop]
            continue
        j = np.clip(np.asarray(js), rows[0], rows[-1])
        i = np.clip(np.asarray(is_), cols[0], cols[-1])
        filled[n] = np.asarray(array[k])[np.ix_(j, i)]
    return filled
