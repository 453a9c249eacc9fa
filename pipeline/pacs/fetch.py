"""PACS sources of a run: search, retrieve each series into the run folder's spool, record it in the ledger.

:func:`fetch_sources` turns PACS source addresses (:mod:`pipeline.pacs.address`) into complete series
folders under ``RUN_DIR/pacs/spool/`` that ``ctpipe run`` then processes like any DICOM folder, with
their origins (:attr:`FetchResult.origins`: the archive, how, the Study and Series Instance UIDs) for
the run store. A series whose case the run store lists as done (by remote SeriesInstanceUID, with
at least as many instances as the archive now lists), or as quarantined unless
``runner.retry_failed``, is neither retrieved nor processed again; a series the ledger lists as
fetched (and whose folder is there) is not retrieved again. Once a case is published or
quarantined, :func:`release_spool` removes its spool folder unless ``pacs.keep_received`` keeps it.
A series retrieved with fewer instances than the archive listed, or of which the archive lists more instances once it
is retrieved (still arriving from the scanner), is not handed on (recorded as ``partial``; the next run tries again).
A DICOMweb series whose search gave no count (no NumberOfSeriesRelatedInstances) is checked, once retrieved, against
what the archive lists then (its count, or its QIDO-RS instance search), and held as ``partial`` when that is more
than arrived or when the archive lists nothing to check it against.
When the archive cannot be asked again (it stopped just after the retrieval), a series is kept if as many instances
arrived as it listed and as its C-MOVE or C-GET responses said it completed; otherwise its failure says that every
listed instance arrived and that the next run retrieves it again.
One source or series failing does not stop the others, except ctpipe's C-MOVE receiver failing to listen (its
``pacs.move_port`` taken): that is reported once for the run, on the source that met it, and the later C-MOVE
sources are not searched (C-GET and WADO-RS sources still are).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CtpipeError, PacsError, PacsReceiverError, PacsUnavailableError, PartialSeriesError
from ..runner.store import remote_series
from .address import PacsSource, Query, for_records, parse_source
from .archive import Archive, RemoteSeries
from .connect import open_archive
from .ledger import Ledger, now
from .spool import Spool, fsync_dir

log = logging.getLogger(__name__)


@dataclass
class FetchResult:
    """What fetching the PACS sources of a run did."""

    folders: list[Path] = field(default_factory=list)  # complete series folders for the runner
    origins: dict[str, dict[str, Any]] = field(default_factory=dict)  # folder → origin (run_batch(origins=...))
    fetched: int = 0  # series retrieved now
    reused: int = 0  # series fetched by an earlier run, not retrieved again
    done_before: int = 0  # series whose case the run store lists as done (or quarantined): not retrieved
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (SeriesInstanceUID, why)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (source or series, error class, message)
    #: the names :meth:`lines` gives failures' subjects (source, accession number) instead, so that the printed and
    #: logged lines hold no accession number unless privacy.keep_identifiers
    shown: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The summary line and one line per series skipped or failure, as printed and logged."""
        out = [
            f"PACS: {self.fetched} series retrieved, {self.reused} retrieved earlier, {self.done_before} processed "
            f"earlier, {len(self.skipped)} skipped, {len(self.failures)} failed"
        ]
        out += [f"  not retrieved {uid}: {why}" for uid, why in self.skipped]
        out += [f"  PACS failure {self.shown.get(what, what)}: {cls}: {msg}" for what, cls, msg in self.failures]
        return out


