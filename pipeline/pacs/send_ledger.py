"""What the result sender records of each result file (:mod:`pipeline.pacs.sender`), in ``pacs/ledger.sqlite`` (table
``sent``, keyed by SOPInstanceUID and destination) and the run store (table ``deliveries``): the result files of the
completed cases found (:func:`result_files`, by SOP class), and each outcome (sent; a failed attempt with its retry
due, after ``pacs.backoff_s`` doubling; failed for good; stored unconfirmed), counted by :class:`SendCounts`. Only
the cases the run store records committed are sent (:func:`committed_cases`). Records
are logged as ``pipeline.pacs.sender``'s, as the sending's own. Times are seconds since the epoch (UTC).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunStoreError
from ..runner.store import RunStore, db_path, open_readonly
from . import recheck
from .ledger import Ledger, now
from .retry import backoff_delay

log = logging.getLogger("pipeline.pacs.sender")

#: SOP classes of ctpipe's DICOM results (what is sent back)
RESULT_SOP_CLASSES = {
    "1.2.840.10008.5.1.4.1.1.88.11": "Basic Text SR",
    "1.2.840.10008.5.1.4.1.1.88.22": "Enhanced SR",
    "1.2.840.10008.5.1.4.1.1.88.33": "Comprehensive SR",
    "1.2.840.10008.5.1.4.1.1.88.34": "Comprehensive 3D SR",
    "1.2.840.10008.5.1.4.1.1.66.4": "Segmentation Storage",
}
MANIFEST = "manifest.json"


def result_files(case_dir: Path) -> list[tuple[Path, str, str]]:
    """``(path, SOPInstanceUID, SOPClassUID)`` of the result objects under a case folder (found by SOP class)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    out = []
    for p in sorted(case_dir.rglob("*.dcm")):
        try:
            ds = pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["SOPClassUID", "SOPInstanceUID"])
        except (InvalidDicomError, OSError, ValueError) as exc:
            log.warning("%s is not a readable DICOM file (%s); not sent", p, exc)
            continue
        cls, uid = str(ds.get("SOPClassUID", "")), str(ds.get("SOPInstanceUID", ""))
        if cls in RESULT_SOP_CLASSES and uid:
            out.append((p, uid, cls))
    return out


def committed_cases(run_dir: Path) -> set[str]:
    """The ids of the cases whose results may be published: recorded done in ``run_dir``'s run store, in their folder
    ``cases/<case_id>``, and confirmed (not among the cases whose source the runner is still checking once more
    after the commit, table ``unconfirmed``). None without a run store (nothing is known to be complete there)."""
    if not db_path(run_dir).is_file():
        return set()
    try:
        db = open_readonly(run_dir)
    except RunStoreError as exc:
        log.error("results not queued: %s", exc, extra={"event": "send_error"})
        return set()
    try:
        query = "SELECT case_id, output_dir FROM cases WHERE status = 'done'"
        try:
            rows = db.execute(query + " AND case_key NOT IN (SELECT case_key FROM unconfirmed)").fetchall()
        except sqlite3.OperationalError:  # a store written before cases were confirmed: none is unconfirmed
            rows = db.execute(query).fetchall()
    finally:
        db.close()
    return {str(cid) for cid, out in rows if out is not None and Path(out) == Path("cases") / str(cid)}


@dataclass
class SendCounts:
    """Result files for one destination, by state."""

    sent: int = 0
    pending: int = 0
    failed: int = 0
    #: stored on the destination's success answer, not confirmed: it refused the confirming query
    unconfirmed: int = 0

    def line(self, destination: str) -> str:
        stored = f", {self.unconfirmed} stored unconfirmed" if self.unconfirmed else ""
        return f"results to {destination}: {self.sent} sent{stored}, {self.pending} pending, {self.failed} failed"


