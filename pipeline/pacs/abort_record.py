"""How the sender ended an open series' latest association (an A-ABORT between instances, or a release), as the
listener's ledger records it, so that a restart judges the series against the ``pacs.abort_count_check`` (or
``pacs.release_count_check``) then in force.

A series whose sender ended its association with an A-ABORT between instances, or a release, is held when fewer
instances arrived than a count they give that the setting of that end checks
(:func:`~pipeline.pacs.expected_count.hold_short`). One accepted under a looser setting (a count left out, or
``none``) and still open when ``ctpipe listen`` restarts with a stricter one is judged again (:func:`hold_aborted`),
and so is one handed to the runner that the runner had not finished when the listener stopped (:func:`hold_handed`):
the ledger's ``series.aborted`` column records, per generation, the last such end (its sender, when, the instances it
stored, ``end``: ``abort`` or ``release``) and the counts its instances gave then
(:func:`~pipeline.pacs.expected_count.announced`). A series still short of a count now checked is held as it would
have been live, with the same note and warning; one accepted under a stricter setting and held is released by a looser
one as before (:func:`~pipeline.pacs.expected_count.recheck_held`).

``series.aborted`` holds ``''`` when no end is recorded (none yet; or, in a ledger written before releases were
recorded, a release since), or the record as JSON, e.g. ``{"at": "2026-12-07 16:11:18 UTC", "counts":
{"ImagesInAcquisition": 8}, "end": "abort", "n": 5, "sender": "MODALITY at 10.0.0.5"}`` (a record without ``end``, as
written before releases were recorded, is an A-ABORT's). A row written before the column existed (the column added
to an older ledger) holds NULL: how its sender's associations ended is not known, and an open one is judged, conservatively, as if its sender had ended with an A-ABORT
(held when short of a count checked, with a note saying so: sending the series again ends the hold); a record that
cannot be read is taken so too. Records are logged as ``pipeline.pacs.listener``'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .expected_count import (
    SETTINGS,
    SHORT_NOTE,
    CountCheck,
    announced,
    checked,
    hold_note,
    hold_short,
    latest_count_check,
    leave_out_hint,
)
from .journal import CUT_NOTE, INCOMPLETE_NOTE, RECOUNTED_NOTE, RESENT_NOTE, ReceiveJournal
from .ledger import Ledger

log = logging.getLogger("pipeline.pacs.listener")

#: In the note of an open series of an older ledger held by :func:`hold_aborted`: why it was judged so.
UNRECORDED = "how its sender's associations ended is not recorded (a ledger written before ctpipe recorded it, or unreadable)"


#: How a sender may end an association that a record keeps: an A-ABORT between instances, or a release.
_ENDS = ("abort", "release")


@dataclass(frozen=True)
class AbortRecord:
    """A sender's A-ABORT between instances (``end='abort'``), or release (``end='release'``), that ended an association
    storing instances of a series: ``sender`` (calling AE title and address), ``at`` (UTC, as the hold's note writes
    it), ``n`` (instances it stored of the series) and ``counts`` (the counts the series' instances gave then, by
    keyword: :func:`~pipeline.pacs.expected_count.announced`).
    """

    sender: str
    at: str
    n: int
    counts: dict[str, int] = field(default_factory=dict)
    end: str = "abort"

    @classmethod
    def taken(cls, row: dict[str, Any], *, sender: str, at: str, n: int, end: str = "abort") -> AbortRecord:
        """The record of the end just taken for the open generation ``row`` (its files read for the counts)."""
        return cls(sender, at, n, announced(Path(row["folder"])) if row.get("folder") else {}, end)


def write(ledger: Ledger, row: dict[str, Any], record: AbortRecord | None) -> None:
    """Record ``record`` for the generation ``row`` (None: no end recorded)."""
    value = "" if record is None else json.dumps(asdict(record), sort_keys=True)
    with ledger.tx() as db:
        db.execute(
            "UPDATE series SET aborted = ? WHERE series_uid = ? AND generation = ?",
            (value, row["series_uid"], row["generation"]),
        )


def _read(row: dict[str, Any]) -> tuple[bool, AbortRecord | None]:
    """Whether ``row``'s end is known, and its record (None: no A-ABORT stands). Not known: NULL (a row written before
    the column existed), or a value that cannot be read (one warning)."""
    value = row.get("aborted")
    if value is None:
        return False, None
    if value == "":
        return True, None
    try:
        data = json.loads(str(value))
        counts = {str(k): int(v) for k, v in data["counts"].items()}
        end = str(data.get("end", "abort"))
        if end not in _ENDS:
            raise ValueError(f"end {end!r} is none of {', '.join(_ENDS)}")
        return True, AbortRecord(str(data["sender"]), str(data["at"]), int(data["n"]), counts, end)
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning(
            "series %s: its A-ABORT record in the ledger (%r) cannot be read; judged as if its sender had ended with an A-ABORT",
            row["series_uid"],
            value,
            extra={"event": "listen_abort_record_unread", "series_uid": row["series_uid"]},
        )
        return False, None


def hold_aborted(journal: ReceiveJournal, ledger: Ledger, *, cfg: Any) -> int:
    """At the listener's start: hold each open series, not held already, whose sender's A-ABORT or release (its record)
    was taken under an earlier, looser ``pacs.abort_count_check`` (``pacs.release_count_check``) and whose instances
    are short of a count the current one checks (:func:`~pipeline.pacs.expected_count.hold_short`, with the sender,
    time and instances of the record: the note and warning a live hold gives). An open series of an older ledger (no
    record) is judged as if its sender had ended with an A-ABORT (see the module docstring). Returns how many series
    were held so."""
    held = 0
    for row in ledger.rows("SELECT * FROM series WHERE state = 'open'"):
        judged = _short_now(ledger, row, cfg=cfg)
        if judged is not None:
            _hold(journal, row, *judged, cfg=cfg)
            held += 1
    return held


def hold_handed(
    journal: ReceiveJournal, ledger: Ledger, *, cfg: Any, finished: Callable[[dict[str, Any]], bool]
) -> tuple[int, int]:
    """At the listener's start: judge each series handed to the runner by an earlier listener that stopped before the
    runner finished it (``finished``: whether the runner did, by the run store) as :func:`hold_aborted` judges an open
    one: one short of a count the current setting checks after its sender's end is put back to open
    (:meth:`~pipeline.pacs.journal.ReceiveJournal.unhand`) and held with the note and warning of a live hold, so that it
    waits for the rest up to ``pacs.series_limit_s`` after its first instance, then is quarantined (never published
    short). One whose series has a newer generation since (its instances and those received after, linked) cannot wait
    for the rest: it is handed over as incomplete, so that the runner quarantines it with that note, and the newer
    generation is processed as any other (its case takes the quarantined one's place). One the runner finished is left
    as it is (handed again, the run store skips its case: recorded, not run twice), and so is one handed over
    incomplete (quarantined anyway). Returns how many series were held, and how many handed over incomplete, so."""
    held = superseded = 0
    for row in journal.handed():
        judged = _short_now(ledger, row, cfg=cfg)
        if judged is None or finished(row):
            continue
        reopened = journal.unhand(row)
        if reopened is not None:
            _hold(journal, reopened, *judged, cfg=cfg)
            held += 1
            continue
        superseded += 1
        record, end, check = judged
        newer = ledger.one("SELECT MAX(generation) AS g FROM series WHERE series_uid = ?", (row["series_uid"],))
        later = int(newer["g"]) if newer is not None and newer["g"] is not None else int(row["generation"]) + 1
        journal.note(
            row,
            f"{INCOMPLETE_NOTE} generation {later} of its series took its instances and those received since: "
            f"{_hold_note(record, end, check, cfg=cfg)}",
        )
        log.warning(
            "series %s (generation %d), handed to the runner and not finished by it when the listener stopped, is short "
            "of a count %s now checks: %s; generation %d holds its instances and those received since, so this one is "
            "handed over incomplete, quarantined (never published short), and generation %d is processed as any other",
            row["series_uid"],
            row["generation"],
            SETTINGS[end],
            check.short,
            later,
            later,
            extra={"event": "listen_cut", "series_uid": row["series_uid"]},
        )
    return held, superseded


def _short_now(ledger: Ledger, row: dict[str, Any], *, cfg: Any) -> tuple[AbortRecord | None, str, CountCheck] | None:
    """Whether the current setting holds the generation ``row`` (open, or handed) for its sender's end: its record
    (None: not recorded, judged as an A-ABORT), that end, and the count check of its files it is short by; None when it
    is not held (held already, no end recorded, no count checked, its instances give none checked or reach them)."""
    if str(row["note"] or "").startswith((CUT_NOTE, INCOMPLETE_NOTE, RESENT_NOTE, RECOUNTED_NOTE)):
        return None  # held already, or opened again from a quarantined case on an end it was judged by then
    known, record = _read(row)
    if known and record is None:
        return None  # no end recorded
    end = record.end if record is not None else "abort"
    counts = checked(cfg, end)
    if not counts or (record is not None and not set(counts) & set(record.counts)):
        return None  # no count checked after such an end, or its instances gave none checked now
    check = latest_count_check(ledger, row["series_uid"], counts=counts, generation=int(row["generation"]))
    if check is None or check.short is None:
        return None
    return record, end, check


def _hold_note(record: AbortRecord | None, end: str, check: CountCheck, *, cfg: Any) -> str:
    """The note of a series :func:`_short_now` found short: a live hold's (the record's sender, time and instances), or,
    without a record, one saying its sender's end is not known and judged as an A-ABORT."""
    if record is not None:
        return hold_note(sender=record.sender, n=record.n, check=check, at=record.at, cfg=cfg, end=end)
    hint = leave_out_hint(str(check.field), checked(cfg, end))
    return f"{CUT_NOTE} {UNRECORDED}, judged as after an A-ABORT, {SHORT_NOTE}: {check.short}; {hint}"


def _hold(
    journal: ReceiveJournal, row: dict[str, Any], record: AbortRecord | None, end: str, check: CountCheck, *, cfg: Any
) -> None:
    """Hold the open generation ``row`` as :func:`_short_now` found it short: as a live hold does (the record's sender,
    time and instances), or, without a record, as after an A-ABORT whose sender is not known."""
    if record is not None:
        hold_short(journal, row, sender=record.sender, n=record.n, check=check, at=record.at, cfg=cfg, end=end)
        return
    hint = leave_out_hint(str(check.field), checked(cfg, end))
    journal.note(row, _hold_note(record, end, check, cfg=cfg))
    log.warning(
        "series %s, open in a ledger that does not record how its sender's associations ended (written before ctpipe "
        "recorded it), has fewer instances than a count they give: %s; held as cut off, as after a sender's A-ABORT "
        "(never published as whole): it waits for the rest up to pacs.series_limit_s = %g s after its first "
        "instance, then is quarantined; fix: send the series again (an association ended with a release, or with "
        "an A-ABORT once the count is reached, ends the hold); %s",
        row["series_uid"],
        check.short,
        cfg.pacs.series_limit_s,
        hint,
        extra={"event": "listen_cut", "series_uid": row["series_uid"]},
    )