def select_series(archive: Archive, query: Query) -> tuple[list[RemoteSeries], list[tuple[str, str, str]]]:
    """The series a query selects (see :mod:`pipeline.pacs.address`), and what the query names that was not
    found: series, studies (or studies without a series of the modality) and accession numbers."""
    found: list[RemoteSeries] = []
    missing: list[tuple[str, str, str]] = []
    for study, series in query.series:
        hits = archive.find_series(study, series_uid=series, modality=query.modality)
        if not hits:
            missing.append((series, "PacsRequestError", _not_found(archive, query.modality, study, series)))
        found += hits
    studies = list(query.studies)
    for acc in query.accessions:
        matched = archive.find_studies(replace(query, accessions=(acc,)))
        if not matched:
            dates = f" dated {query.date_range}" if query.date_range else ""
            missing.append(
                (f"accession {acc}", "PacsRequestError", f"no study{dates} with a {query.modality} series in {archive.endpoint}")
            )
        studies += matched
    if query.study_dates and not query.accessions:
        studies += archive.find_studies(query)
    for study in dict.fromkeys(studies):
        hits = archive.find_series(study, modality=query.modality)
        if not hits and study in query.studies:
            missing.append((study, "PacsRequestError", _not_found(archive, query.modality, study, None)))
        found += hits
    unique = {s.series_uid: s for s in found}
    return list(unique.values()), missing


def _not_found(archive: Archive, modality: str, study: str | None, series: str | None) -> str:
    """Why a named study or series selected nothing: not in the archive, or none of it is of ``modality``."""
    what = "series" if series else "study"
    try:
        other = archive.find_series(study, series_uid=series, modality="")
    except PacsError:
        other = []
    if not other:
        return f"{what} not found in {archive.endpoint}"
    kinds = ", ".join(sorted({s.modality for s in other if s.modality})) or "?"
    held = f"its modality is {kinds}" if series else f"its series are {kinds}"
    return f"{what} found in {archive.endpoint}, but {held}, not {modality} (the source's modality={modality})"


def fetch_sources(
    sources: Sequence[str | PacsSource], *, run_dir: str | os.PathLike[str], cfg: Any, base: Path | None = None
) -> FetchResult:
    """Search and retrieve every PACS source into ``RUN_DIR/pacs/spool/`` (see the module docstring).

    ``cfg`` is the run's :class:`~pipeline.config.Config`; ``base`` resolves relative worklist paths.
    """
    run = Path(run_dir)
    spool = Spool(run)
    spool.clean()
    release_spool(run, cfg)  # what a crash left between processing and removal
    ledger = Ledger(run)
    out = FetchResult()
    seen: set[str] = set()
    receiver: int | None = None  # the index in out.failures of the C-MOVE receiver's failure, once it failed
    not_searched = 0  # the later C-MOVE sources not tried after it
    try:
        for item in sources:
            src = item if isinstance(item, PacsSource) else parse_source(item, base=base)
            if receiver is not None and _moves(src, cfg):  # the same port for every C-MOVE source: said once
                not_searched += 1
                continue
            if _fetch_one(src, cfg, run, spool, ledger, out, seen) and receiver is None:
                receiver = len(out.failures) - 1
    finally:
        ledger.close()
    if receiver is not None and not_searched:
        what, kind, msg = out.failures[receiver]
        left, _, why = msg.partition(" series not retrieved: ")
        out.failures[receiver] = (
            what,
            kind,
            f"{left} series not retrieved, and the {not_searched} later C-MOVE source(s) of this run not searched: {why}",
        )
    for line in out.lines():
        log.info("%s", line, extra={"event": "pacs_fetch"})
    return out


def _withhold_accessions(src: PacsSource, out: FetchResult) -> str:
    """The form of ``src`` for logs and printed lines without its accession numbers; records in ``out.shown`` how
    a failure names the source and each of its accession numbers (by position: ``accession 2 of 3 in SOURCE``)."""
    shown = for_records(str(src), keep_identifiers=False)
    out.shown[str(src)] = shown
    n = len(src.query.accessions)
    for k, acc in enumerate(src.query.accessions, start=1):
        out.shown[f"accession {acc}"] = f"accession {k} of {n} in {shown}"
    return shown


