"""The ingest entry points: :func:`load_series` and :func:`ingest_to_cache`."""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..cache import CacheEntry, CaseCache
from ..errors import (
    AmbiguousSeriesError,
    CacheError,
    CtpipeError,
    DicomError,
    NoSeriesFoundError,
    NotCTError,
    NotDicomError,
    SingleSliceError,
    TruncatedFileError,
    UnreadableFileError,
    missing_path_fix,
    require_path,
    require_text,
)
from ..volume import WRAP_ARRAY_FIX, CTVolume
from .build import build_volume, describe, read_volume
from .discover import STRAY_FILE_FIX, find_files, read_header, read_headers
from .headers import SliceHeader
from .image import IMAGE_SUFFIXES, archive_kind, image_suffix, read_image, unpack_fix
from .scan import PathArg, ScanResult, check_ingest_options, reject, scan_directory
from .series import SelectionRules, SeriesInfo, group_series

log = logging.getLogger(__name__)


def safe_case_id(series_key: str) -> str:
    """A case id (safe file stem) from a series key: UIDs are kept, '#<n>' parts become '_p<n>'."""
    text = series_key.replace("#", "_p")
    text = re.sub(r"[^A-Za-z0-9._-]", "_", text).strip("._-") or "series"
    if not text[0].isalnum():
        text = "s" + text
    return text[:200]


def _series_list(series: Iterable[SeriesInfo], *, keep_identifiers: bool) -> str:
    """``series`` for an error listing them: key, description and slices of each. The description is the header's
    own with ``keep_identifiers`` (the caller asked for the patient's identifiers), else
    :attr:`SeriesInfo.description` (each identifier in it as ``<patient>``)."""
    shown = [(s, s.description_shown(keep_identifiers=keep_identifiers)) for s in series]
    return "; ".join(f"{s.key} ({text or 'no description'}, {s.n_slices} slices)" for s, text in shown)


def explain_nothing(scan: ScanResult, rules: SelectionRules) -> CtpipeError:
    """The most specific error for a scan in which no series qualifies."""
    where = ", ".join(str(r) for r in scan.roots)
    if len(scan.rejected) == 1:  # the one series the rules chose is broken: say exactly how
        return scan.rejected[0].error
    if not scan.series and scan.skipped_files:
        kinds = Counter(f.kind for f in scan.skipped_files)
        n = len(scan.skipped_files)
        if set(kinds) == {"truncated"}:
            return TruncatedFileError(
                f"all {n} DICOM file(s) are cut short ({scan.skipped_list()})",
                where=where,
                fix="copy the files again from the archive/PACS; the transfer was incomplete",
            )
        if set(kinds) <= {"unreadable", "not_regular", "not_followed"}:
            return UnreadableFileError(
                f"none of the {n} entries found can be read as a file ({scan.skipped_list()})",
                where=where,
                fix="make the files readable by this user (permissions, owner), "
                "resolve the links, or point ctpipe at the folder that holds the files",
            )
        fix = "point ctpipe at the folder holding the DICOM image files"
        if any(f.kind == "not_dicom" and image_suffix(f.path) for f in scan.skipped_files):
            # a NIfTI/MHA/NRRD image where a DICOM series was expected (ctpipe ingest): say what reads it, as ctpipe run
            fix = (
                "ctpipe ingest and ctpipe run read DICOM series; analyse an image with `ctpipe detect FILE` or "
                "`ctpipe reconstruct FILE` (in Python: load_series(FILE))"
            )
        archives = [f.path for f in scan.skipped_files if f.reason.startswith("an archive (")]
        if archives:  # zipped exports: their files are the DICOM
            fix = f"{unpack_fix(archives[0], 'ctpipe (or load_series)')}; or " + fix
        if kinds.get("unreadable"):
            fix += "; the unreadable files may be them: check their permissions"
        return NotDicomError(
            f"no DICOM image files found among {n} file(s) ({scan.skipped_summary()}: {scan.skipped_list()})",
            where=where,
            fix=fix,
        )
    if len(scan.series) == 1:
        s = scan.series[0]
        if s.modality not in rules.modalities:
            return NotCTError(
                f"the only series, {s.key}, has Modality {s.modality or 'missing'} (SOP class "
                f"{s.first.sop_class or 'missing'}), not {'/'.join(rules.modalities)}",
                where=describe(s),
                fix="point ctpipe at a CT series",
            )
        if s.n_slices < 2 or any(h.geometry_error for h in s.headers):
            try:  # raises SingleSliceError naming the series, or the multi-frame geometry error naming file and frame
                build_volume(s)
            except CtpipeError as exc:
                return exc
    if not scan.n_files and not scan.skipped_files and not scan.series:
        return NoSeriesFoundError(
            "the folder holds no files (searched recursively)",
            where=where,
            fix="point ctpipe at the folder holding the DICOM series (or wait until its transfer has finished)",
        )
    lines = [f"{s.key}: {s.why_not}" for s in scan.series]
    skipped = f"{scan.skipped_summary()} ({scan.skipped_list()})" if scan.skipped_files else "none"
    return NoSeriesFoundError(
        f"no series matches the selection rules ({rules}); series found: "
        + (" | ".join(lines) or "none")
        + f"; files skipped: {skipped}",
        where=where,
        fix="pick a series with series_uid=... (--series-uid on the command line), or relax the rules "
        "(min_slices, allow_derived, axial_tolerance_deg)",
    )


