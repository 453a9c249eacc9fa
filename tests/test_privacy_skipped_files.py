"""A file that is neither DICOM nor an archive of DICOM, named after a patient none of whose images are among the
sources (``DOE_JANE_report.pdf`` alone in a folder), cannot be told patient-named by any header: unless identifiers
are kept, whatever ctpipe writes about a skipped file that is not DICOM names it by a token ``<file:xxxxxx>`` with
its extension (run.log, the console, the run store and report, ``ctpipe ingest``'s lines and JSON), never by its
name; with ``--keep-identifiers`` its name is written as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

#: the name parts planted in the skipped file's name (lower case)
PLANTED = ("doe", "jane")
TOKEN = re.compile(r"<file:[0-9a-f]{6}>\.pdf")


def _found(text: str) -> list[str]:
    low = text.lower()
    return [w for w in PLANTED if re.search(rf"(?<![a-z]){w}(?![a-z])", low)]


def _leaks(out: Path, console: str) -> list[str]:
    """Where the planted name is: the console, and every file under ``out`` but the DICOM results and the cache."""
    leaks = [f"console: {w}" for w in _found(console)]
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if not p.is_file() or rel.parts[0] in ("dicom", "cache") or p.suffix == ".dcm":
            continue
        leaks += [f"{rel}: {w}" for w in _found(file_text(p) + str(rel))]
    return leaks


def _sources(src: Path) -> None:
    from tests._support.dicom import write_series

    def patient(i, ds):
        ds.PatientName, ds.PatientID = "ROE^RICHARD", "MRN99999"

    write_series(src / "ct", n=12, series_uid="1.2.3.420", tweak=patient)
    (src / "inbox").mkdir()
    (src / "inbox" / "DOE_JANE_report.pdf").write_bytes(b"%PDF-1.4")  # another patient's, none of her images here


@pytest.fixture
def ingest_and_write(monkeypatch):
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name in ("ingest", "write")])


@pytest.mark.parametrize("keep", [False, True])
def test_a_run_names_a_skipped_file_that_is_not_dicom_by_a_token(tmp_path, capsys, own_signals, ingest_and_write, keep):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _sources(src)
    argv = ["run", str(src), "--out", str(run), "--workers", "0", "-v", "--no-dicom", "--set", "report.enabled=true"]
    assert main([*argv, *(["--keep-identifiers"] if keep else [])]) == 0
    cap = capsys.readouterr()
    console = cap.out + cap.err
    log = (run / "run.log").read_text()
    skipped = (run / "report" / "skipped.csv").read_text()
    if keep:
        assert "DOE_JANE_report.pdf" in log and "DOE_JANE_report.pdf" in skipped
        return
    assert _leaks(run, console) == []
    assert TOKEN.search(log) and TOKEN.search(skipped), (log, skipped)
    assert re.search(r"incoming/<folder:[0-9a-f]{6}>/<file:", skipped)  # its folder holds no series: a token too
    assert "--keep-identifiers" in log  # how to see the names


def test_ctpipe_ingest_names_a_skipped_file_that_is_not_dicom_by_a_token(tmp_path, capsys):
    src, out = tmp_path / "incoming", tmp_path / "out"
    _sources(src)
    argv = ["ingest", str(src), "--out", str(out / "cache"), "--json", str(out / "ingest.json"), "-v"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    console = cap.out + cap.err
    assert "skipped file" in console and TOKEN.search(console), console
    assert TOKEN.search((out / "ingest.json").read_text())
    assert _leaks(out, console) == []
    assert main([*argv, "--keep-identifiers"]) == 0
    assert "DOE_JANE_report.pdf" in capsys.readouterr().out


def test_a_skipped_file_token_replaces_the_name_in_paths_only(tmp_path):
    from pipeline.runner.redact import PathRedactor

    r = PathRedactor()
    r.add_skipped([("/in/DOE_JANE_report.pdf", "not_dicom"), ("/in/report", "not_dicom"), ("/in/DICOMDIR", "dicomdir")])
    text = r("skipped /in/DOE_JANE_report.pdf and /in/report; the report names DOE_JANE_report.pdf; /in/DICOMDIR")
    assert "DOE" not in text and text.count(".pdf") == 2, text
    assert "the report names" in text  # a name without an extension is replaced after a folder only
    assert "/in/report" not in text and "/in/DICOMDIR" in text  # DICOMDIR: the name of an index, named nobody
    again = PathRedactor.of(r.shared)  # a worker process's redactor writes the same tokens
    assert again("/in/report, /in/DOE_JANE_report.pdf") == r("/in/report, /in/DOE_JANE_report.pdf")
