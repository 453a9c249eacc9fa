"""Identifiers a run finds outside a patient-named folder: a folder named by the accession number, a file that is not
DICOM named after the patient beside the images or elsewhere in the source, and a SeriesDescription a technologist
typed the patient's name into. Unless identifiers are kept, none of them reaches what a run writes outside dicom/
(run.log, the run store, the report, volume.json) nor its console output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

#: strings planted in the headers and paths (lower case): name parts, PatientID, accession number
PLANTED = ("doe", "jane", "mrn12345", "acc98765")


def _archive(src: Path) -> None:
    from tests._support.dicom import write_series

    def patient(i, ds):
        ds.PatientName, ds.PatientID, ds.AccessionNumber = "DOE^JANE", "MRN12345", "ACC98765"

    study = src / "ACC98765" / "CT"  # an export filed by accession number
    write_series(study, n=12, series_uid="1.2.3.300", tweak=patient, description="CHEST DOE JANE 1.25")
    (study / "DOE_JANE_notes.txt").write_text("not DICOM")  # beside the images, in a folder not named after her
    (src / "misc").mkdir()
    (src / "misc" / "MRN12345_report.pdf").write_bytes(b"%PDF-1.4")  # elsewhere in the source


def _leaks(run: Path, console: str) -> list[str]:
    import re

    def found(text: str) -> list[str]:  # the name parts as words (not "doe" in "does"), the numbers anywhere
        low = text.lower()
        return [w for w in PLANTED if (re.search(rf"(?<![a-z]){w}(?![a-z])", low) if w.isalpha() else w in low)]

    leaks = [f"console: {w}" for w in found(console)]
    for p in run.rglob("*"):
        rel = p.relative_to(run)
        if rel.parts[0] in ("dicom", "cache") or not p.is_file():  # the cache entry names its source as it is
            continue
        leaks += [f"{rel}: {w}" for w in found(file_text(p) + str(rel))]
    return leaks


@pytest.fixture
def ingest_and_write(monkeypatch):
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name in ("ingest", "write")])


def test_accession_folders_patient_named_files_and_descriptions_are_redacted(tmp_path, capsys, own_signals, ingest_and_write):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    argv = ["run", str(src), "--out", str(run), "--workers", "1", "-v", "--no-dicom", "--set", "report.enabled=true"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert _leaks(run, cap.out + cap.err) == []
    # what is not an identifier stays readable: the description's other words, the series' folders, the file kinds
    (volume_json,) = (run / "cases").glob("*/volume.json")
    assert '"CHEST <patient> <patient> 1.25"' in volume_json.read_text()
    skipped = (run / "report" / "skipped.csv").read_text()
    assert "/CT/<patient:" in skipped  # the series' folder, checked against its headers
    assert re.search(r"/<folder:[0-9a-f]{6}>/<patient:", skipped), skipped  # misc/, holding no series: a token


def test_kept_identifiers_keep_them(tmp_path, capsys, own_signals, ingest_and_write):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _archive(src)
    argv = ["run", str(src), "--out", str(run), "--workers", "0", "--no-dicom", "--keep-identifiers"]
    assert main(argv) == 0
    capsys.readouterr()
    log = (run / "run.log").read_text()
    assert "ACC98765" in log and "DOE_JANE_notes.txt" in log and "MRN12345_report.pdf" in log
    (volume_json,) = (run / "cases").glob("*/volume.json")
    assert "CHEST DOE JANE 1.25" in volume_json.read_text()


def test_name_parts_written_together_count_as_the_name():
    # was: a folder or description writing the name without separators (DOEJANE/, CHEST JANEDOE) held no whole word
    # that is a name part, and was written as it is
    from pipeline.runner.redact import PathRedactor, identifiers_of

    ids = identifiers_of([("PatientName", "DOE^JANE^ANN"), ("PatientID", "MRN12345")])
    r = PathRedactor(secret="s")
    r.add_series(["/spool/DOEJANE/CT/x.dcm", "/spool/janeanndoe_ct/y.dcm", "/spool/doesnt/janet/annex/z.dcm"], ids)
    assert set(r.components) == {"DOEJANE", "janeanndoe_ct"}  # not words that only begin with a name part
    from pipeline.identifiers import description_without_identifiers

    name = [("PatientName", "DOE^JANE^ANN")]
    assert description_without_identifiers("CHEST JANEDOE 1.25", name) == "CHEST <patient> 1.25"
    assert description_without_identifiers("CHEST JANET 1.25", name) == "CHEST JANET 1.25"


@pytest.mark.pacs
def test_ctpipe_listen_says_why_a_series_is_not_selected_without_the_patients_name(tmp_path, capsys):
    # was: a localizer whose description held the patient's name was "not selected (SeriesDescription 'TOPOGRAM DOE
    # JANE' names a scout/localizer)" on the console, in the log and in the listener's ledger, after the run that
    # redacted it everywhere else had returned
    import sqlite3
    import time

    import pydicom

    from pipeline.config import load_config
    from pipeline.pacs import Listener
    from pipeline.pacs.cli import print_series_outcome
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.orthanc import cstore, free_port, write_phantom_series

    _, files = write_phantom_series(tmp_path / "case", 9)
    for f in files:
        ds = pydicom.dcmread(f)
        ds.PatientName, ds.PatientID, ds.SeriesDescription = "DOE^JANE", "MRN12345", "TOPOGRAM DOE JANE"
        ds.save_as(f)
    opts = {"pacs.ae_title": "CTPIPE_L", "pacs.port": free_port(), "pacs.allowed_aets": ["ORTHANC"]}
    opts.update({"pacs.quiet_period_s": 0.5, "report.enabled": False, "workers": 0})
    cfg = load_config(overrides=opts, environ={})
    run = tmp_path / "run"
    with Listener(run, cfg, stages=[IngestStage(), WriteStage()], poll_s=0.1, on_series=print_series_outcome) as lst:
        assert cstore(files, lst.port, called="CTPIPE_L") == [0] * len(files)
        deadline = time.monotonic() + 30
        while not lst.step():
            assert time.monotonic() < deadline, "no series was handed to the runner in time"
            time.sleep(0.2)
    out = capsys.readouterr().out
    assert "not selected" in out and "scout/localizer" in out, out
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        ledger = " ".join(str(r) for r in db.execute("SELECT * FROM series").fetchall())
    assert _leaks(run, out + ledger) == []


def test_a_volumes_series_description_holds_no_identifier_of_its_patient_unless_kept(tmp_path):
    # was: load_series (and so the case cache, `ctpipe ingest`'s sidecars and ctp.show's titles) kept "CHEST DOE JANE
    # 1.25" as it was, though the patient's name is left out of the metadata unless keep_identifiers
    import pipeline as ctp
    from tests._support.dicom import write_series

    def patient(i, ds):
        ds.PatientName, ds.PatientID, ds.AccessionNumber = "DOE^JANE", "MRN12345", "ACC98765"

    write_series(tmp_path / "s", n=12, tweak=patient, description="CHEST DOEJANE ACC98765 1.25")
    assert ctp.load_series(tmp_path / "s").metadata["SeriesDescription"] == "CHEST <patient> <patient> 1.25"
    kept = ctp.load_series(tmp_path / "s", keep_identifiers=True).metadata
    assert kept["SeriesDescription"] == "CHEST DOEJANE ACC98765 1.25"
    write_series(tmp_path / "t", n=12, tweak=patient, description="CHEST 1.25 JANET")  # no identifier: as it is
    assert ctp.load_series(tmp_path / "t").metadata["SeriesDescription"] == "CHEST 1.25 JANET"


@pytest.mark.pacs
def test_a_listeners_worker_redacts_the_series_of_each_batch(tmp_path):
    # was: the worker process a listener keeps from batch to batch knew only the first batch's identifiers; the
    # second series' description ("CHEST DOE JANE") reached run.log through the worker's ingest record
    import time

    import pydicom

    from pipeline.config import load_config
    from pipeline.pacs import Listener
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.orthanc import cstore, free_port, write_phantom_series

    opts = {"pacs.ae_title": "CTPIPE_L", "pacs.port": free_port(), "pacs.allowed_aets": ["ORTHANC"]}
    opts.update({"pacs.quiet_period_s": 0.5, "report.enabled": False, "workers": 1})
    run = tmp_path / "run"
    with Listener(run, load_config(overrides=opts, environ={}), stages=[IngestStage(), WriteStage()], poll_s=0.1) as lst:
        for seed, name in ((9, "ROE^RICHARD"), (10, "DOE^JANE")):
            _, files = write_phantom_series(tmp_path / f"case{seed}", seed)
            for f in files:
                ds = pydicom.dcmread(f)
                ds.PatientName, ds.PatientID = name, f"MRN1234{seed}"
                ds.SeriesDescription = "CHEST " + name.replace("^", " ")
                ds.save_as(f)
            assert cstore(files, lst.port, called="CTPIPE_L") == [0] * len(files)
            deadline = time.monotonic() + 60
            while not lst.step():
                assert time.monotonic() < deadline, "no series was handed to the runner in time"
                time.sleep(0.2)
    log = (run / "run.log").read_text()
    assert [ln for ln in log.splitlines() if '"process": "cpu-1"' in ln and "CHEST <patient> <patient>" in ln], log
    assert _leaks(run, "") == []
    assert "richard" not in log.lower()


def test_a_worklists_rows_are_redacted_with_the_identifiers_of_every_row(tmp_path, capsys, own_signals, ingest_and_write):
    # was: the files a row's folder skips were logged once that row was scanned, so a note named after the patient of a
    # later row (DOE_JANE_notes.txt beside another patient's images) reached run.log and the console as it was
    from tests._support.dicom import write_series

    def patient(name: str, pid: str):
        def tweak(i, ds):
            ds.PatientName, ds.PatientID = name, pid

        return tweak

    src, run = tmp_path / "incoming", tmp_path / "run"
    write_series(src / "a", n=12, series_uid="1.2.3.401", tweak=patient("ROE^RICHARD", "MRN99999"))
    (src / "a" / "DOE_JANE_notes.txt").write_text("not DICOM")
    write_series(src / "b", n=12, series_uid="1.2.3.402", tweak=patient("DOE^JANE", "MRN12345"))
    worklist = tmp_path / "worklist.csv"
    worklist.write_text(f"path\n{src / 'a'}\n{src / 'b'}\n")
    argv = ["run", str(worklist), "--out", str(run), "--workers", "0", "-v", "--no-dicom", "--set", "report.enabled=false"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "skipped file" in (run / "run.log").read_text()
    assert _leaks(run, cap.out + cap.err) == []


def test_a_scans_reprs_and_messages_show_the_description_without_the_patients_name(tmp_path):
    # was: ScanResult and SeriesInfo reprs (what a notebook echoes), ctpipe ingest's table and the messages naming a
    # series ('series X ("CHEST DOE JANE", 12 file(s) in ...)') showed the name typed into the description
    import pipeline as ctp
    from pipeline.ingest.build import describe
    from tests._support.dicom import write_series

    def patient(i, ds):
        ds.PatientName, ds.PatientID = "DOE^JANE", "MRN12345"

    write_series(tmp_path / "s", n=12, tweak=patient, description="CHEST DOE JANE MRN12345")
    scan = ctp.scan_directory([tmp_path / "s"])
    (series,) = scan.series
    shown = " ".join([repr(scan), repr(series), describe(series), str(series.summary())])
    assert "CHEST <patient> <patient> <patient>" in shown
    assert not [w for w in ("doe", "jane", "mrn12345") if w in shown.lower()], shown


def test_a_sessions_worker_names_a_folder_by_the_main_processs_token_in_every_batch(tmp_path):
    # was: each batch of a listener's session drew its own secret while the worker process kept from the first batch
    # went on with the first one: from the second batch on, the same folder read as one token in the main process's
    # records and as another in the worker's
    import json
    import re

    from pipeline.config import load_config
    from pipeline.runner import open_run, run_batch
    from pipeline.runner.session import RunSession
    from pipeline.runner.stages import IngestStage, WriteStage
    from tests._support.dicom import write_series

    run = tmp_path / "run"
    cfg = load_config(overrides={"workers": 1, "report.enabled": False, "outputs.dicom": []}, environ={})
    seen: list[tuple[set[str], set[str]]] = []  # per batch: the folder's token in the run store, in the worker's records
    with RunSession(run, config=cfg, stages=[IngestStage(), WriteStage()]) as session:
        for batch, (name, pid) in enumerate((("ROE^RICHARD", "MRN55501"), ("DOE^JANE", "MRN55502"))):

            def patient(i, ds, name=name, pid=pid):
                ds.PatientName, ds.PatientID = name, pid

            folder = tmp_path / "in" / f"{name.replace('^', '_')}_{pid}"
            write_series(folder / "CT", n=12, series_uid=f"1.2.3.6{batch}", tweak=patient)
            before = len((run / "run.log").read_text().splitlines()) if (run / "run.log").exists() else 0
            summary = run_batch([str(folder)], out=run, config=session.config, stages=session.stages, session=session)
            assert not summary.fatal and not summary.stopped
            worker: set[str] = set()
            for line in (run / "run.log").read_text().splitlines()[before:]:
                if json.loads(line).get("process") == "cpu-1":
                    worker.update(re.findall(r"<patient:[0-9a-f]{6}>", line))
            cases = open_run(run).cases
            (source,) = cases.source[cases.series_uid == f"1.2.3.6{batch}"]
            seen.append((set(re.findall(r"<patient:[0-9a-f]{6}>", source)), worker))
    for batch, (main_tokens, worker) in enumerate(seen):
        assert main_tokens and worker, (batch, main_tokens, worker)  # both name the folder by a token
        assert worker == main_tokens, (batch, main_tokens, worker)
