"""Directory scan: which series are there, which are chosen, and why the others are not.

A scan reads headers only. Every problem is recorded, never raised: files
that are not DICOM (or are DICOMDIR, cut short, unreadable, not regular files)
go to ``skipped_files`` with their paths and reasons; series that the selection
rules leave out keep their reasons; selected series that fail validation go to
``rejected`` with the exception. One bad series never stops the others.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CtpipeError,
    DicomError,
    InconsistentSeriesError,
    MissingSliceError,
    NonUniformSpacingError,
    TruncatedFileError,
    UnreadableFileError,
    require_bool,
    require_path,
)
from .build import VolumePlan, describe, plan_volume
from .copies import drop_copies
from .discover import SkippedFile, find_files, read_headers
from .headers import SliceHeader
from .series import SelectionRules, SeriesInfo, apply_rules, group_series, select_lone_series

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

    def __repr__(self) -> str:  # short: a notebook echoes the scan; each series holds every slice's header
        shown = ", ".join(repr(s) for s in self.series[:5]) + (
            f", and {len(self.series) - 5} more" if len(self.series) > 5 else ""
        )
        return (
            f"ScanResult({[str(r) for r in self.roots]}: {self.n_files} files, {len(self.skipped_files)} skipped "
            f"({self.skipped_summary()}); {len(self.series)} series, {len(self.selected)} selected, "
            f"{len(self.rejected)} rejected: [{shown}])"
        )

    @property
    def selected(self) -> list[SeriesInfo]:
        """Series chosen by the rules that passed validation."""
        return [s for s in self.series if s.selected]

    def find(self, series_uid: str) -> list[SeriesInfo]:
        """Series whose key or SeriesInstanceUID is ``series_uid``."""
        return [s for s in self.series if series_uid in (s.key, s.uid)]

    def skipped_summary(self) -> str:
        """Counts of the skipped files by kind, e.g. '2 not dicom, 1 unreadable' (or 'none')."""
        counts = Counter(f.kind for f in self.skipped_files)
        return ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(counts.items())) or "none"

    def skipped_list(self, limit: int = 5) -> str:
        """The first ``limit`` skipped files as 'path: reason', and how many more there are."""
        shown = "; ".join(f"{f.path}: {f.reason}" for f in self.skipped_files[:limit])
        more = len(self.skipped_files) - limit
        return shown + (f"; and {more} more" if more > 0 else "")

    def to_json(self, *, keep_identifiers: bool = False) -> dict[str, Any]:
        """JSON-able report of the scan; the series descriptions as the headers hold them with ``keep_identifiers``,
        else each identifier in them as ``<patient>`` (:meth:`SeriesInfo.description_shown`)."""
        return {
            "roots": [str(r) for r in self.roots],
            "n_files": self.n_files,
            "seconds": round(self.seconds, 4),
            "series": [s.summary(keep_identifiers=keep_identifiers) for s in self.series],
            "skipped_files": [{"path": str(f.path), "kind": f.kind, "reason": f.reason} for f in self.skipped_files],
            "rejected": [{"key": r.series.key, "error": type(r.error).__name__, "message": str(r.error)} for r in self.rejected],
        }


def check_ingest_options(
    *, rules: Any, spacing_tolerance: Any, allow_gantry_tilt: Any, keep_identifiers: Any, workers: Any
) -> None:
    """:class:`DicomError` naming the first option of :func:`scan_directory` / :func:`~pipeline.ingest.load_series`
    of the wrong kind, before any file is read: a string where True or False belongs (``keep_identifiers="no"`` is
    true, and would keep the patient's identifiers), ``workers`` that is no whole number 0 or more, ``rules`` that is
    no :class:`SelectionRules`, a ``spacing_tolerance`` that is no fraction from 0 to 1."""
    require_bool(keep_identifiers, name="keep_identifiers", error=DicomError)
    require_bool(allow_gantry_tilt, name="allow_gantry_tilt", error=DicomError)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0):
        raise DicomError(
            f"workers={workers!r} is not a whole number of threads, 0 or more",
            where="workers",
            fix="pass the threads reading headers and pixels, e.g. workers=4 (0 or 1: none), or None for the default",
        )
    if rules is not None and not isinstance(rules, SelectionRules):
        raise DicomError(
            f"rules={rules!r} is not a SelectionRules",
            where="rules",
            fix="pass pipeline.ingest.SelectionRules(...) (e.g. SelectionRules(min_slices=5)), or None for the defaults",
        )
    tol = spacing_tolerance
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0.0 <= float(tol) <= 1.0:
        raise DicomError(
            f"spacing_tolerance={tol!r} is not a fraction from 0 to 1",
            where="spacing_tolerance",
            fix="pass the tolerated deviation of each slice step from the median step as a fraction, "
            "e.g. spacing_tolerance=0.02 (2 %, the default)",
        )


def _roots(path: PathArg | Iterable[PathArg]) -> list[Path]:
    """The folders and files to scan; :class:`DicomError` naming ``path`` for what is neither a path nor paths."""
    fix = "pass a folder or file, or a list of them, as str or pathlib.Path"
    if isinstance(path, (str, os.PathLike)) or not isinstance(path, Iterable) or isinstance(path, (bytes, Mapping)):
        return [require_path(path, where="path", error=DicomError, what="a folder or file, or a list of them", fix=fix)]
    return [require_path(p, where="path", error=DicomError, what="a folder or file", fix=fix) for p in path]


def scan_directory(
    path: PathArg | Iterable[PathArg],
    *,
    rules: SelectionRules | None = None,
    validate: bool = True,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    lone_series_ok: bool = False,
    keep_identifiers: bool = False,
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
    lone_series_ok: what was scanned is what the user named (one folder or file, not a
        batch): when no series qualifies and its only CT series falls short of
        ``rules.min_slices`` alone, select it with a warning (see :func:`select_lone_series`).
    keep_identifiers: keep patient identifiers in the plans' metadata (see
        :func:`pipeline.ingest.build.plan_volume`); left out by default.

    Positions in the plans are DICOM patient coordinates (LPS, mm).
    """
    check_ingest_options(
        rules=rules,
        spacing_tolerance=spacing_tolerance,
        allow_gantry_tilt=allow_gantry_tilt,
        keep_identifiers=keep_identifiers,
        workers=workers,
    )
    rules = rules or SelectionRules()
    t0 = time.perf_counter()
    roots = _roots(path)
    files, skipped = find_files(roots)
    headers, unread = read_headers(files, workers=workers)
    skipped.extend(unread)
    headers, conflicts = drop_copies(headers, skipped)
    series = group_series(headers)
    apply_rules(series, rules)
    if lone_series_ok:
        select_lone_series(series, rules)
    unreadable = [f for f in skipped if f.kind in ("unreadable", "truncated")]
    result = ScanResult(roots=roots, series=series, skipped_files=skipped, n_files=len(files))
    if validate:
        for s in series:
            if not s.selected:
                continue
            conflict = next((conflicts[h.sop_instance] for h in s.headers if h.sop_instance in conflicts), None)
            if conflict is not None:  # two files hold one of its instances with different images
                reject(result, s, conflict.error(describe(s)))
                continue
            near = _unreadable_near(s, unreadable)
            try:
                # the rules already chose the modality, so a PT/MR series allowed by them is not refused here
                result.plans[s.key] = plan_volume(
                    s,
                    spacing_tolerance=spacing_tolerance,
                    allow_gantry_tilt=allow_gantry_tilt,
                    check_modality=False,
                    keep_identifiers=keep_identifiers,
                )
            except (MissingSliceError, NonUniformSpacingError) as exc:
                reject(result, s, _gap_from_unreadable(s, near, exc) if near else _gap_from_split(s, series, exc))
            except CtpipeError as exc:
                reject(result, s, exc)
            else:
                if near:
                    note = (
                        f"{_files_text(near)} in the series' folder cannot be read; if they belong to this series, "
                        "the volume lacks them"
                    )
                    s.warnings.append(note)
                    result.plans[s.key].metadata.setdefault("warnings", []).append(note)
    result.seconds = time.perf_counter() - t0
    log.info(
        "scanned %d files in %.2f s: %d series (%d selected, %d rejected), skipped: %s",
        len(files),
        result.seconds,
        len(series),
        len(result.selected),
        len(result.rejected),
        result.skipped_summary(),
    )
    return result


def _unreadable_near(series: SeriesInfo, unreadable: list[SkippedFile]) -> list[SkippedFile]:
    """Unreadable files and files whose header is cut short in the folders of ``series``: they may be its missing
    slices."""
    if not unreadable:
        return []
    folders = {h.path.parent for h in series.headers}
    return [f for f in unreadable if f.path.parent in folders]


def _files_text(files: list[SkippedFile]) -> str:
    shown = ", ".join(f"{f.path} ({f.reason})" for f in files[:3])
    return f"{len(files)} file(s) ({shown}{', ...' if len(files) > 3 else ''})"


def _gap_from_unreadable(
    series: SeriesInfo, near: list[SkippedFile], gap: CtpipeError
) -> UnreadableFileError | TruncatedFileError:
    """A gap in the slice positions next to unreadable or cut-short files: the true reason is that they cannot be
    read."""
    problem = f"{_files_text(near)} in the series' folder cannot be read, and the readable slices have a gap ({gap.problem})"
    fixes = []
    if any(f.kind == "truncated" for f in near):
        fixes.append("copy the files cut short again from the archive/PACS (the transfer was incomplete)")
    if any(f.kind != "truncated" for f in near):
        fixes.append("make the unreadable files readable by this user (check their permissions and owner)")
    fix = " and ".join(fixes) + ", then scan again"
    err: UnreadableFileError | TruncatedFileError
    if all(f.kind == "truncated" for f in near):
        err = TruncatedFileError(problem, where=describe(series), fix=fix)
    else:
        err = UnreadableFileError(problem, where=describe(series), fix=fix)
    err.__cause__ = gap
    return err


def _differences(h: SliceHeader, ref: SliceHeader) -> str:
    """What sets ``h`` apart from the slices of the part whose first header is ``ref``, with the values."""
    out = []
    if h.position is None:
        out.append("it has no valid ImagePositionPatient (0020,0032)")
    if h.orientation is None:
        out.append("it has no valid ImageOrientationPatient (0020,0037)")
    elif ref.orientation is not None and max(abs(a - b) for a, b in zip(h.orientation, ref.orientation)) > 1e-4:
        out.append(f"ImageOrientationPatient {list(h.orientation)}, not {list(ref.orientation)}")
    if (h.rows, h.columns) != (ref.rows, ref.columns):
        out.append(f"Rows × Columns {h.rows} × {h.columns}, not {ref.rows} × {ref.columns}")
    if h.pixel_spacing != ref.pixel_spacing:
        out.append(f"PixelSpacing {h.pixel_spacing}, not {ref.pixel_spacing}")
    if "LOCALIZER" in h.image_type:
        out.append("ImageType LOCALIZER")
    if h.acquisition_number != ref.acquisition_number:
        out.append(f"AcquisitionNumber {h.acquisition_number}, not {ref.acquisition_number}")
    return "; ".join(out) or "it was set apart"


def _gap_from_split(part: SeriesInfo, series: list[SeriesInfo], gap: CtpipeError) -> CtpipeError:
    """A gap in the slice positions of one part of a split series where images of the same series lie that were set
    apart from it (another ImageOrientationPatient, no position, ...): the true reason is those images' headers.
    Returns ``gap`` itself when no such image lies in the gap."""
    ref = part.first
    if ref.orientation is None:
        return gap
    normal = np.cross(ref.orientation[:3], ref.orientation[3:])
    dist = [float(normal @ h.position) for h in part.headers if h.position is not None]
    if len(dist) < 2:
        return gap
    lo, hi = min(dist), max(dist)
    inside = [
        h
        for other in series
        if other is not part and other.uid == part.uid and other.study_uid == part.study_uid
        for h in other.headers
        if h.position is None or lo < float(normal @ h.position) < hi
    ]
    if not inside:
        return gap
    shown = "; ".join(
        f"{h.path.name}" + ("" if h.position is None else f" ({float(normal @ h.position):.3f} mm)") + f": {_differences(h, ref)}"
        for h in inside[:3]
    )
    more = f"; and {len(inside) - 3} more" if len(inside) > 3 else ""
    names = ", ".join(h.path.name for h in inside[:3]) + (" and more" if len(inside) > 3 else "")
    err = InconsistentSeriesError(
        f"{gap.problem}; {len(inside)} image(s) of the same series lie within the stack but were set apart from its "
        f"slices because their headers differ: {shown}{more}",
        where=describe(part),
        fix=f"re-export {names} from the scanner/PACS with the header values of the other slices, or, if they do not "
        "belong to this stack, remove them from the folder and copy the missing slices from the archive/PACS",
    )
    err.__cause__ = gap
    return err


def reject(result: ScanResult, series: SeriesInfo, error: CtpipeError) -> None:
    """Record that ``series`` failed with ``error`` (it is no longer selected)."""
    series.selected = False
    series.reasons.append(f"rejected: {type(error).__name__}: {error}")
    result.plans.pop(series.key, None)
    result.rejected.append(RejectedSeries(series, error))
    log.warning("rejected %s: %s", series.key, type(error).__name__)