def _images_instead(scan: ScanResult, where: Path) -> NoSeriesFoundError | None:
    """The error for a folder that holds NIfTI/MHA/NRRD images and no DICOM series, or None."""
    if scan.series:
        return None
    images = sorted(str(f.path) for f in scan.skipped_files if f.kind == "not_dicom" and image_suffix(f.path))
    if not images:
        return None
    names = ", ".join(Path(i).name for i in images[:5]) + (", ..." if len(images) > 5 else "")
    return NoSeriesFoundError(
        f"the folder holds no DICOM series but {len(images)} image file(s): {names}",
        where=where,
        fix=f"load one image file: load_series({images[0]!r}) reads NIfTI/MHA/NRRD images",
    )


def _one_file_of_a_series(path: Path, header: SliceHeader, exc: SingleSliceError, workers: int | None) -> CtpipeError:
    """For one file of a multi-slice series: the error naming its folder's other slices and how to load them all.

    ``exc`` itself when the file's folder holds no other slice of its series.
    """
    folder = path.parent
    try:
        files, _ = find_files([folder])
    except CtpipeError:
        return exc
    others = [f for f in files if f.parent == folder and f != path]
    if not others:
        return exc
    headers, _ = read_headers(others, workers=workers)
    groups = group_series([header, *headers])
    mine = next((g for g in groups if any(h.path == header.path for h in g.headers)), None)
    if mine is None or mine.n_slices < 2:
        return exc
    series = {g.key for g in groups}
    if len(series) > 1:
        fix = (
            f"pass the folder and pick the series: load_series({str(folder)!r}, series_uid={mine.key!r}) "
            f"(the folder holds {len(series)} series); on the command line: {folder} --series-uid {mine.key}"
        )
    else:
        fix = f"pass the folder: load_series({str(folder)!r}); on the command line: {folder} as the source"
    return SingleSliceError(
        f"the file is one slice of series {mine.key}, whose {mine.n_slices} slices are in its folder; "
        "one file loads only a multi-frame (Enhanced CT) object",
        where=path,
        fix=fix,
    )