class SendLedger:
    """The sender's records of one destination's result files (the base of
    :class:`~pipeline.pacs.sender.ResultSender`, which sets these attributes)."""

    run_dir: Path
    cfg: Any
    #: the destination, as recorded (credentials redacted)
    key: str
    ledger: Ledger
    poll_s: float
    _wake: threading.Event

    # -- finding work ----------------------------------------------------------------------
    def scan(self) -> int:
        """Record the result files of committed cases not scanned yet as pending; returns how many were added.

        A case is committed once the run store records it done, its last check of the source passed
        (:func:`committed_cases`), and its folder with its manifest is in place: a folder that is there before its
        case is committed, or that the runner withdraws at the commit (a file of the series landed then), is never
        queued; it is looked at again on the next pass."""
        cases = self.run_dir / "cases"
        if not cases.is_dir():
            return 0
        done = {r["case_id"] for r in self.ledger.rows("SELECT case_id FROM scanned WHERE destination = ?", (self.key,))}
        committed = committed_cases(self.run_dir)
        added = 0
        for folder in sorted(p for p in cases.iterdir() if p.is_dir() and p.name not in done):
            if folder.name not in committed or not (folder / MANIFEST).is_file():
                continue
            files = result_files(folder)
            with self.ledger.tx() as db:
                for path, uid, cls in files:
                    cur = db.execute(
                        "INSERT OR IGNORE INTO sent (sop_uid, destination, case_id, path, sop_class, state, attempts, "
                        "next_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', 0, 0, ?)",
                        (uid, self.key, folder.name, str(path.relative_to(self.run_dir)), cls, now()),
                    )
                    added += cur.rowcount
                db.execute(
                    "INSERT OR REPLACE INTO scanned (case_id, destination, scanned_at) VALUES (?, ?, ?)",
                    (folder.name, self.key, now()),
                )
            if files:
                log.info(
                    "case %s: %d result file(s) queued for %s", folder.name, len(files), self.key, extra={"event": "send_queued"}
                )
        if added:
            self._wake.set()
        return added

    def retry_failed(self) -> int:
        """Put the files recorded ``failed`` for this destination back to ``pending``; returns how many."""
        with self.ledger.tx() as db:
            return db.execute(
                "UPDATE sent SET state = 'pending', attempts = 0, next_at = 0 WHERE destination = ? AND state = 'failed'",
                (self.key,),
            ).rowcount

    def retry_unconfirmed(self) -> int:
        """Put the files recorded ``unconfirmed`` for this destination back to ``pending`` (sent again, then confirmed
        as any send: for a destination that may have lost them); returns how many."""
        with self.ledger.tx() as db:
            return db.execute(
                "UPDATE sent SET state = 'pending', attempts = 0, next_at = 0 WHERE destination = ? AND state = 'unconfirmed'",
                (self.key,),
            ).rowcount

    def counts(self) -> SendCounts:
        c = SendCounts()
        for r in self.ledger.rows("SELECT state, COUNT(*) AS n FROM sent WHERE destination = ? GROUP BY state", (self.key,)):
            setattr(c, r["state"], int(r["n"]))
        return c

    def fail_for_good(self, items: list[dict[str, Any]], error: str) -> None:
        """Record ``items`` failed for good with ``error`` (said at debug level: the caller says it once)."""
        self._failed(items, error, final=True, quiet=True)

    def record(self, outcomes: Sequence[tuple[dict[str, Any], str, int, str | None]]) -> None:
        """Mirror outcomes into the run store (see :meth:`_record`)."""
        self._record(outcomes)

    def _unconfirmed(self, items: list[dict[str, Any]], reason: str, *, quiet: bool = False) -> None:
        """Record ``items`` stored unconfirmed: the destination answered success and refused the query that would
        confirm it holds them (``reason``: the refusal and the fix). Not sent again; ``quiet``: logged at debug level
        (said already, for an earlier case)."""
        with self.ledger.tx() as db:
            for r in items:
                db.execute(
                    "UPDATE sent SET state = 'unconfirmed', attempts = attempts + 1, error = ?, updated_at = ?, "
                    "next_at = ? WHERE sop_uid = ? AND destination = ?",
                    (reason[:2000], now(), recheck.next_due(now(), now()), r["sop_uid"], self.key),
                )
        self._record([(r, "unconfirmed", int(r["attempts"]) + 1, reason[:2000]) for r in items])
        cases = ", ".join(sorted({str(r["case_id"]) for r in items}))
        if quiet:
            log.debug("case(s) %s: %d result file(s) stored at %s, not confirmed", cases, len(items), self.key)
            return
        log.warning(
            "case(s) %s: %d result file(s) %s; they are recorded stored, unconfirmed, and not sent again; the later "
            "cases' results are sent without asking",
            cases,
            len(items),
            reason,
            extra={"event": "send_unconfirmed"},
        )

    def _failed(self, items: list[dict[str, Any]], error: str, *, final: bool = False, quiet: bool = False) -> None:
        """Record a failed attempt of ``items`` (failed for good when ``final`` or out of retries); ``quiet``: logged
        at debug level (the reason was logged already, for an earlier case)."""
        limit = int(self.cfg.pacs.send_retries)
        outcomes = []
        with self.ledger.tx() as db:
            for r in items:
                attempts = int(r["attempts"]) + 1
                give_up = final or attempts > limit
                state = "failed" if give_up else "pending"
                outcomes.append((r, state, attempts, error[:2000]))
                wait = backoff_delay(attempts, float(self.cfg.pacs.backoff_s))
                db.execute(
                    "UPDATE sent SET state = ?, attempts = ?, error = ?, next_at = ?, updated_at = ? "
                    "WHERE sop_uid = ? AND destination = ?",
                    (state, attempts, error[:2000], now() + wait, now(), r["sop_uid"], self.key),
                )
                if give_up and quiet:
                    log.debug("result %s of case %s not sent to %s: %s", r["path"], r["case_id"], self.key, error)
                elif give_up:
                    log.error(
                        "result %s of case %s not sent to %s after %d attempt(s): %s",
                        r["path"],
                        r["case_id"],
                        self.key,
                        attempts,
                        error,
                        extra={"event": "send_failed"},
                    )
                else:
                    log.warning(
                        "result %s of case %s: attempt %d to %s failed (%s); next in %.1f s",
                        r["path"],
                        r["case_id"],
                        attempts,
                        self.key,
                        error,
                        wait,
                        extra={"event": "send_retry"},
                    )

        self._record(outcomes)

    def _record(self, outcomes: Sequence[tuple[dict[str, Any], str, int, str | None]]) -> None:
        """Mirror outcomes ``(ledger row, state, attempts, error)`` into the run store's ``deliveries`` table."""
        if not outcomes or not db_path(self.run_dir).is_file():
            return
        try:
            store = RunStore(self.run_dir, create=False)
        except (RunStoreError, sqlite3.Error) as exc:
            log.error("result deliveries not recorded in the run store: %s", exc, extra={"event": "send_record_failed"})
            return
        try:
            for r, state, attempts, error in outcomes:
                store.record_delivery(
                    sop_uid=r["sop_uid"],
                    destination=self.key,
                    case_id=r["case_id"],
                    sop_class=RESULT_SOP_CLASSES.get(str(r["sop_class"]), r["sop_class"]),
                    state=state,
                    attempts=attempts,
                    error=error,
                )
        except sqlite3.Error as exc:
            log.error("result deliveries not recorded in the run store: %s", exc, extra={"event": "send_record_failed"})
        finally:
            store.close()

    def _next_due_in(self) -> float:
        row = self.ledger.one("SELECT MIN(next_at) AS t FROM sent WHERE destination = ? AND state = 'pending'", (self.key,))
        t = row["t"] if row else None
        return self.poll_s if t is None else max(0.0, min(self.poll_s, float(t) - now()))