def _moves(src: PacsSource, cfg: Any) -> bool:
    """Whether ``src`` retrieves by C-MOVE, through ctpipe's receiver at ``pacs.move_port``."""
    return src.endpoint.kind != "dicomweb" and (src.query.retrieve or cfg.pacs.retrieve) == "move"


def _fetch_one(src: PacsSource, cfg: Any, run: Path, spool: Spool, ledger: Ledger, out: FetchResult, seen: set[str]) -> bool:
    """Search and retrieve one source into ``out``; True when ctpipe's C-MOVE receiver failed (its port taken), which
    every later C-MOVE source of the run would meet too."""
    shown = for_records(str(src), keep_identifiers=True) if cfg.privacy.keep_identifiers else _withhold_accessions(src, out)
    try:
        archive = open_archive(src.endpoint, cfg, mode=src.query.retrieve)
    except CtpipeError as exc:
        out.failures.append((str(src), type(exc).__name__, str(exc)))
        return False
    try:
        try:
            chosen, missing = select_series(archive, src.query)
        except PacsError as exc:
            log.error("PACS search failed for %s: %s", shown, exc, extra={"event": "pacs_search_failed"})
            out.failures.append((str(src), type(exc).__name__, str(exc)))
            return False
        out.failures += missing
        log.info("%s: %d series selected", shown, len(chosen), extra={"event": "pacs_search"})
        known = remote_series(run, [s.series_uid for s in chosen])
        for n, s in enumerate(chosen):
            if s.series_uid in seen:
                continue
            seen.add(s.series_uid)
            if _processed_before(s, known.get(s.series_uid), cfg, out):
                continue
            try:
                _fetch_series(s, src, archive, cfg, run, spool, ledger, out)
            except PacsReceiverError as exc:  # the same for every C-MOVE of the run: said once, not retried
                seen.discard(s.series_uid)  # a later C-GET or WADO-RS source may still retrieve it
                left = len(chosen) - n
                log.error(
                    "%s: %d series not retrieved, nor any later C-MOVE source of this run: %s",
                    shown,
                    left,
                    exc,
                    extra={"event": "pacs_receiver_failed"},
                )
                out.failures.append((str(src), type(exc).__name__, f"{left} series not retrieved: {exc}"))
                return True
    finally:
        archive.close()
    return False


def _processed_before(s: RemoteSeries, case: dict[str, Any] | None, cfg: Any, out: FetchResult) -> bool:
    """Whether the run store lists the series' case as done (or quarantined, unless retried): not retrieved again."""
    if case is None:
        return False
    grown = s.n_instances is not None and case["n_instances"] is not None and s.n_instances > int(case["n_instances"])
    if grown:
        log.info(
            "series %s: the archive now lists %d instances, %s were processed (case %s); retrieved again",
            s.series_uid,
            s.n_instances,
            case["n_instances"],
            case["case_id"],
            extra={"event": "pacs_grown"},
        )
        return False
    if case["status"] == "done" and case.get("unconfirmed"):
        log.info(
            "series %s: case %s is recorded done but not confirmed (a run was killed before it checked the series "
            "once more); handed to this run again, which checks it and adopts the case's folder (or analyses the "
            "series whole), so that its results are sent",
            s.series_uid,
            case["case_id"],
            extra={"event": "pacs_unconfirmed"},
        )
        return False
    if case["status"] == "done" or (case["status"] == "failed" and not cfg.runner.retry_failed):
        out.done_before += 1
        log.info(
            "series %s: case %s is %s in the run store; not retrieved again",
            s.series_uid,
            case["case_id"],
            case["status"],
            extra={"event": "pacs_done_before"},
        )
        return True
    return False


def origin(s: RemoteSeries, src: PacsSource, n_files: int | None) -> dict[str, Any]:
    """The run store's record of where a retrieved series came from (UIDs and the address, no patient data)."""
    via = "wado-rs" if src.endpoint.kind == "dicomweb" else f"c-{src.query.retrieve or 'move'}"
    return {
        "remote": src.endpoint.redacted(),
        "via": via,
        "study_uid": s.study_uid,
        "series_uid": s.series_uid,
        "n_instances": n_files,
    }


