"""Adopting a case folder a killed run left in place before its case was recorded done for good: its source series
is checked again first.

A run puts a case's folder in place (``cases/<case_id>``, see :func:`.resume.publish`), then records the case done in
the run store, with a check of the source series inside that transaction and once more just after it
(:mod:`.arrivals`). A run killed between putting the folder in place and that last check leaves a complete folder
whose series may have gained (or changed) a file in that moment. The next run adopts such a folder only once it has
checked the series as the run that made it would have: its discovery finds the same case (the same
SOPInstanceUIDs and file sizes: :mod:`.fingerprint`) and its files have the sizes and modification times they had
when the folder was made (:func:`source_digest`, kept in the manifest as ``source``). Otherwise the folder is
withdrawn and the case left pending with the reason (:class:`~pipeline.errors.SeriesStillWrittenError`): the run
analyses the series whole. A series this run's sources do not hold cannot be checked: its folder and case are left as
they are, for a run over its source.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .arrivals import SourceSnapshot
from .stage import CaseSpec

__all__ = ["NOT_FOUND", "SourceCheck", "source_check", "source_digest"]

#: What a :data:`SourceCheck` answers for a case whose series this run's sources do not hold (it cannot be checked).
NOT_FOUND = "\0not found"

#: Why the source series of a case (its run store row, its folder's manifest) is not what its folder was made from;
#: None when it is; :data:`NOT_FOUND` when this run's sources do not hold the series.
SourceCheck = Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]


def source_digest(files: Iterable[str], snapshot: SourceSnapshot) -> str | None:
    """SHA-256 (24 hex digits) of the name, size (bytes) and modification time (ns) of each of a case's source
    ``files`` as discovery saw them (``snapshot.files``); None when discovery saw none of them."""
    seen = sorted((os.path.basename(f), *snapshot.files[f]) for f in files if f in snapshot.files)
    if not seen:
        return None
    h = hashlib.sha256()
    for name, size, mtime_ns in seen:
        h.update(f"|{name}:{size}:{mtime_ns}".encode())
    return h.hexdigest()[:24]


def source_check(cases: Iterable[CaseSpec], snapshot: SourceSnapshot) -> SourceCheck:
    """The :data:`SourceCheck` of a run whose discovery found ``cases`` and saw ``snapshot`` of its sources."""
    by_series: dict[str, list[CaseSpec]] = {}
    for c in cases:
        if c.series_uid is not None:
            by_series.setdefault(c.series_uid, []).append(c)

    def check(row: Mapping[str, Any], manifest: Mapping[str, Any]) -> str | None:
        found = by_series.get(str(row["series_uid"]), [])
        if not found:
            return NOT_FOUND
        same = next((c for c in found if c.case_key == row["case_key"]), None)
        n_made = manifest.get("source_files")
        if same is None:
            now = max(found, key=lambda c: len(c.files))
            made = f" (its folder was made from {n_made} file(s))" if n_made is not None else ""
            return (
                f"series {row['series_uid']} has other content in the source now than case {row['case_id']}'s folder, "
                f"left by a run killed as it recorded the case, was made from: {len(now.files)} file(s) now{made}, "
                "files added, removed or replaced as that run ended"
            )
        digest = manifest.get("source")
        if digest is not None and source_digest(same.files, snapshot) != digest:
            return (
                f"a file of series {row['series_uid']} was rewritten in the source (its size or modification time "
                f"changed) since case {row['case_id']}'s folder, left by a run killed as it recorded the case, was made"
            )
        return None

    return check
