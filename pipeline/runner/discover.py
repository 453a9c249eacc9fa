"""Finding the cases of a run: DICOM series under folders, or the rows of a worklist CSV.

Each selected CT series becomes a :class:`~pipeline.runner.stage.CaseSpec`
keyed by its SeriesInstanceUID (``<uid>#<n>`` for a part of a split series) and
a content fingerprint: SHA-256 over the sorted (SOPInstanceUID, file size)
pairs of its files, so a series that changed is a new case key (see
:func:`pipeline.runner.resume.plan` for what a rerun does with it). Series the scan
chose but could not validate (missing or duplicate slices, inconsistent
geometry) become cases that are quarantined at once with their reason;
series not chosen by the selection rules (localizers, too few slices, not CT)
are listed with why, but are not cases; so are the files the scan skipped (not
DICOM, unreadable, cut short, link loops, ...), each with its path and reason.
With ``runner.stable_age_s``, a series whose newest file changed less than that
long ago is still being written (a PACS exporting into the source folder during
the run): it is listed as not selected, with why, and the next run takes it
(:func:`still_written`), instead of being processed half-written. Without it, what the scan saw of the folders is
kept (:class:`~.arrivals.SourceSnapshot`, ``Discovery.snapshot``): a series whose files arrive or change after the scan
is not published, and is left for the next run, which takes it whole.

A worklist CSV has a ``path`` column (a folder or file; relative paths are
resolved against ``runner.worklist_root`` or the CSV's folder) and optional
``series_uid`` and ``case_id`` columns. A row that yields no series is a case
quarantined with the reason.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cache import is_safe_case_id
from ..config import Config
from ..csvfile import read_table
from ..errors import ConfigError, NoSeriesFoundError, described, missing_path_fix, require_path
from .arrivals import SourceSnapshot
from .fingerprint import fingerprint_series
from .redact_active import active, held_back
from .stage import CaseSpec

log = logging.getLogger(__name__)

#: How the reason of a series left for the next run because it is still being written begins (:func:`still_written`).
STILL_WRITTEN = "still being written"


@dataclass
class Discovery:
    """The cases found, plus the series (``not_selected``: series, source, why) and files (``skipped_files``:
    path, kind, reason) that were not taken and why; ``snapshot``: what the scan saw of the source folders (their file
    names, the sizes and modification times of the series' files), against which a case is checked before it is
    published."""

    cases: list[CaseSpec] = field(default_factory=list)
    not_selected: list[dict[str, Any]] = field(default_factory=list)
    skipped_files: list[dict[str, str]] = field(default_factory=list)
    n_files: int = 0
    snapshot: SourceSnapshot = field(default_factory=SourceSnapshot)

    def skipped_rows(self) -> list[dict[str, Any]]:
        """Everything left out, as rows of the run store's ``skipped`` table (files first, then series)."""
        rows = [
            {"what": "file", "item": f["path"], "kind": f["kind"], "reason": f["reason"], "source": None}
            for f in self.skipped_files
        ]
        rows += [
            {"what": "series", "item": n["series"], "kind": "not_selected", "reason": n["why"], "source": n["source"]}
            for n in self.not_selected
        ]
        return rows


def _case(series: Any, source: str, case_id: str | None = None, error: Exception | None = None) -> CaseSpec:
    from ..ingest import safe_case_id

    fp = fingerprint_series(series)
    rejected = (type(error).__name__, str(error)) if error is not None else None
    return CaseSpec(
        case_id or safe_case_id(series.key),
        f"{series.key}:{fp}",
        series.key,
        fp,
        source,
        tuple(str(p) for p in series.files),
        rejected,
    )


def _missing(source: str, reason: str, case_id: str | None = None, *, fix: str | None = None) -> CaseSpec:
    fp = hashlib.sha256(source.encode()).hexdigest()[:24]
    err = NoSeriesFoundError(reason, where=source, fix=fix or "check the worklist row's path and series_uid")
    cid = case_id or f"missing-{fp[:12]}"
    return CaseSpec(cid, f"missing:{fp}", None, fp, source, (), (type(err).__name__, str(err)))


def _image_row(path: Path) -> tuple[str, str] | None:
    """Why a worklist row naming the image file ``path`` (NIfTI, MHA, NRRD; no DICOM series) has no case, and the
    fix; None for any other path. An image that looks like a label map (a segmentation such as a TotalSegmentator
    result, a mask) says so: no command that computes from HU takes it, and the fix is the CT's series."""
    from ..errors import CtpipeError
    from ..ingest.image import image_suffix, label_map_text, read_image, starts_like_dicom

    if not path.is_file() or image_suffix(path) is None or starts_like_dicom(path):
        return None
    image = "a NIfTI/MHA/NRRD image, not a DICOM series: ctpipe run reads DICOM folders and files"
    try:  # loaded without read_image's warning, which names the file: the row's token names it here
        labels = label_map_text(read_image(path, label_map="load").array)
    except (CtpipeError, OSError):  # unreadable: said as an image file all the same
        labels = None
    if labels is not None:
        return (
            f"{image}, and {labels}: no command that computes from HU takes it",
            "name the DICOM series of the CT the labels were made from in the worklist",
        )
    return image, "name the image's DICOM series in the worklist, or analyse the image with ctpipe detect or reconstruct"


def _scan(
    paths: Sequence[str | os.PathLike[str]],
    cfg: Config,
    out: Discovery,
    *,
    series_uid: str | None = None,
    case_id: str | None = None,
    source: str | None = None,
) -> list[CaseSpec]:
    from ..ingest import scan_directory
    from .stages import _rules

    with held_back():  # the scan's own records (files it skips) are written once its series' identifiers are known
        scan = scan_directory(
            list(paths),
            rules=_rules(cfg),
            spacing_tolerance=cfg.ingest.spacing_tolerance,
            allow_gantry_tilt=cfg.ingest.allow_gantry_tilt,
        )
        redactor = active()
        if redactor is not None:  # before anything logs a path of it: its patient-named folders and files are known
            redactor.add_scan(scan.series)
            redactor.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots, given_alone=True)
    out.n_files += scan.n_files
    out.snapshot.add_scan(scan)
    seen = {f["path"] for f in out.skipped_files}
    for f in scan.skipped_files:
        if str(f.path) not in seen:
            out.skipped_files.append({"path": str(f.path), "kind": f.kind, "reason": f.reason})
            log.info("skipped file %s: %s", f.path, f.reason, extra={"event": "skipped_file"})
    errors = {r.series.key: r.error for r in scan.rejected}
    cases: list[CaseSpec] = []
    now = time.time()
    for s in scan.series:
        src = source or os.path.commonpath([str(f.parent) for f in s.files]) if s.files else str(paths[0])
        if series_uid is not None and series_uid not in (s.key, s.uid):
            continue
        writing = still_written(s.files, cfg.runner.stable_age_s, now=now)
        if writing is not None:  # before its verdict: a file being written reads as cut short
            out.not_selected.append({"series": s.key, "source": src, "why": writing})
            log.info("series %s in %s left for the next run: %s", s.key, src, writing, extra={"event": "not_selected"})
        elif s.key in errors:
            cases.append(_case(s, src, case_id, errors[s.key]))
        elif s.selected or (series_uid is not None and s.modality == "CT"):
            cases.append(_case(s, src, case_id))
        else:
            out.not_selected.append({"series": s.key, "source": src, "why": s.why_not})
            log.info("series %s in %s not selected: %s", s.key, src, s.why_not, extra={"event": "not_selected"})
    return cases