def release_spool(run_dir: str | os.PathLike[str], cfg: Any) -> int:
    """Remove the spool folders of series whose case is published or quarantined (see ``pacs.keep_received``);
    how many were removed. Their ledger rows become ``removed``; the run store keeps their origin."""
    from .journal import should_remove

    run = Path(run_dir)
    if cfg.pacs.keep_received == "all" or not (run / "pacs" / "ledger.sqlite").is_file():
        return 0
    ledger = Ledger(run)
    n = 0
    try:
        rows = ledger.rows("SELECT * FROM fetched WHERE state = 'fetched'")
        cases = remote_series(run, [r["series_uid"] for r in rows])
        for r in rows:
            case = cases.get(r["series_uid"])
            if case is None or case.get("unconfirmed") or not should_remove(str(case["status"]), cfg.pacs.keep_received):
                continue  # an unconfirmed case's series: kept for the run that checks it
            if r["folder"]:
                folder = run / r["folder"]
                if folder.is_dir():
                    shutil.rmtree(folder)
                    fsync_dir(folder.parent)
            with ledger.tx() as db:
                db.execute("UPDATE fetched SET state = 'removed', updated_at = ? WHERE series_uid = ?", (now(), r["series_uid"]))
            n += 1
    finally:
        ledger.close()
    if n:
        log.info("%d processed series removed from the spool", n, extra={"event": "pacs_spool_released"})
    return n


def _check_not_arriving(s: RemoteSeries, n: int, src: PacsSource, archive: Archive) -> None:
    """Raise :class:`PartialSeriesError` when the archive, asked again once the series is retrieved, lists more instances
    of it than were retrieved: a modality or another node is still sending it to the archive, and the instances
    retrieved are not the whole scan (its results would reach the PACS as the study's). The next run takes it whole."""
    if s.n_instances is None:
        return
    try:
        again = archive.find_series(s.study_uid, series_uid=s.series_uid, modality="")
    except PacsUnavailableError as exc:  # the archive stopped (or became unreachable) once the retrieval was over
        told = getattr(archive, "completed", {}).get(s.series_uid)
        if told is not None and n == told and n >= s.n_instances:
            log.warning(
                "series %s: all %d instance(s) retrieved, as many as the archive listed and its retrieval said it "
                "completed; the archive could not be asked again whether more are arriving (%s), so the series is "
                "kept as retrieved",
                s.series_uid,
                n,
                exc.problem,
                extra={"event": "pacs_not_asked_again", "series_uid": s.series_uid},
            )
            return
        raise PacsUnavailableError(
            f"all {n} instance(s) the archive listed were retrieved, but it could not be asked again whether more are "
            f"arriving ({exc.problem})",
            where=f"series {s.series_uid} at {src.endpoint}",
            fix="nothing of it is processed now; the next run retrieves it again whole once the archive answers",
        ) from exc
    now = max((a.n_instances for a in again if a.n_instances is not None), default=None)
    if now is not None and now > n:
        raise PartialSeriesError(
            f"the series is still arriving at the archive: it listed {s.n_instances} instances, {n} were retrieved, "
            f"and it now lists {now}",
            where=f"series {s.series_uid} at {src.endpoint}",
            fix="nothing of it is processed now; the next run retrieves it whole (run once the scanner has sent the "
            "study, e.g. ?studydate=yesterday for a nightly job)",
        )


