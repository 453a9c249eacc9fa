"""Results back to a PACS: the DICOM outputs (SR, SEG) of completed cases, sent in a background thread.

:class:`ResultSender` watches ``RUN_DIR/cases/``: a case folder is complete once its
``manifest.json`` is there (the runner publishes case folders atomically). Every ``*.dcm`` file
under it whose SOP class is a result class (:data:`RESULT_SOP_CLASSES`: structured reports and
segmentations) is recorded ``pending`` in the ledger (:mod:`pipeline.pacs.ledger`, table ``sent``,
keyed by SOPInstanceUID and destination) and sent by STOW-RS (``dicomweb+http(s)://``) or C-STORE
(``dimse://``) to ``pacs.send_to``. An attempt that failed for a transient reason (archive unreachable, a
timeout, HTTP 5xx, a dropped association) is retried after ``pacs.backoff_s``, doubling, up to
``pacs.send_retries`` times, then recorded ``failed`` with the reason; one the destination refused
(:class:`~pipeline.errors.PacsRequestError`: wrong credentials, an AE title it does not know, a SOP class it does
not take) is recorded ``failed`` at once (``ctpipe send --retry-failed`` tries those again, once it is corrected). Every outcome (sent; a failed attempt with the retry due;
failed for good, with the error) is also recorded in the run store (table ``deliveries``, read as
``open_run(RUN_DIR).deliveries``). With ``pacs.verify_sent`` (the default), a file the destination answered
success for is recorded ``sent`` only once the destination, asked right after (C-FIND at IMAGE level or QIDO-RS by
SOPInstanceUID, one query per case; by series for an archive that answers no IMAGE-level query, see
:mod:`pipeline.pacs.confirm`), holds it: an archive can answer success and not keep the instance (a filter or
routing rule, storage failing after the answer); one it does not hold counts as a failed attempt (retried as above,
then ``failed``, with the instance, the destination and the likely cause). A destination that answered success but
refuses the confirming query (:class:`~pipeline.errors.PacsRequestError`: its query permissions, or no query service)
has the files recorded ``unconfirmed`` (stored on its success answer, not confirmed), with the refusal and the fix,
said once; they are not sent again (``--retry-failed`` neither; ``--retry-unconfirmed`` does), and the later cases are sent without the query for
:data:`~pipeline.pacs.recheck.RECHECK_S`. Later passes ask for them again (:mod:`pipeline.pacs.recheck`: the first
of each process, then after 15 minutes, doubling up to a day, for 7 days; each when due, that pause or not): those the destination now holds are
recorded ``sent``, those it answers it does not hold ``failed``, those still unconfirmed after 7 days ``failed`` with
the fix; with ``pacs.verify_sent`` off they are recorded ``sent``. A file is never sent twice to one
destination; files still pending when a process stops are sent by the next ``ctpipe run``, ``ctpipe listen`` or ``ctpipe send``.
Sending runs beside the pipeline and never blocks it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydicom.errors import InvalidDicomError

from ..config import from_dict
from ..errors import CtpipeError, PacsError, PacsRequestError, PacsUnavailableError, RunStoreError
from ..runner.store import RunStore, db_path
from . import recheck
from .address import Endpoint, parse_destination
from .archive import Archive
from .confirm import Confirmer, SentResult, read_sent
from .connect import open_archive
from .ledger import Ledger, now
from .recheck import Asked, UnconfirmedRecheck
from .retry import backoff_delay

log = logging.getLogger(__name__)

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


class ResultSender:
    """Sends the result files of a run folder's completed cases (see the module docstring).

    ``cfg``: the run's :class:`~pipeline.config.Config`; ``destination``: an address (default
    ``pacs.send_to``). :meth:`start` runs it in a background thread; :meth:`close` stops it.
    """

    def __init__(self, run_dir: str | Path, cfg: Any, *, destination: str | None = None, poll_s: float = 1.0):
        text = destination or cfg.pacs.send_to
        if not text:
            raise PacsError("no destination for results", where="pacs.send_to", fix="set pacs.send_to or pass --to")
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        # one retry policy: this sender's (send_retries, with backoff between passes), none inside each request
        self._request_cfg = from_dict({**cfg.to_dict(), "pacs": {**dict(cfg.pacs), "retries": 0}}, source="pacs sender")
        self.endpoint: Endpoint = parse_destination(text)
        self.key = self.endpoint.redacted()
        self.poll_s = poll_s
        self.ledger = Ledger(self.run_dir)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._archive: Archive | None = None
        self._confirmer = Confirmer(self.key, dicomweb=self.endpoint.kind == "dicomweb", known=self._last_sent())
        #: why the destination cannot confirm what it holds (it refused the query), and when it said so: the later
        #: cases are sent and recorded unconfirmed with it, not asked again, for RECHECK_S (a long-running listener
        #: asks again once that has passed: the archive may have been corrected)
        self._cannot_confirm: tuple[str, float] | None = None
        #: whether results the destination listed nothing of, at any level, were said already (logged once)
        self._said_uncertain = False
        #: whether the last case of this pass could not reach the destination (the pass stops there)
        self._unreachable = False
        #: when results recorded unconfirmed (by this run or an earlier one) are asked for again, see
        #: :meth:`confirm_unconfirmed`
        self._recheck = UnconfirmedRecheck(self)

    def _last_sent(self) -> SentResult | None:
        """The last result recorded sent to this destination (by an earlier run too), if its file can still be read:
        what the confirming queries ask for again when the destination lists nothing of a case."""
        row = self.ledger.one(
            "SELECT path FROM sent WHERE destination = ? AND state = 'sent' ORDER BY updated_at DESC LIMIT 1", (self.key,)
        )
        if row is None or not row["path"]:
            return None
        try:
            return read_sent(self.run_dir / row["path"])
        except (OSError, InvalidDicomError):
            return None

    # -- finding work ----------------------------------------------------------------------
    def scan(self) -> int:
        """Record the result files of complete cases not scanned yet as pending; returns how many were added."""
        cases = self.run_dir / "cases"
        if not cases.is_dir():
            return 0
        done = {r["case_id"] for r in self.ledger.rows("SELECT case_id FROM scanned WHERE destination = ?", (self.key,))}
        added = 0
        for folder in sorted(p for p in cases.iterdir() if p.is_dir() and p.name not in done):
            if not (folder / MANIFEST).is_file():
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

    # -- sending ---------------------------------------------------------------------------
    def send_due(self) -> int:
        """Send every pending file whose retry time has come (one request per case); returns how many were sent."""
        rows = self.ledger.rows(
            "SELECT * FROM sent WHERE destination = ? AND state = 'pending' AND next_at <= ? ORDER BY case_id, path",
            (self.key, now()),
        )
        by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_case[r["case_id"]].append(r)
        n_sent = 0
        self._unreachable = False
        cases = list(by_case.items())
        for n, (case_id, items) in enumerate(cases):
            if self._stop.is_set():
                break
            n_sent += self._send_case(case_id, items)
            if self._unreachable and n + 1 < len(cases):  # the next cases would meet the same archive: not tried now
                log.warning(
                    "%s cannot be reached; %d more case(s) with results due wait for the next attempt (not counted as attempts)",
                    self.key,
                    len(cases) - n - 1,
                    extra={"event": "send_unreachable"},
                )
                break
        if not self._unreachable and not self._stop.is_set():
            self.confirm_unconfirmed()
        return n_sent

    def confirm_unconfirmed(self) -> int:
        """Settle the results recorded ``unconfirmed`` for this destination (stored on its success answer, its
        confirming query refused), without sending them again, if their re-check is due; returns how many are now
        recorded sent. When, how often and until when they are asked for: :mod:`pipeline.pacs.recheck`."""
        return self._recheck.run()

    def refused_recently(self) -> bool:
        """Whether the destination refused a confirming query less than :data:`~pipeline.pacs.recheck.RECHECK_S` ago."""
        return self._cannot_confirm is not None and now() - self._cannot_confirm[1] < recheck.RECHECK_S

    def ask_again(self, rows: list[dict[str, Any]], asked: Asked) -> None:
        """Ask the destination for results recorded unconfirmed earlier (the same queries as right after a send, one
        per case), filling in ``asked``; those it answers it does not hold are failed as a drop. Raises
        :class:`~pipeline.errors.PacsError` when it cannot be reached."""
        try:
            if self._archive is None:
                self._archive = open_archive(self.endpoint, self._request_cfg)
            self._confirmed(self._archive, rows, later=asked)
        except (PacsError, CtpipeError):
            self._drop_archive()
            raise

    def fail_for_good(self, items: list[dict[str, Any]], error: str) -> None:
        """Record ``items`` failed for good with ``error`` (said at debug level: the caller says it once)."""
        self._failed(items, error, final=True, quiet=True)

    def record(self, outcomes: Sequence[tuple[dict[str, Any], str, int, str | None]]) -> None:
        """Mirror outcomes into the run store (see :meth:`_record`)."""
        self._record(outcomes)

    def _send_case(self, case_id: str, items: list[dict[str, Any]]) -> int:
        paths = [self.run_dir / r["path"] for r in items]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            self._failed(items, f"file missing: {missing[0]}", final=True)
            return 0
        if self._cannot_confirm and not self.refused_recently():
            self._cannot_confirm = None
        try:
            if self._archive is None:
                self._archive = open_archive(self.endpoint, self._request_cfg)
            archive = self._archive
            outcomes = archive.store(paths)
        except PacsRequestError as exc:  # refused (credentials, AE title, SOP classes): waiting does not mend it
            self._failed(items, f"{type(exc).__name__}: {exc}", final=True)
            self._drop_archive()
            return 0
        except (PacsError, CtpipeError) as exc:
            self._failed(items, f"{type(exc).__name__}: {exc}")
            self._drop_archive()
            # down, hanging or cut off before anything was answered: the same for every case of this pass
            self._unreachable = isinstance(exc, PacsUnavailableError)
            return 0
        except (OSError, InvalidDicomError) as exc:  # a result file damaged since it was published: sending cannot mend it
            self._failed(items, f"cannot read a result file of the case: {exc}", final=True)
            return 0
        ok = {o.sop_instance_uid for o in outcomes if o.ok}
        refused = {o.sop_instance_uid: o.detail for o in outcomes if not o.ok}
        if ok and self.cfg.pacs.verify_sent and self._cannot_confirm:  # refused for an earlier case: not asked again
            self._unconfirmed([r for r in items if r["sop_uid"] in ok], self._cannot_confirm[0], quiet=True)
            ok = set()
        elif ok and self.cfg.pacs.verify_sent:
            ok = self._confirmed(archive, [r for r in items if r["sop_uid"] in ok])
        with self.ledger.tx() as db:
            for r in items:
                if r["sop_uid"] in ok:
                    db.execute(
                        "UPDATE sent SET state = 'sent', attempts = attempts + 1, error = NULL, updated_at = ? "
                        "WHERE sop_uid = ? AND destination = ?",
                        (now(), r["sop_uid"], self.key),
                    )
        self._record([(r, "sent", int(r["attempts"]) + 1, None) for r in items if r["sop_uid"] in ok])
        if refused:
            self._failed([r for r in items if r["sop_uid"] in refused], "refused: " + "; ".join(sorted(set(refused.values()))))
        if ok:
            log.info(
                "case %s: %d result file(s) sent to %s%s",
                case_id,
                len(ok),
                self.key,
                " (and found there)" if self.cfg.pacs.verify_sent else "",
                extra={"event": "sent"},
            )
        return len(ok)

    def _confirmed(self, archive: Archive, items: list[dict[str, Any]], *, later: Asked | None = None) -> set[str]:
        """The SOPInstanceUIDs of ``items`` (answered success) that the destination holds when asked right after
        (:class:`~pipeline.pacs.confirm.Confirmer`: one query per study, that is per case; one more by series when
        the archive finds none of them by instance). The others are recorded as a failed attempt, with the instance,
        the destination and the likely cause; a query that failed, as a failed attempt of all of them; a query the
        destination refused, as stored unconfirmed (:meth:`_unconfirmed`, naming ``pacs.verify_sent``, said once: the
        later cases are not asked for RECHECK_S)). ``later``: ``items`` are results recorded unconfirmed earlier
        (:meth:`confirm_unconfirmed`), what the queries said is filled in there: a query that failed or was refused
        leaves them so (a refusal is noted as above), as does an archive that lists nothing of them at any level;
        only those the destination answers it does not hold are failed (for good)."""
        studies: dict[str, list[tuple[dict[str, Any], SentResult]]] = defaultdict(list)
        for r in items:
            try:
                sent = read_sent(self.run_dir / r["path"])
            except (OSError, InvalidDicomError) as exc:
                if later is not None:  # its file gone since: what the archive stored is not asked for, it stays unconfirmed
                    log.debug("result %s stays unconfirmed: cannot read its StudyInstanceUID (%s)", r["path"], exc)
                else:
                    self._failed([r], f"sent, but not confirmed: cannot read its StudyInstanceUID ({exc})", final=True)
                continue
            studies[sent.study_uid].append((r, sent))
        held: set[str] = set()
        groups = list(studies.items())
        for n, (study, pairs) in enumerate(groups):
            try:
                asked = "asked again after it was stored unconfirmed" if later is not None else "right after the send"
                found, why, uncertain = self._confirmer.held(archive, study, [sent for _, sent in pairs], asked=asked)
            except PacsError as exc:  # this study's results and those not asked about yet: not confirmed
                unasked = [r for _, rest in groups[n:] for r, _ in rest]
                self._drop_archive()
                refused = isinstance(exc, PacsRequestError)  # asking again does not mend it, sending again neither
                reason = f"stored ({self.key} answered success), not confirmed: {type(exc).__name__}: {exc}"
                if refused:
                    self._cannot_confirm = (reason, now())
                if later is not None:
                    later.held, later.error = held, exc
                elif refused:
                    self._unconfirmed(unasked, reason)
                else:
                    self._failed(unasked, f"sent, but not confirmed: {type(exc).__name__}: {exc}")
                return held
            held |= found
            missing = [r for r, _ in pairs if r["sop_uid"] not in found]
            cause = not uncertain or self._confirmer.known is None  # a drop, or one that cannot be ruled out
            if later is not None and uncertain:  # lists nothing at all: not told from an archive that cannot say
                later.uncertain = why  # left as they are
                continue
            for r in missing:  # uncertain (nothing listed at all): failed at once, said for the first case only
                final = uncertain or later is not None
                self._failed([r], self._not_held(r, why, cause=cause), final=final, quiet=uncertain and self._said_uncertain)
            self._said_uncertain |= uncertain and bool(missing)
        if later is not None:
            later.held = held
        return held

    def _not_held(self, r: dict[str, Any], why: str, *, cause: bool = True) -> str:
        """Why a result the destination answered success for is not recorded sent, and what to do (``why``: what
        the confirming queries said; ``cause``: they show a drop, whose likely causes are named)."""
        what = RESULT_SOP_CLASSES.get(str(r["sop_class"]), str(r["sop_class"]))
        head = f"{what} {r['sop_uid']} ({r['path']}): {self.key} answered success but does not hold it ({why})."
        if not cause:
            return f"{head} Then `ctpipe send {self.run_dir} --retry-failed`"
        return (
            f"{head} Likely cause: a filter or routing rule on the archive dropped it (an Orthanc Lua "
            "ReceivedInstanceFilter, for one), or its storage failed after it answered; check the archive's log for "
            f"this SOPInstanceUID. Fix: let the archive keep ctpipe's results, then `ctpipe send {self.run_dir} "
            "--retry-failed`"
        )

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

    def _drop_archive(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive = None

    def _next_due_in(self) -> float:
        row = self.ledger.one("SELECT MIN(next_at) AS t FROM sent WHERE destination = ? AND state = 'pending'", (self.key,))
        t = row["t"] if row else None
        return self.poll_s if t is None else max(0.0, min(self.poll_s, float(t) - now()))

    # -- the background thread -------------------------------------------------------------
    def start(self) -> ResultSender:
        """Send in a background thread (scanning for newly completed cases every ``poll_s``)."""
        self._thread = threading.Thread(target=self._loop, name="ctpipe-result-sender", daemon=True)
        self._thread.start()
        return self

    def notify(self) -> None:
        """Look for newly completed cases now (e.g. after a batch of the listener)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
                self.send_due()
            except CtpipeError as exc:  # the ledger or a case folder: log, keep the thread alive, try again later
                log.error("result sender: %s", exc, extra={"event": "send_error"})
            except Exception:  # anything else must not end sending for the rest of the run: logged with its traceback
                log.exception("result sender: unexpected error; trying again later", extra={"event": "send_error"})
            self._wake.wait(self._next_due_in())
            self._wake.clear()

    def drain(self, timeout_s: float) -> SendCounts:
        """Scan once more and send until nothing is pending or ``timeout_s`` has passed; the counts."""
        deadline = time.monotonic() + timeout_s
        self.scan()
        while time.monotonic() < deadline:
            if self._thread is None:
                self.send_due()
            c = self.counts()
            if not c.pending:
                break
            self._wake.set()
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.counts()

    def close(self, drain_s: float = 0.0) -> SendCounts:
        """Send what is pending for up to ``drain_s``, stop the thread, and return the counts."""
        counts = self.drain(drain_s) if drain_s > 0 else self.counts()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, float(self.cfg.pacs.timeout_s) + 5.0))
            self._thread = None
        self._drop_archive()
        counts = self.counts()
        self.ledger.close()
        return counts