def load_series(
    path: PathArg,
    *,
    series_uid: str | None = None,
    rules: SelectionRules | None = None,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    keep_identifiers: bool = False,
    workers: int | None = None,
) -> CTVolume:
    """Load one CT series as a :class:`~pipeline.volume.CTVolume` in Hounsfield units.

    Parameters
    ----------
    path: a folder (searched recursively, any file names) holding the series, one
        file (an Enhanced CT multi-frame object), or a NIfTI/MHA/NRRD image file
        (``.nii``, ``.nii.gz``, ``.mha``, ``.mhd``, ``.nrrd``) holding HU values. An image
        file is read with SimpleITK, which gives its geometry in LPS (a NIfTI's RAS
        affine is converted); ``series_uid`` and the DICOM options do not apply to it
        and its ``metadata["SeriesInstanceUID"]`` is the file name without the ending, which then names what
        ``detect`` and ``reconstruct`` write of it (``ctpipe detect`` and ``reconstruct`` name their outputs by a digest
        of the image unless asked: :func:`pipeline.ingest.source.image_named`).
    series_uid: the SeriesInstanceUID (or ``<uid>#<part>`` key of a split series) to
        load. It bypasses the selection rules except that the series must be CT.
        Without it the folder must hold exactly one series that the rules select;
        when its only CT series is shorter than ``rules.min_slices`` (but has at least
        2 slices), that series is loaded with a warning: the folder was named.
    rules: selection rules (see :class:`SelectionRules`).
    spacing_tolerance: allowed deviation of each slice step from the median step,
        as a fraction (0.02 = 2 %); larger deviations raise MissingSliceError or
        NonUniformSpacingError.
    allow_gantry_tilt: resample a tilted-gantry series onto an orthogonal grid
        (per-slice in-plane linear interpolation) instead of raising GantryTiltError;
        the grid grows along the shift to hold every slice whole (LPS positions kept).
    keep_identifiers: copy the patient identifiers the header scan reads,
        :data:`pipeline.ingest.header_values.METADATA_IDENTIFIERS` (PatientID, PatientName,
        PatientBirthDate, AccessionNumber), into ``metadata``, and the SeriesDescription as it is, also in the error
        listing the folder's series (several qualify, or ``series_uid`` is not among them); the other
        attributes of :data:`pipeline.volume.PATIENT_IDENTIFIERS` are never read. By default they are left out and
        each of them in the description reads ``<patient>``. An image file's label-map warning names the other
        image files beside it with it, else counts them (:func:`~pipeline.ingest.image.label_map_warning`).
    workers: threads for header and pixel reads, 0 or more (0 or 1: none; default: 2 × CPU count, at most 8).

    Returns
    -------
    The HU array ``[k, j, i]`` (int16 when the rescale is integral and fits, else
    float32; an image file's values likewise: int16 when they are integers that fit, else float32; pixel padding, PixelPaddingValue (0028,0120) up to PixelPaddingRangeLimit
    (0028,0121), is -1024 HU and does not count toward the fit) with its geometry in DICOM patient coordinates (LPS, mm): origin = the
    ImagePositionPatient of the first slice along the slice normal, direction
    columns = row cosine, column cosine, normal = cross(row, column), spacing =
    (PixelSpacing[1], PixelSpacing[0], median slice step) — the same grid as
    SimpleITK's ImageSeriesReader; a tilt-corrected series' grid has more rows or
    columns, and starts before the first slice's position where the slices drift
    towards lower indices (see ``allow_gantry_tilt``). ``metadata["warnings"]`` lists what ingest assumed to
    load the series (a generated series id, a Modality taken from the SOP class, ...);
    each is also logged.

    Raises a :class:`~pipeline.errors.DicomError` subclass naming the file or series,
    the problem and the fix (e.g. for one slice file of a series: the folder to pass); a
    :class:`~pipeline.errors.DicomError` naming the argument for a ``path`` that is not one path (several folders:
    :func:`scan_directory` or :func:`~pipeline.run_batch` take them; an HU array: ``CTVolume(array, Geometry(...))``;
    a SimpleITK image: :meth:`CTVolume.from_sitk <pipeline.volume.CTVolume.from_sitk>`) or an option of the wrong
    kind (:func:`~pipeline.ingest.scan.check_ingest_options`: ``keep_identifiers="no"`` is refused, not taken as true;
    a ``spacing_tolerance`` outside 0..1).
    """
    _check_load_arguments(path)
    require_text(series_uid, name="series_uid", error=DicomError)
    options: dict[str, Any] = {
        "spacing_tolerance": spacing_tolerance,
        "allow_gantry_tilt": allow_gantry_tilt,
        "keep_identifiers": keep_identifiers,
    }
    check_ingest_options(rules=rules, workers=workers, **options)  # a file is read without scan_directory's check
    rules = rules or SelectionRules()
    p = Path(path)
    if p.is_file() and image_suffix(p):
        if series_uid is not None:
            raise NoSeriesFoundError(
                f"series_uid={series_uid!r} picks a series of a DICOM folder; this image file holds one volume",
                where=p,
                fix="leave out series_uid",
            )
        return read_image(p, keep_identifiers=keep_identifiers)
    if p.is_file():
        try:
            header = read_header(p)
        except NotDicomError as exc:
            # the file named is what is wrong, not a stray file in a scanned folder
            if kind := archive_kind(p):
                raise NotDicomError(
                    f"an archive ({kind}), not a DICOM file",
                    where=p,
                    fix=unpack_fix(p, "load_series"),
                ) from exc
            if exc.fix != STRAY_FILE_FIX:  # said of this file (a DICOMDIR, a NIfTI): as it is
                raise
            raise NotDicomError(
                exc.problem,
                where=p,
                fix="pass the folder of a DICOM series, one Enhanced CT (multi-frame) DICOM file, or a NIfTI/MHA/NRRD "
                f"image ({', '.join(IMAGE_SUFFIXES)})",
            ) from exc
        series = group_series([header])[0]
        try:
            return build_volume(series, **options, workers=workers)
        except SingleSliceError as exc:
            err = _one_file_of_a_series(p, header, exc, workers)
            if err is exc:
                raise
            raise err from exc
    if not p.exists() and not p.is_symlink():
        raise NotDicomError("no such file or folder", where=p, fix=missing_path_fix(path, "check the path"))
    scan = scan_directory(p, rules=rules, lone_series_ok=True, **options, workers=workers)
    for f in scan.skipped_files:
        log.log(logging.WARNING if f.kind in ("unreadable", "truncated") else logging.INFO, "skipped %s: %s", f.path, f.reason)
    if series_uid is not None:
        picked = _pick(scan, series_uid, keep_identifiers=keep_identifiers)
        if picked.key in scan.plans:
            return read_volume(scan.plans[picked.key], workers=workers)
        return build_volume(picked, **options, workers=workers)
    chosen = scan.selected
    if len(chosen) > 1:
        raise AmbiguousSeriesError(
            f"{len(chosen)} CT series qualify: {_series_list(chosen, keep_identifiers=keep_identifiers)}",
            where=p,
            fix="pass series_uid=<one of the keys above> (--series-uid on the command line), or use ingest_to_cache "
            "(ctpipe ingest, ctpipe run) to take them all",
        )
    if not chosen:
        raise _images_instead(scan, p) or explain_nothing(scan, rules)
    for r in scan.rejected:
        log.warning("not loaded: %s", r.reason)
    return read_volume(scan.plans[chosen[0].key], workers=workers)


