"""A patient-named file whose series is not in the run: a ZIP or tar export among the sources
(``DOE_JANE_MRN12345.zip``), whose DICOM files are inside it and never read as a series. Its name is redacted by the
identifiers of the DICOM files it holds; a file that is not DICOM and holds none (a PDF named after a patient whose
images are not among the sources) cannot be told from any other file name and is shown as a token ``<file:xxxxxx>``
of its own with its ending, as every skipped file that is not DICOM, unless identifiers are kept (README)."""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

PLANTED = ("doe", "jane", "mrn12345")
TOKEN = re.compile(r"<patient:[0-9a-f]{6}>")


def _patient(name: str, pid: str):
    def tweak(i, ds):
        ds.PatientName, ds.PatientID = name, pid

    return tweak


def _sources(src: Path, tmp: Path, *, kind: str) -> None:
    """A series of ROE^RICHARD, and DOE^JANE's series exported as an archive beside it."""
    from tests._support.dicom import write_series

    write_series(src / "ct", n=12, series_uid="1.2.3.700", tweak=_patient("ROE^RICHARD", "MRN55555"))
    files = write_series(tmp / "doe", n=12, series_uid="1.2.3.701", tweak=_patient("DOE^JANE", "MRN12345"))
    if kind == "zip":
        with zipfile.ZipFile(src / "DOE_JANE_MRN12345.zip", "w") as zf:
            zf.writestr("README.txt", "export")  # not DICOM: the first DICOM member is read
            for f in files:
                zf.write(f, f"IMAGES/{f.name}")
    else:
        with tarfile.open(src / "export_MRN12345.tar.gz", "w:gz") as tf:
            for f in files:
                tf.add(f, f"IMAGES/{f.name}")


def _found(text: str) -> list[str]:
    low = text.lower()
    return [w for w in PLANTED if (re.search(rf"(?<![a-z]){w}(?![a-z])", low) if w.isalpha() else w in low)]


@pytest.fixture
def ingest_only(monkeypatch):
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_an_archive_named_after_its_patient_is_redacted_by_the_dicom_inside(tmp_path, capsys, own_signals, ingest_only, kind):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _sources(src, tmp_path, kind=kind)
    assert main(["run", str(src), "--out", str(run), "--workers", "1", "-v", "--set", "report.enabled=true"]) == 0
    cap = capsys.readouterr()
    console = cap.out + cap.err
    assert "archive" in console and TOKEN.search(console), console
    leaks = [f"console: {w}" for w in _found(console)]
    for p in run.rglob("*"):
        if p.is_file() and p.relative_to(run).parts[0] not in ("dicom", "cache"):
            leaks += [f"{p.relative_to(run)}: {w}" for w in _found(file_text(p))]
    assert leaks == []


def test_ctpipe_ingest_redacts_the_archive_too(tmp_path, capsys):
    src = tmp_path / "incoming"
    _sources(src, tmp_path, kind="zip")
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache")]) == 0
    cap = capsys.readouterr()
    assert "archive" in cap.out and _found(cap.out + cap.err) == [], cap.out


def test_a_file_of_a_patient_not_among_the_sources_is_shown_as_a_token_unless_kept(tmp_path, capsys):
    # no header names its patient: the name alone cannot be told from any other file name, so no skipped file's
    # name that is not DICOM is shown (was: shown as it is)
    from tests._support.dicom import write_series

    src = tmp_path / "incoming"
    write_series(src / "ct", n=12, series_uid="1.2.3.702", tweak=_patient("ROE^RICHARD", "MRN55555"))
    (src / "DOE_JANE_report.pdf").write_bytes(b"%PDF-1.4")
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "DOE_JANE" not in out and re.search(r"incoming/<file:[0-9a-f]{6}>\.pdf", out), out
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache"), "--keep-identifiers"]) == 0
    assert "DOE_JANE_report.pdf" in capsys.readouterr().out
