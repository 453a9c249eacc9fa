"""Enhanced CT (multi-frame) files.

Geometry and rescale live in the functional group sequences: per frame
(PerFrameFunctionalGroupsSequence) or shared by all frames
(SharedFunctionalGroupsSequence). Each frame is treated as one slice: the
frames are sorted by position along the slice normal like single-frame
slices (LPS, mm).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CorruptHeaderError,
    InconsistentSeriesError,
    MissingPixelDataError,
    SeriesGeometryError,
    TruncatedFileError,
)
from ._pydicom import PYDICOM_ERRORS, check_decoder, decode_pixels, read_dataset, through_pixel_data
from .codestream import FrameShape, check_decoded_size, check_encapsulated_pixels

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameInfo:
    """Geometry and rescale of one frame of an enhanced file (LPS, mm)."""

    path: Path
    frame: int  # 0-based
    position: tuple[float, float, float]
    orientation: tuple[float, float, float, float, float, float]
    pixel_spacing: tuple[float, float]
    slope: float
    intercept: float
    slice_thickness: float | None

    @property
    def name(self) -> str:
        return f"{self.path.name} frame {self.frame + 1}"


def _macro(item: Any, shared: Any, seq: str) -> Any | None:
    """The first item of functional group macro ``seq``, per-frame first, then shared."""
    for group in (item, shared):
        if group is not None and seq in group and len(group[seq].value) > 0:
            return group[seq].value[0]
    return None


def read_frames(path: Path, ds: Any | None = None) -> list[FrameInfo]:
    """Per-frame geometry and rescale of an enhanced CT file (header only when ``ds`` is None)."""

    try:
        if ds is None:
            ds = read_dataset(path, stop_before_pixels=True)
        return _frames(Path(path), ds)
    except PYDICOM_ERRORS as exc:
        raise CorruptHeaderError(
            f"the multi-frame header is damaged ({type(exc).__name__}: {exc})",
            where=path,
            fix="copy the file again from the archive/PACS, or re-export it from the scanner",
        ) from exc


def _frames(path: Path, ds: Any) -> list[FrameInfo]:
    n = int(ds.get("NumberOfFrames", 1) or 1)
    shared_seq = ds.get("SharedFunctionalGroupsSequence")
    shared = shared_seq[0] if shared_seq else None
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or []
    if per_frame and len(per_frame) != n:
        raise InconsistentSeriesError(
            f"NumberOfFrames is {n} but PerFrameFunctionalGroupsSequence has {len(per_frame)} items",
            where=path,
            fix="re-export the multi-frame object; it is inconsistent",
        )
    frames: list[FrameInfo] = []
    for f in range(n):
        item = per_frame[f] if per_frame else None
        pos = _macro(item, shared, "PlanePositionSequence")
        ori = _macro(item, shared, "PlaneOrientationSequence")
        meas = _macro(item, shared, "PixelMeasuresSequence")
        trans = _macro(item, shared, "PixelValueTransformationSequence")
        ipp = pos.get("ImagePositionPatient") if pos is not None else ds.get("ImagePositionPatient")
        iop = ori.get("ImageOrientationPatient") if ori is not None else ds.get("ImageOrientationPatient")
        ps = meas.get("PixelSpacing") if meas is not None else ds.get("PixelSpacing")
        if ipp is None or iop is None or ps is None:
            missing = [
                k for k, v in (("ImagePositionPatient", ipp), ("ImageOrientationPatient", iop), ("PixelSpacing", ps)) if v is None
            ]
            raise SeriesGeometryError(
                f"frame {f + 1} has no {', '.join(missing)} in its functional groups",
                where=path,
                fix="re-export the multi-frame object with plane position/orientation and pixel measures",
            )
        for name, value, count in (
            ("ImagePositionPatient", ipp, 3),
            ("ImageOrientationPatient", iop, 6),
            ("PixelSpacing", ps, 2),
        ):
            if len(value) != count:
                raise SeriesGeometryError(
                    f"frame {f + 1} has {name} {list(value)}: {len(value)} values, {count} expected",
                    where=path,
                    fix="re-export the multi-frame object from the scanner/PACS; the tag is corrupt",
                )
        src = trans if trans is not None else ds
        thick = meas.get("SliceThickness") if meas is not None else ds.get("SliceThickness")
        frames.append(
            FrameInfo(
                path=Path(path),
                frame=f,
                position=(float(ipp[0]), float(ipp[1]), float(ipp[2])),
                orientation=(float(iop[0]), float(iop[1]), float(iop[2]), float(iop[3]), float(iop[4]), float(iop[5])),
                pixel_spacing=(float(ps[0]), float(ps[1])),
                slope=_number(src.get("RescaleSlope"), 1.0),  # a 0 or NaN is kept: planning refuses it naming the frame
                intercept=_number(src.get("RescaleIntercept"), 0.0),
                slice_thickness=float(thick) if thick not in (None, "") else None,
            )
        )
    return frames


def _number(value: Any, default: float) -> float:
    """A header number: ``default`` when absent or empty, NaN when it is not a number."""
    if value is None or str(value).strip() == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def read_frame_pixels(
    path: Path, n_frames: int, rows: int, columns: int, transfer_syntax: str, *, pixel_end: int | None = None
) -> np.ndarray:
    """Stored values of every frame, ``[frame, row, column]``; ``pixel_end``: where compressed pixel data end when
    bytes follow them (:attr:`~pipeline.ingest.headers.SliceHeader.pixel_end`; those bytes are left out)."""

    check_decoder(transfer_syntax, path)
    try:
        ds = read_dataset(through_pixel_data(path, pixel_end))
    except PYDICOM_ERRORS as exc:
        raise TruncatedFileError(
            f"the file cannot be read ({exc})", where=path, fix="copy the file again from the archive/PACS"
        ) from exc
    if "PixelData" not in ds:
        raise MissingPixelDataError(
            "the multi-frame image has no PixelData (7FE0,0010)",
            where=path,
            fix="re-export the object from the scanner/PACS with pixel data",
        )
    shape = FrameShape(rows, columns, int(ds.get("SamplesPerPixel", 1) or 1), int(ds.get("BitsAllocated", 16) or 16))
    check_encapsulated_pixels(ds, transfer_syntax, shape, n_frames=n_frames, where=path)
    arr = decode_pixels(ds, transfer_syntax, path)
    check_decoded_size(arr.size, n_frames * rows * columns, where=path, frames=n_frames)
    return np.asarray(arr).reshape(n_frames, rows, columns)
