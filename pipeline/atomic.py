"""Atomic file writes: a file appears complete at its path, or not at all.

Every module that publishes a file (cache arrays, findings, meshes, reports, DICOM) writes it
through these helpers, so that a crash or kill never leaves a half-written file under its final name.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content appears at ``path`` only if the block completes.

    Writes go to a temporary file in the same folder, which is flushed, synced and
    renamed over ``path``; on any error the temporary file is removed and ``path``
    is left as it was.
    """
    if path.is_dir():  # found before anything is written, and named: not the temporary file's rename failing
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _naming(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename == tmp:  # the rename's error: about ``path``, not ``tmp``
            raise _naming(exc, path) from exc
        raise


def _naming(exc: OSError, path: Path) -> OSError:
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
    ``what`` (the option or setting that gave it) when it is a file or cannot be created or written."""
    from .errors import CtpipeError

    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CtpipeError(f"{what}: this is a file, not a folder", where=folder, fix=f"give {what} a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtpipeError(
            f"{what}: the folder cannot be created ({exc.strerror})", where=folder, fix="choose a folder this user can write"
        ) from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CtpipeError(f"{what}: the folder is not writable", where=folder, fix="choose a folder this user can write")
    return folder


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
