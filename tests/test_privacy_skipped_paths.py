"""Every skipped file's path, whatever its kind (not DICOM, cut short, unreadable, a DICOMDIR), is written outside the
DICOM results with its name as a token ``<file:xxxxxx>`` and each folder below the source that holds no series found
as a token ``<folder:xxxxxx>`` (``incoming/inbox/DOE_JANE/notes.txt`` reads
``incoming/<folder:xxxxxx>/<folder:xxxxxx>/<file:xxxxxx>.txt``): no
header tells whether such a name is a patient's. A series' own folders are checked against its headers and keep
their names unless patient-named. The counts and kinds stay; ``--keep-identifiers`` writes the paths as they are."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.test_privacy_skipped_files import _leaks

FOLDER = re.compile(r"<folder:[0-9a-f]{6}>")
KINDS = {"dicomdir": 1, "not_dicom": 1, "not_followed": 1, "truncated": 1, "unreadable": 1}


def _sources(src: Path, tmp_path: Path) -> dict[str, str]:
    """A series of ROE^RICHARD and four skipped files named after another patient; each file's kind by its name."""
    from pydicom.fileset import FileSet

    from tests._support.dicom import write_series

    def patient(i, ds):
        ds.PatientName, ds.PatientID = "ROE^RICHARD", "MRN99999"

    files = write_series(src / "ct", n=12, series_uid="1.2.3.430", tweak=patient)
    (src / "inbox" / "DOE_JANE").mkdir(parents=True)
    (src / "inbox" / "DOE_JANE" / "notes.txt").write_text("seen by Dr. X")  # in a folder named after her
    (src / "partial").mkdir()
    (src / "partial" / "DOE_JANE_0001.dcm").write_bytes(files[0].read_bytes()[:200])  # cut short
    (src / "links").mkdir()
    (src / "links" / "DOE_JANE_scan.dcm").symlink_to(tmp_path / "archive" / "Jane Doe" / "gone.dcm")  # broken
    (tmp_path / "elsewhere" / "Jane Doe").mkdir(parents=True)
    (src / "links" / "old").symlink_to(tmp_path / "elsewhere" / "Jane Doe", target_is_directory=True)  # not followed
    fs = FileSet()
    fs.add(write_series(tmp_path / "cd", n=2, series_uid="1.2.3.431")[0])
    fs.write(tmp_path / "media")
    (src / "media").mkdir()
    shutil.copy(tmp_path / "media" / "DICOMDIR", src / "media" / "DOE_JANE.DIR")  # a DICOMDIR, renamed
    return {"notes.txt": "not_dicom", "DOE_JANE_0001.dcm": "truncated", "DOE_JANE_scan.dcm": "unreadable"}


def test_ctpipe_ingest_names_every_skipped_file_and_its_folders_below_the_source_by_tokens(tmp_path, capsys):
    # was: inbox/DOE_JANE/<file:...>.txt, and the cut-short, unreadable and DICOMDIR files by their names
    src, out = tmp_path / "incoming", tmp_path / "out"
    _sources(src, tmp_path)
    argv = ["ingest", str(src), "--out", str(out / "cache"), "--json", str(out / "ingest.json"), "-v"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    console = cap.out + cap.err
    assert _leaks(out, console) == [], console
    data = json.loads((out / "ingest.json").read_text())
    skipped = data["skipped_files"]
    assert sorted(f["kind"] for f in skipped) == sorted(k for k, n in KINDS.items() for _ in range(n))
    assert all(re.search(r"/<file:[0-9a-f]{6}>(\.\w+)?$", f["path"]) for f in skipped), skipped
    assert any(re.search(r"to the folder <folder:[0-9a-f]{6}> ", f["reason"]) for f in skipped), skipped
    notes = next(f["path"] for f in skipped if f["kind"] == "not_dicom")
    assert re.fullmatch(rf"{re.escape(str(src))}/<folder:[0-9a-f]{{6}}>/<folder:[0-9a-f]{{6}}>/<file:[0-9a-f]{{6}}>\.txt", notes)
    assert (
        str(src) in console and "1 dicomdir, 1 not dicom, 1 not followed, 1 truncated, 1 unreadable" in console
    )  # counts, kinds
    assert f"{src}/ct" in console  # the series' folder, checked against its headers, as it is

    assert main([*argv, "--keep-identifiers"]) == 0
    cap = capsys.readouterr()
    for name in ("DOE_JANE/notes.txt", "DOE_JANE_0001.dcm", "DOE_JANE_scan.dcm", "DOE_JANE.DIR"):
        assert name in cap.out and name in (out / "ingest.json").read_text(), name
    assert not FOLDER.search(cap.out + cap.err)


@pytest.fixture
def ingest_and_write(monkeypatch):
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name in ("ingest", "write")])


@pytest.mark.parametrize("keep", [False, True])
def test_a_run_names_every_skipped_file_and_its_folders_below_the_source_by_tokens(
    tmp_path, capsys, own_signals, ingest_and_write, keep
):
    src, run = tmp_path / "incoming", tmp_path / "run"
    _sources(src, tmp_path)
    argv = ["run", str(src), "--out", str(run), "--workers", "0", "-v", "--no-dicom", "--set", "report.enabled=true"]
    assert main([*argv, *(["--keep-identifiers"] if keep else [])]) == 0
    cap = capsys.readouterr()
    skipped = (run / "report" / "skipped.csv").read_text()
    if keep:
        assert "inbox/DOE_JANE/notes.txt" in skipped and "DOE_JANE.DIR" in skipped, skipped
        return
    assert _leaks(run, cap.out + cap.err) == []
    assert re.search(r"incoming/<folder:[0-9a-f]{6}>/<folder:[0-9a-f]{6}>/<file:[0-9a-f]{6}>\.txt", skipped), skipped
    for kind in KINDS:  # each kind, named by its token
        assert re.search(rf"<file:[0-9a-f]{{6}}>[^,]*,{kind}\b", skipped), (kind, skipped)
    assert "1 dicomdir, 1 not dicom, 1 not followed, 1 truncated, 1 unreadable" in cap.out + cap.err


def test_a_folder_token_replaces_the_folder_in_paths_only(tmp_path):
    from pipeline.runner.redact import PathRedactor

    r = PathRedactor()
    r.add_skipped([("/in/inbox/DOE_JANE/notes", "not_dicom"), ("/in/ct/DICOMDIR", "dicomdir")], roots=["/in"])
    text = r("skipped /in/inbox/DOE_JANE/notes in the inbox of DOE_JANE; /in/ct/DICOMDIR")
    assert re.fullmatch(
        r"skipped /in/<folder:[0-9a-f]{6}>/<folder:[0-9a-f]{6}>/<file:[0-9a-f]{6}> in the inbox of DOE_JANE; "
        r"/in/<folder:[0-9a-f]{6}>/DICOMDIR",
        text,
    ), text  # the words of a message stay; a DICOMDIR is named so by the standard, and names nobody
    assert PathRedactor.of(r.shared)("/in/inbox/DOE_JANE/notes") == r("/in/inbox/DOE_JANE/notes")  # a worker's
