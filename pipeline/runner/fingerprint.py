"""A series' fingerprint: its key and the SOPInstanceUIDs and sizes of its files. Discovery keys cases by it (a
changed series is a new case), and the DICOM stage checks a case's files against it before publishing."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def fingerprint_series(series: Any) -> str:
    """The fingerprint of a scanned series (:func:`fingerprint_files`' of its key and its files' headers)."""
    return fingerprint_files(str(series.key), [(hh.sop_instance, hh.file_size) for hh in series.headers])


def fingerprint_files(series_key: str, files: Iterable[tuple[str, int]]) -> str:
    """A series' fingerprint: its key and the (SOPInstanceUID, size in bytes) of each of its files, in any order."""
    h = hashlib.sha256(series_key.encode())
    for sop, size in sorted(files):
        h.update(f"|{sop}:{size}".encode())
    return h.hexdigest()[:24]


def files_fingerprint_now(series_key: str, paths: Sequence[str | os.PathLike[str]]) -> str:
    """:func:`fingerprint_files` of ``paths`` as they are on disk now, their headers read as discovery reads them
    (:func:`pipeline.ingest.read_headers`; a file that is gone or no longer DICOM counts as changed)."""
    from ..ingest import read_headers

    headers, skipped = read_headers([Path(p) for p in paths], processes=False)
    pairs = [(h.sop_instance, h.file_size) for h in headers] + [(f"skipped:{f.path}", -1) for f in skipped]
    return fingerprint_files(series_key, pairs)
