"""Durable DICOM files on disk: single instances, and series folders that appear complete or not at all.

Layout under a run folder::

    RUN_DIR/pacs/partial/<SeriesInstanceUID>/    a series being retrieved (removed on the next start)
    RUN_DIR/pacs/spool/<SeriesInstanceUID>/      retrieved series, one <SOPInstanceUID>.dcm per instance

Every retrieved instance file is written through :func:`pipeline.atomic.atomic_open` (temporary file, flush,
fsync, rename); a retrieved series is published by renaming its partial folder into ``spool/``
after the folder has been synced, and the rename is synced too. The listener's received instances
(``RUN_DIR/pacs/incoming/``, :mod:`pipeline.pacs.journal`) go through :func:`store_received`, which renames
first and syncs after, its journal telling complete files from files a crash cut short.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from concurrent.futures import Executor
from pathlib import Path

from ..atomic import atomic_open, error_about
from ..errors import PacsRequestError
from .address import valid_uid

log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Make the entries of folder ``path`` (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def instance_path(folder: Path, sop_instance_uid: str) -> Path:
    """``folder/<SOPInstanceUID>.dcm``; refuses a UID that is not digits and dots (it names a file)."""
    if not valid_uid(sop_instance_uid):
        raise PacsRequestError(
            f"SOPInstanceUID {sop_instance_uid[:80]!r} is not a valid UID",
            where=folder,
            fix="the sender must use UIDs of digits and dots (at most 64 characters)",
        )
    return folder / f"{sop_instance_uid}.dcm"


def write_instance(folder: Path, sop_instance_uid: str, data: bytes, *, sync_dir: bool = False) -> Path:
    """Write one DICOM Part 10 file atomically; with ``sync_dir`` its folder entry is synced too (durable on return)."""
    path = instance_path(folder, sop_instance_uid)
    with atomic_open(path) as fh:
        fh.write(data)
    if sync_dir:
        fsync_dir(folder)
    return path


def store_received(
    folder: Path, sop_instance_uid: str, data: bytes, *, sync_first: bool = False, pool: Executor | None = None
) -> Path:
    """Write one received instance (``data``: its DICOM Part 10 bytes) to ``folder/<SOPInstanceUID>.dcm`` and make
    it durable, for an instance that is acknowledged only afterwards.

    The bytes go to a temporary file ``.<name>.<random>.tmp`` that is renamed to its name at once; then the file's
    data (``fdatasync``) and the folder's entry (``fsync``) are synced, at the same time when ``pool`` is given (the
    folder's in one of its threads): the file system then joins both in one journal commit, where syncing the data,
    renaming, then syncing the folder takes two, one after the other. The price is that a crash before the syncs
    return can leave the name with incomplete content; such an instance was not acknowledged, and
    :meth:`~pipeline.pacs.journal.ReceiveJournal.recover` removes it (its journal row, if any, records the size and
    CRC-32 the file must have). With ``sync_first`` the data is synced before the rename, as :func:`write_instance`
    does, for a file that recovery could not check. On an error the file is removed (neither name is left) and an
    :class:`OSError` naming the final path is raised.
    """
    path = instance_path(folder, sop_instance_uid)
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
    placed = tmp
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # less the umask
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync_first:
                os.fdatasync(fd)
            os.replace(tmp, path)
            placed = path
            entry = pool.submit(fsync_dir, folder) if pool is not None else None
            try:
                if not sync_first:
                    os.fdatasync(fd)
            finally:
                if entry is not None:
                    entry.result()
        finally:
            os.close(fd)
        if pool is None:
            fsync_dir(folder)
    except BaseException as exc:
        placed.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename in (str(tmp), None):
            raise error_about(exc, path) from exc
        raise
    return path


class Spool:
    """The retrieved-series folders of a run (see the module docstring)."""

    def __init__(self, run_dir: Path):
        self.root = Path(run_dir) / "pacs"
        self.partial_root = self.root / "partial"
        self.series_root = self.root / "spool"

    def clean(self) -> None:
        """Remove partial folders left by an interrupted retrieval (their series are fetched again)."""
        if self.partial_root.is_dir():
            for p in self.partial_root.iterdir():
                log.info("removing the partial retrieval %s", p.name, extra={"event": "pacs_partial_removed"})
                shutil.rmtree(p, ignore_errors=True)

    def folder(self, series_uid: str) -> Path:
        return self.series_root / _uid_name(series_uid)

    def start(self, series_uid: str) -> Path:
        """A fresh, empty partial folder for ``series_uid``."""
        part = self.partial_root / _uid_name(series_uid)
        if part.exists():
            shutil.rmtree(part)
        part.mkdir(parents=True)
        return part

    def discard(self, series_uid: str) -> None:
        shutil.rmtree(self.partial_root / _uid_name(series_uid), ignore_errors=True)

    def publish(self, series_uid: str) -> Path:
        """Move the complete partial folder to ``spool/`` atomically; returns the final folder."""
        part = self.partial_root / _uid_name(series_uid)
        final = self.folder(series_uid)
        fsync_dir(part)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # an earlier copy the ledger does not vouch for: replace it
            trash = self.partial_root / f".old-{final.name}"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(part, final)
        fsync_dir(final.parent)
        return final


def _uid_name(uid: str) -> str:
    if not valid_uid(uid):
        raise PacsRequestError(
            f"SeriesInstanceUID {uid[:80]!r} is not a valid UID",
            where="PACS answer",
            fix="the archive must use UIDs of digits and dots (at most 64 characters)",
        )
    return uid
