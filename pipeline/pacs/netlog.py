"""pynetdicom's log, through ctpipe's: its records of ordinary network events (a peer that resets or closes the
connection, an association aborted, an unknown PDU) are logged by pynetdicom at ERROR, with full tracebacks
(``ConnectionResetError``), while ctpipe reports the same event itself, once, with what to do (the retrieval's or
sender's error, the listener's "cut off" warning). :func:`route_pynetdicom_log` (called by
:func:`~pipeline.pacs.scp.build_ae`, so before any association) stops the ``pynetdicom`` logger's records from
propagating and hands each to ctpipe's logger ``pipeline.pacs.network`` instead, the record's name kept
(``pynetdicom.dul``...): its WARNING and ERROR records at INFO (``-v``), its tracebacks and everything else at DEBUG
(``-vv``). An HTTP response where a DICOM PDU was awaited (pynetdicom's "Unknown PDU type received '0x48'": 'H' of
``HTTP/1.1``) is said by ctpipe, with the port and the fix, and :func:`answered_http` tells the caller that opened
the association, whose error then says "port N answers HTTP, not DICOM" (not "refused or dropped").
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

log = logging.getLogger("pipeline.pacs.network")

#: Associations whose peer answered in HTTP (see :func:`answered_http`).
_HTTP_ANSWERS: weakref.WeakSet[Any] = weakref.WeakSet()
_HTTP_PDU = "Unknown PDU type received '0x48'"


class _Route(logging.Handler):
    """Hands pynetdicom's records to :data:`log` at their new level (see the module docstring)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.WARNING and not record.exc_info:
                level = logging.INFO
            else:
                level = logging.DEBUG
            if str(record.msg).startswith(_HTTP_PDU):
                _said_http()
            if not log.isEnabledFor(level):
                return
            record.levelno, record.levelname = level, logging.getLevelName(level)
            log.handle(record)
        except Exception:  # noqa: BLE001 - a logging failure must not end pynetdicom's thread
            self.handleError(record)


def _said_http() -> None:
    """Note and say that the peer of the association whose thread logs this answered in HTTP."""
    assoc = getattr(threading.current_thread(), "assoc", None)  # pynetdicom's DUL thread knows its association
    if assoc is None:
        log.info("an archive answered HTTP, not DICOM: give the archive's DICOM port (Orthanc: 4242)")
        return
    _HTTP_ANSWERS.add(assoc)
    if not getattr(assoc, "is_requestor", False):  # a client of ctpipe listen that speaks HTTP: its own affair
        return
    peer = assoc.acceptor
    log.info(  # the association's error says it too, at ERROR, with the fix
        "port %s answers HTTP, not DICOM: give the archive's DICOM port (Orthanc: 4242), not its web port (%s:%s)",
        peer.port,
        peer.address,
        peer.port,
        extra={"event": "pacs_http_port"},
    )


def answered_http(assoc: Any) -> bool:
    """Whether the peer of ``assoc`` (a pynetdicom Association) answered with HTTP where DICOM was awaited."""
    return assoc in _HTTP_ANSWERS


_routed = threading.Lock()


def route_pynetdicom_log() -> None:
    """Route the ``pynetdicom`` logger through ctpipe's (see the module docstring); once per process."""
    lib = logging.getLogger("pynetdicom")
    with _routed:
        if any(isinstance(h, _Route) for h in lib.handlers):
            return
        lib.addHandler(_Route())
        lib.propagate = False
