"""File discovery and header-only reads.

:func:`find_files` walks folders recursively whatever the file names are;
:func:`read_headers` reads each file's header (never its pixel data) in a
thread pool with the raw parser of :mod:`pipeline.ingest.rawheader`, falling
back to pydicom for big-endian or deflated files. Nothing the file system does
stops a scan: files that are not DICOM, DICOMDIR files, files whose header is cut
short, files that cannot be read (permission denied, gone since they were listed),
symbolic link loops, broken links, linked folders, FIFOs and device files each come
back as a :class:`SkippedFile` naming the path and the reason instead of raising.
"""

from __future__ import annotations

import errno
import logging
import math
import multiprocessing as mp
import os
import stat
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, overload

from ..errors import CtpipeError, NotDicomError, TruncatedFileError, UnreadableFileError, missing_path_fix
from ._pydicom import PYDICOM_ERRORS, read_dataset
from .headers import CT_SOPS, ENHANCED_CT_SOP, LEGACY_ENHANCED_CT_SOP, SliceHeader
from .image import archive_kind, image_suffix, unpack_fix
from .multiframe import read_frames
from .padding import pixel_padding
from .rawheader import (
    CHARSET_TEXT_KEYS,
    DICOMDIR_SOP,
    EXPLICIT_BE,
    WANTED,
    RawHeader,
    RawHeaderError,
    RawHeaderUnsupported,
    decode_text,
    read_raw_header,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedFile:
    """A file (or folder entry) the scan did not use; ``reason`` says why in words.

    ``kind`` is one of ``not_dicom``, ``dicomdir``, ``truncated``, ``unreadable``
    (permission denied, gone since it was listed, a symbolic link loop or a broken
    link), ``not_regular`` (FIFO, device file, socket), ``not_followed`` (a symbolic
    link to a folder), ``duplicate_copy`` (another copy of an SOP instance) or ``conflicting_copy`` (a different
    image under the SOPInstanceUID of another file: the series of that file is refused).
    """

    path: Path
    kind: str
    reason: str


#: The patient identifiers (of :data:`pipeline.volume.PATIENT_IDENTIFIERS`) the header scan reads: the ones
#: ``keep_identifiers=True`` copies into a volume's metadata (``load_series``, ``ingest_to_cache``, ``ctpipe ingest
#: --keep-identifiers``). The other attributes of that list (InstitutionName, OtherPatientIDs, ...) are never read.
METADATA_IDENTIFIERS = ("PatientID", "PatientName", "PatientBirthDate", "AccessionNumber")

# Header values kept as text on each SliceHeader. The patient identifiers among them stay in memory: they
# reach volume metadata only when a caller asks for them (keep_identifiers=True, see pipeline.ingest.build).
_EXTRA_KEYS = (
    *METADATA_IDENTIFIERS,
    "StudyDate",
    "SeriesDate",
    "SeriesTime",
    "FrameOfReferenceUID",
    "SliceThickness",
    "ConvolutionKernel",
    "KVP",
    "Manufacturer",
    "PatientPosition",
    "GantryDetectorTilt",
    "RescaleSlope",
    "RescaleIntercept",
    "LossyImageCompression",
    "LossyImageCompressionRatio",
    "LossyImageCompressionMethod",
)


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


def _rescale(text: object, default: float) -> float:
    """A rescale value: ``default`` when absent, NaN when the text is not a number (refused when planning)."""
    if text is None or str(text).strip() == "":
        return default
    try:
        return float(str(text).split("\\")[0])
    except ValueError:
        return math.nan


def header_from_values(path: Path, raw: RawHeader, *, use_pydicom: bool = False) -> SliceHeader:
    """Build a :class:`SliceHeader` from the raw values of one file (text decoded with its SpecificCharacterSet)."""
    v = raw.values
    charset = v.get("SpecificCharacterSet")
    charset = charset if isinstance(charset, str) and charset.strip() else None
    # the raw parser reads text byte for byte; pydicom decodes it itself, as Latin-1 without a SpecificCharacterSet,
    # which decode_text reads again as UTF-8 when it is (as it does for the raw parser's text)
    if not use_pydicom or charset is None:
        v = {k: decode_text(val, charset) if k in CHARSET_TEXT_KEYS and isinstance(val, str) else val for k, val in v.items()}

    def s(key: str) -> str:
        val = v.get(key)
        return "" if val is None else str(val)

    us: dict[str, int | None] = {}
    for k in ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation", "SamplesPerPixel"):
        val = v.get(k)
        us[k] = val if isinstance(val, int) else _int(val)
    sop_class = s("SOPClassUID") or s("MediaStorageSOPClassUID")
    modality = s("Modality").upper()
    n_frames = _int(v.get("NumberOfFrames")) or 1
    padding, padding_error = pixel_padding(
        v.get("PixelPaddingValue"),
        v.get("PixelPaddingRangeLimit"),
        signed=us["PixelRepresentation"] == 1,
        bits_stored=us["BitsStored"],
        bits_allocated=us["BitsAllocated"],
    )
    notes: list[str] = []
    if not modality and sop_class in CT_SOPS:
        modality = "CT"
        notes.append(f"Modality (0008,0060) is missing; taken as CT from the SOP class {sop_class} ({CT_SOPS[sop_class]})")
    single_frame = n_frames == 1 and sop_class not in (ENHANCED_CT_SOP, LEGACY_ENHANCED_CT_SOP)
    if (
        modality == "CT"
        and single_frame
        and raw.pixel_offset is not None
        and (not s("RescaleSlope") or not s("RescaleIntercept"))
    ):
        notes.append(
            "RescaleSlope/RescaleIntercept (0028,1053/1052) missing: slope 1, intercept 0 assumed (stored values taken as HU)"
        )
    return SliceHeader(
        path=path,
        file_size=raw.file_size,
        file_mtime_ns=raw.file_mtime_ns,
        transfer_syntax=s("TransferSyntaxUID") or "1.2.840.10008.1.2",
        sop_class=sop_class,
        sop_instance=s("SOPInstanceUID"),
        study_uid=s("StudyInstanceUID"),
        series_uid=s("SeriesInstanceUID"),
        modality=modality,
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
        n_frames=n_frames,
        slope=_rescale(v.get("RescaleSlope"), 1.0),
        intercept=_rescale(v.get("RescaleIntercept"), 0.0),
        pixel_offset=raw.pixel_offset,
        pixel_length=raw.pixel_length,
        truncated=raw.truncated,
        pixel_end=raw.pixel_end,
        use_pydicom=use_pydicom,
        extra=tuple((k, s(k)) for k in _EXTRA_KEYS if s(k)),
        notes=tuple(notes),
        padding=padding,
        padding_error=padding_error,
    )


def _pydicom_header(path: Path) -> SliceHeader:
    """Header of a big-endian or deflated file through pydicom (pixel data left unread)."""
    # lazy on purpose: pydicom is slow to import and only these rare transfer syntaxes need it here
    from pydicom.errors import InvalidDicomError

    st = path.stat()
    raw = RawHeader(file_size=st.st_size, file_mtime_ns=st.st_mtime_ns)
    try:
        ds = read_dataset(path, defer_size=256)  # a big-endian file without file meta information too
        big_endian = str(ds.file_meta.get("TransferSyntaxUID", "")) == EXPLICIT_BE
        for kw, kind in WANTED.values():
            source = ds.file_meta if kw in ds.file_meta else ds
            if kw not in source:
                continue
            val = source[kw].value
            if kind == "bin" and isinstance(val, bytes) and len(val) == 2:  # VR left open (US or SS): as stored
                signed = ds.get("PixelRepresentation") == 1
                val = int.from_bytes(val, "big" if big_endian else "little", signed=signed)
            elif kind == "bin" and isinstance(val, bytes):
                raw.values[kw] = ("", val)  # not one 16-bit value: refused by pipeline.ingest.padding
                continue
            if isinstance(val, (list, tuple)) or type(val).__name__ == "MultiValue":
                val = "\\".join(str(x) for x in val)
            raw.values[kw] = val if isinstance(val, int) else str(val)
        has_pixels = "PixelData" in ds
    except OSError:
        raise  # the file cannot be read (read_header reports it as unreadable), not a damaged header
    except (InvalidDicomError, *PYDICOM_ERRORS) as exc:
        raise RawHeaderError("truncated", f"pydicom cannot read the header ({type(exc).__name__}: {exc})") from exc
    if has_pixels:
        raw.pixel_offset, raw.pixel_length = 0, -1
    return header_from_values(path, raw, use_pydicom=True)


def os_reason(exc: OSError) -> str:
    """Why a file system call failed, in words (permission denied, gone, a link loop, ...)."""
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, FileNotFoundError):
        return "it is gone (deleted or moved after it was listed)"
    if exc.errno == errno.ELOOP:
        return "symbolic link loop (following the link leads back to it)"
    if exc.errno == errno.ENAMETOOLONG:
        length = f" ({len(os.fsencode(exc.filename))} bytes)" if isinstance(exc.filename, (str, bytes)) else ""
        return (
            f"its path is longer than the system allows{length}: move or copy the files to a folder with a shorter "
            "path, then scan that folder"
        )
    return exc.strerror or str(exc)


