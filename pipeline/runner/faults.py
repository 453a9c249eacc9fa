"""Environmental failures told apart from case defects.

A case defect (a truncated file, a series with a gap) belongs to the case: it is
quarantined with its reason. An environmental failure belongs to the machine:
the run folder cannot be written because the disk is full (``ENOSPC``), the
quota is spent (``EDQUOT``), a file would pass the process's file-size limit
(``EFBIG``: ``ulimit -f``, systemd's ``LimitFSIZE=``), the file system is
read-only (``EROFS``), this
user may not write there (``EACCES``/``EPERM`` on a path inside the run folder;
the same errors on an input file are the case's problem), or a file stands
where the run folder keeps a folder (``ENOTDIR``, or ``EEXIST`` from making that
folder; ``EISDIR`` the other way round; again only inside the run folder). A run that meets one
stops admitting cases, records itself as interrupted and leaves the cases it
could not finish to the next run, which retries them without
``--retry-failed``.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..atomic import in_the_way
from ..errors import RunEnvironmentError

#: Errors that only writing can meet: environmental wherever they happen.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
#: Errors that are environmental when the path is inside the run folder (else an input file's problem).
ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR})

_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")
#: A short write reported without an error number: numpy's ``tofile`` ("98304 requested and 12224 written"), and its
#: preallocation of an array of 16 MiB or more, as every real scan's is ("Not enough free space to write 73924608
#: bytes after offset 128").
_SHORT_WRITE = re.compile(r"\b\d+ requested and \d+ written\b|\bNot enough free space to write \d+ bytes\b")


@dataclass(frozen=True)
class EnvironmentFailure:
    """What stopped the run: the error number and the folder that could not be written."""

    errno: int
    folder: str

    @property
    def name(self) -> str:
        return errno.errorcode.get(self.errno, str(self.errno))

    def describe(self) -> str:
        """One line: the folder, the system's words for the error and its symbol (for ``EFBIG``, the limit)."""
        return f"cannot write in {self.folder}: {self._what()}"

    def _what(self) -> str:
        text = f"{os.strerror(self.errno)} ({self.name})"
        limit = file_size_limit()
        if self.errno == errno.EFBIG and limit is not None:
            text += f": a file would pass this process's file-size limit of {limit} bytes (ulimit -f)"
        elif self.errno == errno.ENOTDIR:
            text += ": it is a file, where the run folder keeps a folder"
        elif self.errno == errno.EISDIR:
            text += ": it is a folder, where the run folder keeps a file"
        return text

    def advice(self) -> str:
        """What to do about it, ending with running the same command again."""
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free disk space (or raise the quota) and run the same command again"
        if self.errno == errno.EFBIG:
            return (
                "raise the file-size limit of the process running ctpipe (ulimit -f unlimited in its shell or cron "
                "script, LimitFSIZE=infinity in a systemd unit) and run the same command again"
            )
        if self.errno in (errno.ENOTDIR, errno.EISDIR):
            return f"move {self.folder} out of the run folder (or give another --out) and run the same command again"
        return "make the folder writable by this user (or give another --out) and run the same command again"

    def error(self) -> RunEnvironmentError:
        return RunEnvironmentError(self._what(), where=self.folder, fix=self.advice())


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (``RLIMIT_FSIZE``, ``ulimit -f``), or None when there is none."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _short_write_errno(run_dir: Path | None) -> int:
    """Why a write came up short without an error number: ``EFBIG`` when this process has a file-size limit and the
    run folder's file system has more room than that limit (so the limit, not the disk, stopped it), else ``ENOSPC``."""
    limit = file_size_limit()
    if limit is None or run_dir is None:
        return errno.ENOSPC
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return errno.ENOSPC
    return errno.EFBIG if st.f_bavail * st.f_frsize > limit else errno.ENOSPC


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend((e.__cause__, e.__context__))


