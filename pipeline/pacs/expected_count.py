"""How many instances a received series says it has, from the counts its own instances carry.

A C-STORE sender that ends its association with an A-ABORT between two instances may have finished (some
modalities and routers end every association so) or been stopped by its operator part-way: the association alone
cannot tell. Nor can a release: a store job cancelled or paused part-way releases its association as one that sent
everything does (Orthanc's), and many senders send one instance per association. The instances sometimes can: Number
of Series Related Instances (0020,1209), which some archives and routers put in what they forward, and Images in
Acquisition (0020,1002), which many CT scanners write (the images of one acquisition, per Acquisition Number
(0020,0012)). :func:`count_check` says when fewer instances arrived than those
counts give; a series whose instances carry neither cannot be told from a whole one this way. Some scanners count in
Images in Acquisition the images of every series of one acquisition: the series of a study short of one such count
alone are counted together, and whole when they make it exactly. :func:`hold_short` holds a short series as cut off
(:data:`~pipeline.pacs.journal.CUT_NOTE`): it waits for the rest up to ``pacs.series_limit_s``, then is quarantined,
never published; :func:`lift_held` releases it when another series of its study makes its count up. Which counts are
checked is ``pacs.abort_count_check`` after an A-ABORT and ``pacs.release_count_check`` after a release (both counts
by default; a site whose instances count images never sent to ctpipe leaves that count out). A series held after a
release is warned of once it is quiet (:func:`warn_quiet_hold`): a sender of one instance per association has it
short at every association but the last. Records are logged as ``pipeline.pacs.listener``'s.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config_schema import ABORT_COUNTS
from .journal import ALSO_NOTE, CUT_NOTE, INCOMPLETE_NOTE, RECOUNTED_NOTE, ReceiveJournal
from .ledger import Ledger

log = logging.getLogger("pipeline.pacs.listener")

_TAGS = ["NumberOfSeriesRelatedInstances", "ImagesInAcquisition", "AcquisitionNumber"]

#: In the note of a series held by :func:`hold_short`: what it was held for.
SHORT_NOTE = "short of the series' count"
#: In the note of a series held by :func:`hold_short` after its sender released the association: how it ended.
RELEASED = "released its association (A-RELEASE)"
#: The setting that lists the counts checked, by how the sender ended the association (``'abort'``, ``'release'``).
SETTINGS = {"abort": "pacs.abort_count_check", "release": "pacs.release_count_check"}
#: The environment variable of each setting of :data:`SETTINGS`.
_ENV = {"abort": "CTPIPE_PACS_ABORT_COUNT_CHECK", "release": "CTPIPE_PACS_RELEASE_COUNT_CHECK"}


def checked(cfg: Any, end: str) -> list[str]:
    """The counts checked after an association the sender ended so (``end``: ``'abort'`` or ``'release'``)."""
    return list(getattr(cfg.pacs, SETTINGS[end].split(".", 1)[1]))


def held_after(note: str) -> str:
    """How the association ended that the hold in ``note`` (:func:`hold_short`'s) was taken at: ``'release'`` or
    ``'abort'`` (also a hold of a series whose end the ledger does not record: judged as after an A-ABORT)."""
    return "release" if RELEASED in note.split(f", {SHORT_NOTE}: ", 1)[0] else "abort"


def _count(value: object) -> int | None:
    """A count element's value as a positive int, or None (absent, empty, not a number)."""
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _read(path: Path) -> Any:
    """The count elements of one received instance (None when it cannot be read)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_TAGS)
    except (InvalidDicomError, OSError, ValueError) as exc:
        log.debug("%s: its instance counts not read (%s)", path, exc)
        return None


def _acquisition(ds: Any) -> str:
    acq = ds.get("AcquisitionNumber")
    return "" if acq is None else str(acq).strip()


def _which(acq: str) -> str:
    return f"acquisition {acq}" if acq else "its acquisition"


@dataclass(frozen=True)
class CountCheck:
    """The instances received of one series against the counts they carry.

    ``received``: how many arrived; ``short``: why they are known to be fewer than the series has (``'5 of 8 image(s) of
    acquisition 1 received (ImagesInAcquisition 8 in its instances)'``), or None; ``field``: the keyword of the count
    it is short of (``'ImagesInAcquisition'``), or None; ``counted``: the count they were all found to reach
    (``'ImagesInAcquisition 8'``), or None when they carry none checked (or are short); ``pooled``: the other series of
    the study whose images of the same acquisition make up that count with this one's."""

    received: int
    short: str | None = None
    counted: str | None = None
    pooled: tuple[str, ...] = ()
    field: str | None = None


#: Per Acquisition Number (``''``: none): the instances received, and the largest Images in Acquisition they give.
Tally = dict[str, tuple[int, int | None]]


def _tally(files: list[Path]) -> Tally:
    by_acq: dict[str, list[int | None]] = defaultdict(list)
    for ds in (_read(p) for p in files):
        if ds is not None:
            by_acq[_acquisition(ds)].append(_count(ds.get("ImagesInAcquisition")))
    return {acq: (len(c), max((n for n in c if n is not None), default=None)) for acq, c in by_acq.items()}


def count_check(
    folder: Path, *, siblings: Mapping[str, Path] | None = None, counts: Collection[str] = ABORT_COUNTS
) -> CountCheck:
    """The instances received in ``folder`` (``*.dcm``, one series) against the counts they carry: the Number of
    Series Related Instances they give, and, for each Acquisition Number (or none), the Images in Acquisition its
    instances give (see :class:`CountCheck`; a series whose instances carry no count may still be short: they cannot
    say). One instance is read (and one of each sibling) while the count cannot be reached, each of them otherwise
    (a sender may end an association after each instance).

    ``siblings``: the other series of the same study received (Series Instance UID → folder). Some scanners count in
    Images in Acquisition the images of every series of one acquisition: an acquisition this series is short of is
    whole when the siblings that are short of the same count for the same Acquisition Number, each alone, make it up
    with this one exactly (a sibling that reaches the count alone counts its own images: another acquisition given
    the same number, as a pre- and a post-contrast series).

    ``counts``: the counts checked, by keyword (``pacs.abort_count_check``; empty: none, nothing is read)."""
    if not counts:
        return CountCheck(len(list(folder.glob("*.dcm"))))
    files = sorted(folder.glob("*.dcm"))
    received = len(files)
    first = _read(files[0]) if files else None
    if first is None:
        return CountCheck(received)
    counted = None
    series_n = _count(first.get("NumberOfSeriesRelatedInstances")) if "NumberOfSeriesRelatedInstances" in counts else None
    if series_n is not None:
        if received < series_n:
            why = f"{received} of {series_n} instance(s) received (NumberOfSeriesRelatedInstances {series_n} in its instances)"
            return CountCheck(received, short=why, field="NumberOfSeriesRelatedInstances")
        counted = f"NumberOfSeriesRelatedInstances {series_n}"
    acq_n = _count(first.get("ImagesInAcquisition")) if "ImagesInAcquisition" in counts else None
    if acq_n is None:
        return CountCheck(received, counted=counted)
    others = _Siblings(siblings or {})
    if received < acq_n and received + others.files_giving(acq_n) < acq_n:  # siblings cannot make it up either
        acq = _which(_acquisition(first))
        why = f"{received} of {acq_n} image(s) of {acq} received (ImagesInAcquisition {acq_n} in its instances)"
        return CountCheck(received, short=why, field="ImagesInAcquisition")
    tally = _tally(files)
    reached: list[str] = []
    pooled: set[str] = set()
    for acq, (k, expected) in sorted(tally.items()):
        if expected is None:
            continue
        parts = others.short_alone(acq, expected) if k < expected else {}
        total = k + sum(parts.values())
        if k < expected and total != expected:
            within = f", {total} in {len(parts) + 1} series of the study" if parts else ""
            why = (
                f"{k} of {expected} image(s) of {_which(acq)} received{within} (ImagesInAcquisition {expected} in its instances)"
            )
            return CountCheck(received, short=why, field="ImagesInAcquisition")
        pooled.update(parts)
        across = f" across {len(parts) + 1} series of the study" if parts else ""
        reached.append(f"{expected}{across}" if len(tally) == 1 else f"{expected} of {_which(acq)}{across}")
    if reached:
        counted = ", ".join(([counted] if counted else []) + [f"ImagesInAcquisition {', '.join(reached)}"])
    return CountCheck(received, counted=counted, pooled=tuple(sorted(pooled)))


class _Siblings:
    """The other series of a study (Series Instance UID → folder), each read only as far as a count asks: its first
    instance's Images in Acquisition, then, where that is the count, each instance's."""

    def __init__(self, folders: Mapping[str, Path]):
        self.folders = folders
        self._heads: dict[str, tuple[list[Path], int | None]] | None = None
        self._tallies: dict[str, Tally] = {}

    def _first(self) -> dict[str, tuple[list[Path], int | None]]:
        """Each sibling's files, and the Images in Acquisition its first instance gives."""
        if self._heads is None:
            self._heads = {}
            for uid, folder in self.folders.items():
                files = sorted(folder.glob("*.dcm"))
                head = _read(files[0]) if files else None
                self._heads[uid] = (files, _count(head.get("ImagesInAcquisition")) if head is not None else None)
        return self._heads

    def files_giving(self, expected: int) -> int:
        """How many instances the siblings whose first instance gives the count ``expected`` hold: the most they can
        add to it (only their first instances read)."""
        return sum(len(files) for files, first_n in self._first().values() if first_n == expected)

    def short_alone(self, acq: str, expected: int) -> dict[str, int]:
        """The siblings whose instances of acquisition ``acq`` give the count ``expected`` and are fewer alone: how
        many each has."""
        out = {}
        for uid, (files, first_n) in self._first().items():
            if first_n != expected:
                continue
            if uid not in self._tallies:
                self._tallies[uid] = _tally(files)
            k, n = self._tallies[uid].get(acq, (0, None))
            if n == expected and k < expected:
                out[uid] = k
        return out


def announced(folder: Path) -> dict[str, int]:
    """The counts the instances received in ``folder`` give, as :func:`count_check` reads them (the first ``*.dcm`` by
    name): Number of Series Related Instances and Images in Acquisition, by keyword, those present (one file read)."""
    files = sorted(folder.glob("*.dcm"))
    first = _read(files[0]) if files else None
    if first is None:
        return {}
    counts = {keyword: _count(first.get(keyword)) for keyword in ABORT_COUNTS}
    return {keyword: n for keyword, n in counts.items() if n is not None}


def shortfall(folder: Path) -> str | None:
    """Why the instances received in ``folder`` are known to be fewer than the series has (:func:`count_check`), or
    None."""
    return count_check(folder).short


def latest_count_check(
    ledger: Ledger, series_uid: str, *, counts: Collection[str] = ABORT_COUNTS, generation: int | None = None
) -> CountCheck | None:
    """:func:`count_check` of the series' latest generation (or ``generation``) in the listener's ledger against
    ``counts``, with the latest generations of the other series of its study whose files are kept as siblings (None
    when its own files are gone)."""
    if generation is not None:
        row = ledger.one("SELECT * FROM series WHERE series_uid = ? AND generation = ?", (series_uid, generation))
    else:
        row = ledger.one("SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (series_uid,))
    if row is None or row["removed_at"] is not None or not row["folder"]:
        return None
    latest: dict[str, Any] = {}
    if row["study_uid"]:
        query = "SELECT * FROM series WHERE study_uid = ? AND series_uid != ? ORDER BY generation"
        latest = {r["series_uid"]: r for r in ledger.rows(query, (row["study_uid"], series_uid))}
    siblings = {uid: Path(r["folder"]) for uid, r in latest.items() if r["removed_at"] is None and r["folder"]}
    return count_check(Path(row["folder"]), siblings=siblings, counts=counts)


def lift_held(journal: ReceiveJournal, ledger: Ledger, series_uid: str, *, cfg: Any) -> None:
    """The open series of ``series_uid``'s study held as short of their count (:func:`hold_short`) that its instances,
    just received, make whole (the count is their acquisition's, over several series: :func:`count_check`): their
    hold is lifted (one INFO line each), and they are processed once quiet as any other. Each is judged by the counts
    of the setting its hold was taken under (:func:`held_after`, :data:`SETTINGS`)."""
    row = ledger.one("SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (series_uid,))
    if row is None or not row["study_uid"]:
        return
    query = "SELECT * FROM series WHERE study_uid = ? AND series_uid != ? AND state = 'open'"
    for held in ledger.rows(query, (row["study_uid"], series_uid)):
        note = str(held["note"] or "")
        if not note.startswith(CUT_NOTE) or SHORT_NOTE not in note:
            continue
        again = latest_count_check(ledger, held["series_uid"], counts=checked(cfg, held_after(note)))
        if again is None or again.short is not None or series_uid not in again.pooled:
            continue
        journal.note(held, None)
        log.info(
            "series %s, held as short of the count its instances give, is whole with series %s of the same study "
            "and acquisition (%s in their instances): processed once quiet for pacs.quiet_period_s if its slices "
            "form a volume",
            held["series_uid"],
            series_uid,
            again.counted,
            extra={"event": "listen_count_reached", "series_uid": held["series_uid"]},
        )


def setting(counts: Collection[str]) -> str:
    """``pacs.abort_count_check`` (or ``pacs.release_count_check``) as a config file writes it:
    ``[NumberOfSeriesRelatedInstances]``, or ``none``."""
    return f"[{', '.join(counts)}]" if counts else "none"


def leave_out_hint(field: str, counts: Collection[str], *, end: str = "abort") -> str:
    """When and how to stop holding series short of the count ``field`` (a keyword of ``counts``, the counts
    checked after an association its sender ended so: ``end``, ``'abort'`` or ``'release'``): a sender that ends every
    sending with an A-ABORT (or any sender, after a release), whose instances count images never sent here, has every
    series held, sent again or not."""
    rest = [c for c in counts if c != field]
    example = " (a scanner counting in it every series of the acquisition, some routed elsewhere)"
    if end == "release":
        return (
            f"if the site's {field} counts images never sent here{example if field == 'ImagesInAcquisition' else ''}, "
            f"every series is held so, sent again or not: set pacs.release_count_check: {setting(rest)} (config file, "
            f"{_ENV[end]} or --set) and restart ctpipe listen (the series held so, and those quarantined so whose "
            "files are kept, are then judged by the new setting)"
        )
    return (
        f"if the sender ends every sending with an A-ABORT and its {field} counts images not sent here"
        f"{example if field == 'ImagesInAcquisition' else ''}, a series sent again is held again: "
        f"set pacs.abort_count_check: {setting(rest)} (config file, CTPIPE_PACS_ABORT_COUNT_CHECK or --set) and restart "
        f"ctpipe listen (the series held so, and those quarantined so whose files are kept, are then judged by the new setting)"
    )


def hold_note(*, sender: str, n: int, check: CountCheck, at: str, cfg: Any, end: str = "abort") -> str:
    """The note of a series held by :func:`hold_short` (its arguments): the cut-off, how and when the sender ended its
    association, the count it is short of, and how to leave that count out."""
    how = RELEASED if end == "release" else "ended its association with an A-ABORT"
    hint = leave_out_hint(str(check.field), checked(cfg, end), end=end)
    return f"{CUT_NOTE} {sender} {how} at {at} after {n} instance(s), {SHORT_NOTE}: {check.short}; {hint}"


def hold_short(
    journal: ReceiveJournal,
    row: dict[str, Any],
    *,
    sender: str,
    n: int,
    check: CountCheck,
    at: str,
    cfg: Any,
    end: str = "abort",
) -> None:
    """Hold the open generation ``row`` as cut off: its ``sender`` (calling AE title and address) ended its association
    with an A-ABORT between instances (``end='abort'``) or a release (``end='release'``) at ``at`` (UTC) after ``n``
    instance(s), and fewer arrived than the series' own count (``check``, from :func:`count_check`, short of one of
    the counts :data:`SETTINGS` checks after that end), as when its operator stopped it, or its store job was cancelled,
    part-way. The note (and so the quarantine) and the warning say how to leave that count out, and when. After a
    release, the warning waits until the series is quiet (:func:`warn_quiet_hold`; one INFO line now): a sender of one
    instance per association releases each short of the count but the last."""
    short = str(check.short)
    hint = leave_out_hint(str(check.field), checked(cfg, end), end=end)
    journal.note(row, hold_note(sender=sender, n=n, check=check, at=at, cfg=cfg, end=end))
    if end == "release":
        log.info(
            "the association from %s released by the sender after %d instance(s) of series %s: %s; held until the "
            "rest arrives (pacs.release_count_check)",
            sender,
            n,
            row["series_uid"],
            short,
            extra={"event": "listen_released_short", "series_uid": row["series_uid"]},
        )
        return
    log.warning(
        "the association from %s ended by the sender's A-ABORT after %d instance(s) of series %s: %s, held as cut off "
        "(the sender was stopped before the end); what arrived is kept, and the series waits for the rest (the "
        "instances already received are not stored twice) up to pacs.series_limit_s = %g s after its first instance, "
        "then is quarantined (not published); fix: send the series again; %s",
        sender,
        n,
        row["series_uid"],
        short,
        cfg.pacs.series_limit_s,
        hint,
        extra={"event": "listen_cut", "series_uid": row["series_uid"]},
    )


def warn_quiet_hold(row: dict[str, Any], cfg: Any) -> None:
    """The warning of the open generation ``row``, held short of a count after its sender released the association
    (:func:`hold_short` with ``end='release'``), now quiet for ``pacs.quiet_period_s``: the sender stopped part-way
    (a store job cancelled or paused), or the instances count images never sent here. Once per generation and
    listener (the caller keeps track)."""
    hold = str(row.get("note") or "").split(ALSO_NOTE, 1)[0]
    head, _, rest = hold.removeprefix(CUT_NOTE).strip().partition(f", {SHORT_NOTE}: ")
    short, _, hint = rest.partition("; ")
    log.warning(
        "series %s is quiet and short of the count its instances give after its sender released the association "
        "(%s: %s), held as cut off (the sender was stopped before the end, as a store job cancelled or paused); what "
        "arrived is kept, and the series waits for the rest (the instances already received are not stored twice) up "
        "to pacs.series_limit_s = %g s after its first instance, then is quarantined (not published); fix: send the "
        "series again; %s",
        row["series_uid"],
        head,
        short,
        cfg.pacs.series_limit_s,
        hint,
        extra={"event": "listen_cut", "series_uid": row["series_uid"]},
    )


def recheck_held(journal: ReceiveJournal, ledger: Ledger, *, cfg: Any) -> int:
    """At the listener's start: judge the series held as short of a count (:func:`hold_short`) again against the
    current ``cfg.pacs.abort_count_check`` (``cfg.pacs.release_count_check`` for those held after a release), which may
    have changed since they were held (the way out for a sender whose instances count images never sent here). An
    open one no longer short of a count checked has its hold lifted and is processed once quiet as any other (a gap
    or too few slices still hold it); one quarantined only as short, its files still kept (``pacs.incomplete_keep_s``),
    is opened again (:data:`RECOUNTED_NOTE`) and its case run again once quiet; one INFO line each. An open one still
    short has its note's count and fix brought up to date. Returns how many series were released so."""
    released = 0
    for held in ledger.rows("SELECT * FROM series WHERE state = 'open'"):
        hold = str(held["note"] or "").split(ALSO_NOTE, 1)[0]
        if not hold.startswith(CUT_NOTE) or f", {SHORT_NOTE}: " not in hold:
            continue
        end = held_after(hold)
        counts = checked(cfg, end)
        check = latest_count_check(ledger, held["series_uid"], counts=counts)
        if check is None:
            continue
        if check.short is None:
            journal.note(held, None)
            released += 1
            _say_released(held["series_uid"], hold, counts, "its hold is lifted, and it is processed", end=end)
            continue
        head = hold.split(f", {SHORT_NOTE}: ", 1)[0]
        again = f"{head}, {SHORT_NOTE}: {check.short}; {leave_out_hint(str(check.field), counts, end=end)}"
        if again != hold:
            journal.note(held, again)
    query = "SELECT * FROM series WHERE state = 'processed' AND outcome = 'failed' AND removed_at IS NULL"
    for failed in ledger.rows(query):
        note = str(failed["note"] or "")
        if not note.startswith(INCOMPLETE_NOTE) or f": {CUT_NOTE}" not in note or f", {SHORT_NOTE}: " not in note:
            continue
        if ALSO_NOTE in note:  # a gap or too few slices as well: sending the rest completes it, not a setting
            continue
        end = held_after(note.split(f": {CUT_NOTE}", 1)[1])
        counts = checked(cfg, end)
        check = latest_count_check(ledger, failed["series_uid"], counts=counts)
        if check is None or check.short is not None:
            continue
        reopened = journal.reopen(dict(failed), f"{RECOUNTED_NOTE} {SETTINGS[end]}: {setting(counts)}")
        if reopened is not None:
            released += 1
            _say_released(failed["series_uid"], note, counts, "its quarantined case is run again", end=end)
    return released


def _say_released(series_uid: str, note: str, counts: Collection[str], then: str, *, end: str) -> None:
    """The INFO line of a series held as short of a count (``note``: its hold, taken after an association its sender
    ended so: ``end``) that ``counts`` no longer hold."""
    log.info(
        "series %s, held as short of the count its instances give (%s), is not short of a count checked by the "
        "current %s: %s: %s once quiet for pacs.quiet_period_s if its slices form a volume",
        series_uid,
        note.split(f", {SHORT_NOTE}: ", 1)[1].split("; ", 1)[0],
        SETTINGS[end],
        setting(counts),
        then,
        extra={"event": "listen_hold_lifted", "series_uid": series_uid},
    )