def unreadable_error(path: str | os.PathLike[str], exc: OSError) -> UnreadableFileError:
    """The :class:`UnreadableFileError` for ``path`` after ``exc``, with the fix."""
    return UnreadableFileError(
        f"cannot read the file: {os_reason(exc)}",
        where=os.fspath(path),
        fix="make the file readable by this user (check its permissions and owner), or remove it from the input folder",
    )


#: The fix of a file in a scanned folder that is not DICOM (load_series names another for a file given on its own).
STRAY_FILE_FIX = "remove the file from the input folder or point ctpipe at the DICOM files only"


def read_header(path: str | os.PathLike[str]) -> SliceHeader:
    """Read the header of one file (no pixel data).

    Raises :class:`NotDicomError` (with a DICOMDIR note for DICOMDIR files),
    :class:`TruncatedFileError` or :class:`UnreadableFileError`, naming the file and the fix.
    """
    p = Path(path)
    try:
        try:
            raw = read_raw_header(p)
        except RawHeaderUnsupported:
            return _pydicom_header(p)
    except RawHeaderError as exc:
        if exc.kind == "truncated":
            raise TruncatedFileError(
                f"the DICOM header is cut short: {exc}",
                where=p,
                fix="copy the file again from the archive/PACS; the transfer was incomplete",
            ) from exc
        if image_suffix(p):
            raise NotDicomError(
                f"not a DICOM file but a NIfTI/MHA/NRRD image ({exc})",
                where=p,
                fix=f"load the image on its own: load_series({str(p)!r}) reads it (ctpipe detect and ctpipe reconstruct "
                "take the file too); or remove it from the input folder",
            ) from exc
        if kind := archive_kind(p):  # a PACS export or download, zipped: its DICOM files are inside
            raise NotDicomError(
                f"an archive ({kind}), not a DICOM file: the files inside it are not read",
                where=p,
                fix=unpack_fix(p, "ctpipe (or load_series)"),
            ) from exc
        raise NotDicomError(f"not a DICOM file: {exc}", where=p, fix=STRAY_FILE_FIX) from exc
    except OSError as exc:
        raise unreadable_error(p, exc) from exc
    if raw.values.get("MediaStorageSOPClassUID") == DICOMDIR_SOP or raw.values.get("SOPClassUID") == DICOMDIR_SOP:
        raise NotDicomError(
            "this is a DICOMDIR (a media index), not an image",
            where=p,
            fix=f"pass the folder holding it ({p.parent}): ctpipe finds the image files there itself (in a folder it "
            "scans, a DICOMDIR is skipped)",
        )
    hdr = header_from_values(p, raw)
    return _with_frame_geometry(hdr) if hdr.is_enhanced else hdr


