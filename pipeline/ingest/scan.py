"""Directory scan: which series are there, which are chosen, and why the others are not.

A scan reads headers only. Every problem is recorded, never raised: files
that are not DICOM (or are DICOMDIR, or are cut short) go to
``skipped_files``; series that the selection rules leave out keep their
reasons; selected series that fail validation go to ``rejected`` with the
exception. One bad series never stops the others.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CtpipeError
from .build import VolumePlan, plan_volume
from .discover import SkippedFile, discover_files, read_headers
from .headers import SliceHeader
from .series import SelectionRules, SeriesInfo, apply_rules, group_series

log = logging.getLogger(__name__)

PathArg = str | os.PathLike[str]


@dataclass(frozen=True)
class RejectedSeries:
    """A series the rules selected but that cannot form a valid volume."""

    series: SeriesInfo
    error: CtpipeError

    @property
    def reason(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@dataclass
class ScanResult:
    """What :func:`scan_directory` found.

    ``series``: every (sub-)series with ``selected`` and ``reasons``;
    ``skipped_files``: files not used, with reasons; ``rejected``: selected series
    that failed validation, with the exception; ``plans``: validated series by key.
    """

    roots: list[Path]
    series: list[SeriesInfo]
    skipped_files: list[SkippedFile]
    rejected: list[RejectedSeries] = field(default_factory=list)
    plans: dict[str, VolumePlan] = field(default_factory=dict)
    n_files: int = 0
    seconds: float = 0.0

    @property
    def selected(self) -> list[SeriesInfo]:
        """Series chosen by the rules that passed validation."""
        return [s for s in self.series if s.selected]

    def find(self, series_uid: str) -> list[SeriesInfo]:
        """Series whose key or SeriesInstanceUID is ``series_uid``."""
        return [s for s in self.series if series_uid in (s.key, s.uid)]

    def skipped_summary(self) -> str:
        counts = Counter(f.kind for f in self.skipped_files)
        return ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(counts.items())) or "none"

    def to_json(self) -> dict[str, Any]:
        """JSON-able report of the scan."""
        return {
            "roots": [str(r) for r in self.roots],
            "n_files": self.n_files,
            "seconds": round(self.seconds, 4),
            "series": [s.summary() for s in self.series],
            "skipped_files": [{"path": str(f.path), "kind": f.kind, "reason": f.reason} for f in self.skipped_files],
            "rejected": [{"key": r.series.key, "error": type(r.error).__name__, "message": str(r.error)} for r in self.rejected],
        }


def _roots(path: PathArg | Iterable[PathArg]) -> list[Path]:
    if isinstance(path, (str, os.PathLike)):
        return [Path(path)]
    return [Path(p) for p in path]


def scan_directory(
    path: PathArg | Iterable[PathArg],
    *,
    rules: SelectionRules | None = None,
    validate: bool = True,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    workers: int | None = None,
) -> ScanResult:
    """Scan folders (recursively, any file names) or files for DICOM series, reading headers only.

    Parameters
    ----------
    path: a folder, a file, or several of them.
    rules: selection rules (default :class:`SelectionRules()`: CT, axial, >= 10 slices,
        no localizers, no derived images).
    validate: also check every selected series' geometry from its headers (sort
        order, spacing, tilt, consistency); failures go to ``rejected``.
    spacing_tolerance, allow_gantry_tilt: see :func:`pipeline.ingest.load_series`.

    Positions in the plans are DICOM patient coordinates (LPS, mm).
    """
    rules = rules or SelectionRules()
    t0 = time.perf_counter()
    roots = _roots(path)
    files = discover_files(roots)
    headers, skipped = read_headers(files, workers=workers)
    headers = _drop_copies(headers, skipped)
    series = group_series(headers)
    apply_rules(series, rules)
    result = ScanResult(roots=roots, series=series, skipped_files=skipped, n_files=len(files))
    if validate:
        for s in series:
            if not s.selected:
                continue
            try:
                # the rules already chose the modality, so a PT/MR series allowed by them is not refused here
                result.plans[s.key] = plan_volume(s, spacing_tolerance=spacing_tolerance, allow_gantry_tilt=allow_gantry_tilt,
                                                  check_modality=False)
            except CtpipeError as exc:
                reject(result, s, exc)
    result.seconds = time.perf_counter() - t0
    log.info("scanned %d files in %.2f s: %d series (%d selected, %d rejected), skipped: %s", len(files), result.seconds,
             len(series), len(result.selected), len(result.rejected), result.skipped_summary())
    return result


def _drop_copies(headers: list[SliceHeader], skipped: list[SkippedFile]) -> list[SliceHeader]:
    """Keep one file per SOPInstanceUID; the other copies are skipped with a reason."""
    seen: dict[str, SliceHeader] = {}
    kept = []
    for h in headers:
        first = seen.get(h.sop_instance) if h.sop_instance else None
        if first is None:
            if h.sop_instance:
                seen[h.sop_instance] = h
            kept.append(h)
        else:
            skipped.append(SkippedFile(h.path, "duplicate_copy", f"another copy of SOP instance {h.sop_instance} (kept {first.path})"))
    return kept


def reject(result: ScanResult, series: SeriesInfo, error: CtpipeError) -> None:
    """Record that ``series`` failed with ``error`` (it is no longer selected)."""
    series.selected = False
    series.reasons.append(f"rejected: {type(error).__name__}: {error}")
    result.plans.pop(series.key, None)
    result.rejected.append(RejectedSeries(series, error))
    log.warning("rejected %s: %s", series.key, type(error).__name__)