def _inside(path: str | os.PathLike[str], folder: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def _folder_of(filename: object, run_dir: Path | None, number: int | None = None) -> str:
    if isinstance(filename, (str, os.PathLike)) and str(filename) and number in (errno.ENOTDIR, errno.EISDIR):
        return in_the_way(filename) if number == errno.ENOTDIR else str(Path(os.path.abspath(filename)))
    if isinstance(filename, (str, os.PathLike)) and str(filename):
        p = Path(os.path.abspath(filename))
        return str(p if p.is_dir() else p.parent)
    return str(run_dir) if run_dir is not None else "the run folder"


def environment_failure(exc: BaseException, *, run_dir: Path | None) -> EnvironmentFailure | None:
    """The environmental failure behind ``exc`` (itself, its cause or its context), or None for a case defect.

    SQLite's "database or disk is full" and "readonly database" count as ``ENOSPC`` and ``EROFS``
    in ``run_dir`` (the run store lives there), and its bare "disk I/O error" as ``EFBIG`` or ``ENOSPC`` where the
    file-size limit or the disk explains it (:func:`_store_io_errno`); so does a short write reported without an error number
    (numpy writing an array to a full disk: "N requested and M written", or "Not enough free space to write N bytes
    after offset M" for an array of 16 MiB or more): the runner writes only there; such a
    write counts as ``EFBIG`` when the process's file-size limit, not the disk, explains it.
    """
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno is None and _SHORT_WRITE.search(str(e)):
            return EnvironmentFailure(_short_write_errno(run_dir), str(run_dir) if run_dir else "the run folder")
        if isinstance(e, OSError) and e.errno is not None:
            if e.errno in WRITE_ERRNOS:
                return EnvironmentFailure(e.errno, _folder_of(e.filename, run_dir))
            if e.errno in ACCESS_ERRNOS and run_dir is not None and e.filename and _inside(e.filename, run_dir):
                name = e.filename
                if e.errno == errno.EISDIR and e.filename2 and os.path.isdir(e.filename2):
                    name = e.filename2  # a rename onto a folder: the folder in the way, not the file renamed
                return EnvironmentFailure(e.errno, _folder_of(name, run_dir, e.errno))
            if e.errno == errno.EEXIST and run_dir is not None and e.filename and _inside(e.filename, run_dir):
                # mkdir(exist_ok=True) of a folder the run keeps, where a file stands: the ENOTDIR case by another name
                target = Path(os.fsdecode(e.filename))
                if target.exists() and not target.is_dir():
                    return EnvironmentFailure(errno.ENOTDIR, _folder_of(e.filename, run_dir, errno.ENOTDIR))
        if isinstance(e, sqlite3.OperationalError):
            text = str(e).lower()
            if "disk is full" in text:
                return EnvironmentFailure(errno.ENOSPC, str(run_dir) if run_dir else "the run folder")
            if "readonly database" in text:
                return EnvironmentFailure(errno.EROFS, str(run_dir) if run_dir else "the run folder")
            if "disk i/o error" in text and run_dir is not None:
                number = _store_io_errno(run_dir)
                if number is not None:
                    return EnvironmentFailure(number, str(run_dir))
    return None


#: Room (bytes) the run store needs to write on: a few of SQLite's pages.
_STORE_HEADROOM = 64 * 1024


def _store_io_errno(run_dir: Path) -> int | None:
    """What SQLite's bare "disk I/O error" on the run store of ``run_dir`` stands for, where the machine explains it:
    ``EFBIG`` when one of the run folder's own files (the store, its write-ahead log) is within a few pages of this
    process's file-size limit, ``ENOSPC`` when the folder's file system has no more room than that; else None."""
    limit = file_size_limit()
    if limit is not None:
        try:
            with os.scandir(run_dir) as entries:
                sizes = [e.stat().st_size for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:
            sizes = []
        if any(size + _STORE_HEADROOM >= limit for size in sizes):
            return errno.EFBIG
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return None
    return errno.ENOSPC if st.f_bavail * st.f_frsize < _STORE_HEADROOM else None


def errno_in_text(text: str) -> int | None:
    """The error number quoted in a recorded message (``... [Errno 28] No space left ...``), or None."""
    m = _ERRNO_TEXT.search(text or "")
    return int(m.group(1)) if m else None


def is_environmental_errno(number: int | None) -> bool:
    """Whether a write that failed with ``number`` failed because of the machine, not the case."""
    return number is not None and (number in WRITE_ERRNOS or number in ACCESS_ERRNOS)


def check_writable(run_dir: Path) -> None:
    """Create ``run_dir`` if needed and prove that a file can be made in it; raise :class:`RunEnvironmentError` if not."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-probe-{os.getpid()}.tmp"
        with open(probe, "wb") as fh:
            fh.write(b"ctpipe")
            fh.flush()
            os.fsync(fh.fileno())
        # a run holding the folder removes the probes of killed runs at its start: this one's too, when two start at once
        probe.unlink(missing_ok=True)
    except OSError as exc:  # named by the run folder asked for (the folder that refused may be one of its parents)
        raise EnvironmentFailure(exc.errno or errno.EIO, str(run_dir)).error() from exc