def find_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[SkippedFile]]:
    """Regular files under ``paths``, and every entry left out with its reason; never raises for what it meets.

    Folders are walked recursively; symbolic links to files are followed, links to folders
    are not (so links cannot loop; each is reported as ``not_followed``). Hidden entries
    (names starting with '.') are ignored. FIFOs, device files and sockets (``not_regular``),
    link loops, broken links and folders or files that cannot be examined (``unreadable``)
    are reported, not raised. Only a path in ``paths`` that does not exist raises
    :class:`NotDicomError`. A file under two of ``paths`` (a folder and a folder inside it) is listed once. Both
    lists are sorted by path for reproducibility.
    """
    found: list[str] = []
    skipped: list[SkippedFile] = []
    stack: list[str] = []
    n_roots = 0
    for p in paths:
        n_roots += 1
        p = os.fspath(p)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if os.path.islink(p):
                skipped.append(_broken_link(p))
                continue
            raise NotDicomError(
                "no such file or folder", where=p, fix=missing_path_fix(p, "check the path (a DICOM folder or file)")
            ) from None
        except OSError as exc:
            skipped.append(SkippedFile(Path(p), "unreadable", f"cannot examine it: {os_reason(exc)}"))
            continue
        if stat.S_ISDIR(st.st_mode):
            stack.append(p)
        elif stat.S_ISREG(st.st_mode):
            found.append(p)
        else:
            skipped.append(SkippedFile(Path(p), "not_regular", f"not a regular file ({_file_type(st.st_mode)})"))
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as exc:
            skipped.append(SkippedFile(Path(top), "unreadable", f"cannot list the folder: {os_reason(exc)}"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            kind_path = _classify(entry)
            if kind_path is None:
                stack.append(entry.path)
            elif isinstance(kind_path, SkippedFile):
                skipped.append(kind_path)
            else:
                found.append(kind_path)
    if n_roots > 1:  # sources that overlap (a folder and a folder inside it) list a file once
        found = list({os.path.normpath(os.path.abspath(f)): f for f in reversed(found)}.values())
        skipped = list({os.path.normpath(os.path.abspath(f.path)): f for f in reversed(skipped)}.values())
    found.sort()
    skipped.sort(key=lambda f: str(f.path))
    for f in skipped:
        log.info("skipped %s: %s", f.path, f.reason)
    return [Path(f) for f in found], skipped


def _classify(entry: os.DirEntry[str]) -> str | SkippedFile | None:
    """None for a folder to walk, the path of a regular file to read, or why the entry is left out."""
    path = Path(entry.path)
    try:
        if entry.is_dir(follow_symlinks=False):
            return None
        if entry.is_file(follow_symlinks=False):  # the common case: no system call beyond the listing
            return entry.path
        if entry.is_symlink():
            try:
                st = os.stat(entry.path)
            except FileNotFoundError:
                return _broken_link(entry.path)
            except OSError as exc:
                return SkippedFile(path, "unreadable", os_reason(exc))
            if stat.S_ISDIR(st.st_mode):
                return SkippedFile(
                    path,
                    "not_followed",
                    f"symbolic link to the folder {os.path.realpath(entry.path)} "
                    "(links to folders are not followed; scan that folder directly)",
                )
        else:
            st = entry.stat(follow_symlinks=False)
    except OSError as exc:
        return SkippedFile(path, "unreadable", f"cannot examine it: {os_reason(exc)}")
    if stat.S_ISREG(st.st_mode):
        return entry.path
    return SkippedFile(path, "not_regular", f"not a regular file ({_file_type(st.st_mode)})")


def _broken_link(path: str) -> SkippedFile:
    try:
        target = f"its target {os.readlink(path)!r} does not exist"
    except OSError as exc:
        target = os_reason(exc)
    return SkippedFile(Path(path), "unreadable", f"broken symbolic link ({target})")


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO / named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"file type {stat.S_IFMT(mode):o}"


def discover_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The regular files of :func:`find_files` (what it leaves out is logged, not returned)."""
    return find_files(paths)[0]


def _read_one(path: Path) -> SliceHeader | SkippedFile:
    try:
        return read_header(path)
    except TruncatedFileError as exc:
        return SkippedFile(path, "truncated", exc.problem)
    except UnreadableFileError as exc:
        return SkippedFile(path, "unreadable", exc.problem)
    except NotDicomError as exc:
        kind = "dicomdir" if "DICOMDIR" in exc.problem else "not_dicom"
        return SkippedFile(path, kind, exc.problem)


def _with_frame_geometry(hdr: SliceHeader) -> SliceHeader:
    """Fill position/orientation/spacing/rescale of a multi-frame header from its first frame."""
    try:
        frames = read_frames(hdr.path)
    except CtpipeError as exc:
        log.info("%s: multi-frame geometry unreadable (%s)", hdr.path, exc)
        # the selection rules give this as the reason the series is left out; the build step raises it when asked for
        return replace(hdr, geometry_error=f"{hdr.path.name}: {exc.problem}" + (f" (fix: {exc.fix})" if exc.fix else ""))
    if not frames:
        return hdr
    f = frames[0]
    return replace(
        hdr, position=f.position, orientation=f.orientation, pixel_spacing=f.pixel_spacing, slope=f.slope, intercept=f.intercept
    )


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
