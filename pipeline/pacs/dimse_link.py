"""Associations with a DIMSE archive (``pynetdicom``), the plumbing of :class:`~pipeline.pacs.dimse.DimseArchive`.

ctpipe calls the archive as ``pacs.ae_title``. Every association uses ``pacs.timeout_s`` for connecting, negotiating
and each DIMSE message. An association that cannot be set up or is aborted raises
:class:`~pipeline.errors.PacsUnavailableError` (retried), and so does one the archive rejects for now (transient:
congestion); a rejected association or a failure status raises :class:`~pipeline.errors.PacsRequestError`, the
rejection with the archive's reason and the AE title to correct. Records are logged as ``pipeline.pacs.dimse``'s.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..errors import PacsRequestError, PacsUnavailableError
from .address import Endpoint
from .netlog import answered_http
from .retry import with_retries
from .scp import build_ae

log = logging.getLogger("pipeline.pacs.dimse")

T = TypeVar("T")

# Study Root Query/Retrieve Information Model: FIND, MOVE, GET
FIND = "1.2.840.10008.5.1.4.1.2.2.1"
MOVE = "1.2.840.10008.5.1.4.1.2.2.2"
GET = "1.2.840.10008.5.1.4.1.2.2.3"
_PENDING = (0xFF00, 0xFF01)
_UNCOMPRESSED = ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"]  # explicit, implicit VR little endian


class DimseLink:
    """Associations with the DIMSE archive at ``endpoint`` (AE title, host, port); ``mode`` "move" or "get" for
    retrievals (it names what the archive must list when it rejects ctpipe's AE title)."""

    def __init__(self, endpoint: Endpoint, cfg: Any, *, mode: str = "move"):
        self.endpoint = endpoint
        self.cfg = cfg
        self.mode = mode

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


def _ended(assoc: Any, *, wait_s: float = 1.0) -> bool:
    """Whether an association that left a request unanswered was ended by the peer (its A-ABORT or A-RELEASE is
    processed by pynetdicom's own thread, so it is given up to ``wait_s`` to arrive)."""
    deadline = time.monotonic() + wait_s
    while assoc.is_established and time.monotonic() < deadline:
        time.sleep(0.02)
    return not assoc.is_established


def _sop_name(uid: Any) -> str:
    """A SOP class's name (e.g. "Comprehensive 3D SR Storage"), or its UID when pydicom does not know it."""
    from pydicom.uid import UID

    name = UID(str(uid)).name
    return name if name and name != str(uid) else str(uid)
