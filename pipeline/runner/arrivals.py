"""A series still being written into the source while the run processes it: files of it that arrived, or changed,
since discovery found it.

A nightly or continuous ``ctpipe run`` is often pointed at a folder a PACS or archive is still exporting into. With
``runner.stable_age_s`` at 0 (the default), a series whose export is under way when discovery scans the folder is
taken with the slices already there. Before such a case is published, and again once its folder is in place, inside
the run store's transaction that records it done, just before it commits (a file landing in between withdraws it and
rolls the completion back), and once more when that commit is made (a file that landed as it committed withdraws it
and undoes the completion), the engine asks :class:`SourceSnapshot` whether the series changed in the source
since, and if so nothing of the case is published: it is left for the next run
(:class:`~pipeline.errors.SeriesStillWrittenError`), which finds the whole series under a new fingerprint and
analyses it. The series changed when, under the source folders its files were found under:

- a file of the same SeriesInstanceUID is there that discovery did not see: a new name in a folder discovery listed,
  any file in a folder it found no file in (a new batch subfolder, a sibling folder, a new folder anywhere under the
  source), or a file discovery skipped (empty, cut short) in a folder next to the series' own (:func:`_tops`) that
  has since been written to (its size changed);
- a file of the series changed size or modification time;
- a file that may be one of the series still being written lies beside it (in a folder holding its files, or in a
  folder next to or below one of those that held no other series' files at discovery: a new batch folder, or one
  the exporter made early): a new DICOM file cut short before its series can be read, or a new file holding no
  DICOM header yet (0 bytes, or zeros where the header begins: created, or its size set, and not yet written). A
  file that was already there at discovery (it is among discovery's skipped files) counts only once its size
  changes, so an empty junk or marker file, touched or not, never holds a case back; a new one holds the case back
  for this run only, as the next run's discovery finds it and skips it.

A DICOM file given by itself as the source, or named by a worklist row, is the whole input the user asked for:
files arriving beside it are not looked for (its own changes still are).

The check costs, per case, one ``os.scandir`` per folder under the source folders holding its files (the names
compared with those discovery listed, no ``stat`` of other series' files; about 1 µs per file in the source: some
7 ms for 20 series of 300 files), one ``stat`` per file of the case and per file discovery skipped next to them;
headers (up to the pixel data, as discovery reads them) only of new or rewritten files, each read once while it
keeps its size and modification time. Where listing the whole source takes longer than :data:`FRESH_S` (some 50 000
files), that listing serves the next cases for up to ten times as long as it took (at most a minute), so the checks
take about a tenth of the run's time at most: the folders next to each case's own (their parent folder, and all
below it) are still listed for each case, but a file of the series arriving elsewhere in the source during that
time is found by the next run (which, the series having changed, analyses it again as a new case).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
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

#: A new file's verdict: of no series (None), of a series (its SeriesInstanceUID), or possibly of any series while
#: still being written: :data:`CUT` (a DICOM header cut short) or :data:`BLANK` (no DICOM header yet).
CUT, BLANK = "\0cut", "\0blank"

#: A listing of a case's source folders that took longer than this (s; some 50 000 files) is reused for the next
#: cases for up to :data:`REUSE` times as long as it took (at most :data:`REUSE_MAX_S` s), but for the folders next
#: to the case's own (:func:`_tops`), listed again each time: the check then takes about a tenth of the run's time
#: at most, however large the source.
FRESH_S = 0.05
REUSE = 10.0
REUSE_MAX_S = 60.0

#: Bytes a DICOM file's 128-byte preamble and its 'DICM' marker take.
_HEAD = 132


@dataclass
class SourceSnapshot:
    """What discovery saw of the source: ``names``, for each folder it listed (absolute path as discovery wrote it),
    the names of every regular file it found there (of any series, or skipped); ``files``, for each file of a series
    it found, its size (bytes) and modification time (ns since the Unix epoch) when its header was read; ``skipped``,
    for each of those folders, the size (bytes) of each file it skipped there (not DICOM, empty, cut short, ...),
    by name; ``held``, the folders holding files of a series; ``roots``, for each scan, the folders it was given (a
    file given by itself is not one)."""

    names: dict[str, set[str]] = field(default_factory=dict)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    roots: list[tuple[str, ...]] = field(default_factory=list)
    #: verdicts of the new files read so far, by path: ((size, mtime_ns) when read, verdict)
    _read: dict[str, tuple[tuple[int, int], str | None]] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: the last listing of each set of source folders: (time.monotonic() when made, s it took, new files by folder)
    _listed: dict[tuple[str, ...], tuple[float, float, dict[str, list[str]]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def add_scan(self, scan: Any) -> None:
        """Record what a :class:`~pipeline.ingest.ScanResult` saw: its series' files and the files it skipped, in the
        folders under the scan's folder roots (a file given by itself does not make its folder listed)."""
        roots = [str(r) for r in scan.roots if os.path.isdir(r)]
        alone = [str(r) for r in scan.roots if not os.path.isdir(r)]
        if roots:
            self.roots.append(tuple(roots))
        if alone:
            log.info(
                "%d DICOM file(s) given by themselves (the first: %s) are the whole input asked for: files arriving "
                "beside them during the run are not looked for",
                len(alone),
                alone[0],
            )
        absolute = [os.path.abspath(r) for r in roots]
        listed: dict[str, bool] = {}

        def note(path: str) -> bool:
            folder, name = os.path.split(path)
            if folder not in listed:
                listed[folder] = any(_under(os.path.abspath(folder), r) for r in absolute)
            if listed[folder]:
                self.names.setdefault(folder, set()).add(name)
            return listed[folder]

        for s in scan.series:
            for h in s.headers:
                path = str(h.path)
                if note(path):
                    self.held.add(os.path.dirname(path))
                self.files[path] = (h.file_size, h.file_mtime_ns)
        for f in scan.skipped_files:
            path = str(f.path)
            if note(path):
                folder, name = os.path.split(path)
                try:
                    self.skipped.setdefault(folder, {})[name] = os.stat(path).st_size
                except OSError:  # gone, or a broken link: a file written there later is a new name's worth
                    self.names[folder].discard(name)

    def still_written(self, case: CaseSpec) -> SeriesStillWrittenError | None:
        """Why ``case``'s series was still being written since discovery (see the module docstring), or None when
        the source holds what discovery saw of it. Folders that cannot be listed any more are passed over (a source
        that went away is told by :class:`~.source_roots.SourceRoots`, files gone by the stages)."""
        if not case.files or case.series_uid is None:
            return None
        own = set(case.files)
        homes = {os.path.dirname(f) for f in case.files}
        changed: list[str] = []
        new: dict[str, bool] = {}  # a file discovery did not see (or saw skipped and that grew since): near the case?
        walked: set[str] = set()
        roots = tuple(self._roots_of(homes))
        tops = _tops(homes, roots)
        began = time.monotonic()
        earlier = self._reusable(roots, began)
        listed: dict[str, list[str]] = {}
        for folder, entries in _walk(tops if earlier is not None else roots):
            walked.add(folder)
            seen = self.names.get(folder)
            # next to the case: its folders, and those holding no other series' files beside or below them
            near = folder in homes or (folder not in self.held and any(_under(folder, t) for t in tops))
            if seen is None:  # discovery found no file here: each one is new
                new.update((e.path, near) for e in entries)
                listed[folder] = [e.path for e in entries]
                continue
            fresh = [e for e in entries if e.name not in seen]
            listed[folder] = [e.path for e in fresh]
            if folder in homes:
                changed += [e.path for e in entries if e.path in own and self._changed(e.path, e)]
            grew = self.skipped.get(folder)
            if grew and any(_under(folder, t) for t in tops):  # one discovery skipped next to the case, written to since
                fresh += [e for e in entries if e.name in grew and _size(e) not in (grew[e.name], None)]
            new.update((e.path, near) for e in fresh)
        took = time.monotonic() - began
        if earlier is None and took > FRESH_S:  # a large source: this listing serves the next cases for a while
            self._listed[roots] = (began, took, listed)
        elif earlier is not None:  # the rest of the source as listed then (tops were listed now)
            for folder, paths in earlier.items():
                if not any(_under(folder, t) for t in tops):
                    new.update((p, False) for p in paths)
        changed += [f for f in case.files if os.path.dirname(f) not in walked and self._changed(f, None)]
        verdicts = self._verdicts(list(new)) if new else {}
        uid = _series_uid(case.series_uid)
        arrived = sorted(p for p, v in verdicts.items() if v == uid)
        cut = sorted(p for p, v in verdicts.items() if v == CUT and new[p])
        blank = sorted(p for p, v in verdicts.items() if v == BLANK and new[p])
        if not (arrived or changed or cut or blank):
            return None
        return _error(case, arrived, sorted(changed), cut, blank)

    def _reusable(self, roots: tuple[str, ...], now: float) -> dict[str, list[str]] | None:
        """The new files by folder under ``roots`` as a listing that took longer than :data:`FRESH_S` saw them, while
        it is younger than :data:`REUSE` times as long as it took (and :data:`REUSE_MAX_S`); else None: list again."""
        earlier = self._listed.get(roots)
        if earlier is None or now - earlier[0] > min(REUSE * earlier[1], REUSE_MAX_S):
            return None
        return earlier[2]

    def _roots_of(self, homes: set[str]) -> list[str]:
        """The folders given to the scans that found files in ``homes`` (all of a scan's folders: a series found
        under one of them gains files under any of them in the next scan), none below another one."""
        roots = {r for group in self.roots if any(_under(h, r) for h in homes for r in group) for r in group}
        return sorted(r for r in roots if not any(o != r and _under(r, o) for o in roots))

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

    def _verdicts(self, paths: Sequence[str]) -> dict[str, str | None]:
        """The verdict of each of the new files ``paths`` (see :data:`CUT`); each file's header is read again only
        once it changed size or modification time. Files gone again are left out."""
        out: dict[str, str | None] = {}
        todo: dict[str, tuple[int, int]] = {}
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                continue
            key = (st.st_size, st.st_mtime_ns)
            known = self._read.get(p)
            if known is not None and known[0] == key:
                out[p] = known[1]
            else:
                todo[p] = key
        for p, verdict in _read_verdicts(list(todo)).items() if todo else ():
            self._read[p] = (todo[p], verdict)
            out[p] = verdict
        return out