def still_written(files: Sequence[str | os.PathLike[str]], stable_age_s: float, *, now: float) -> str | None:
    """Why a series of ``files`` is still being written, or None when it is not or ``stable_age_s`` is 0
    (``runner.stable_age_s``): its newest file's modification time lies within ``stable_age_s`` seconds of ``now``
    (Unix s), before it or after it (a writer whose clock runs a little ahead). A file gone since the scan counts as
    a change at ``now``."""
    if stable_age_s <= 0 or not files:
        return None
    newest, changed = None, -float("inf")
    for f in files:
        try:
            mtime = os.stat(f).st_mtime
        except OSError:  # removed or replaced since the scan: the writer is at work
            newest, changed = f, now
            break
        if mtime > changed:
            newest, changed = f, mtime
    age = now - changed
    if abs(age) >= stable_age_s:
        return None
    return (
        f"{STILL_WRITTEN}: its newest file {newest} changed {max(age, 0.0):.0f} s ago, less than runner.stable_age_s "
        f"= {stable_age_s:g} s ago; the next run takes it"
    )


def read_worklist(path: Path, cfg: Config) -> list[dict[str, str]]:
    """The rows of a worklist CSV (:func:`pipeline.csvfile.read_table`: a spreadsheet's export reads too), keyed by
    the lower-case column names, each ``path`` made absolute (relative to ``runner.worklist_root`` or the CSV's
    folder)."""
    try:
        table = read_table(path)
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the worklist ({exc})",
            where=path,
            fix="save it as a UTF-8 CSV file (in Excel: CSV UTF-8) with a 'path' column",
        ) from exc
    rows = [{k.lower(): v for k, v in r.items()} for r in table.rows]
    if rows and "path" not in rows[0]:
        raise ConfigError(
            f"the worklist has no 'path' column (columns: {', '.join(table.columns)})",
            where=path,
            fix="name the column holding folders/files 'path'; optional columns: series_uid, case_id",
        )
    root = worklist_root(cfg) or path.parent
    for r in rows:
        p = Path((r.get("path") or "").strip())
        r["path"] = str(p if p.is_absolute() else root / p)
    return rows


