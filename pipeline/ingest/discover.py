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
import multiprocessing as mp
import os
import stat
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import CtpipeError, NotDicomError, TruncatedFileError, UnreadableFileError, missing_path_fix
from .header_values import header_from_values, pydicom_header
from .headers import SliceHeader
from .image import archive_kind, image_suffix, unpack_fix
from .multiframe import read_frames
from .rawheader import (
    DICOMDIR_SOP,
    RawHeaderError,
    RawHeaderUnsupported,
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
            return pydicom_header(p)
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
