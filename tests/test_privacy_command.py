"""Accession numbers in PACS sources stay out of the run store's command line and the PACS logs unless
``privacy.keep_identifiers``; the queries go to a real Orthanc (``tests._support.orthanc``) that holds none of them."""

from __future__ import annotations

import logging
import sqlite3
import sys
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.pacs import fetch
from pipeline.pacs.address import for_records, parse_source, redact_identifiers
from pipeline.runner.batch import run_batch

pytest_plugins = ["tests._support.orthanc"]

SOURCE = "dimse://PACS@pacs.example.org:104?studydate=20261130&accession=A123,B456&modality=CT"


def test_redact_identifiers_withholds_accession_values_only():
    assert redact_identifiers(SOURCE) == "dimse://PACS@pacs.example.org:104?studydate=20261130&accession=***&modality=CT"
    line = f"ctpipe run '{SOURCE}' dicomweb+https://h/dicom-web?Accession=Z9 --out runs/a --set privacy.x=accession=1"
    shown = redact_identifiers(line)
    assert "A123" not in shown and "B456" not in shown and "Z9" not in shown
    assert "dicomweb+https://h/dicom-web?Accession=***" in shown
    assert shown.endswith("--out runs/a --set privacy.x=accession=1")  # text outside addresses is left alone
    assert redact_identifiers("dimse://PACS@h:104?study=1.2.3&series=1.2.3.4") == "dimse://PACS@h:104?study=1.2.3&series=1.2.3.4"
    assert redact_identifiers("dicomweb+http://u:secret@h/x?accession=A1") == "dicomweb+http://u:***@h/x?accession=***"


def test_for_records_withholds_identifiers_unless_kept_and_never_shows_passwords():
    text = "dicomweb+http://u:secret@h/x?accession=A1&modality=CT"
    assert for_records(text, keep_identifiers=False) == "dicomweb+http://u:***@h/x?accession=***&modality=CT"
    assert for_records(text, keep_identifiers=True) == "dicomweb+http://u:***@h/x?accession=A1&modality=CT"


def _stored_command(tmp_path: Path, **opts) -> tuple[str, str]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    run_batch([src], out=out, stages=[], workers=0, **{"report.enabled": False}, **opts)
    with sqlite3.connect(out / "runs.sqlite") as db:
        command, sources = db.execute("SELECT command, sources FROM runs").fetchone()
    return command, sources


def test_the_run_store_keeps_no_accession_number_unless_keep_identifiers(tmp_path, monkeypatch):
    command = f"ctpipe run {SOURCE} --out runs/a"
    stored, _ = _stored_command(tmp_path, command=command)
    assert "A123" not in stored and "B456" not in stored
    assert stored == "ctpipe run dimse://PACS@pacs.example.org:104?studydate=20261130&accession=***&modality=CT --out runs/a"
    monkeypatch.setattr(sys, "argv", ["ctpipe", "run", SOURCE])  # the command line itself when none is given
    stored, _ = _stored_command(tmp_path)
    assert "A123" not in stored and "accession=***" in stored
    stored, _ = _stored_command(tmp_path, command=command, keep_identifiers=True)
    assert stored == command


@pytest.fixture
def pacs_source(orthanc, monkeypatch) -> str:
    """A DIMSE source on the test Orthanc asking for two accession numbers it does not hold (credentials set)."""
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    return f"{orthanc.dimse}?studydate=20261130&accession=A123,B456&modality=CT"


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.pacs
def test_pacs_fetch_logs_and_lines_name_accessions_only_with_keep_identifiers(tmp_path, pacs_source, orthanc, caplog, keep):
    cfg = load_config(overrides={"keep_identifiers": keep, "pacs.timeout_s": 10.0, "pacs.retries": 0}, environ={})
    with caplog.at_level(logging.DEBUG, logger="pipeline"):  # everything ctpipe logs while it queries the archive
        res = fetch.fetch_sources([parse_source(pacs_source)], run_dir=tmp_path / "run", cfg=cfg)
    assert [what for what, _, _ in res.failures] == ["accession A123", "accession B456"]  # the caller's own values
    assert all("no study dated 20261130-20261130 with a CT series" in why for _, _, why in res.failures), res.failures
    text = "\n".join(res.lines()) + "\n" + caplog.text
    assert "0 series selected" in caplog.text
    if keep:
        assert "accession A123" in text and "accession=A123,B456" in text
    else:
        assert "A123" not in text and "B456" not in text
        assert f"PACS failure accession 2 of 2 in {orthanc.dimse}?studydate=20261130&accession=***" in text


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.pacs
def test_ctpipe_run_of_a_pacs_source_records_and_prints_no_accession_unless_kept(
    tmp_path, pacs_source, orthanc, monkeypatch, capsys, keep
):
    from pipeline.cli import main

    (tmp_path / "src").mkdir()
    argv = ["run", pacs_source, str(tmp_path / "src"), "--out", str(tmp_path / "run"), "--workers", "0"]
    argv += ["--set", "report.enabled=false", "--set", "pacs.retries=0", *(["--keep-identifiers"] if keep else [])]
    monkeypatch.setattr(sys, "argv", ["ctpipe", *argv])
    assert main(argv) == 3  # the accession numbers selected nothing
    printed = capsys.readouterr()
    assert "PACS failure accession" in printed.err
    with sqlite3.connect(tmp_path / "run" / "runs.sqlite") as db:
        (command,) = db.execute("SELECT command FROM runs").fetchone()
    text = command + printed.out + printed.err + (tmp_path / "run" / "run.log").read_text()
    assert command.startswith(f"ctpipe run {orthanc.dimse}?studydate=20261130&accession=")
    assert ("A123" in text and "B456" in command) if keep else ("A123" not in text and "B456" not in text)
