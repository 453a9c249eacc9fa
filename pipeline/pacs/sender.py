"""Results back to a PACS: the DICOM outputs (SR, SEG) of completed cases, sent in a background thread.

:class:`ResultSender` watches ``RUN_DIR/cases/``: a case folder is complete once the run store records its case
done and confirmed (the runner's last check of the source series, after the commit, passed; see
:func:`~pipeline.pacs.send_ledger.committed_cases`) and its ``manifest.json`` is there: a folder in place before its
case is committed, or withdrawn at the commit because a file of its series landed then, is never sent. Every ``*.dcm`` file
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
Sending runs beside the pipeline and never blocks it. What is recorded of each result lives in
:mod:`pipeline.pacs.send_ledger`, the confirming queries in :mod:`pipeline.pacs.send_confirm`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydicom.errors import InvalidDicomError

from ..config import from_dict
from ..errors import CtpipeError, PacsError, PacsRequestError, PacsUnavailableError
from .address import Endpoint, parse_destination
from .archive import Archive
from .confirm import Confirmer
from .connect import open_archive
from .ledger import Ledger, now
from .recheck import UnconfirmedRecheck
from .send_confirm import ConfirmingSender
from .send_ledger import MANIFEST, RESULT_SOP_CLASSES, SendCounts, result_files

log = logging.getLogger(__name__)


class ResultSender(ConfirmingSender):
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

    def _connected(self) -> Archive:
        """The open archive (opened if none is, with no retries inside each request: this sender's own apply)."""
        if self._archive is None:
            self._archive = open_archive(self.endpoint, self._request_cfg)
        return self._archive

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

    def _send_case(self, case_id: str, items: list[dict[str, Any]]) -> int:
        paths = [self.run_dir / r["path"] for r in items]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            self._failed(items, f"file missing: {missing[0]}", final=True)
            return 0
        if self._cannot_confirm and not self.refused_recently():
            self._cannot_confirm = None
        try:
            archive = self._connected()
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


__all__ = ["MANIFEST", "RESULT_SOP_CLASSES", "ResultSender", "SendCounts", "result_files"]
