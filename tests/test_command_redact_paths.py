"""``ctpipe detect``, ``ctpipe reconstruct`` and ``ctpipe ingest`` on a folder named after the patient
(``/data/DOE_JANE_MRN12345/series1``): as ``ctpipe run``, they show and write that folder as a ``<patient:xxxxxx>``
token, never as typed, on the console (stdout and stderr, errors included), in their logs and in every file they write
outside the DICOM results (findings JSON and CSV, PNGs, measurements, ``ctpipe ingest --json``); ``ctpipe ingest
--keep-identifiers`` shows it as it is. The case cache names its source folder as it is (``ctpipe detect <entry>``
reads the source images from it for the SR)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

#: the strings planted in the path and the headers (lower case)
PLANTED = ("doe", "jane", "mrn12345", "19600101")
TOKEN = re.compile(r"<patient:[0-9a-f]{6}>")


def _patient(i, ds) -> None:
    ds.PatientName, ds.PatientID, ds.PatientBirthDate = "DOE^JANE", "MRN12345", "19600101"


def _found(text: str) -> list[str]:
    """The planted strings in ``text``: the name parts as words (not "doe" in "does"), the numbers anywhere."""
    low = text.lower()
    return [w for w in PLANTED if (re.search(rf"(?<![a-z]){w}(?![a-z])", low) if w.isalpha() else w in low)]


def _leaks(out: Path, console: str) -> list[str]:
    """Where the planted strings are: the console, and every file under ``out`` but the DICOM results and the cache."""
    leaks = [f"console: {w}" for w in _found(console)]
    for p in sorted(out.rglob("*")):
        if not p.is_file() or p.suffix == ".dcm" or (p.parent.name == "cache" and p.suffix in (".json", ".npy")):
            continue
        rel = p.relative_to(out)
        leaks += [f"{rel}: {w}" for w in _found(file_text(p) + str(rel))]
    return leaks


def test_ctpipe_ingest_shows_a_patient_named_folder_as_a_token(tmp_path, capsys):
    from tests._support.dicom import write_series

    src = tmp_path / "data" / "DOE_JANE_MRN12345" / "series1"
    write_series(src, n=12, series_uid="1.2.3.400", tweak=_patient)
    (src / "notes.txt").write_text("not DICOM")  # a skipped file, named in the table and the JSON report
    out = tmp_path / "out"
    argv = ["ingest", str(src), "--out", str(out / "cache"), "--json", str(out / "ingest.json"), "-v"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    console = cap.out + cap.err
    assert "skipped file" in console and TOKEN.search(console), console
    assert _leaks(out, console) == []
    assert TOKEN.search((out / "ingest.json").read_text())
    # the cache entry keeps its source folder as it is: ctpipe detect <entry> reads the source images from it
    (sidecar,) = (out / "cache").glob("*.json")
    assert "DOE_JANE_MRN12345" in sidecar.read_text()

    # with --json -: the JSON report on stdout is redacted too
    assert main(["ingest", str(src), "--out", str(out / "cache"), "--json", "-"]) == 0
    cap = capsys.readouterr()
    assert _found(cap.out + cap.err) == [] and TOKEN.search(cap.out), cap.out


def test_ctpipe_ingest_keep_identifiers_shows_the_folder_as_it_is(tmp_path, capsys):
    from tests._support.dicom import write_series

    src = tmp_path / "data" / "DOE_JANE_MRN12345" / "series1"
    write_series(src, n=12, series_uid="1.2.3.401", tweak=_patient)
    (src / "notes.txt").write_text("not DICOM")
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache"), "--keep-identifiers"]) == 0
    console = capsys.readouterr().out
    assert "DOE_JANE_MRN12345" in console and not TOKEN.search(console), console


def test_an_error_on_a_patient_named_folder_names_it_by_its_token(tmp_path, capsys):
    from tests._support.dicom import write_series

    src = tmp_path / "data" / "DOE_JANE_MRN12345"
    write_series(src / "a", n=12, series_uid="1.2.3.402", tweak=_patient)
    write_series(src / "b", n=12, series_uid="1.2.3.403", tweak=_patient, series_number=3)
    for command in ("detect", "reconstruct"):  # two series qualify: the error names the folder
        rc = main([command, str(src), "--out", str(tmp_path / command), "--device", "cpu", "-v"])
        assert rc == 1
        cap = capsys.readouterr()
        console = cap.out + cap.err
        assert "error" in console and TOKEN.search(console), console
        assert _found(console) == [], console


@pytest.mark.slow
def test_ctpipe_detect_and_reconstruct_show_a_patient_named_folder_as_a_token(tmp_path, capsys):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.volume import CTVolume

    ph = generate_phantom(4, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=2)
    identifiers = {"PatientName": "DOE^JANE", "PatientID": "MRN12345", "PatientBirthDate": "19600101"}
    volume = CTVolume(ph.volume.array, ph.volume.geometry, metadata={**ph.volume.metadata, **identifiers})
    src = tmp_path / "data" / "DOE_JANE_MRN12345" / "series1"
    write_dicom_series(volume, src, seed=4)
    out = tmp_path / "out"
    consoles = []
    for argv in (
        ["detect", str(src), "--out", str(out / "detect"), "--device", "cpu", "--score-threshold", "0.3", "-v"],
        ["reconstruct", str(src), "--out", str(out / "reconstruct"), "--device", "cpu", "-v"],
    ):
        assert main(argv) == 0
        cap = capsys.readouterr()
        consoles.append(cap.out + cap.err)
        assert TOKEN.search(cap.err), cap.err  # -v: the series read from the folder, named by its token
    assert list((out / "detect").rglob("*.png")) and list((out / "reconstruct").rglob("*.png"))
    assert _leaks(out, "\n".join(consoles)) == []


def test_detect_and_reconstruct_keep_identifiers_show_the_folder_as_it_is(tmp_path, capsys):
    from tests._support.dicom import write_series

    src = tmp_path / "data" / "DOE_JANE_MRN12345"
    write_series(src / "a", n=12, series_uid="1.2.3.404", tweak=_patient)
    write_series(src / "b", n=12, series_uid="1.2.3.405", tweak=_patient, series_number=3)
    for command in ("detect", "reconstruct"):  # two series qualify: the error names the folder, here as it is
        rc = main([command, str(src), "--out", str(tmp_path / command), "--device", "cpu", "--keep-identifiers"])
        assert rc == 1
        cap = capsys.readouterr()
        console = cap.out + cap.err
        assert "DOE_JANE_MRN12345" in console and not TOKEN.search(console), console


def _described(i, ds) -> None:
    _patient(i, ds)
    ds.SeriesDescription = "Chest DOE JANE"


def test_detect_and_reconstruct_keep_identifiers_keep_the_series_description_as_ctpipe_run_does(tmp_path, capsys, monkeypatch):
    import pipeline.ingest.api as api
    from pipeline.ingest.source import read_source
    from tests._support.dicom import write_series

    src = tmp_path / "data" / "DOE_JANE_MRN12345" / "a"
    write_series(src, n=12, series_uid="1.2.3.406", tweak=_described)
    kept, _ = read_source(src, keep_identifiers=True)
    assert kept.metadata["SeriesDescription"] == "Chest DOE JANE"
    assert kept.metadata["PatientID"] == "MRN12345"
    redacted, _ = read_source(src)
    assert "DOE" not in redacted.metadata["SeriesDescription"] and "PatientID" not in redacted.metadata

    # the volume each command reads (the real one, recorded on its way) is the one ctpipe run's option reads
    read = []
    real = api.load_series
    monkeypatch.setattr(api, "load_series", lambda *a, **k: read.append(real(*a, **k)) or read[-1])
    argv = ["--out", str(tmp_path / "r"), "--organs", "lung_left", "--no-render", "--dicom", "none", "--device", "cpu"]
    main(["reconstruct", str(src), *argv, "--keep-identifiers"])  # a tiny series: no body found, exit status 1
    main(["detect", str(src), "--out", str(tmp_path / "d"), "--keep-identifiers", "--bundle", str(tmp_path / "none")])
    capsys.readouterr()
    assert [v.metadata["SeriesDescription"] for v in read] == ["Chest DOE JANE"] * 2
