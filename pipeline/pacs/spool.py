"""Durable DICOM files on disk: single instances, and series folders that appear complete or not at all.

Layout under a run folder::

    RUN_DIR/pacs/partial/<SeriesInstanceUID>/    a series being retrieved (removed on the next start)
    RUN_DIR/pacs/spool/<SeriesInstanceUID>/      retrieved series, one <SOPInstanceUID>.dcm per instance

Every instance file is written through :func:`pipeline.atomic.atomic_open` (temporary file, flush,
fsync, rename); a retrieved series is published by renaming its partial folder into ``spool/``
after the folder has been synced, and the rename is synced too.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..atomic import atomic_open
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
