"""Atomic file writes: a file appears complete at its path, or not at all.

Every module that publishes a file (cache arrays, findings, meshes, reports, DICOM) writes it
through these helpers, so that a crash or kill never leaves a half-written file under its final name.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)


@contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content appears at ``path`` only if the block completes.

    Writes go to a temporary file in the same folder, which is flushed, synced and
    renamed over ``path``; on any error the temporary file is removed and ``path``
    is left as it was (an :class:`OSError` of the writes, which name no file, is raised naming ``path``). The file gets the permissions any new file of the process gets
    (0666 less the umask: ``-rw-r--r--`` under the usual 022), not the temporary file's
    owner-only 0600, so that the group a report or rendering is shared with can read it.
    """
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            _share_as_umask_says(fh.fileno(), path)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename in (tmp, None):  # a write's or the rename's: about ``path``
            raise error_about(exc, path) from exc
        raise


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file (open descriptor, path) in the folder of ``path`` (created if missing), for content
    that is to replace ``path``; an :class:`IsADirectoryError` naming ``path`` when a folder stands there (found
    before anything is written, not as the rename failing), an error of the folder named as about ``path``."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    if not path.parent.is_dir():
        from .errors import refuse_unexpanded_home

        refuse_unexpanded_home(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise error_about(exc, path) from exc


@contextmanager
def published_together(folder: Path) -> Iterator[Callable[[str, bytes], Path]]:
    """Files of ``folder`` that appear together (a report's page, JSON and tables), as ``write(name, data)`` in the
    block gives them; ``write`` returns the file's final path.

    Each file is written, flushed and synced to a temporary file in ``folder`` at once; when the block completes,
    all are renamed over their names one after the other, with no other work between them. On any error in the
    block (a write's too: a full disk, a folder where a file should be) every temporary file is removed and no file
    of ``folder`` is replaced: the folder holds the earlier complete set or the new complete one, never part of
    each. Files get the permissions :func:`atomic_open` gives them. Other files of ``folder`` are left as they are.
    """
    staged: list[tuple[str, Path]] = []

    def write(name: str, data: bytes) -> Path:
        path = folder / name
        fd, tmp = _temp_beside(path)
        staged.append((tmp, path))
        try:
            with os.fdopen(fd, "wb") as fh:
                _share_as_umask_says(fh.fileno(), path)
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.filename in (tmp, None):  # a write's: about ``path``
                raise error_about(exc, path) from exc
            raise
        return path

    try:
        yield write
        while staged:
            tmp, path = staged[0]
            os.replace(tmp, path)
            staged.pop(0)
    except BaseException as exc:
        for tmp, _final in staged:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and staged and exc.filename == staged[0][0]:  # a rename's: about its file
            raise error_about(exc, staged[0][1]) from exc
        raise


def _share_as_umask_says(fd: int, path: Path) -> None:
    """Give the open temporary file of ``path`` the mode 0666 less the umask; a file system that keeps its own
    permissions (vfat, some CIFS mounts) refusing it leaves the file as it is, with a debug line."""
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except OSError as exc:
        log.debug("%s keeps its owner-only permissions (%s)", path, exc.strerror or exc)


def current_umask() -> int:
    """The process's file mode creation mask (e.g. ``0o022``), read without changing it where the system says it
    (Linux ``/proc/self/status``); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            status = fh.read()
    except OSError:  # no procfs (macOS): ask os.umask below
        status = ""
    for line in status.splitlines():
        if line.startswith("Umask:"):  # Linux 4.7 and later
            return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def error_about(exc: OSError, path: Path) -> OSError:
    """``exc`` (an error about a temporary file beside ``path``) as the same kind of error, about ``path``."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))  # OSError(errno, ...) makes the subclass of that errno


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    with atomic_open(path) as fh:
        fh.write(data)


def ensure_dir(path: str | os.PathLike[str], *, what: str = "--out") -> Path:
    """The folder ``path``, created with its parents if missing; a :class:`~pipeline.errors.CtpipeError` naming
    ``what`` (the option or setting that gave it) when it is a file or cannot be created or written, or starts with
    ``~`` (:func:`~pipeline.errors.refuse_unexpanded_home`)."""
    from .errors import CtpipeError, refuse_unexpanded_home

    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CtpipeError(f"{what}: this is a file, not a folder", where=folder, fix=f"give {what} a folder path")
    refuse_unexpanded_home(path, what=what)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:  # a file where one of its parent folders should be
            blocker = in_the_way(folder)
            raise CtpipeError(
                f"{what}: the folder cannot be created: {blocker} is a file, not a folder",
                where=folder,
                fix=f"give {what} a path that does not go through the file {blocker}",
            ) from exc
        raise CtpipeError(
            f"{what}: the folder cannot be created ({exc.strerror})", where=folder, fix="choose a folder this user can write"
        ) from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CtpipeError(f"{what}: the folder is not writable", where=folder, fix="choose a folder this user can write")
    return folder


def in_the_way(path: str | os.PathLike[str]) -> str:
    """The existing file that stands in a folder's place on the way to ``path`` (what ``ENOTDIR`` is about), else
    ``path`` itself (absolute)."""
    absolute = Path(os.path.abspath(path))
    for p in reversed([absolute, *absolute.parents]):
        if p.exists() and not p.is_dir():
            return str(p)
    return str(absolute)


def ensure_file_path(path: str | os.PathLike[str], *, what: str) -> Path:
    """The file path ``path``, checked before any work, its folder created (:func:`ensure_dir`); a
    :class:`~pipeline.errors.CtpipeError` naming ``what`` (the option that gave it) when it is an existing folder,
    or its folder cannot be made or written."""
    from .errors import CtpipeError

    target = Path(path)
    if target.is_dir():
        raise CtpipeError(
            f"{what}: this is a folder, not a file", where=target, fix=f"give {what} a file path, e.g. {target / 'report.json'}"
        )
    ensure_dir(target.parent, what=f"the folder of {what}")
    return target


#: What a later scan of the source folder would read back when a command's ``--out`` lies inside it.
SCANNED_OUTPUTS = "these outputs back as input and list each as a skipped file"


def check_out_outside_sources(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    later: str = "ctpipe ingest or run",
    reads_back: str = SCANNED_OUTPUTS,
    beside: str = "out",
) -> None:
    """:class:`~pipeline.errors.ConfigError` when the output folder ``out`` (``--out``) is one of the source folders
    or lies inside one (checked before anything is written): every later ``later`` of that source would scan the
    command's own files as input. The folder that holds a source DICOM file counts as a source folder too: it holds
    DICOM files that a later scan of the folder reads, with the command's outputs among them. A worklist CSV's folder
    is not one (it holds worklists, not images), nor a NIfTI/MHA/NRRD image's. The fix suggests
    ``<source folder's parent>/<beside>/<out's name>`` (``<beside>`` alone when ``out`` is named so). Paths are
    file-system paths, compared after resolving links."""
    from .errors import ConfigError
    from .ingest.image import starts_like_dicom

    target = Path(os.path.realpath(out))
    for src in sources:
        path = Path(os.path.realpath(src))
        folder = path.parent if path.is_file() and starts_like_dicom(path) else path
        if folder.is_dir() and (target == folder or folder in target.parents):
            example = folder.parent / beside if target.name == beside else folder.parent / beside / target.name
            shown = src if folder == path else Path(src).parent
            inside = f"the source folder {src}" if folder == path else f"{shown}, the folder of the source file {src}"
            raise ConfigError(
                f"--out is inside {inside}: every later {later} of {shown} would read {reads_back}",
                where=Path(out),
                fix=f"give --out a folder outside {shown}, e.g. {example}",
            )