def _check_load_arguments(path: Any) -> None:
    """:class:`DicomError` naming ``path`` when it is not one path (str or os.PathLike), with how to load what it is."""
    if isinstance(path, CTVolume):
        fix = "the CTVolume is already loaded: pass it to detect, reconstruct or show as it is"
    elif isinstance(path, np.ndarray):
        fix = f"an array holds no geometry to read: {WRAP_ARRAY_FIX}"
    elif type(path).__module__.startswith("SimpleITK"):
        fix = "build the volume from the image: CTVolume.from_sitk(image)"
    elif isinstance(path, Iterable) and not isinstance(path, (str, bytes, Mapping)):
        fix = (
            "load one series at a time: load_series(folder); scan_directory(folders) lists the series of several, "
            "run_batch(folders, out=...) processes them all"
        )
    else:
        fix = "pass the folder holding the series (or one DICOM or NIfTI/MHA/NRRD file) as a str or pathlib.Path"
    require_path(path, where="path", error=DicomError, what="one folder or file", fix=fix)


def _pick(scan: ScanResult, series_uid: str, *, keep_identifiers: bool) -> SeriesInfo:
    """The series (or part) of ``scan`` keyed ``series_uid``; the errors list the series found, their descriptions
    as :func:`_series_list` shows them with ``keep_identifiers``."""
    found = scan.find(series_uid)
    if not found:
        listed = _series_list(scan.series, keep_identifiers=keep_identifiers)
        raise NoSeriesFoundError(
            f"no series with SeriesInstanceUID {series_uid!r}; found: {listed or 'none'}",
            where=", ".join(str(r) for r in scan.roots),
            fix="use one of the series keys listed",
        )
    if len(found) == 1:
        return found[0]
    picked = [s for s in found if s.selected] or [s for s in found if not s.reasons]
    if len(picked) == 1:
        return picked[0]
    raise AmbiguousSeriesError(
        f"series {series_uid} was split into {len(found)} parts: {_series_list(found, keep_identifiers=keep_identifiers)}",
        where=describe(found[0]),
        fix="pass the key of one part, e.g. series_uid='" + found[0].key + "'",
    )


