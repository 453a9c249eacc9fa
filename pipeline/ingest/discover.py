"""File discovery and header-only reads.

:func:`discover_files` walks folders recursively whatever the file names are;
:func:`read_headers` reads each file's header (never its pixel data) in a
thread pool with the raw parser of :mod:`pipeline.ingest.rawheader`, falling
back to pydicom for big-endian or deflated files. Files that are not DICOM,
DICOMDIR files and files whose header is cut short come back as
:class:`SkippedFile` with a reason instead of raising.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, overload

from ..errors import CtpipeError, NotDicomError, TruncatedFileError
from ._pydicom import PYDICOM_ERRORS
from .headers import SliceHeader
from .multiframe import read_frames
from .rawheader import DICOMDIR_SOP, WANTED, RawHeader, RawHeaderError, RawHeaderUnsupported, read_raw_header

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedFile:
    """A file the scan did not use: ``kind`` is one of ``not_dicom``, ``dicomdir``,
    ``truncated``, ``unreadable``, ``no_series``; ``reason`` says why in words."""

    path: Path
    kind: str
    reason: str


_EXTRA_KEYS = ("PatientID", "StudyDate", "SliceThickness", "ConvolutionKernel", "KVP", "Manufacturer",
               "PatientPosition", "GantryDetectorTilt")


@overload
def _floats(text: object, n: Literal[2]) -> tuple[float, float] | None: ...


@overload
def _floats(text: object, n: Literal[3]) -> tuple[float, float, float] | None: ...


@overload
def _floats(text: object, n: Literal[6]) -> tuple[float, float, float, float, float, float] | None: ...


def _floats(text: object, n: int) -> tuple[float, ...] | None:
    if text is None or text == "":
        return None
    try:
        vals = tuple(float(v) for v in str(text).split("\\"))
    except ValueError:
        return None
    return vals if len(vals) == n and all(math.isfinite(v) for v in vals) else None


def _int(text: object) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(float(str(text).split("\\")[0]))
    except (ValueError, OverflowError):
        return None


def _float(text: object, default: float) -> float:
    if text is None or text == "":
        return default
    try:
        value = float(str(text).split("\\")[0])
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def header_from_values(path: Path, raw: RawHeader, *, use_pydicom: bool = False) -> SliceHeader:
    """Build a :class:`SliceHeader` from the raw values of one file."""
    v = raw.values

    def s(key: str) -> str:
        val = v.get(key)
        return "" if val is None else str(val)

    us: dict[str, int | None] = {}
    for k in ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation", "SamplesPerPixel"):
        val = v.get(k)
        us[k] = val if isinstance(val, int) else _int(val)
    return SliceHeader(
        path=path,
        file_size=raw.file_size,
        transfer_syntax=s("TransferSyntaxUID") or "1.2.840.10008.1.2",
        sop_class=s("SOPClassUID") or s("MediaStorageSOPClassUID"),
        sop_instance=s("SOPInstanceUID"),
        study_uid=s("StudyInstanceUID"),
        series_uid=s("SeriesInstanceUID"),
        modality=s("Modality").upper(),
        image_type=tuple(p.strip().upper() for p in s("ImageType").split("\\") if p.strip()),
        series_description=s("SeriesDescription"),
        series_number=_int(v.get("SeriesNumber")),
        acquisition_number=_int(v.get("AcquisitionNumber")),
        instance_number=_int(v.get("InstanceNumber")),
        position=_floats(v.get("ImagePositionPatient"), 3),
        orientation=_floats(v.get("ImageOrientationPatient"), 6),
        rows=us["Rows"],
        columns=us["Columns"],
        pixel_spacing=_floats(v.get("PixelSpacing"), 2),
        samples_per_pixel=us["SamplesPerPixel"] or 1,
        bits_allocated=us["BitsAllocated"],
        bits_stored=us["BitsStored"],
        pixel_representation=us["PixelRepresentation"] or 0,
        photometric=s("PhotometricInterpretation"),
        n_frames=_int(v.get("NumberOfFrames")) or 1,
        slope=_float(v.get("RescaleSlope"), 1.0),
        intercept=_float(v.get("RescaleIntercept"), 0.0),
        pixel_offset=raw.pixel_offset,
        pixel_length=raw.pixel_length,
        truncated=raw.truncated,
        use_pydicom=use_pydicom,
        extra=tuple((k, s(k)) for k in _EXTRA_KEYS if s(k)),
    )


def _pydicom_header(path: Path) -> SliceHeader:
    """Header of a big-endian or deflated file through pydicom (pixel data left unread)."""
    # lazy on purpose: pydicom is slow to import and only these rare transfer syntaxes need it here
    import pydicom
    from pydicom.errors import InvalidDicomError

    raw = RawHeader(file_size=path.stat().st_size)
    try:
        ds = pydicom.dcmread(path, defer_size=256)
        for kw in {kw for kw, _ in WANTED.values()}:
            source = ds.file_meta if kw in ds.file_meta else ds
            if kw not in source:
                continue
            val = source[kw].value
            if isinstance(val, (list, tuple)) or type(val).__name__ == "MultiValue":
                val = "\\".join(str(x) for x in val)
            raw.values[kw] = val if isinstance(val, int) else str(val)
        has_pixels = "PixelData" in ds
    except (InvalidDicomError, *PYDICOM_ERRORS) as exc:
        raise RawHeaderError("truncated", f"pydicom cannot read the header ({type(exc).__name__}: {exc})") from exc
    if has_pixels:
        raw.pixel_offset, raw.pixel_length = 0, -1
    return header_from_values(path, raw, use_pydicom=True)


def read_header(path: str | os.PathLike[str]) -> SliceHeader:
    """Read the header of one file (no pixel data).

    Raises :class:`NotDicomError` (with a DICOMDIR note for DICOMDIR files)
    or :class:`TruncatedFileError`, naming the file and the fix.
    """
    p = Path(path)
    try:
        raw = read_raw_header(p)
    except RawHeaderUnsupported:
        return _pydicom_header(p)
    except RawHeaderError as exc:
        if exc.kind == "truncated":
            raise TruncatedFileError(f"the DICOM header is cut short: {exc}", where=p,
                                     fix="copy the file again from the archive/PACS; the transfer was incomplete") from exc
        raise NotDicomError(f"not a DICOM file: {exc}", where=p,
                            fix="remove the file from the input folder or point ctpipe at the DICOM files only") from exc
    except OSError as exc:
        raise NotDicomError(f"cannot read the file ({exc.strerror or exc})", where=p,
                            fix="check that the file exists and is readable") from exc
    if raw.values.get("MediaStorageSOPClassUID") == DICOMDIR_SOP or raw.values.get("SOPClassUID") == DICOMDIR_SOP:
        raise NotDicomError("this is a DICOMDIR (a media index), not an image", where=p,
                            fix="nothing to do: ctpipe scans the image files themselves and ignores DICOMDIR")
    hdr = header_from_values(p, raw)
    return _with_frame_geometry(hdr) if hdr.is_enhanced else hdr


def discover_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """All regular files under ``paths`` (folders are walked recursively; symlinked folders are not followed).

    Hidden files (names starting with '.') are skipped. The result is sorted for reproducibility.
    """
    found: list[str] = []
    stack: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            stack.append(p)
        elif os.path.exists(p):
            found.append(p)
        else:
            raise NotDicomError("no such file or folder", where=p, fix="check the path (a DICOM folder or file)")
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError as exc:
            log.warning("cannot list %s: %s", top, exc)
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file():
                found.append(entry.path)
    found.sort()
    return [Path(f) for f in found]


def _read_one(path: Path) -> SliceHeader | SkippedFile:
    try:
        hdr = read_header(path)
    except TruncatedFileError as exc:
        return SkippedFile(path, "truncated", exc.problem)
    except NotDicomError as exc:
        kind = "dicomdir" if "DICOMDIR" in exc.problem else "not_dicom"
        return SkippedFile(path, kind, exc.problem)
    if not hdr.series_uid:
        return SkippedFile(path, "no_series", "DICOM file without a SeriesInstanceUID (0020,000E)")
    return hdr


def _with_frame_geometry(hdr: SliceHeader) -> SliceHeader:
    """Fill position/orientation/spacing/rescale of a multi-frame header from its first frame."""
    try:
        frames = read_frames(hdr.path)
    except CtpipeError as exc:
        log.info("%s: multi-frame geometry unreadable (%s)", hdr.path, exc)
        return hdr  # the build step reports the problem for the series
    if not frames:
        return hdr
    f = frames[0]
    return replace(hdr, position=f.position, orientation=f.orientation, pixel_spacing=f.pixel_spacing,
                   slope=f.slope, intercept=f.intercept)


#: Scans of at least this many files parse headers in worker processes (one per CPU, up to 8).
PROCESS_MIN_FILES = 1500


def _read_batch(batch: Sequence[Path]) -> list[SliceHeader | SkippedFile]:
    return [_read_one(f) for f in batch]


def read_headers(
    files: Sequence[Path], *, workers: int | None = None, processes: bool | None = None
) -> tuple[list[SliceHeader], list[SkippedFile]]:
    """Read the headers of ``files`` in parallel; returns (headers, skipped) in input order.

    Header parsing is Python code, so large scans (``processes=None`` and at least
    :data:`PROCESS_MIN_FILES` files) use forked worker processes, one per CPU; smaller
    ones (or machines with fewer than 4 CPUs) use ``workers`` threads, which overlap the file I/O.
    """
    cpus = os.cpu_count() or 1
    if workers is None:
        workers = min(8, 2 * cpus)
    if processes is None:
        processes = len(files) >= PROCESS_MIN_FILES and cpus >= 4 and workers > 1 and "fork" in mp.get_all_start_methods()
    if workers <= 1 or len(files) < 32:
        results = _read_batch(files)
    elif processes:
        n_proc = min(8, cpus, workers)
        chunk = max(64, len(files) // (n_proc * 4))
        batches = [files[i : i + chunk] for i in range(0, len(files), chunk)]
        with ProcessPoolExecutor(max_workers=n_proc, mp_context=mp.get_context("fork")) as pool:
            results = [r for part in pool.map(_read_batch, batches) for r in part]
    else:
        chunk = max(16, len(files) // (workers * 8))
        batches = [files[i : i + chunk] for i in range(0, len(files), chunk)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = [r for part in pool.map(_read_batch, batches) for r in part]
    headers = [r for r in results if isinstance(r, SliceHeader)]
    skipped = [r for r in results if isinstance(r, SkippedFile)]
    return headers, skipped
