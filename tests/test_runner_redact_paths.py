"""Archive exports name folders and files after the patient: unless identifiers are kept, no such name reaches what
a run writes outside dicom/ (run.log, the run store, the report and its CSV files, quarantine files, metrics) nor
its console output; each such folder or file reads as one stable token instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

#: (PatientName, PatientID, PatientBirthDate) of the two patients, and the strings planted in their paths
SMITH = ("Smith^John", "1234567", "19600101")
DOE = ("DOERR^JANETTE", "7654321", "19711231")
PLANTED = ("smith", "john", "1234567", "19600101", "doerr", "janette", "7654321", "19711231")


@pytest.fixture
def ingest_only(monkeypatch):
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])


def _patient(who: tuple[str, str, str]):
    def tweak(i, ds):
        ds.PatientName, ds.PatientID, ds.PatientBirthDate = who

    return tweak


def _archive(src: Path) -> None:
    from tests._support.dicom import write_series

    good = src / "SMITH^JOHN_1234567" / "CT"  # a PACS spool's patient folder
    write_series(good, n=12, series_uid="1.2.3.100", tweak=_patient(SMITH), names=lambda i: f"Smith_John_19600101_{i:03d}.dcm")
    (good / "notes.txt").write_text("not DICOM")  # skipped: redacted through its folder
    (good / "export.zip").write_bytes(b"PK\x03\x04")  # an archive to unpack
    (good / "loop").symlink_to(good, target_is_directory=True)  # skipped while the folders are walked, before any
    # header is read
    gap = src / "7654321"  # a folder named by the PatientID alone; one slice missing: quarantined
    positions = [(-10.0, -20.0, 30.0 + 1.25 * k) for k in range(13) if k != 6]
    write_series(
        gap, n=12, series_uid="1.2.3.200", tweak=_patient(DOE), positions=positions, names=lambda i: f"Doerr_Janette_{i}.dcm"
    )


def _leaks(run: Path, console: str) -> list[str]:
    found = [f"console: {w}" for w in PLANTED if w in console.lower()]
    for p in run.rglob("*"):
        rel = p.relative_to(run)
        if rel.parts[0] == "dicom" or not p.is_file():
            continue
        text = file_text(p)
        found += [f"{rel}: {w}" for w in PLANTED if w in text or w in str(rel).lower()]
    return found


def test_patient_named_folders_and_files_are_redacted_outside_dicom(tmp_path, capsys, own_signals, ingest_only):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    # one worker process: its stages' records go to run.log from that process
    argv = ["run", str(src), "--out", str(run), "--workers", "1", "-v", "--set", "report.enabled=true"]
    assert main(argv) == 3
    cap = capsys.readouterr()
    console = cap.out + cap.err
    assert "quarantined" in console and "MissingSliceError" in console
    assert _leaks(run, console) == []
    # the token stands where the name was, the same for the same folder throughout the run
    log = (run / "run.log").read_text()
    tokens = set(re.findall(r"<patient:[0-9a-f]{6}>", log))
    assert tokens, log
    skipped = (run / "report" / "skipped.csv").read_text()
    # a file that is not DICOM: through its folder's token, its own name as a token of its own
    (folder,) = {m for m in re.findall(r"<patient:[0-9a-f]{6}>/CT/<file:[0-9a-f]{6}>\.txt", skipped)}
    assert folder.split("/")[0] in tokens


def test_kept_identifiers_keep_the_paths(tmp_path, capsys, own_signals, ingest_only):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    argv = ["run", str(src), "--out", str(run), "--workers", "0", "--keep-identifiers", "--set", "report.enabled=false"]
    assert main(argv) == 3
    capsys.readouterr()
    assert "SMITH^JOHN_1234567" in (run / "run.log").read_text()


def test_what_counts_as_a_patient_named_component():
    from pipeline.runner.redact import PathRedactor, identifiers_of

    ids = identifiers_of([("PatientName", "Smith^Jo^^Dr"), ("PatientID", "1234567"), ("PatientBirthDate", "19600101")])
    # "Jo", "Dr": too short to look for alone (only within the whole name, SMITH JO DR)
    assert {i for i in ids if i.isalnum()} == {"smith", "1234567", "19600101"} and not {"jo", "dr"} & ids
    r = PathRedactor(secret="s")
    r.add_series(["/spool/smith-j/CT/IM0001", "/spool/2024/x_19600101.dcm", "/spool/ab/1234567/f.dcm"], ids)
    assert set(r.components) == {"smith-j", "x_19600101.dcm", "1234567"}  # case-insensitive; 'spool', 'CT' stay
    text = "in /spool/smith-j/CT and /spool/ab/1234567/f.dcm; series 1.2.840.1234567.5, case 1234567a"
    out = r(text)
    assert out == (
        f"in /spool/{r.token('smith-j')}/CT and /spool/ab/{r.token('1234567')}/f.dcm; series 1.2.840.1234567.5, case 1234567a"
    )  # a UID or a longer name holding the same digits is left alone
    assert r.token("smith-j") == PathRedactor(secret="s").token("smith-j") != PathRedactor().token("smith-j")

    # a name part is a word of the component (also between a small letter and a capital), not any three letters of it
    named = PathRedactor()
    lee = identifiers_of([("PatientName", "Lee^Ann"), ("PatientID", "AB123")])
    named.add_series(["/data/sleep_annual/LeeAnn/x.dcm", "/data/MüllerLee/y", "/data/ids/xab123y/z"], lee)
    assert set(named.components) == {"LeeAnn", "MüllerLee", "xab123y"}


@pytest.mark.slow
def test_ray_actors_redact_their_records_too(tmp_path):
    """Ray actors write their stages' records to run.log themselves: with the driver's tokens."""
    pytest.importorskip("ray")
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage
    from tests._support.ray_cluster import LocalCluster

    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    cluster = LocalCluster(head_cpus=1).start()
    try:
        s = run_batch(
            [src], out=run, stages=[IngestStage()], engine="ray", ray_address=cluster.address, **{"report.enabled": False}
        )
    finally:
        cluster.stop()
    assert s.done == 1, s.lines()
    log = (run / "run.log").read_text()
    actor_lines = [ln for ln in log.splitlines() if '"process": "cpu' in ln and "@" in ln]
    assert any("<patient:" in ln for ln in actor_lines), actor_lines
    assert _leaks(run, "\n".join(s.lines())) == []


def test_a_run_interrupted_mid_case_keeps_its_cache_entry_pointing_at_the_source(tmp_path):
    """A run stopped before the case ends keeps the ingested volume's cache entry for the next run. The entry holds the
    scan itself, and its sidecar names the folder the series came from, as it is: ``ctpipe detect <entry>``
    finds the source images through it. Everything else in the run folder names that folder by its token."""
    from pipeline.dicom_out.case import dicom_source_of
    from pipeline.runner import run_batch
    from pipeline.runner.stage import CaseContext, Stage
    from pipeline.runner.stages import IngestStage

    class _Stop(Stage):
        name = "stop"

        def process(self, ctx: CaseContext) -> dict:
            raise KeyboardInterrupt  # as ctpipe run's SIGTERM handler does

    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    with pytest.raises(KeyboardInterrupt):
        run_batch([src], out=run, stages=[IngestStage(), _Stop()], workers=0, **{"report.enabled": False})
    entries = sorted((run / "cache").rglob("*.json"))
    assert entries  # kept for the next run
    source = dicom_source_of(entries[0])
    assert source is not None and source.is_dir() and source.is_relative_to(src), source
    leaks = [leak for leak in _leaks(run, "") if not leak.startswith("cache")]
    assert leaks == []


def test_a_done_cases_volume_json_names_its_patient_named_source_by_token(tmp_path, capsys, own_signals, monkeypatch):
    # was: cases/<id>/volume.json, the published copy of the cache sidecar, named the source folder as it is
    # ("source": ".../SMITH^JOHN_1234567/CT") and so kept the patient's name in the results of every completed case
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name in ("ingest", "write")])
    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    argv = ["run", str(src), "--out", str(run), "--workers", "1", "--no-dicom", "--set", "report.enabled=false"]
    assert main(argv) == 3
    console = "".join(capsys.readouterr())
    (volume_json,) = (run / "cases").glob("*/volume.json")
    assert "<patient:" in volume_json.read_text(encoding="utf-8")
    assert [leak for leak in _leaks(run, console) if not leak.startswith("cache")] == []


def test_volume_json_redaction_reads_through_escaped_non_ascii_names():
    """The cache sidecar stores non-ASCII characters escaped (``M\\u00fcller``): its published copy is redacted by
    value, so such a folder is replaced too; without a run that redacts it is copied byte for byte."""
    import json

    from pipeline.runner.redact import PathRedactor, identifiers_of
    from pipeline.runner.redact_active import redacting
    from pipeline.runner.stages import _redacted_json

    sidecar = json.dumps({"extra": {"source": "/spool/MüllerAnna/CT"}, "n": [1, 2.5, None]}, indent=1).encode()
    assert b"M\\u00fcller" in sidecar
    assert _redacted_json(sidecar) == sidecar
    r = PathRedactor(secret="s")
    r.add_series(["/spool/MüllerAnna/CT/x.dcm"], identifiers_of([("PatientName", "Müller^Anna")]))
    with redacting(r):
        doc = json.loads(_redacted_json(sidecar))
    assert doc == {"extra": {"source": f"/spool/{r.token('MüllerAnna')}/CT"}, "n": [1, 2.5, None]}
