"""DIMSE archives (``pynetdicom``): C-FIND, then C-MOVE to ctpipe's own storage SCP or C-GET; C-STORE of results.

ctpipe calls the archive as ``pacs.ae_title``; the archive must know that AE title (for C-MOVE, at
``pacs.bind``:``pacs.move_port``, where :class:`MoveReceiver` listens while a retrieval runs and
accepts instances from the archive's AE title only). Every association uses ``pacs.timeout_s`` for
connecting, negotiating and each DIMSE message. An association that cannot be set up or is aborted
raises :class:`~pipeline.errors.PacsUnavailableError` (retried), and so does one the archive rejects for now
(transient: congestion); a rejected association or a failure status raises
:class:`~pipeline.errors.PacsRequestError`, the rejection with the archive's reason and the AE title to correct (a
called AE title not recognised: the address's; a calling one: ``pacs.ae_title``, to be listed at the archive), and so
does an association the archive closes at the first request, unanswered (how archives such as Orthanc refuse a
calling AE title they do not list).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PacsRequestError, PacsUnavailableError
from .address import Endpoint, Query, valid_uid
from .archive import CT_SOP_CLASSES, RemoteSeries, StoreOutcome, unverifiable
from .move_receiver import MoveReceiver
from .netlog import answered_http
from .retry import with_retries
from .scp import STATUS_OK, STATUS_UNEXPECTED, build_ae, ct_storage_contexts, store_event

log = logging.getLogger(__name__)

T = TypeVar("T")

# Study Root Query/Retrieve Information Model: FIND, MOVE, GET
FIND = "1.2.840.10008.5.1.4.1.2.2.1"
MOVE = "1.2.840.10008.5.1.4.1.2.2.2"
GET = "1.2.840.10008.5.1.4.1.2.2.3"
_PENDING = (0xFF00, 0xFF01)
_STORE_OK = (0x0000, 0xB000, 0xB006, 0xB007)


class DimseArchive:
    """A DIMSE archive at ``endpoint`` (AE title, host, port); ``mode`` "move" or "get" for retrievals."""

    def __init__(self, endpoint: Endpoint, cfg: Any, *, mode: str = "move"):
        self.endpoint = endpoint
        self.cfg = cfg
        self.mode = mode
        self._receiver: MoveReceiver | None = None
        #: series UID → the sub-operations the archive's last C-MOVE or C-GET response said it completed
        self.completed: dict[str, int] = {}

    # -- plumbing --------------------------------------------------------------------------
    def _where(self) -> str:
        return self.endpoint.redacted()

    @contextmanager
    def _association(
        self,
        contexts: list[tuple[str, list[str]]],
        *,
        ext_neg: list[Any] | None = None,
        handlers: list[Any] | None = None,
        storing: bool = False,
    ) -> Iterator[Any]:
        from pynetdicom import evt

        ae = build_ae(self.cfg)
        for abstract, syntaxes in contexts:
            ae.add_requested_context(abstract, syntaxes)
        answers: list[Any] = []  # the archive's A-ASSOCIATE response: why it rejected the association, if it did
        watch = (evt.EVT_ACSE_RECV, lambda event: answers.append(event.primitive))
        t0 = time.monotonic()
        try:
            assoc = ae.associate(
                self.endpoint.host,
                self.endpoint.port,
                ae_title=self.endpoint.aet,
                ext_neg=ext_neg,
                evt_handlers=[*(handlers or []), watch],
            )
        except socket.gaierror as exc:  # a host name nobody knows: said as such, not as a file that cannot be read
            raise PacsUnavailableError(
                f"cannot open an association: the host name {self.endpoint.host!r} is not known ({exc.strerror})",
                where=self._where(),
                fix="check the host in the address: a name this machine resolves, or the archive's IP address",
            ) from exc
        if not assoc.is_established:
            if assoc.is_rejected:
                rejection = next((a for a in reversed(answers) if getattr(a, "result", None) in (1, 2)), None)
                raise self._rejected(rejection, storing=storing)
            if assoc.rejected_contexts:  # the peer answered, but accepted none of the SOP classes offered
                names = sorted({_sop_name(cx.abstract_syntax) for cx in assoc.rejected_contexts})
                raise PacsRequestError(
                    f"{self.endpoint.aet} accepts none of the SOP classes offered ({', '.join(names)})",
                    where=self._where(),
                    fix=f"configure the archive to accept {', '.join(names)} from {self.cfg.pacs.ae_title!r}, or send elsewhere",
                )
            if answered_http(assoc):  # the address names the archive's web port
                raise PacsUnavailableError(
                    f"cannot open an association: port {self.endpoint.port} answers HTTP, not DICOM",
                    where=self._where(),
                    fix="give the archive's DICOM port (Orthanc: 4242; often 104 or 11112), not its web port",
                )
            waited = time.monotonic() - t0
            timeout = float(self.cfg.pacs.timeout_s)
            how = (
                f"no answer within pacs.timeout_s = {timeout:g} s"
                if waited >= 0.9 * timeout
                else f"the connection was refused or dropped after {waited:.1f} s"
            )
            raise PacsUnavailableError(
                f"cannot open an association: {how}",
                where=self._where(),
                fix="check that the archive is running and reachable"
                + (
                    " (or raise pacs.timeout_s)"
                    if waited >= 0.9 * timeout
                    else f", and that {self.endpoint.port} is its DICOM port (DIMSE; often 104 or 11112), not its HTTP one"
                ),
            )
        try:
            yield assoc
        finally:
            if assoc.is_established:
                assoc.release()
            ae.shutdown()

    def _rejected(self, answer: Any, *, storing: bool) -> PacsRequestError | PacsUnavailableError:
        """The error for an association the archive rejected, from its A-ASSOCIATE-RJ ``answer`` (result, source and
        reason; None when it was not seen): a called AE title the archive does not recognise is the address's AE title,
        a calling one is ``pacs.ae_title``, and a transient rejection (congestion) is worth another attempt."""
        me, them = self.cfg.pacs.ae_title, self.endpoint.aet
        said = f"{answer.result_str}, {answer.reason_str}" if answer is not None else "no reason seen"
        problem = f"association rejected by the archive ({said}; called AE title {them}, calling AE title {me})"
        if answer is not None and int(answer.result) == 2:
            return PacsUnavailableError(problem, where=self._where(), fix="the archive is busy; try again later")
        source, reason = (int(answer.result_source), int(answer.diagnostic)) if answer is not None else (0, 0)
        if (source, reason) == (1, 7):
            return PacsRequestError(
                problem,
                where=self._where(),
                fix=f"{them!r} is not the archive's AE title: put the archive's own AE title in the address "
                f"(dimse://ARCHIVE_AET@{self.endpoint.host}:{self.endpoint.port})",
            )
        listed = "with this host" + (" and pacs.move_port" if self.mode == "move" and not storing else "")
        return PacsRequestError(
            problem,
            where=self._where(),
            fix=f"the archive must list ctpipe's AE title {me!r} (pacs.ae_title) among its modalities, {listed}",
        )

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return with_retries(
            fn, what=f"{what} at {self._where()}", retries=self.cfg.pacs.retries, backoff_s=self.cfg.pacs.backoff_s
        )

    def _responses(self, what: str, responses: Any, *, received: Callable[[], int] = lambda: 0) -> Iterator[Any]:
        """Identifiers of pending responses; raises on an aborted association or a failure status.

        ``received``: how many instances a retrieval has written so far. An association that ends once the archive
        has answered or sent anything was lost mid-transfer (the archive stopped, the network dropped): worth another
        attempt. One that ends before is how archives refuse a request."""
        last = time.monotonic()
        answered = 0
        for status, identifier in responses:
            if not status:  # no response within the DIMSE timeout, or the archive aborted the association
                if time.monotonic() - last < 0.9 * float(self.cfg.pacs.timeout_s) and (answered or received()):
                    raise PacsUnavailableError(
                        f"{what}: the connection to the archive was lost mid-transfer, after {answered} pending "
                        f"response(s) and {received()} instance(s) received (the archive stopped or the network dropped)",
                        where=self._where(),
                        fix="check that the archive is running and reachable; what was received is discarded and the "
                        "series retrieved again whole (pacs.retries, or the next run)",
                    )
                if time.monotonic() - last < 0.9 * float(self.cfg.pacs.timeout_s):
                    raise PacsRequestError(
                        f"{what}: the archive aborted the association",
                        where=self._where(),
                        fix=f"archives abort requests they refuse: check that the archive knows ctpipe's "
                        f"AE title {self.cfg.pacs.ae_title!r} (pacs.ae_title) and allows it this request",
                    )
                raise PacsUnavailableError(
                    f"{what}: no answer within {self.cfg.pacs.timeout_s:g} s",
                    where=self._where(),
                    fix="the archive is slow or stopped; raise pacs.timeout_s or try later",
                )
            last = time.monotonic()
            answered += 1
            code = int(status.Status)
            if code in _PENDING:
                yield identifier
            elif code == 0x0000:
                return
            elif code == 0xB000:  # C-MOVE / C-GET: some sub-operations failed; counted by the caller
                log.warning("%s: warning status 0xB000 from %s (some sub-operations failed)", what, self._where())
                return
            else:
                raise PacsRequestError(
                    f"{what}: failure status 0x{code:04X}",
                    where=self._where(),
                    fix="see the archive's log for why it refused the request",
                )

    # -- search ----------------------------------------------------------------------------
    def find_studies(self, query: Query) -> list[str]:
        """StudyInstanceUIDs matching the query's dates, accession numbers and modality (C-FIND, STUDY level)."""
        from pydicom.dataset import Dataset

        out: list[str] = []
        for acc in query.accessions or [None]:
            ds = Dataset()
            ds.QueryRetrieveLevel = "STUDY"
            ds.StudyInstanceUID = ""
            ds.StudyDate = query.date_range or ""
            ds.AccessionNumber = acc or ""
            ds.ModalitiesInStudy = query.modality or ""

            def find(ds: Dataset = ds) -> list[str]:
                with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                    return [
                        str(i.StudyInstanceUID)
                        for i in self._responses("C-FIND (study)", assoc.send_c_find(ds, FIND))
                        if i is not None and i.get("StudyInstanceUID")
                    ]

            out.extend(self._call("C-FIND (study)", find))
        return list(dict.fromkeys(out))

    def find_series(self, study_uid: str | None, *, series_uid: str | None = None, modality: str = "CT") -> list[RemoteSeries]:
        """Series of a study (or the one series ``series_uid``, found at SERIES level) with the given modality."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = study_uid or ""
        ds.SeriesInstanceUID = series_uid or ""
        ds.Modality = modality or ""
        ds.NumberOfSeriesRelatedInstances = ""

        def find() -> list[RemoteSeries]:
            out = []
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                for i in self._responses("C-FIND (series)", assoc.send_c_find(ds, FIND)):
                    if i is None:
                        continue
                    study, series = str(i.get("StudyInstanceUID", "") or study_uid or ""), str(i.get("SeriesInstanceUID", ""))
                    if not (valid_uid(study) and valid_uid(series)):
                        log.warning("%s listed a series without valid UIDs (%r, %r); ignored", self._where(), study, series)
                        continue
                    n = i.get("NumberOfSeriesRelatedInstances")
                    out.append(
                        RemoteSeries(
                            study, series, str(i.get("Modality", "") or modality), int(n) if n not in (None, "") else None
                        )
                    )
            return out

        return self._call("C-FIND (series)", find)

    # -- retrieve --------------------------------------------------------------------------
    def retrieve(self, series: RemoteSeries, dest: Path) -> int:
        """C-MOVE (to :class:`MoveReceiver`) or C-GET the series into ``dest``; returns the number of files there."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = series.study_uid
        ds.SeriesInstanceUID = series.series_uid

        def once() -> int:
            for p in dest.glob("*.dcm"):  # a retry starts again from an empty folder
                p.unlink()
            if self.mode == "get":
                self._get(ds, dest)
            else:
                self._move(ds, series.series_uid, dest)
            return sum(1 for _ in dest.glob("*.dcm"))

        return self._call(f"C-{self.mode.upper()} of series {series.series_uid}", once)

    def _move(self, ds: Any, series_uid: str, dest: Path) -> None:

        if self._receiver is None:
            self._receiver = MoveReceiver(self.cfg, archive_aet=self.endpoint.aet)
        receiver = self._receiver
        turned_away = len(receiver.turned_away)
        with receiver.route(series_uid, dest), self._association([(MOVE, _UNCOMPRESSED)]) as assoc:
            try:
                moved = self._counted(series_uid, assoc.send_c_move(ds, self.cfg.pacs.ae_title, MOVE))
                for _ in self._responses("C-MOVE", moved, received=lambda: _count(dest)):
                    pass
            except PacsRequestError as exc:
                if any(dest.glob("*.dcm")):
                    raise
                seen = list(dict.fromkeys(receiver.turned_away[turned_away:]))
                came = [calling for calling, _ in seen if calling != self.endpoint.aet]
                addressed = [called for calling, called in seen if calling == self.endpoint.aet]
                if addressed:  # the archive sends to another AE title than ctpipe's
                    raise PacsRequestError(
                        f"{exc.problem}; ctpipe's C-MOVE receiver turned away the archive's association, addressed to AE "
                        f"title {addressed[0]!r}, not {self.cfg.pacs.ae_title!r} (pacs.ae_title)",
                        where=exc.where,
                        fix=f"the archive's entry for ctpipe must have AE title {self.cfg.pacs.ae_title!r}, or set "
                        "pacs.check_called_aet: false",
                    ) from exc
                if came:  # the archive reached the receiver, but sends from another AE title than the address names
                    raise PacsRequestError(
                        f"{exc.problem}; ctpipe's C-MOVE receiver turned away an association from calling AE title "
                        f"{came[0]!r}: it takes instances only from {self.endpoint.aet!r}, the AE title of the address",
                        where=exc.where,
                        fix=f"if {came[0]!r} is the archive's AE title, put it in the address "
                        f"(dimse://{came[0]}@{self.endpoint.host}:{self.endpoint.port}); an archive that sends from an AE "
                        "title of its own for C-MOVE needs C-GET instead (retrieve=get)",
                    ) from exc
                raise self._nothing_arrived(exc) from exc

    def _counted(self, series_uid: str, responses: Any) -> Iterator[Any]:
        """``responses`` of a C-MOVE or C-GET, noting in :attr:`completed` the Number of Completed Sub-operations the
        archive's responses give (the last one that gives it)."""
        self.completed.pop(series_uid, None)
        for status, identifier in responses:
            n = status.get("NumberOfCompletedSuboperations") if status else None
            if n not in (None, ""):
                self.completed[series_uid] = int(n)
            yield status, identifier

    def _nothing_arrived(self, exc: PacsRequestError) -> PacsRequestError:
        """The error of a C-MOVE the archive failed with no instance reaching ctpipe's receiver: most often the
        archive cannot reach it (the move destination). A receiver on a loopback address (the default ``pacs.bind``)
        cannot be reached from an archive on another machine: said first, with the setting to change."""
        me, bind, port = self.cfg.pacs.ae_title, str(self.cfg.pacs.bind), self.cfg.pacs.move_port
        listed = (
            f"the archive must list AE title {me!r} (pacs.ae_title) at this host and port {port} (pacs.move_port), and "
            f"send as {self.endpoint.aet!r} (the AE title of the address); or retrieve by C-GET (retrieve=get)"
        )
        problem = f"{exc.problem}; no instance reached ctpipe's C-MOVE receiver ({me} at {bind}:{port})"
        if _is_loopback(bind) and not _is_loopback(self.endpoint.host):
            return PacsRequestError(
                f"{problem}, which listens on {bind} (pacs.bind): an archive on another machine "
                f"({self.endpoint.host}) cannot reach it",
                where=exc.where,
                fix="set pacs.bind to 0.0.0.0 (every interface) or this machine's address on the archive's network; "
                f"then {listed}",
            )
        return PacsRequestError(problem, where=exc.where, fix=listed)

    def _get(self, ds: Any, dest: Path) -> None:
        from pynetdicom import build_role, evt

        roles = [build_role(uid, scp_role=True) for uid in CT_SOP_CLASSES]
        contexts = [(GET, _UNCOMPRESSED), *ct_storage_contexts()]
        handlers = [(evt.EVT_C_STORE, lambda event: store_event(event, lambda _ds: dest))]
        with self._association(contexts, ext_neg=roles, handlers=handlers) as assoc:
            got = self._counted(str(ds.SeriesInstanceUID), assoc.send_c_get(ds, GET))
            for _ in self._responses("C-GET", got, received=lambda: _count(dest)):
                pass

    # -- store -----------------------------------------------------------------------------
    def store(self, paths: Sequence[Path]) -> list[StoreOutcome]:
        """C-STORE the files on one association; the status of each."""
        import pydicom
        from pydicom.uid import ExplicitVRLittleEndian

        datasets = [pydicom.dcmread(p) for p in paths]
        wanted: dict[str, set[str]] = {}
        for ds in datasets:
            wanted.setdefault(str(ds.SOPClassUID), set()).update({str(ds.file_meta.TransferSyntaxUID), ExplicitVRLittleEndian})
        contexts = [(cls, sorted(ts)) for cls, ts in wanted.items()]

        def send() -> list[StoreOutcome]:
            out = []
            with self._association(contexts, storing=True) as assoc:
                accepted = {str(cx.abstract_syntax) for cx in assoc.accepted_contexts}
                answered = 0  # requests the destination answered on this association
                for n, (p, ds) in enumerate(zip(paths, datasets)):
                    cls = str(ds.SOPClassUID)
                    if cls not in accepted:
                        out.append(
                            StoreOutcome(p, str(ds.SOPInstanceUID), False, f"{_sop_name(cls)} not accepted by the destination")
                        )
                        continue
                    t0 = time.monotonic()
                    try:
                        status = assoc.send_c_store(ds) if assoc.is_established else None
                    except ValueError as exc:  # no accepted transfer syntax fits the file, or it cannot be encoded
                        out.append(StoreOutcome(p, str(ds.SOPInstanceUID), False, f"not sent: {exc}"))
                        continue
                    except RuntimeError:  # the association ended between two requests
                        status = None
                    answered_quickly = time.monotonic() - t0 < 0.9 * float(self.cfg.pacs.timeout_s)
                    if not status and answered == 0 and answered_quickly and _ended(assoc):
                        raise self._store_refused(len(paths))
                    if not status and _ended(assoc):  # aborted or released by the destination
                        why = f"the destination closed the association after {n} of {len(paths)} file(s): not sent"
                        out += [StoreOutcome(q, str(d.SOPInstanceUID), False, why) for q, d in zip(paths[n:], datasets[n:])]
                        log.warning("%s: %s", self._where(), why, extra={"event": "association_closed"})
                        break
                    if not status:
                        raise PacsUnavailableError(
                            f"C-STORE of {p.name}: no answer within {self.cfg.pacs.timeout_s:g} s",
                            where=self._where(),
                            fix="the destination is slow or stopped",
                        )
                    answered += 1
                    code = int(status.Status)
                    out.append(StoreOutcome(p, str(ds.SOPInstanceUID), code in _STORE_OK, _store_status(code)))
            return out

        return self._call(f"C-STORE of {len(paths)} instance(s)", send)

    def held(self, study_uid: str, sop_uids: Sequence[str]) -> set[str]:
        """Which of the instances ``sop_uids`` of study ``study_uid`` the archive holds: one C-FIND at IMAGE level
        whose SOPInstanceUID is the list of them (list of UID matching)."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "IMAGE"
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = ""
        ds.SOPInstanceUID = list(sop_uids) if len(sop_uids) > 1 else (sop_uids[0] if sop_uids else "")

        def find() -> set[str]:
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                return {
                    str(i.SOPInstanceUID)
                    for i in self._responses("C-FIND (image)", assoc.send_c_find(ds, FIND))
                    if i is not None and i.get("SOPInstanceUID")
                }

        try:
            return self._call("C-FIND (image) of the results sent", find)
        except PacsRequestError as exc:
            raise unverifiable(exc, "C-FIND at IMAGE level") from exc

    def held_series(self, study_uid: str, series_uids: Sequence[str]) -> dict[str, int | None]:
        """Which of the series ``series_uids`` of study ``study_uid`` the archive lists, and how many instances it
        says each has: one C-FIND at SERIES level (list of UID matching), NumberOfSeriesRelatedInstances asked for."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = list(series_uids) if len(series_uids) > 1 else (series_uids[0] if series_uids else "")
        ds.NumberOfSeriesRelatedInstances = ""

        def find() -> dict[str, int | None]:
            out: dict[str, int | None] = {}
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                for i in self._responses("C-FIND (series)", assoc.send_c_find(ds, FIND)):
                    if i is not None and i.get("SeriesInstanceUID"):
                        n = i.get("NumberOfSeriesRelatedInstances")
                        out[str(i.SeriesInstanceUID)] = int(n) if n not in (None, "") else None
            return out

        try:
            return self._call("C-FIND (series) of the results sent", find)
        except PacsRequestError as exc:
            raise unverifiable(exc, "C-FIND at SERIES level") from exc

    def _store_refused(self, n_files: int) -> PacsRequestError:
        """The error for a destination that accepted the association, then closed it at the first C-STORE request
        without answering it: what an archive does (Orthanc among them) to a calling AE title it does not allow to
        store. A refusal, not a passing failure: waiting and sending again does not mend it."""
        me = self.cfg.pacs.ae_title
        return PacsRequestError(
            f"C-STORE: the destination closed the association at the first request, before taking any of {n_files} "
            f"file(s) (called AE title {self.endpoint.aet}, calling AE title {me})",
            where=self._where(),
            fix=f"archives do this to a calling AE title they do not allow to store: the archive must list ctpipe's AE "
            f"title {me!r} (pacs.ae_title) among its modalities, with this host; its log names the reason",
        )

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, 127.0.0.0/8, ``::1``), without a
    name lookup."""
    import ipaddress

    if host.strip("[]").lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _count(folder: Path) -> int:
    """How many instances a retrieval has written into ``folder`` so far."""
    return sum(1 for _ in folder.glob("*.dcm"))


def _ended(assoc: Any, *, wait_s: float = 1.0) -> bool:
    """Whether an association that left a request unanswered was ended by the peer (its A-ABORT or A-RELEASE is
    processed by pynetdicom's own thread, so it is given up to ``wait_s`` to arrive)."""
    deadline = time.monotonic() + wait_s
    while assoc.is_established and time.monotonic() < deadline:
        time.sleep(0.02)
    return not assoc.is_established


_UNCOMPRESSED = ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"]  # explicit, implicit VR little endian


def _sop_name(uid: Any) -> str:
    """A SOP class's name (e.g. "Comprehensive 3D SR Storage"), or its UID when pydicom does not know it."""
    from pydicom.uid import UID

    name = UID(str(uid)).name
    return name if name and name != str(uid) else str(uid)


def _store_status(code: int) -> str:
    """A C-STORE status as written to the ledger: the code and, for a refusal, what it means."""
    meaning = {
        0x0122: "SOP class not supported",
        0x0124: "not authorised",
        0x0210: "duplicate invocation",
        0x0211: "unrecognised operation",
        0x0212: "mistyped argument",
    }.get(code)
    if meaning is None and code >> 8 == 0xA7:
        meaning = "out of resources"
    elif meaning is None and code >> 8 == 0xA9:
        meaning = "data set does not match SOP class"
    elif meaning is None and code >> 12 == 0xC:
        meaning = "cannot understand"
    return f"status 0x{code:04X}" + (f" ({meaning})" if meaning and code not in _STORE_OK else "")


__all__ = ["STATUS_OK", "STATUS_UNEXPECTED", "DimseArchive", "MoveReceiver"]