def scanned_paths(sources: Sequence[str | os.PathLike[str]], cfg: Config) -> list[str]:
    """What a run of ``sources`` scans: each source, and for a worklist ``.csv`` the path of each of its rows that
    exists (:func:`read_worklist`); the folders an output must stay out of (``check_out_outside_sources``)."""
    out: list[str] = []
    for src in sources:
        out.append(os.fspath(src))
        p = Path(src)
        if p.suffix.lower() == ".csv" and p.is_file():
            out += [r["path"] for r in read_worklist(p, cfg) if Path(r["path"]).exists()]
    return out


def worklist_root(cfg: Config) -> Path | None:
    """``runner.worklist_root``, the folder relative worklist paths start from (None: each CSV's own folder);
    :class:`ConfigError` when it is not a folder (else every relative row would be "the path does not exist")."""
    if not cfg.runner.worklist_root:
        return None
    root = Path(cfg.runner.worklist_root)
    if not root.is_dir():
        raise ConfigError(
            f"runner.worklist_root, the folder relative worklist paths start from, "
            f"{'is a file' if root.exists() else 'does not exist'}",
            where=root,
            fix="set runner.worklist_root to the folder holding the worklist's series (or null: the CSV's own folder)",
        )
    return root


def source_list(sources: Any) -> list[str | os.PathLike[str]]:
    """``run_batch``'s ``sources`` as a list, each as given: one DICOM folder or file or worklist CSV (a str or an
    os.PathLike), or an iterable of them; else a :class:`ConfigError` naming ``sources`` and what was given."""
    fix = "pass a DICOM folder or file or a worklist CSV, or a list of them, as str or pathlib.Path"
    if isinstance(sources, (str, os.PathLike)):
        return [sources]
    if not isinstance(sources, Iterable) or isinstance(sources, (bytes, Mapping)):
        raise ConfigError(
            f"must be a folder or file, or a list of them (a str or a pathlib.Path), got {described(sources)}",
            where="sources",
            fix=fix,
        )
    items = list(sources)
    for item in items:
        require_path(item, where="sources", error=ConfigError, what="a folder or file", fix=fix)
    return items


