"""A series still being written into the source while the run processes it: files of it that arrived, or changed,
since discovery found it.

A nightly or continuous ``ctpipe run`` is often pointed at a folder a PACS or archive is still exporting into. With
``runner.stable_age_s`` at 0 (the default), a series whose export is under way when discovery scans the folder is
taken with the slices already there. Before such a case is published, the engine asks :class:`SourceSnapshot` whether
the series changed in its folders since: a file of the same SeriesInstanceUID that was not there (or a file of the
series whose size or modification time changed, or a new DICOM file beside it cut short, its series not readable
yet). Then nothing of the case is published: it is left for the next run (:class:`~pipeline.errors.SeriesStillWrittenError`),
which finds the whole series under a new fingerprint and analyses it.

The check is cheap for an unchanged source: one ``os.scandir`` per folder holding the case's files, its names
compared with those discovery listed there, and one ``stat`` per file of the case; headers (up to the pixel data,
as discovery reads them) only of files whose names are new. A folder discovery did not list (a single DICOM file
given as the source, or a worklist row naming a file) is not searched for new files; its case's own files are
still checked for changes. Files in other folders (a new subfolder) are not looked for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SeriesStillWrittenError
from .stage import CaseSpec

__all__ = ["SourceSnapshot"]

log = logging.getLogger(__name__)

#: What a case left for the next run because its series was still being written is told to do.
STILL_WRITTEN_FIX = (
    "nothing of the case was published; the next ctpipe run over the same source takes the whole series as a new "
    "case (or set runner.stable_age_s, e.g. 120, to leave a series whose newest file is younger than that many "
    "seconds for the next run)"
)


@dataclass
class SourceSnapshot:
    """What discovery saw of the source: ``names``, for each folder it listed (absolute path as discovery wrote it),
    the names of every regular file it found there (of any series, or skipped); ``files``, for each file of a series
    it found, its size (bytes) and modification time (ns since the Unix epoch) when its header was read."""

    names: dict[str, set[str]] = field(default_factory=dict)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add_scan(self, scan: Any) -> None:
        """Record what a :class:`~pipeline.ingest.ScanResult` saw: its series' files and the files it skipped, in the
        folders under the scan's folder roots (a file given by itself does not make its folder listed)."""
        roots = [os.path.abspath(r) for r in scan.roots if os.path.isdir(r)]
        listed: dict[str, bool] = {}

        def note(path: str) -> None:
            folder, name = os.path.split(path)
            if folder not in listed:
                here = os.path.abspath(folder)
                listed[folder] = any(here == r or here.startswith(r.rstrip(os.sep) + os.sep) for r in roots)
            if listed[folder]:
                self.names.setdefault(folder, set()).add(name)

        for s in scan.series:
            for h in s.headers:
                path = str(h.path)
                note(path)
                self.files[path] = (h.file_size, h.file_mtime_ns)
        for f in scan.skipped_files:
            note(str(f.path))

    def still_written(self, case: CaseSpec) -> SeriesStillWrittenError | None:
        """Why ``case``'s series was still being written since discovery (see the module docstring), or None when
        its folders hold what discovery saw of it. Folders that cannot be listed any more are passed over (a source
        that went away is told by :class:`~.source_roots.SourceRoots`, files gone by the stages)."""
        if not case.files or case.series_uid is None:
            return None
        own = set(case.files)
        new: list[str] = []
        changed: list[str] = []
        for folder in dict.fromkeys(os.path.dirname(f) for f in case.files):
            seen = self.names.get(folder)
            if seen is None:  # not listed by discovery: only the case's own files there
                changed += [f for f in case.files if os.path.dirname(f) == folder and self._changed(f, None)]
                continue
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                log.debug("cannot list %s to look for files that arrived: %s", folder, exc)
                continue
            for e in entries:
                if e.name.startswith("."):  # hidden: a writer's temporary file, as discovery leaves them out
                    continue
                if e.path in own:
                    if self._changed(e.path, e):
                        changed.append(e.path)
                elif e.name not in seen and _is_file(e):
                    new.append(e.path)
        arrived, unreadable = _of_series(case.series_uid, new) if new else ([], [])
        if not (arrived or changed or unreadable):
            return None
        return _error(case, arrived, changed, unreadable)

    def _changed(self, path: str, entry: os.DirEntry[str] | None) -> bool:
        """Whether the file ``path`` of a case changed size or modification time since discovery read its header (a
        file that is gone is not a change here)."""
        was = self.files.get(path)
        if was is None:
            return False
        try:
            st = entry.stat() if entry is not None else os.stat(path)
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns) != was


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _series_uid(key: str) -> str:
    """The SeriesInstanceUID of a series key (``<uid>#<n>`` for a part of a split series)."""
    uid, sep, part = key.rpartition("#")
    return uid if sep and part.isdigit() else key


def _of_series(key: str, paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of the files ``paths`` new in a case's folders: those of the series ``key`` (their headers read as discovery
    reads them, a file without SeriesInstanceUID given the same generated one), and those that begin as DICOM but are
    cut short before their series can be read (still being written). Other files (another series, not DICOM) are
    left out."""
    from ..ingest import read_headers
    from ..ingest.series import fallback_series_uid

    uid = _series_uid(key)
    headers, skipped = read_headers([Path(p) for p in paths], processes=False)
    mine = [str(h.path) for h in headers if (h.series_uid or fallback_series_uid(h)[0]) == uid]
    cut = [str(f.path) for f in skipped if f.kind == "truncated"]
    return sorted(mine), sorted(cut)


def _error(case: CaseSpec, arrived: list[str], changed: list[str], unreadable: list[str]) -> SeriesStillWrittenError:
    parts = []
    if arrived:
        parts.append(
            f"{len(arrived)} file(s) of it arrived in the source since the run found its {len(case.files)} file(s) "
            f"(the first: {arrived[0]})"
        )
    if changed:
        parts.append(f"{len(changed)} of its file(s) changed size or modification time since (the first: {changed[0]})")
    if unreadable:
        parts.append(
            f"{len(unreadable)} new DICOM file(s) beside it are cut short, still being written (the first: {unreadable[0]})"
        )
    return SeriesStillWrittenError(
        f"series {case.series_uid} was still being written while the run processed it: " + "; ".join(parts),
        where=case.source,
        fix=STILL_WRITTEN_FIX,
    )
