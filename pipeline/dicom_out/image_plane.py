"""A source image's own pixel grid, and LPS points as 2-D coordinates on it (SCOORD).

An SR draws a measurement on an image with an SCOORD: (column, row) pairs in that image's pixel matrix, the top left
corner of its top left pixel at (0, 0) and that pixel's centre at (0.5, 0.5) (PS3.3 C.18.6.1.1). They are converted
from DICOM patient coordinates (LPS mm) with the referenced image's own ImagePositionPatient, ImageOrientationPatient
and PixelSpacing (a multi-frame image's: those of the frame), never the volume's grid: a tilt-corrected volume's slice
is shifted in-plane from its image, and a viewer places the coordinates on the image as stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DicomOutputError, GeometryError
from ..geometry import Geometry
from .sources import SourceSeries

__all__ = ["image_coordinates", "image_geometry", "image_points_lps"]


def _frame_item(dataset: Any, frame: int, name: str) -> Any:
    """The ``name`` functional group macro of 1-based ``frame`` of a multi-frame header (per-frame, else shared)."""
    per_frame = dataset.get("PerFrameFunctionalGroupsSequence") or []
    shared = dataset.get("SharedFunctionalGroupsSequence") or []
    for item in ([per_frame[frame - 1]] if len(per_frame) >= frame else []) + list(shared[:1]):
        if name in item and item[name].value:
            return item[name][0]
    return None


def _plane_attributes(source: SourceSeries, k: int) -> tuple[Any, Any, Any, int, int]:
    ds = source.dataset_of(k)
    frame = source.frame_of(k)
    if frame is None:
        orientation, spacing = ds.get("ImageOrientationPatient"), ds.get("PixelSpacing")
    else:
        plane = _frame_item(ds, frame, "PlaneOrientationSequence")
        measures = _frame_item(ds, frame, "PixelMeasuresSequence")
        orientation = plane.get("ImageOrientationPatient") if plane is not None else ds.get("ImageOrientationPatient")
        spacing = measures.get("PixelSpacing") if measures is not None else ds.get("PixelSpacing")
    return source.positions[k], orientation, spacing, int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)


def image_geometry(source: SourceSeries, k: int) -> Geometry:
    """The pixel grid of the source image (or frame) of volume slice ``k``: shape ``(1, Rows, Columns)``, spacing
    (column spacing, row spacing, 1) mm, origin its ImagePositionPatient (the top left pixel's centre, LPS mm),
    direction its row and column cosines and their cross product (LPS).

    Raises :class:`~pipeline.errors.DicomOutputError` naming the image when its header lacks an orientation, a pixel
    spacing or a size, or states them invalid.
    """
    position, orientation, spacing, rows, columns = _plane_attributes(source, k)
    where = f"source image {source.sop_instance_uids[k]}" + (f" frame {source.frame_of(k)}" if source.multiframe else "")
    try:
        iop = np.asarray([float(v) for v in orientation or ()], dtype=np.float64)
        ps = np.asarray([float(v) for v in spacing or ()], dtype=np.float64)
    except (TypeError, ValueError):
        iop, ps = np.empty(0), np.empty(0)
    if iop.shape != (6,) or ps.shape != (2,) or rows < 1 or columns < 1:
        raise DicomOutputError(
            f"ImageOrientationPatient {orientation!r}, PixelSpacing {spacing!r}, Rows {rows} and Columns {columns} "
            "do not describe an image plane",
            where=where,
            fix="pass the original CT files; without them a measurement cannot be drawn on the image",
        )
    row, col = iop[:3] / np.linalg.norm(iop[:3]), iop[3:] / np.linalg.norm(iop[3:])
    direction = np.stack([row, col, np.cross(row, col)], axis=1)
    try:
        return Geometry(shape=(1, rows, columns), spacing=(ps[1], ps[0], 1.0), origin=position, direction=direction)
    except GeometryError as exc:
        raise DicomOutputError(f"the image plane is invalid: {exc}", where=where, fix="pass the original CT files") from exc


def image_coordinates(plane: Geometry, points_lps: Any) -> np.ndarray:
    """LPS points (``(n, 3)``, mm) as SCOORD image coordinates ``(n, 2)`` (column, row) on ``plane``
    (:func:`image_geometry`): each point's projection on the image plane, in pixels from the top left corner of the
    top left pixel."""
    ijk = plane.lps_to_index(np.asarray(points_lps, dtype=np.float64).reshape(-1, 3))
    return ijk[:, :2] + 0.5


def image_points_lps(plane: Geometry, coordinates: Any) -> np.ndarray:
    """SCOORD image coordinates ``(n, 2)`` (column, row) on ``plane`` as LPS points ``(n, 3)`` (mm) in its plane: the
    inverse of :func:`image_coordinates` for points in the plane."""
    cr = np.asarray(coordinates, dtype=np.float64).reshape(-1, 2) - 0.5
    return plane.index_to_lps(np.concatenate([cr, np.zeros((len(cr), 1))], axis=1))