def _listed_after(s: RemoteSeries, n: int, src: PacsSource, archive: Archive) -> RemoteSeries:
    """``s`` with the number of instances the archive lists now, for a series its search listed without one (a
    DICOMweb archive answering QIDO-RS without NumberOfSeriesRelatedInstances): asked once ``n`` instances are
    retrieved (:meth:`~pipeline.pacs.dicomweb.DicomwebArchive.listed_instances`), so that a short retrieval is held as
    partial, not handed on as the whole series. Raises :class:`PartialSeriesError` when the archive lists no instance
    of it at all (the retrieval cannot be checked); ``s`` unchanged for an archive that cannot be asked so (DIMSE:
    its C-MOVE and C-GET responses count what they completed)."""
    listed_instances = getattr(archive, "listed_instances", None)
    if listed_instances is None:
        return s
    listed = listed_instances(s.study_uid, s.series_uid)
    if listed is None:
        raise PartialSeriesError(
            f"{n} instance(s) retrieved, but the archive gives no number of instances for the series (no "
            "NumberOfSeriesRelatedInstances in its series search, nothing listed by its instance search): whether the "
            "retrieval is whole cannot be checked",
            where=f"series {s.series_uid} at {src.endpoint}",
            fix="have the archive answer QIDO-RS series searches with NumberOfSeriesRelatedInstances (includefield="
            "00201209) or instance searches; nothing of it is processed now, the next run tries again",
        )
    log.info(
        "series %s: the archive's search gave no count; it lists %d instance(s), %d retrieved",
        s.series_uid,
        listed,
        n,
        extra={"event": "pacs_counted", "series_uid": s.series_uid},
    )
    return replace(s, n_instances=listed)


def _fetch_series(
    s: RemoteSeries, src: PacsSource, archive: Archive, cfg: Any, run: Path, spool: Spool, ledger: Ledger, out: FetchResult
) -> None:
    if s.n_instances is not None and s.n_instances < cfg.ingest.min_slices:
        out.skipped.append((s.series_uid, f"{s.n_instances} instance(s), fewer than ingest.min_slices = {cfg.ingest.min_slices}"))
        return
    row = ledger.fetched(s.series_uid)
    if row is not None and row["state"] == "fetched" and (run / row["folder"]).is_dir():
        out.folders.append(run / row["folder"])
        out.origins[str(run / row["folder"])] = origin(s, src, row["n_files"])
        out.reused += 1
        return
    part = spool.start(s.series_uid)
    try:
        n = archive.retrieve(s, part)
        if s.n_instances is None and n:
            s = _listed_after(s, n, src, archive)
        if n == 0 or (s.n_instances is not None and n < s.n_instances):
            raise PartialSeriesError(
                f"{n} of {s.n_instances if s.n_instances is not None else '?'} instances retrieved",
                where=f"series {s.series_uid} at {src.endpoint}",
                fix="the archive may still be receiving it, or lost instances; the next run tries again",
            )
        _check_not_arriving(s, n, src, archive)
        final = spool.publish(s.series_uid)
    except PacsReceiverError:
        spool.discard(s.series_uid)
        raise
    except PacsError as exc:
        spool.discard(s.series_uid)
        state = "partial" if isinstance(exc, PartialSeriesError) else "failed"
        ledger.record_fetch(
            s.series_uid,
            study_uid=s.study_uid,
            source=str(src.endpoint),
            state=state,
            n_expected=s.n_instances,
            n_files=None,
            folder=None,
            error=str(exc),
        )
        log.error("series %s not retrieved: %s", s.series_uid, exc, extra={"event": "pacs_fetch_failed"})
        out.failures.append((s.series_uid, type(exc).__name__, str(exc)))
        return
    ledger.record_fetch(
        s.series_uid,
        study_uid=s.study_uid,
        source=str(src.endpoint),
        state="fetched",
        n_expected=s.n_instances,
        n_files=n,
        folder=str(final.relative_to(run)),
        error=None,
    )
    out.folders.append(final)
    out.origins[str(final)] = origin(s, src, n)
    out.fetched += 1
    log.info("series %s: %d instance(s) retrieved from %s", s.series_uid, n, src.endpoint, extra={"event": "pacs_fetched"})
