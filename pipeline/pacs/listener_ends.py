"""How ``ctpipe listen`` takes the end of each association: the half of receiving that follows a sender's associations
(:class:`~pipeline.pacs.listener.Listener` stores the instances; see :mod:`pipeline.pacs.listener` for the whole).

Per association it notes whether an instance is being received when the sender's own A-ABORT comes (in the middle of
an instance, or between two), and when the association ends it summarises the instances sent again, and marks the
series it stored instances of as cut off (:data:`~pipeline.pacs.journal.CUT_NOTE`) when it ended without a release
and without the sender's A-ABORT between instances, or with that A-ABORT or a release while the series' instances give
a count that fewer arrived than (:mod:`pipeline.pacs.expected_count`; ``pacs.abort_count_check``,
``pacs.release_count_check``): a store job cancelled part-way releases its association as one that finished does.
Such an A-ABORT or release is recorded per series, for a restart with a stricter setting to judge the series again
(:mod:`pipeline.pacs.abort_record`). An end that leaves no checked count short clears the mark, and makes a series
quarantined only as cut off run again when sent again whole. Records are logged as ``pipeline.pacs.listener``'s, as the
listener's own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..config_schema import ABORT_COUNTS
from . import abort_record
from .expected_count import CountCheck, checked, hold_short, latest_count_check, lift_held, setting
from .journal import ALSO_NOTE, CUT_NOTE, INCOMPLETE_NOTE, RESENT_NOTE, ReceiveJournal
from .ledger import Ledger

log = logging.getLogger("pipeline.pacs.listener")


class AssociationEnds:
    """What :class:`~pipeline.pacs.listener.Listener` does as a sender's associations end (see the module docstring).
    The attributes are the listener's; pynetdicom's association threads call the ``_on_*`` handlers."""

    cfg: Any
    journal: ReceiveJournal | None
    _ledger: Ledger | None
    _closing: bool
    _dup_lock: threading.Lock
    _duplicates: dict[tuple[int, str, str], int]
    _stored: dict[int, dict[str, int]]
    _receiving: dict[int, bool]
    _sender_ended: dict[int, bool]

    def _on_pdu(self, event: Any) -> None:
        """Note, per association, whether a message (an instance) is being received, and whether the sender's own
        A-ABORT came between messages (every instance it began sent whole) or in the middle of one."""
        from pynetdicom.pdu import A_ABORT_RQ, P_DATA_TF

        key = id(event.assoc)
        if isinstance(event.pdu, P_DATA_TF):
            self._receiving[key] = True
        elif isinstance(event.pdu, A_ABORT_RQ) and event.pdu.source == 0:  # 0: the sending application, not its network
            self._sender_ended[key] = not self._receiving.get(key, False)

    def _on_message(self, event: Any) -> None:
        """A whole DIMSE message (a C-STORE request with its dataset) arrived on the association."""
        self._receiving[id(event.assoc)] = False

    def _on_conn_close(self, event: Any) -> None:
        """An association ended (released, aborted or cut): summarise the duplicates it sent; mark the series it
        stored instances of as cut off when it ended without a release and without the sender's own A-ABORT between
        instances (see :meth:`_mark_cut`)."""
        key = id(event.assoc)
        self._report_duplicates(key)
        self._receiving.pop(key, None)
        ended_by_abort = self._sender_ended.pop(key, False) and not self._closing
        with self._dup_lock:
            stored = self._stored.pop(key, {})
        if stored and self.journal is not None:
            self._mark_cut(event.assoc, stored, ended_by_abort=ended_by_abort)

    def _mark_cut(self, assoc: Any, stored: dict[str, int], *, ended_by_abort: bool = False) -> None:
        """Note (:data:`CUT_NOTE`) the open series an association stored instances of (``stored``: series → count)
        when it was cut off: it ended without a release and without an A-ABORT of the sender's own between instances
        (the connection dropped: the sender crashed or lost the network; or it aborted in the middle of an instance).
        What arrived may have no gap and still not be the whole series, so :meth:`step` does not hand it on as
        complete once quiet; it waits for the sender to send it again (an association that sends the series and ends
        with a release, or with the sender's A-ABORT after its last instance, clears the note) or for
        ``pacs.series_limit_s``.

        ``ended_by_abort``: the sender ended the association with an A-ABORT once every instance it had begun had
        arrived whole (some modalities and routers end every association so). That is taken as the end of its
        sending, as a release is, unless the series' instances give a count that fewer arrived than
        (:func:`~pipeline.pacs.expected_count.count_check`, the counts of ``pacs.abort_count_check``: held as cut
        off, one warning); otherwise one INFO line
        says so, and the series is judged as any other, complete once quiet for ``pacs.quiet_period_s`` with its slices
        forming a volume (no gap in InstanceNumber or slice positions, at least ``ingest.min_slices``).

        A release is judged the same way by the counts of ``pacs.release_count_check``: a sender stopped part-way
        (a store job cancelled or paused) releases its association too. A series short of one is held as cut off
        (one INFO line; its warning once it is quiet, as a sender of one instance per association releases each
        short but the last), and the association that brings the rest, reaching the count, ends the hold."""
        assert self.journal is not None and self._ledger is not None
        calling = str(assoc.requestor.ae_title).strip()
        address = getattr(assoc.requestor, "address", "?")
        released = bool(getattr(assoc, "is_released", False)) or ended_by_abort
        end = "abort" if ended_by_abort else "release"
        counts = checked(self.cfg, end)
        judged = ended_by_abort or (released and bool(counts))  # a release with no count checked: taken as the end
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for series_uid, n in stored.items():
            rows = self._ledger.rows("SELECT * FROM series WHERE series_uid = ? AND state = 'open'", (series_uid,))
            check = latest_count_check(self._ledger, series_uid, counts=counts) if judged else None
            short = check.short if check is not None else None
            ended = released and short is None
            if ended_by_abort and short is None and rows:
                _say_ended_by_abort(f"{calling} at {address}", series_uid, n=n, check=check, counts=counts)
            if ended and not rows:
                self._confirm_whole(series_uid, calling)
            if ended and n:  # series of its study held short of a count that its instances make up
                lift_held(self.journal, self._ledger, series_uid, cfg=self.cfg)
            for row in rows:
                if released:  # judged again at a restart under the setting then (a stricter one may hold it)
                    record = abort_record.AbortRecord.taken(row, sender=f"{calling} at {address}", at=at, n=n, end=end)
                    abort_record.write(self._ledger, row, record)
                if ended:
                    if str(row["note"] or "").startswith(CUT_NOTE):
                        self.journal.note(row, None)
                    continue
                if check is not None and short is not None:  # a sender stopped part-way, its A-ABORT or release as if done
                    sender = f"{calling} at {address}"
                    hold_short(self.journal, row, sender=sender, n=n, check=check, at=at, cfg=self.cfg, end=end)
                    continue
                if not n:  # instances it had sent before: nothing of the series rests on this association
                    continue
                self.journal.note(
                    row,
                    f"{CUT_NOTE} {calling} at {address} ended its association without a release at {at} after {n} instance(s)",
                )
                log.warning(
                    "the association from %s at %s ended without a release after %d instance(s) of series %s were "
                    "stored: %s; what arrived is kept, and the series "
                    "waits for the sender to send it again (the instances already received are not stored twice) up "
                    "to pacs.series_limit_s = %g s after its first instance, then is quarantined (not published); "
                    "fix: check the sender's queue or log and send the series again",
                    calling,
                    address,
                    n,
                    series_uid,
                    "this listener stopping ended it" if self._closing else "the sender stopped or lost the network mid-series",
                    self.cfg.pacs.series_limit_s,
                    extra={"event": "listen_cut", "series_uid": series_uid},
                )

    def _confirm_whole(self, series_uid: str, calling: str) -> None:
        """A released association sent instances of ``series_uid`` (all received before): when the series' latest
        generation was quarantined only as cut off (no gap, not known whole) and its files are kept, the series is now
        known whole; it is opened again (:meth:`ReceiveJournal.reopen`), and the runner runs its quarantined case
        again once it is quiet."""
        assert self.journal is not None and self._ledger is not None
        row = self._ledger.one("SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (series_uid,))
        note = str(row["note"] or "") if row is not None else ""
        if row is None or row["state"] != "processed" or row["outcome"] != "failed" or not note.startswith(INCOMPLETE_NOTE):
            return
        if f": {CUT_NOTE}" not in note or ALSO_NOTE in note:  # missing slices: sending them completes it, not the same again
            return
        reopened = self.journal.reopen(dict(row), f"{RESENT_NOTE} {calling} sent it again and ended its association")
        if reopened is not None:
            log.warning(
                "series %s, quarantined as its sender was cut off mid-series, was sent again whole by %s (its "
                "association ended by the sender): processed again as generation %d",
                series_uid,
                calling,
                reopened["generation"],
                extra={"event": "listen_resent_whole", "series_uid": series_uid},
            )

    def _report_duplicates(self, assoc: int | None) -> None:
        """One INFO line per series for the instances association ``assoc`` (None: every one) sent again."""
        with self._dup_lock:
            keys = [k for k in self._duplicates if assoc is None or k[0] == assoc]
            counts = [(k, self._duplicates.pop(k)) for k in keys]
        for (_, series_uid, calling), n in counts:
            log.info(
                "%d instance(s) of series %s from %s were received before; not stored again",
                n,
                series_uid,
                calling,
                extra={"event": "listen_duplicate", "series_uid": series_uid},
            )


def _say_ended_by_abort(
    sender: str, series_uid: str, *, n: int, check: CountCheck | None, counts: list[str] | tuple[str, ...]
) -> None:
    """The one line of an association from ``sender`` (calling AE title and address) that its sender ended with an
    A-ABORT after its last instance, ``n`` instance(s) of ``series_uid`` stored on it, the series not short of a
    count its instances give among ``counts`` (``pacs.abort_count_check``; ``check``; None: its files are gone): it
    is processed as after a release."""
    then = "processed once quiet for pacs.quiet_period_s if its slices form a volume"
    if check is not None and check.counted is not None:
        log.info(
            "the association from %s ended by the sender's A-ABORT after all %d instance(s) of series %s had arrived "
            "(%s in its instances; %d on this association): %s",
            sender,
            check.received,
            series_uid,
            check.counted,
            n,
            then,
            extra={"event": "listen_aborted", "series_uid": series_uid},
        )
        return
    if not counts:
        unchecked = "no count checked: pacs.abort_count_check: none"
    elif set(counts) != set(ABORT_COUNTS):
        unchecked = f"its instances give no count of pacs.abort_count_check: {setting(counts)} to check them against"
    else:
        unchecked = "its instances give no count to check them against"
    log.info(
        "the association from %s ended by the sender's A-ABORT after its last instance was answered (%d instance(s) "
        "of series %s on it; %s): %s, as after a release",
        sender,
        n,
        series_uid,
        unchecked,
        then,
        extra={"event": "listen_aborted", "series_uid": series_uid},
    )
