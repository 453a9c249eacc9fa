"""PACS addresses, credentials and the pacs config section (no server needed)."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from pipeline.config import load_config
from pipeline.errors import ConfigError, PacsAddressError, PacsUnavailableError
from pipeline.pacs.address import is_pacs_address, parse_destination, parse_source, redact, without_url_queries
from pipeline.pacs.auth import find_credentials, http_session
from pipeline.pacs.retry import backoff_delay, with_retries

UID = "1.2.826.0.1.3680043.8.498.1"


def test_dicomweb_source_with_dates_accessions_and_modality():
    src = parse_source(
        "dicomweb+https://pacs.example.org:8443/dicom-web/?studydate=20261101-20261130&accession=A1,A2&modality=ct"
    )
    assert src.endpoint.kind == "dicomweb"
    assert src.endpoint.url == "https://pacs.example.org:8443/dicom-web"
    assert src.query.date_range == "20261101-20261130"
    assert src.query.accessions == ("A1", "A2")
    assert src.query.modality == "CT"
    assert src.query.retrieve is None


def test_dimse_source_and_named_dates():
    src = parse_source("dimse://ORTHANC@127.0.0.1:4242?studydate=yesterday&retrieve=get", today=dt.date(2026, 12, 1))
    assert (src.endpoint.kind, src.endpoint.aet, src.endpoint.host, src.endpoint.port) == ("dimse", "ORTHANC", "127.0.0.1", 4242)
    assert src.query.study_dates == ("20261130", "20261130")
    assert src.query.retrieve == "get"
    assert str(src.endpoint) == "dimse://ORTHANC@127.0.0.1:4242"


def test_worklist_of_series_and_of_studies(tmp_path):
    wl = tmp_path / "wl.csv"
    wl.write_text(f"StudyInstanceUID,SeriesInstanceUID\n{UID}.1,{UID}.2\n,{UID}.3\n")
    src = parse_source("dimse://PACS@localhost:104?worklist=wl.csv", base=tmp_path)
    assert src.query.series == ((f"{UID}.1", f"{UID}.2"), (None, f"{UID}.3"))
    studies = tmp_path / "studies.csv"
    studies.write_text(f"\ufeffstudy_uid\r\n{UID}.7\r\n", encoding="utf-8")  # a spreadsheet's export
    assert parse_source(f"dimse://PACS@localhost:104?worklist={studies}").query.studies == (f"{UID}.7",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dicomweb+http://h:80/dw", "selects nothing"),
        ("dicomweb+http://user:secret@h/dw?studydate=20260101", "credentials in the address"),
        ("dimse://h:104?studydate=20260101", "names no AE title"),
        ("dimse://PACS@h?studydate=20260101", "no port"),
        ("dimse://PACS@h:104?studydate=2026-01-01", "not a date"),
        ("dimse://PACS@h:104?studydate=20260105-20260101", "ends before it starts"),
        ("dimse://PACS@h:104?series=1.2.x", "no valid UID"),
        ("dimse://PACS@h:104?patient=123", "unknown query key"),
        ("dicomweb+http://h/dw?series=1.2&retrieve=get", "dimse:// sources only"),
        ("dimse://PACS@h:104?studydate=20260101&retrieve=push", "not move or get"),
        ("dimse://AVERYLONGAETITLE_X@h:104?series=1.2", "AE title"),
        ("ftp://h/x", "unknown scheme"),
    ],
)
def test_bad_sources_are_refused_with_the_reason(text, message):
    with pytest.raises(PacsAddressError, match=message) as ei:
        parse_source(text)
    assert "secret" not in str(ei.value)  # a password never reaches a message


@pytest.mark.parametrize(
    "text",
    [
        "dimse://PACS@h?accession=A12345678",
        "dimse://PACS@h:104?accession=A12345678&studydate=2026-01-01",
        "dimse://PACS@h:104?accession=A12345678&patient=123",
        "dimse://PACS@h:104?accession=A12345678&retrieve=push",
        "dicomweb+http://h/dw?accession=A12345678#part",
        "dicomweb+http://user:secret@h/dw?accession=A12345678",
    ],
)
def test_bad_sources_are_refused_without_their_accession_numbers(text):
    with pytest.raises(PacsAddressError) as ei:
        parse_source(text)
    assert "A12345678" not in str(ei.value) and "accession=***" in str(ei.value)


def test_destination_and_redaction():
    assert parse_destination("dicomweb+http://127.0.0.1:8042/dicom-web").url == "http://127.0.0.1:8042/dicom-web"
    assert parse_destination("dimse://ORTHANC@127.0.0.1:4242").aet == "ORTHANC"
    with pytest.raises(PacsAddressError, match="takes no query"):
        parse_destination("dimse://ORTHANC@127.0.0.1:4242?studydate=today")
    assert redact("dicomweb+http://u:pw@h/x") == "dicomweb+http://u:***@h/x"
    assert is_pacs_address("DIMSE://A@h:1") and not is_pacs_address("/data/dicom")


def test_credentials_from_environment_then_netrc(tmp_path):
    env = {"CTPIPE_DICOMWEB_USER": "alice", "CTPIPE_DICOMWEB_PASSWORD": "s3cret"}
    creds = find_credentials("pacs", environ=env)
    assert (creds.user, creds.password, creds.origin) == ("alice", "s3cret", "environment")
    assert "s3cret" not in repr(creds)
    with pytest.raises(PacsAddressError, match="CTPIPE_DICOMWEB_PASSWORD is not set"):
        find_credentials("pacs", environ={"CTPIPE_DICOMWEB_USER": "alice"})
    rc = tmp_path / "netrc"
    rc.write_text("machine pacs login bob password hunter2\n")
    rc.chmod(0o600)
    creds = find_credentials("pacs", netrc_file=rc, environ={})
    assert (creds.user, creds.password) == ("bob", "hunter2")
    assert find_credentials("other", netrc_file=rc, environ={}) is None
    assert find_credentials("pacs", environ={"NETRC": str(rc)}).user == "bob"
    with pytest.raises(PacsAddressError, match="does not exist"):
        find_credentials("pacs", netrc_file=tmp_path / "missing", environ={})


def test_archive_errors_never_quote_a_search_query():
    said = "Exceeded 30 redirects: 'http://u:pw@127.0.0.1:8042/dicom-web/studies?AccessionNumber=A123&limit=100' (x)"
    assert without_url_queries(said) == "Exceeded 30 redirects: 'http://u:***@127.0.0.1:8042/dicom-web/studies?***' (x)"
    assert without_url_queries("no URL here?AccessionNumber=A1") == "no URL here?AccessionNumber=A1"


def test_archive_request_error_message_withholds_the_query():
    import requests

    from pipeline.errors import PacsRequestError
    from pipeline.pacs.dicomweb import DicomWebArchive

    archive = DicomWebArchive(parse_destination("dicomweb+http://127.0.0.1:9/dicom-web"), load_config(environ={}))

    def fail():
        raise requests.exceptions.TooManyRedirects("too many for http://127.0.0.1:9/dicom-web/studies?AccessionNumber=A123")

    with pytest.raises(PacsRequestError) as err:
        archive._call("QIDO-RS study search", fail)
    assert "A123" not in str(err.value) and "studies?***" in str(err.value)


def test_tls_verification_is_on_unless_switched_off(monkeypatch, caplog):
    monkeypatch.delenv("CTPIPE_DICOMWEB_USER", raising=False)
    monkeypatch.delenv("CTPIPE_DICOMWEB_PASSWORD", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    ep = parse_destination("dicomweb+https://pacs.example.org/dicom-web")
    assert http_session(ep, load_config(environ={})).verify is True
    with caplog.at_level(logging.WARNING, logger="pipeline.pacs"):
        s = http_session(ep, load_config(overrides={"pacs.tls_verify": False}, environ={}))
    assert s.verify is False
    assert "verification is off" in caplog.text
    assert http_session(ep, load_config(overrides={"pacs.ca_bundle": "/etc/ca.pem"}, environ={})).verify == "/etc/ca.pem"


def test_pacs_config_section_and_secrets_kept_out_of_it():
    cfg = load_config(overrides={"pacs.allowed_aets": "MOD1, PACS"}, environ={})
    assert cfg.pacs.allowed_aets == ["MOD1", "PACS"]
    assert cfg.pacs.bind == "127.0.0.1" and cfg.pacs.tls_verify is True
    with pytest.raises(ConfigError, match="pacs.timeout_s"):
        load_config(overrides={"pacs.timeout_s": 0}, environ={})
    with pytest.raises(ConfigError, match="unknown option"):  # no place for a password in the configuration
        load_config(environ={"CTPIPE_PACS_PASSWORD": "x"})


def test_retries_back_off_then_give_up_naming_the_attempts():
    waits: list[float] = []
    calls = []

    def down() -> None:
        calls.append(1)
        raise PacsUnavailableError("cannot connect", where="dimse://A@h:1", fix="start it")

    with pytest.raises(PacsUnavailableError, match="gave up after 4 attempts"):
        with_retries(down, what="C-FIND", retries=3, backoff_s=0.5, sleep=waits.append)
    assert len(calls) == 4 and waits == [0.5, 1.0, 2.0]
    assert backoff_delay(20, 1.0) == 300.0
    outcomes = iter([PacsUnavailableError("busy"), "ok"])

    def flaky() -> str:
        o = next(outcomes)
        if isinstance(o, Exception):
            raise o
        return o

    assert with_retries(flaky, what="x", retries=1, backoff_s=0.0, sleep=waits.append) == "ok"
