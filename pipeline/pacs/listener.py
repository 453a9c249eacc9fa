"""``ctpipe listen``: a C-STORE SCP that feeds received CT series into the crash-safe runner, continuously.

The listener is ``pacs.ae_title`` at ``pacs.bind``:``pacs.port`` (127.0.0.1 by default). It accepts
associations only from the calling AE titles in ``pacs.allowed_aets`` (others are rejected:
"calling AE title not recognised") and, with ``pacs.check_called_aet`` (the default), only those
addressed to ``pacs.ae_title`` ("called AE title not recognised"; each rejection is logged with both
AE titles). It takes CT Image Storage and Enhanced CT Image Storage, and answers any other SOP class with status 0x0122. Each instance is written to disk, synced and
recorded in the journal (:mod:`pipeline.pacs.journal`) before success is answered; a duplicate
SOPInstanceUID is answered with success and not stored again. An instance whose dataset names another SOP
Instance UID or SOP Class UID than the C-STORE request's Affected ones is answered 0xA900 (as dcmtk's ``storescp``)
and not stored; the warning names the sender and both UIDs.

A series is complete when no instance has arrived for ``pacs.quiet_period_s`` and its slices form
a volume (no gap, at least ``ingest.min_slices``) and its sender was not cut off mid-series (an association whose
connection dropped without a release, or that the sender aborted in the middle of an instance, marks the series it
sent as cut off until an association that sends it ends with a release; a sender's own A-ABORT once every instance
it began has arrived whole, as some modalities and routers end every association, counts as a release; either end
holds the series as cut off when its instances give a count, Images in Acquisition or Number of Series Related
Instances, that fewer arrived than: a store job cancelled part-way releases its association too
(:mod:`pipeline.pacs.expected_count`, ``pacs.abort_count_check``, ``pacs.release_count_check``); a sender stopped
between two instances, whose instances give none, cannot be told from one that finished); one still
incomplete ``pacs.series_limit_s``
after its first instance is reported (log, ``RUN_DIR/pacs/incomplete/``) and handed over as it is
(the runner quarantines it with the reason, a :class:`~pipeline.errors.PartialSeriesError` for a cut-off one with
no gap: nothing incomplete is published); its files are kept for ``pacs.incomplete_keep_s``, so that the
missing instances, sent later, complete it as a new generation (the same case). A hospital thus gets every series
processed: a complete one after the quiet period, an incomplete one after ``pacs.series_limit_s``, reported.
How the end of each association is taken (a release, a sender's A-ABORT, a dropped connection) is in
:mod:`pipeline.pacs.listener_ends`.

Complete series are handed (:mod:`pipeline.pacs.handover`) to the crash-safe runner on the same run folder, in batches of what is
complete at the time (two generations of one series never in the same batch), through one :class:`~pipeline.runner.session.RunSession`: the executor the
first batch starts (with ``runner.workers: 0``, the listener's default, this process; otherwise the
worker processes) and the detector it loads are kept for every later batch, so the model is loaded
once for the listener's lifetime. The run store records where each case came from (the calling AE
title, the Study and Series Instance UIDs; :meth:`~pipeline.runner.store.RunStore.record_origins`).
Once a case is published or quarantined, its received files are removed unless
``pacs.keep_received`` keeps them (see :mod:`pipeline.pacs.journal`). After a crash or ``kill -9``,
a restart processes every instance answered success before it, none twice (the journal, then the run
store, which skips done cases), and removes what a crash left half-written, including the files of instances
never answered (their senders send them again).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import PacsAddressError
from .abort_record import hold_aborted, hold_handed
from .address import check_aet, listen_error, valid_uid
from .expected_count import recheck_held
from .handover import Handover, SeriesOutcome
from .journal import Admission, ReceiveJournal
from .ledger import Ledger, PacsLock
from .listener_ends import AssociationEnds
from .listener_uids import read_uids
from .scp import (
    STATUS_DATASET_MISMATCH,
    STATUS_OK,
    STATUS_OUT_OF_RESOURCES,
    accepted_storage_contexts,
    build_ae,
    check_instance,
    dataset_mismatch,
    part10_header,
)
from .spool import store_received

log = logging.getLogger(__name__)


def _say_restart(counts: dict[str, int]) -> None:
    """The listener's one WARNING line of what its start found and did (``counts``: :meth:`ReceiveJournal.recover`'s,
    ``released``: processed series' files removed, ``lifted``: held series :func:`recheck_held` released, ``held``: open
    series :func:`hold_aborted` held, ``unhanded`` and ``superseded``: series handed to the runner and not finished by
    it that :func:`hold_handed` held, or handed over incomplete); none when it did nothing."""
    if not any(counts.values()):
        return
    log.warning(
        "listener restart: %d instance file(s) never acknowledged removed (their senders send them again), "
        "%d open series resumed, %d empty dropped, "
        "%d series to process again, %d leftover folder(s) or temporary file(s) removed, "
        "%d processed series' files removed, %d series held short of a count released by the current "
        "pacs.abort_count_check or pacs.release_count_check (processed once quiet), %d open series ended by a sender's "
        "A-ABORT or release (or whose end the ledger does not record) held short of a count it checks, %d series "
        "handed to the runner and not finished by it held so instead, %d such series handed over incomplete instead "
        "(a newer generation holds their instances)",
        counts["unacknowledged"],
        counts["reopened"],
        counts["dropped"],
        counts["handed"],
        counts["orphans"],
        counts["released"],
        counts["lifted"],
        counts["held"],
        counts["unhanded"],
        counts["superseded"],
        extra={"event": "listen_recover"},
    )


#: The largest PDU the listener takes (bytes), told to each sender at association: one PDU holds a whole CT slice
#: (512 × 512 × 2 bytes) instead of pynetdicom's default 16 382 bytes taking 32; with 256 × 256 slices
#: the listener took 12 to 27 % more instances per second from dcmtk's ``storescu`` than with the default.
MAX_PDU_BYTES = 1_048_576


class Listener(AssociationEnds, Handover):
    """The listener of a run folder (see the module docstring).

    ``cfg``: the :class:`~pipeline.config.Config`; ``stages``: custom runner stages (default: the
    standard pipeline); ``run_options``: extra options of every batch (short or dotted names, as for
    :func:`~pipeline.runner.run_batch`), applied once to the listener's :class:`~pipeline.runner.session.RunSession`;
    ``on_series``: called with the :class:`SeriesOutcome` of every series handed to the runner, once the runner is
    done with it (``ctpipe listen`` prints it; each is also logged at INFO).
    """

    def __init__(
        self,
        run_dir: str | Path,
        cfg: Any,
        *,
        stages: Sequence[Any] | None = None,
        run_options: dict[str, Any] | None = None,
        poll_s: float = 0.5,
        on_series: Callable[[SeriesOutcome], None] | None = None,
    ):
        check_aet(cfg.pacs.ae_title, "pacs.ae_title (--ae-title)")
        allowed = [check_aet(a, "pacs.allowed_aets") for a in cfg.pacs.allowed_aets]
        if not allowed:
            raise PacsAddressError(
                "no calling AE title is allowed to send to the listener (pacs.allowed_aets is empty)",
                where="pacs.allowed_aets",
                fix="name the senders: --allow AET (repeatable) or pacs.allowed_aets: [MODALITY1, PACS]",
            )
        self.allowed = allowed
        self.run_dir = Path(run_dir).resolve()
        self.cfg = cfg
        self.stages = list(stages) if stages is not None else None
        self.run_options = dict(run_options or {})
        self.poll_s = poll_s
        self.on_series = on_series
        self.batches = 0
        self._lock: PacsLock | None = None
        self._ledger: Ledger | None = None
        self.journal: ReceiveJournal | None = None
        self._ae: Any = None
        self._server: Any = None
        self._sender: Any = None
        self._pool: ThreadPoolExecutor | None = None  # syncs folder entries and writes journal rows beside file syncs
        self.session: Any = None  # the RunSession feeding the runner (from start)
        self._stop = threading.Event()
        self._reported: set[tuple[str, int]] = set()
        self._dup_lock = threading.Lock()
        self._duplicates: dict[tuple[int, str, str], int] = {}  # (association, series, calling AET): instances sent again
        self._stored: dict[int, dict[str, int]] = {}  # association: series: instances stored (0: only sent again)
        self._closing = False  # close() is ending the associations still open
        self._receiving: dict[int, bool] = {}  # association: a message's PDUs arrived and the message is not whole yet
        self._sender_ended: dict[int, bool] = {}  # association: the sender's A-ABORT came with every message whole
        self._checked: dict[tuple[str, int], tuple[float, str | None]] = {}  # last_at when checked, why incomplete
        self._quiet_held: set[tuple[str, int]] = set()  # series held short after a release, warned of once quiet
        self._swept = 0.0  # when processed series' files were last released

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> Listener:
        """Take the run folder's PACS lock, recover the journal, start the SCP (and the result sender)."""
        from pynetdicom import evt

        from ..runner.result_options import check_run_folder
        from ..runner.session import RunSession

        self._lock = PacsLock(self.run_dir, holder="ctpipe listen")
        self._ledger = Ledger(self.run_dir)
        self.journal = ReceiveJournal(self._ledger, self.run_dir / "pacs" / "incoming")
        counts = self.journal.recover()
        counts["released"] = self._release_processed()
        counts["lifted"] = counts["held"] = counts["unhanded"] = counts["superseded"] = 0
        try:
            self.session = RunSession(
                self.run_dir, config=self.cfg, stages=self.stages, command="ctpipe listen", **self.run_options
            )
            # a folder whose results were made with other options or model files: refused now, not at every batch
            check_run_folder(self.run_dir, self.session.config)
            # series held short of a count under the setting of an earlier start: the current one decides
            counts["lifted"] = recheck_held(self.journal, self._ledger, cfg=self.cfg)
            # open series whose sender's A-ABORT an earlier, looser setting accepted: the current one may hold them
            counts["held"] = hold_aborted(self.journal, self._ledger, cfg=self.cfg)
            # series handed to the runner that it had not finished: judged as open ones, by the setting now in force
            counts["unhanded"], counts["superseded"] = hold_handed(
                self.journal, self._ledger, cfg=self.cfg, finished=self._finished_by_runner
            )
            counts["handed"] -= counts["unhanded"]
        finally:  # what the restart did, also when the folder is refused
            _say_restart(counts)
        ae = build_ae(self.cfg)
        ae.add_supported_context("1.2.840.10008.1.1")  # Verification (C-ECHO)
        for abstract, syntaxes in accepted_storage_contexts():
            ae.add_supported_context(abstract, syntaxes)
        ae.require_calling_aet = self.allowed
        ae.require_called_aet = bool(self.cfg.pacs.check_called_aet)
        ae.maximum_associations = 16
        ae.maximum_pdu_size = MAX_PDU_BYTES
        self._pool = ThreadPoolExecutor(max_workers=2 * ae.maximum_associations, thread_name_prefix="ctpipe-listen-sync")
        address = (self.cfg.pacs.bind, int(self.cfg.pacs.port))
        try:
            self._server = ae.start_server(
                address,
                block=False,
                ae_title=self.cfg.pacs.ae_title,
                evt_handlers=[
                    (evt.EVT_C_STORE, self._on_store),
                    (evt.EVT_REJECTED, self._on_rejected),
                    (evt.EVT_CONN_CLOSE, self._on_conn_close),
                    (evt.EVT_PDU_RECV, self._on_pdu),
                    (evt.EVT_DIMSE_RECV, self._on_message),
                ],
            )
        except OSError as exc:
            self.close()
            raise listen_error(
                exc,
                address[0],
                address[1],
                port_key="pacs.port",
                port_fix="choose a free port (--port) or stop the other listener",
            ) from exc
        self._ae = ae
        if self.cfg.pacs.send_to:
            from .sender import ResultSender

            self._sender = ResultSender(self.run_dir, self.cfg).start()
        log.info(
            "listening as %s on %s:%d for %s",
            self.cfg.pacs.ae_title,
            *address,
            ", ".join(self.allowed),
            extra={"event": "listen_start"},
        )
        return self

    @property
    def port(self) -> int:
        """The TCP port the SCP listens on (useful with ``pacs.port`` taken from a free-port search)."""
        return int(self._server.server_address[1]) if self._server is not None else int(self.cfg.pacs.port)

    def stop(self) -> None:
        """Ask :meth:`serve_forever` to return after the current step."""
        self._stop.set()

    def close(self) -> None:
        """Stop receiving, stop the sender (pending results stay in the ledger), release the lock."""
        self._closing = True
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        if self._ae is not None:
            self._ae.shutdown()
            self._ae = None
        self._report_duplicates(None)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self.session is not None:
            self.session.close()
            self.session = None
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receiving (pynetdicom's association threads) --------------------------------------
    def _on_rejected(self, event: Any) -> None:
        """Log why an association was rejected: the operator of the sending node needs the AE titles."""
        calling = str(event.assoc.requestor.ae_title).strip()
        called = str(getattr(event.assoc.requestor.primitive, "called_ae_title", "") or "").strip()
        if calling not in self.allowed:
            why = f"calling AE title {calling!r} is not among pacs.allowed_aets ({', '.join(self.allowed)})"
            fix = f"add {calling!r} to pacs.allowed_aets (--allow) if that node may send"
        elif self.cfg.pacs.check_called_aet and called != self.cfg.pacs.ae_title:
            why = f"called AE title {called!r} is not this listener's {self.cfg.pacs.ae_title!r}"
            fix = f"configure {calling} to send to AE title {self.cfg.pacs.ae_title!r}, or set pacs.check_called_aet: false"
        elif self._full(event.assoc):
            limit = int(event.assoc.ae.maximum_associations)
            why = f"{limit} associations were open already, the most this listener takes at once (a transient rejection)"
            fix = (
                f"the sender may send again once the others end; have the senders open at most {limit} associations "
                "at once (a router's or modality's parallel sends)"
            )
        else:
            why, fix = "the association request was not acceptable", "see the sender's log"
        log.warning(
            "rejected an association from %s at %s: %s; fix: %s",
            calling,
            getattr(event.assoc.requestor, "address", "?"),
            why,
            fix,
            extra={"event": "listen_rejected"},
        )

    @staticmethod
    def _full(assoc: Any) -> bool:
        """Whether ``assoc`` was rejected as one association too many: the listener's other associations (the one
        rejected still counts among its active ones) were ``maximum_associations`` already."""
        ae = assoc.ae
        active = [a for a in ae.active_associations if a.is_acceptor and a is not assoc]
        return len(active) >= int(ae.maximum_associations)

    def _on_store(self, event: Any) -> Any:
        status, sop_class, sop_uid = check_instance(event)
        calling = str(event.assoc.requestor.ae_title).strip()
        if status != STATUS_OK:
            log.warning(
                "refused instance %s of SOP class %s from %s (status 0x%04X)",
                sop_uid[:64],
                sop_class,
                calling,
                status,
                extra={"event": "listen_refused"},
            )
            return status
        transfer_syntax = str(event.context.transfer_syntax)
        raw = event.encoded_dataset(include_meta=False)  # the dataset as received, not decoded
        uids = read_uids(raw, transfer_syntax)
        if uids is not None and uids["series_uid"] is not None:
            series_uid, study_uid = uids["series_uid"], uids["study_uid"]
            found_class, found_uid = uids["sop_class"], uids["sop_uid"]
        else:  # what the scan of the encoded dataset cannot be sure of: decoded in full
            try:
                ds = event.dataset
                series_uid = str(ds.SeriesInstanceUID)
                study_uid = str(ds.get("StudyInstanceUID", "")) or None
                found_class, found_uid = str(ds.get("SOPClassUID", "")), str(ds.get("SOPInstanceUID", ""))
            except (AttributeError, KeyError, ValueError, TypeError) as exc:
                log.warning("refused instance %s from %s: unreadable dataset (%s)", sop_uid, calling, exc)
                return STATUS_DATASET_MISMATCH
        wrong = dataset_mismatch(sop_class=sop_class, sop_uid=sop_uid, dataset_class=found_class, dataset_uid=found_uid)
        if wrong is not None:
            log.warning(
                "refused an instance from %s at %s (status 0x%04X, nothing stored): %s; fix: the sender must send the "
                "file's own UIDs (a file edited or anonymised without its File Meta Information, or a sender that "
                "reuses a request): correct it there and send it again",
                calling,
                getattr(event.assoc.requestor, "address", "?"),
                STATUS_DATASET_MISMATCH,
                wrong.problem(),
                extra={"event": "listen_mismatch", "series_uid": series_uid},
            )
            return wrong.response()
        if not valid_uid(series_uid):
            log.warning("refused instance %s from %s: SeriesInstanceUID %r is not valid", sop_uid, calling, series_uid[:80])
            return STATUS_DATASET_MISMATCH
        assert self.journal is not None
        adm = self.journal.admit(sop_uid, series_uid, study_uid=study_uid if study_uid and valid_uid(study_uid) else None)
        if adm.duplicate:
            log.debug(
                "instance %s of series %s from %s was received before; not stored again",
                sop_uid,
                series_uid,
                calling,
                extra={"event": "listen_duplicate_instance"},
            )
            with self._dup_lock:
                key = (id(event.assoc), series_uid, calling)
                self._duplicates[key] = self._duplicates.get(key, 0) + 1
                self._stored.setdefault(id(event.assoc), {}).setdefault(series_uid, 0)
            return STATUS_OK
        assert adm.folder is not None
        try:
            data = part10_header(sop_class=sop_class, sop_instance=sop_uid, transfer_syntax=transfer_syntax) + raw
            self._store(adm, data, sop_class=sop_class, calling=calling)
        except OSError as exc:
            log.error("cannot store instance %s (%s); the sender is told to try again", sop_uid, exc)
            return STATUS_OUT_OF_RESOURCES
        with self._dup_lock:
            stored = self._stored.setdefault(id(event.assoc), {})
            stored[series_uid] = stored.get(series_uid, 0) + 1
        return STATUS_OK

    def _store(self, adm: Admission, data: bytes, *, sop_class: str, calling: str) -> None:
        """Make an admitted instance (``data``: its Part 10 bytes) durable, file and journal row, or raise with neither
        kept. The row is written (in a thread of the sync pool) while the file and its folder entry are synced, so
        that the three syncs share the file system's commits; an instance the journal listed before is synced first
        and recorded after (see :mod:`pipeline.pacs.journal`)."""
        assert self.journal is not None and adm.folder is not None and self._pool is not None
        journal, row = self.journal, {"sop_uid": adm.sop_uid, "sop_class": sop_class, "calling_aet": calling}
        if adm.listed:
            try:
                path = store_received(adm.folder, adm.sop_uid, data, sync_first=True, pool=self._pool)
            except BaseException:
                journal.abandon(adm)
                raise
            try:
                journal.commit(adm, **row, size=len(data), crc32=zlib.crc32(data))
            except BaseException:
                path.unlink(missing_ok=True)
                journal.abandon(adm)
                raise
            return
        try:
            recorded = self._pool.submit(journal.record, adm, **row, size=len(data), crc32=zlib.crc32(data))
        except BaseException:  # the listener is closing
            journal.abandon(adm)
            raise
        try:
            store_received(adm.folder, adm.sop_uid, data, pool=self._pool)
        except BaseException:
            if recorded.exception() is None:
                journal.withdraw(adm)
            else:
                journal.abandon(adm)
            raise
        try:
            recorded.result()
        except BaseException:
            (adm.folder / f"{adm.sop_uid}.dcm").unlink(missing_ok=True)
            journal.abandon(adm)
            raise
        journal.finish(adm)