@dataclass
class IngestReport:
    """Result of :func:`ingest_to_cache`: the scan and the cases written (series key → entry); ``seconds``: wall time
    of the whole ingest (s): the header scan (``scan.seconds``), the pixel reads and the cache writes."""

    scan: ScanResult
    written: dict[str, CacheEntry] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.scan.rejected


def ingest_to_cache(
    path: PathArg | Iterable[PathArg],
    cache: CaseCache,
    *,
    series_uid: str | None = None,
    rules: SelectionRules | None = None,
    spacing_tolerance: float = 0.02,
    allow_gantry_tilt: bool = False,
    lone_series_ok: bool | None = None,
    keep_identifiers: bool = False,
    workers: int | None = None,
) -> IngestReport:
    """Scan ``path`` and write every selected series (or only ``series_uid``) to ``cache``.

    The case id is :func:`safe_case_id` of the series key (the SeriesInstanceUID).
    Each case is written atomically (array, then sidecar); a series that fails is
    recorded in ``report.scan.rejected`` and leaves nothing in the cache. Geometry in
    the cache is LPS, mm.

    ``lone_series_ok``: take the only CT series even when it is shorter than
    ``rules.min_slices`` (with a warning); default: when ``path`` is one folder or file,
    not for several. ``keep_identifiers``: keep the patient identifiers the header scan reads
    (:data:`pipeline.ingest.header_values.METADATA_IDENTIFIERS`, of :data:`pipeline.volume.PATIENT_IDENTIFIERS`)
    in the metadata and the cache sidecars, and the SeriesDescription as it is (by default they are left out and each
    of them in the description reads ``<patient>``).
    """
    t0 = time.perf_counter()
    rules = rules or SelectionRules()
    paths: list[PathArg] = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if lone_series_ok is None:
        lone_series_ok = len(paths) == 1
    scan = scan_directory(
        paths,
        rules=rules,
        spacing_tolerance=spacing_tolerance,
        allow_gantry_tilt=allow_gantry_tilt,
        lone_series_ok=lone_series_ok,
        keep_identifiers=keep_identifiers,
        workers=workers,
    )
    report = IngestReport(scan)
    if series_uid is not None:
        targets = [_pick(scan, series_uid, keep_identifiers=keep_identifiers)]
    else:
        targets = scan.selected
    for s in targets:
        if any(r.series is s for r in scan.rejected):
            continue  # already recorded with its reason
        try:
            plan = scan.plans.get(s.key)
            vol = (
                read_volume(plan, workers=workers)
                if plan is not None
                else build_volume(
                    s,
                    spacing_tolerance=spacing_tolerance,
                    allow_gantry_tilt=allow_gantry_tilt,
                    keep_identifiers=keep_identifiers,
                    workers=workers,
                )
            )
            case_id = safe_case_id(s.key)
            folder = os.path.commonpath([str(f.parent) for f in s.files])
            try:
                report.written[s.key] = cache.write(
                    case_id, vol, extra={"source": folder, "series_key": s.key}, keep_identifiers=keep_identifiers
                )
            except OSError as exc:
                raise CacheError(
                    f"cannot write case {case_id} ({exc.strerror or exc}); nothing was left behind",
                    where=cache.root,
                    fix="free disk space or fix the folder's permissions, then ingest again",
                ) from exc
        except CtpipeError as exc:
            reject(scan, s, exc)
    report.seconds = time.perf_counter() - t0
    return report