def check_sources(sources: Sequence[str | os.PathLike[str]], *, from_python: bool = False) -> None:
    """:class:`ConfigError` naming the first of ``sources`` that does not exist, or that is a file neither DICOM nor a
    worklist ``.csv`` (an Excel worklist, a NIfTI image: the run would find nothing and exit 0); checked before a run
    folder is made. ``from_python``: the errors name the notebook API (``run_batch``, ``load_series``, ``detect``)
    instead of the ``ctpipe`` commands."""
    from ..ingest.image import archive_kind, image_suffix, starts_like_dicom, unpack_fix

    runner = "run_batch" if from_python else "ctpipe run"
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise ConfigError(
                "no such file or folder", where=path, fix=missing_path_fix(src, f"check the sources given to {runner}")
            )
        if not path.is_file() or path.suffix.lower() == ".csv" or starts_like_dicom(path):
            continue
        if image_suffix(path):
            fix = (
                f"load it with volume = load_series({str(path)!r}), then detect(volume) or reconstruct(volume)"
                if from_python
                else f"analyse the image with `ctpipe detect {path}` or `ctpipe reconstruct {path}`"
            )
            raise ConfigError(
                f"a NIfTI/MHA/NRRD image, not a DICOM series: {runner} reads DICOM folders and files and worklist CSVs",
                where=path,
                fix=fix,
            )
        if kind := archive_kind(path):
            raise ConfigError(
                f"an archive ({kind}), not a DICOM folder or file: {runner} reads DICOM folders and files and worklist CSVs",
                where=path,
                fix=unpack_fix(path, runner),
            )
        raise ConfigError(
            "neither a DICOM file nor a worklist CSV (.csv)",
            where=path,
            fix="give a DICOM folder or file, or the worklist saved as CSV (in Excel: Save As, CSV UTF-8) with a 'path' column",
        )


def discover(sources: Sequence[str | os.PathLike[str]], cfg: Config) -> Discovery:
    """Cases under ``sources`` (folders, files, or worklist ``.csv`` files), in a stable order; ``sources`` as
    :func:`check_sources` passed them (``run_batch`` checks them before the run folder is made, so their files are
    not read again here)."""
    out = Discovery()
    folders: list[str] = []
    # what each row's or folder's scan logs is written once every series' identifiers are known: a file named after
    # the patient of a later worklist row is redacted too
    with held_back():
        for src in sources:
            p = Path(src)
            if p.suffix.lower() == ".csv" and p.is_file():
                for n, row in enumerate(read_worklist(p, cfg), start=2):
                    where = f"{p}:{n} ({row['path']})"
                    uid = (row.get("series_uid") or "").strip() or None
                    cid = (row.get("case_id") or "").strip() or None
                    if cid is not None and not is_safe_case_id(cid):  # it names files and folders: never a path
                        out.cases.append(
                            _missing(
                                where,
                                f"the case_id {cid!r} is not a safe file name",
                                fix="use letters, digits, '.', '_' and '-' only in the worklist's case_id column "
                                "(or leave it empty: the SeriesInstanceUID is used)",
                            )
                        )
                        continue
                    if not Path(row["path"]).exists():
                        out.cases.append(_missing(where, "the path does not exist", cid))
                        continue
                    found = _scan([row["path"]], cfg, out, series_uid=uid, case_id=cid)
                    if not found and (image := _image_row(Path(row["path"]))) is not None:
                        out.cases.append(_missing(where, image[0], cid, fix=image[1]))
                    elif not found:
                        out.cases.append(
                            _missing(where, "no CT series found" + (f" with SeriesInstanceUID {uid}" if uid else ""), cid)
                        )
                    out.cases.extend(found)
            else:
                folders.append(str(p))
        if folders:
            out.cases.extend(_scan(folders, cfg, out))
        if (redactor := active()) is not None:
            redactor.add_skipped((f["path"], f["kind"]) for f in out.skipped_files)
    out.cases.sort(key=lambda c: (c.source, c.case_id))
    log.info(
        "discovered %d case(s) in %d file(s); %d series not selected, %d file(s) skipped",
        len(out.cases),
        out.n_files,
        len(out.not_selected),
        len(out.skipped_files),
        extra={"event": "discover"},
    )
    return out
