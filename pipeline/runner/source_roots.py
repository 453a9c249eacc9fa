"""The source folders of a run, and whether one of them has gone away while the run went on.

A nightly source is often a network share (NFS, SMB) or a PACS export folder on one. When the mount drops during
the run, every remaining series' files are gone at once; that is not the series' fault, and quarantining each one
(a rerun then needing ``--retry-failed``) would turn one outage into hundreds of bad cases. :class:`SourceRoots`
tells the two apart: a case whose files are under a source folder that is itself gone or unreadable is the
machine's problem (the run stops, the case is left for the next run), a case whose own files vanished while its
source folder is still there keeps its quarantine (:class:`~pipeline.errors.SourceMismatchError`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..config import Config
from .discover import worklist_root
from .stage import CaseSpec

__all__ = ["SOURCE_GONE", "SourceRoots"]

#: How the reason a run stopped for a vanished source begins (the summary tells it from a run folder failure by it).
SOURCE_GONE = "the source folder "


class SourceRoots:
    """The folders a run's series were found under: each source folder given, and for a worklist CSV its own
    folder and ``runner.worklist_root`` (when set). File-system paths, made absolute."""

    def __init__(self, folders: Sequence[str | os.PathLike[str]]) -> None:
        self.folders = [Path(os.path.abspath(f)) for f in dict.fromkeys(os.fspath(f) for f in folders)]

    @classmethod
    def of(cls, sources: Sequence[str | os.PathLike[str]], cfg: Config) -> SourceRoots:
        """The source folders of a run of ``sources`` (folders, DICOM files, worklist CSVs) under ``cfg``; a single
        DICOM file's source folder is the folder holding it."""
        folders: list[str | os.PathLike[str]] = []
        for src in sources:
            path = Path(src)
            if path.suffix.lower() == ".csv" and path.is_file():
                folders.append(path.parent)
                root = worklist_root(cfg)
                if root is not None:
                    folders.append(root)
            elif path.is_dir():
                folders.append(path)
            else:
                folders.append(path.parent)
        return cls(folders)

    def gone(self, case: CaseSpec) -> str | None:
        """Why the source folder of ``case`` (the source folder its files, or its ``source``, lie under) cannot be
        read any more: the folder named, with the system's reason; None when it can be read, or when the case lies
        under none of the source folders. A message beginning :data:`SOURCE_GONE`, naming the fix."""
        where = Path(os.path.abspath(case.files[0] if case.files else case.source))
        for folder in self.folders:
            if folder != where and folder not in where.parents:
                continue
            why = _unreadable(folder)
            if why is not None:
                return (
                    f"{SOURCE_GONE}{folder} is gone or unreadable ({why}) since the run found its series: a network "
                    "mount or share that dropped, or the folder moved. Fix: mount it again (or restore the folder) "
                    "and run the same command again to finish the remaining cases (no --retry-failed needed)"
                )
        return None


def _unreadable(folder: Path) -> str | None:
    """The system's reason the folder ``folder`` cannot be listed (gone, no permission, a stale NFS handle), or None."""
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