def _tops(homes: set[str], roots: Sequence[str]) -> list[str]:
    """The folders listed for a case whatever the size of the source: the parent of each of its folders ``homes``
    (so its sibling and subfolders too), or the folder itself when it is one of ``roots`` (or lies under none),
    none below another one."""
    tops = set()
    for h in homes:
        up = os.path.dirname(h)
        tops.add(up if any(_under(up, r) for r in roots) else h)
    return sorted(t for t in tops if not any(o != t and _under(t, o) for o in tops))


def _under(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (paths spelled alike: both absolute, or both as given)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _walk(roots: Sequence[str]) -> Iterator[tuple[str, list[os.DirEntry[str]]]]:
    """Each folder under ``roots`` (themselves included) with its regular files, as discovery walks them: hidden
    entries left out, links to folders not followed; a folder that cannot be listed is passed over."""
    stack = list(reversed(roots))
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as exc:
            log.debug("cannot list %s to look for files that arrived: %s", top, exc)
            continue
        files = []
        for e in entries:
            if e.name.startswith("."):  # hidden: a writer's temporary file, as discovery leaves them out
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file():
                    files.append(e)
            except OSError:
                continue
        yield top, files


def _size(entry: os.DirEntry[str]) -> int | None:
    """The size (bytes) of the file ``entry``, None when it is gone. Only a change of size tells a file discovery
    skipped was written to: an empty marker file touched again is not a slice being written."""
    try:
        return entry.stat().st_size
    except OSError:
        return None


def _series_uid(key: str) -> str:
    """The SeriesInstanceUID of a series key (``<uid>#<n>`` for a part of a split series)."""
    uid, sep, part = key.rpartition("#")
    return uid if sep and part.isdigit() else key


def _read_verdicts(paths: Sequence[str]) -> dict[str, str | None]:
    """Of each of the files ``paths``: the SeriesInstanceUID in its header (read as discovery reads it, a file
    without one given the same generated one), :data:`CUT` when it begins as DICOM but is cut short before its
    series can be read, :data:`BLANK` when it holds no DICOM header yet (:func:`_no_header_yet`), else None (not
    DICOM, a DICOMDIR, unreadable)."""
    from ..ingest import read_headers
    from ..ingest.series import fallback_series_uid

    headers, skipped = read_headers([Path(p) for p in paths], processes=False)
    out: dict[str, str | None] = {str(h.path): h.series_uid or fallback_series_uid(h)[0] for h in headers}
    for f in skipped:
        blank = f.kind == "not_dicom" and _no_header_yet(f.path)
        out[str(f.path)] = CUT if f.kind == "truncated" else BLANK if blank else None
    return out


def _no_header_yet(path: Path) -> bool:
    """Whether the file ``path`` could still become a DICOM file as its writer goes on: empty, zeros where the
    preamble and 'DICM' marker go (the size set first, the bytes written later, or a zero preamble being written),
    or fewer than 8 bytes that begin like a data set without a preamble (group 0002 or 0008)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return False
    if not head.strip(b"\0"):
        return True
    return len(head) < 8 and (b"\x02\x00".startswith(head[:2]) or b"\x08\x00".startswith(head[:2]))


def _error(case: CaseSpec, arrived: list[str], changed: list[str], cut: list[str], blank: list[str]) -> SeriesStillWrittenError:
    parts = []
    if arrived:
        parts.append(
            f"{len(arrived)} file(s) of it arrived in the source since the run found its {len(case.files)} file(s) "
            f"(the first: {arrived[0]})"
        )
    if changed:
        parts.append(f"{len(changed)} of its file(s) changed size or modification time since (the first: {changed[0]})")
    if cut:
        parts.append(f"{len(cut)} new DICOM file(s) beside it are cut short, still being written (the first: {cut[0]})")
    if blank:
        parts.append(
            f"{len(blank)} new file(s) beside it hold no DICOM header yet (0 bytes, or zeros where it begins), "
            f"possibly files of it being written (the first: {blank[0]})"
        )
    return SeriesStillWrittenError(
        f"series {case.series_uid} was still being written while the run processed it: " + "; ".join(parts),
        where=case.source,
        fix=STILL_WRITTEN_FIX,
    )
