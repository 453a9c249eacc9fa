"""pynetdicom's own records on ordinary network events (a peer that resets the connection, an HTTP port given as the
DICOM port) go through ctpipe's logging below WARNING, their tracebacks at DEBUG; an HTTP answer on the DICOM port
is said by ctpipe, with the port and the fix."""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from pipeline.config import load_config
from pipeline.errors import PacsError
from pipeline.pacs.address import parse_destination
from pipeline.pacs.dimse import DimseArchive
from tests._support.orthanc import HOST

pytestmark = pytest.mark.pacs


def _cfg() -> object:
    return load_config(overrides={"pacs.ae_title": "CTPIPE", "pacs.timeout_s": 5.0, "pacs.retries": 0}, environ={})


def _peer(answer: bytes | None) -> Iterator[int]:
    """A TCP server on a free port that reads what a client sends first, then answers ``answer`` and closes, or, with
    None, resets the connection (RST: an archive killed)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((HOST, 0))
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.recv(65536)
            if answer is None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.sendall(answer)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    srv.close()


@pytest.fixture
def resetting_peer() -> Iterator[int]:
    yield from _peer(None)


@pytest.fixture
def http_port() -> Iterator[int]:
    """A tiny HTTP server (an archive's web port): it answers what is not an HTTP request with 400 Bad Request."""
    body = b"<html><body>Bad Request</body></html>"
    yield from _peer(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def _library_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.split(".")[0] == "pynetdicom"]


def test_a_reset_connection_gives_no_library_error_and_its_traceback_only_at_debug(resetting_peer, caplog):
    archive = DimseArchive(parse_destination(f"dimse://PACS@{HOST}:{resetting_peer}"), _cfg())
    with caplog.at_level(logging.DEBUG), pytest.raises(PacsError):
        archive.find_series(None, series_uid="1.2.3")
    archive.close()
    records = _library_records(caplog)
    assert records, "pynetdicom's records reach ctpipe's log"
    loud = [f"{r.levelname} {r.getMessage()}" for r in records if r.levelno >= logging.WARNING]
    assert loud == []
    tracebacks = [r for r in records if r.exc_info]
    assert tracebacks and all(r.levelno == logging.DEBUG for r in tracebacks)


def test_an_http_port_given_as_the_dicom_port_is_said_so_with_the_port(http_port, caplog):
    archive = DimseArchive(parse_destination(f"dimse://PACS@{HOST}:{http_port}"), _cfg())
    with caplog.at_level(logging.DEBUG), pytest.raises(PacsError) as err:
        archive.find_series(None, series_uid="1.2.3")
    archive.close()
    text = str(err.value)
    assert f"port {http_port} answers HTTP, not DICOM" in text and "4242" in text, text
    assert [r.getMessage() for r in _library_records(caplog) if r.levelno >= logging.WARNING] == []
    said = [r for r in caplog.records if r.name.startswith("pipeline.") and "answers HTTP" in r.getMessage()]
    assert said, [r.getMessage() for r in caplog.records]
    assert err.type.__name__ == "PacsUnavailableError"  # pending results wait for the address to be corrected
