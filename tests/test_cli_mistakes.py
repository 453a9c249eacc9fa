"""Ordinary mistakes on the command line: each is a one-line error naming the value and the fix, before any work."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.cli import cli_error as _err

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_text("x")
    return path


def test_an_output_that_is_a_file_or_cannot_be_made(tmp_path, capsys, a_file):
    for argv in (
        ["detect", str(SAMPLE / "dicom"), "--out", str(a_file)],
        ["reconstruct", str(SAMPLE / "dicom"), "--out", str(a_file)],
        ["evaluate", "--pred", str(tmp_path), "--truth", str(tmp_path), "--out", str(a_file)],
        ["run", str(SAMPLE / "dicom"), "--out", str(a_file)],
    ):
        rc, err = _err(capsys, *argv)
        assert rc == 1 and f"{a_file}: --out" in err and "a file, not a" in err, argv
    for command in ("detect", "ingest", "reconstruct"):  # was: "(Not a directory). Fix: choose a folder this user can write"
        rc, err = _err(capsys, command, str(SAMPLE / "dicom"), "--out", str(a_file / "sub" / "dir"))
        assert rc == 1 and f"--out: the folder cannot be created: {a_file} is a file, not a folder. " in err, err
        assert f"Fix: give --out a path that does not go through the file {a_file}" in err


def test_a_phantom_out_dir_that_is_a_file_is_refused_before_any_case_is_made(tmp_path, capsys, monkeypatch, a_file):
    # was: the first case generated, then "<a_file>/phantom_00001/dicom: Not a directory. Fix: check the path"
    import pipeline.phantom

    def not_to_be_called(*args, **kwargs):
        raise AssertionError("a phantom was generated for an OUT_DIR that cannot hold it")

    monkeypatch.setattr(pipeline.phantom, "generate_phantom", not_to_be_called)
    rc, err = _err(capsys, "phantom", str(a_file), "--seed", "1", "--matrix", "64", "--slices", "12")
    assert rc == 1 and f"{a_file}: OUT_DIR: this is a file, not a folder. Fix: give OUT_DIR a folder path" in err, err
    rc, err = _err(capsys, "phantom", str(a_file / "sub"), "--seed", "1", "--count", "3")
    assert rc == 1 and f"OUT_DIR: the folder cannot be created: {a_file} is a file, not a folder" in err, err


def test_values_out_of_range_and_unknown_devices(tmp_path, capsys):
    out = str(tmp_path / "o")
    with pytest.raises(SystemExit) as ei:
        main(["evaluate", "--pred", out, "--truth", out, "--out", out, "--bootstrap", "-1"])
    assert ei.value.code == 2 and "--bootstrap: -1 is out of range (>= 0)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:  # numpy's bootstrap generator takes no negative seed: was a traceback
        main(["evaluate", "--pred", out, "--truth", out, "--out", out, "--seed", "-1"])
    assert ei.value.code == 2 and "--seed: -1 is out of range (0..4294967295)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", out, "--out", out, "--hours-per-day", "30"])
    assert "30 is out of range (0.1..24.0)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:  # was exit 1 and "--target-triangles 50 is too small", unlike the others
        main(["reconstruct", str(SAMPLE / "dicom"), "--out", out, "--target-triangles", "50"])
    assert ei.value.code == 2 and "argument --target-triangles: 50 is out of range (>= 100)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:  # was exit 1, after the other options had been taken
        main(["detect", str(SAMPLE / "dicom"), "--out", out, "--device", "cdua"])
    assert ei.value.code == 2 and "argument --device: unknown device 'cdua'" in capsys.readouterr().err
    rc, err = _err(capsys, "detect", str(SAMPLE / "dicom"), "--out", out, "--case-id", "../../escape")
    assert (
        rc == 2 and "'../../escape' is not a plain file name" in err and not (tmp_path.parent / "escape.findings.json").exists()
    )


def test_evaluate_refuses_ground_truth_as_predictions_and_scans_in_no_common(tmp_path, capsys):
    truth = SAMPLE.parent / "phantom_00001"
    rc, err = _err(capsys, "evaluate", "--pred", str(truth / "ground_truth.json"), "--truth", str(truth), "--out", str(tmp_path))
    assert rc == 1 and "not a ctpipe findings JSON" in err and "ground truth goes to --truth" in err
    (tmp_path / "p").mkdir()
    findings = {"format": "ctpipe-findings/1", "series_uid": "9.9.9", "findings": []}
    (tmp_path / "p" / "a.findings.json").write_text(json.dumps(findings))
    rc, err = _err(capsys, "evaluate", "--pred", str(tmp_path / "p"), "--truth", str(truth), "--out", str(tmp_path / "e"))
    assert rc == 1 and "share no scan" in err and "9.9.9" in err
    assert not (tmp_path / "e").exists()  # a failed command leaves no empty --out folder behind


def test_evaluate_scores_a_model_that_found_nothing(tmp_path, capsys):
    """Zero predictions are a result (sensitivity 0), not a mismatch of scan names: a LUNA16 candidates CSV with
    no rows is scored against the truth's scans, and with --scans against the listed ones."""
    truth = SAMPLE.parent / "phantom_00001"
    (tmp_path / "none.csv").write_text("seriesuid,coordX,coordY,coordZ,probability\n")
    rc, _ = _err(capsys, "evaluate", "--pred", str(tmp_path / "none.csv"), "--truth", str(truth), "--out", str(tmp_path / "e"))
    froc = json.loads((tmp_path / "e" / "froc.json").read_text())
    assert rc == 0 and froc["cpm"] == 0.0 and froc["n_scans"] == 1 and froc["n_nodules"] > 0


def test_reconstruct_refuses_junk_findings_and_no_organ_and_one_lung_is_not_the_lungs(tmp_path, capsys):
    (tmp_path / "junk.json").write_text('{"foo": 1}')
    rc, err = _err(
        capsys, "reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--findings", str(tmp_path / "junk.json")
    )
    assert rc == 1 and "not a ctpipe findings JSON" in err
    rc, err = _err(capsys, "reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--organs", " , ")
    assert rc == 2 and "--organs: names no organ" in err
    rc, err = _err(capsys, "reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--organs", "lung,heart")
    assert rc == 2 and "--organs: unknown organ name(s) lung, heart" in err and "organs=[" not in err
    rc, err = _err(capsys, "reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--formats", "stl,fbx")
    assert rc == 2 and "--formats: unknown mesh format(s) ['fbx']" in err and "--formats stl,glb" in err
    rc, err = _err(capsys, "reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--formats", ",")
    assert rc == 2 and "--formats: names no mesh format" in err and not (tmp_path / "r").exists()
    argv = ["reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r1"), "--no-render", "--no-dicom"]
    assert main([*argv, "--organs", "lung_left , lung_right", "--formats", "stl, glb"]) == 0  # spaces around the names
    assert "lungs total" in capsys.readouterr().out
    assert main([*argv, "--organs", "lung_left"]) == 0
    assert "lungs total" not in capsys.readouterr().out
    meas = json.loads(next((tmp_path / "r1").glob("*_measurements.json")).read_text())
    assert meas["lungs"]["lungs_total_volume_ml"] is None and meas["lungs"]["lung_left_volume_ml"] > 0


def test_a_binary_config_and_a_metrics_port_in_use_stop_the_run_before_it_is_recorded(tmp_path, capsys):
    rc, err = _err(capsys, "run", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--config", str(SAMPLE / "masks.npz"))
    assert rc == 1 and "not a text file" in err
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = ["run", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r2"), "--workers", "0", "--metrics-port", str(port)]
        rc, err = _err(capsys, *argv)
    assert rc == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in err
    import sqlite3

    with sqlite3.connect(tmp_path / "r2" / "runs.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


def test_send_and_listen_refuse_what_is_not_theirs(tmp_path, capsys):
    rc, err = _err(capsys, "send", str(SAMPLE), "--to", "dimse://PACS@127.0.0.1:1")
    assert rc == 1 and "not a ctpipe run folder" in err and not (SAMPLE / "pacs").exists()
    rc, err = _err(capsys, "listen", "--out", str(tmp_path / "l"), "--allow", "X", "--ae-title", "THIS_TITLE_IS_WAY_TOO_LONG")
    assert rc == 2 and "pacs.ae_title = 'THIS_TITLE_IS_WAY_TOO_LONG': AE title 'THIS_TITLE_IS_WAY_TOO_LONG' is not valid" in err
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # an address of no interface here (TEST-NET-1): binding fails at once, nothing is sent anywhere
    rc, err = _err(capsys, "listen", "--out", str(tmp_path / "l"), "--allow", "X", "--bind", "192.0.2.1", "--port", str(port))
    assert rc == 1 and "pacs.bind" in err and "not an address of this machine" in err


@pytest.mark.slow
def test_a_run_says_where_its_cases_results_are_and_its_report_counts_it_named_twice_once(tmp_path, capsys):
    """The run's summary names the folder of its cases' results (was: the log, the metrics and the report, not the
    folder of the findings and meshes), and the report over the run folder named twice (``r`` and ``r/``) counts its
    runs and cases once. One run serves both: the report is checked on the run that made the case, before the rerun."""
    from pipeline.runner.report import summarize

    argv = ["run", str(SAMPLE / "dicom"), "--out", str(tmp_path / "r"), "--workers", "0", "--dicom", "none"]
    for i in range(2):  # the run that made them, and a rerun with nothing left to do
        assert main([*argv, "--set", "reconstruct.renderings=false"]) == 0
        out = capsys.readouterr().out
        assert f"results: {tmp_path / 'r' / 'cases'}/<case id>/ (findings.json" in out, out
        if i == 0:
            once, _ = summarize([tmp_path / "r"])
            twice, _ = summarize([tmp_path / "r", str(tmp_path / "r") + "/"])
            assert twice["cases"] == once["cases"]
            assert twice["runs"] == once["runs"] and twice["throughput"]["cases_done"] == once["throughput"]["cases_done"] == 1
    (case,) = (tmp_path / "r" / "cases").iterdir()
    assert (case / "findings.json").is_file() and (case / "recon").is_dir()
    listed = out.split("results: ", 1)[1].split("(", 1)[1].split(")", 1)[0].split(", ")
    assert "dicom/" not in listed  # --dicom none: the run writes no DICOM results
    assert all((case / name.rstrip("/")).exists() for name in listed), (listed, sorted(p.name for p in case.iterdir()))


def test_verbose_goes_before_or_after_the_command(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for i, argv in enumerate((["-v", "run"], ["run", "-v"], ["run", "--verbose"])):
        out = tmp_path / f"r{i}"
        assert main([*argv, str(tmp_path / "empty"), "--out", str(out), "--workers", "0"]) == 0, argv
        assert "INFO pipeline.runner.discover: discovered 0 case(s)" in capsys.readouterr().err, argv
    assert main(["run", str(tmp_path / "empty"), "--out", str(tmp_path / "q"), "--workers", "0", "-v", "--quiet"]) == 0
    assert "INFO" not in capsys.readouterr().err  # --quiet wins


def test_output_read_by_a_pipe_closed_early_is_no_error(tmp_path):
    """ctpipe ... | head: once the reader is gone the rest of the output goes nowhere, with the shell's status for it
    (128 + SIGPIPE), not "error: Broken pipe. Fix: check the path" and status 1, nor a traceback at exit."""
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    argv = [sys.executable, "-m", "pipeline", "run", str(tmp_path / "empty"), "--out", str(tmp_path / "r"), "--workers", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
    assert (tmp_path / "r" / "runs.sqlite").is_file()  # the run itself went through


def test_a_pacs_host_name_that_does_not_resolve_is_said_as_such(tmp_path, capsys):
    """A mistyped DIMSE host is a PACS failure naming the host (exit status 3, as for an archive that is down), not
    "error: Name or service not known. Fix: check the path" (exit status 1)."""
    # the real resolver and pynetdicom: ".invalid" names never resolve (RFC 6761), so the association fails at once
    source = "dimse://PACS@pacs.example.invalid:104?studydate=20261130"
    rc = main(["run", source, "--out", str(tmp_path / "r"), "--workers", "0", "--set", "pacs.retries=0"])
    out = capsys.readouterr()
    assert rc == 3 and "Traceback" not in out.err and "check the path" not in out.err
    assert "PACS failure" in out.err and "the host name 'pacs.example.invalid' is not known" in out.err


def test_a_run_folder_inside_its_source_is_refused_before_it_is_made(tmp_path, capsys):
    # was: the run went ahead, and every later run of the source scanned the run's own SR, SEG, cache and meshes
    from pipeline.atomic import check_out_outside_sources

    src = tmp_path / "dicom"
    src.mkdir()
    files = sorted(f for f in (SAMPLE / "dicom").rglob("*") if f.is_file())[:3]
    for n, f in enumerate(files):
        (src / f"IM{n}").write_bytes(f.read_bytes())
    for out in (src / "runs" / "r1", src):
        rc, err = _err(capsys, "run", str(src), "--out", str(out))
        assert rc == 1 and f"{out}: --out is inside the source folder {src}" in err, err
        assert f"Fix: give --out a folder outside {src}, e.g. {tmp_path / 'runs' / out.name}" in err
    assert sorted(p.name for p in src.iterdir()) == ["IM0", "IM1", "IM2"]  # nothing made in the source
    check_out_outside_sources([src], tmp_path / "runs" / "r1")  # beside the source: fine
    check_out_outside_sources([src / "a.csv"], src / "r1")  # a worklist's folder is not a source folder


@pytest.mark.parametrize(("command", "beside"), [("ingest", "cache"), ("detect", "findings"), ("reconstruct", "recon")])
def test_an_output_folder_inside_the_dicom_source_is_refused_by_every_command(tmp_path, capsys, command, beside):
    # was: accepted, and every later ingest or run of the folder listed the outputs (cache, SR, meshes) as skipped files
    src = tmp_path / "dicom"
    src.mkdir()
    files = sorted(f for f in (SAMPLE / "dicom").rglob("*") if f.is_file())  # a whole series: reconstruct reads it first
    for n, f in enumerate(files):
        (src / f"IM{n:03d}").write_bytes(f.read_bytes())
    for out in (src / beside, src):
        rc, err = _err(capsys, command, str(src), "--out", str(out))
        assert rc == 1 and f"{out}: --out is inside the source folder {src}: every later ctpipe ingest or run of {src}" in err, (
            err
        )
        assert f"Fix: give --out a folder outside {src}, e.g. {tmp_path / beside}" in err
    assert sorted(p.name for p in src.iterdir()) == [f"IM{n:03d}" for n in range(len(files))]  # nothing made there


@pytest.mark.parametrize(
    ("command", "beside"), [("ingest", "cache"), ("detect", "findings"), ("reconstruct", "recon"), ("run", "runs")]
)
def test_an_output_folder_beside_a_single_dicom_source_file_is_refused_by_every_command(tmp_path, capsys, command, beside):
    # was: accepted (only source folders were checked), and every later ingest or run of the file's folder read the
    # command's own outputs back as input
    src = tmp_path / "incoming"
    src.mkdir()
    files = sorted(f for f in (SAMPLE / "dicom").rglob("*") if f.is_file())
    for n, f in enumerate(files):
        (src / f"IM{n:03d}").write_bytes(f.read_bytes())
    one = src / "IM000"
    for out in (src / beside, src):
        rc, err = _err(capsys, command, str(one), "--out", str(out))
        assert rc == 1 and f"{out}: --out is inside {src}, the folder of the source file {one}: every later " in err, err
        assert f"Fix: give --out a folder outside {src}, e.g. {tmp_path / beside}" in err
    assert sorted(p.name for p in src.iterdir()) == [f"IM{n:03d}" for n in range(len(files))]  # nothing made there


def test_a_run_folder_inside_a_folder_a_worklist_row_names_is_refused_before_it_is_made(tmp_path, capsys):
    # was: accepted (only the worklist's own folder was looked at), and every later run of the worklist scanned the
    # run's own SR, SEG and cache in that row's folder
    src = tmp_path / "studies" / "s1"
    src.mkdir(parents=True)
    for n, f in enumerate(sorted(f for f in (SAMPLE / "dicom").rglob("*") if f.is_file())[:3]):
        (src / f"IM{n}").write_bytes(f.read_bytes())
    worklist = tmp_path / "worklist.csv"
    worklist.write_text(f"path\n{src}\n")
    out = src / "runs" / "r1"
    rc, err = _err(capsys, "run", str(worklist), "--out", str(out))
    assert rc == 1 and f"{out}: --out is inside the source folder {src}: every later run of {src}" in err, err
    assert sorted(p.name for p in src.iterdir()) == ["IM0", "IM1", "IM2"]  # nothing made there


def test_a_source_file_that_is_neither_dicom_nor_a_worklist_csv_is_refused(tmp_path, capsys):
    # was: exit 0, "no CT series found in worklist.xlsx: nothing to do", and a run folder with an empty report
    import numpy as np
    import SimpleITK as sitk

    excel = tmp_path / "worklist.xlsx"
    excel.write_bytes(b"PK\x03\x04" + bytes(200))
    image = tmp_path / "chest.nii.gz"
    sitk.WriteImage(sitk.GetImageFromArray(np.full((4, 8, 8), -1000, np.int16)), str(image))
    rc, err = _err(capsys, "run", str(excel), "--out", str(tmp_path / "r1"))
    assert rc == 1 and f"{excel}: neither a DICOM file nor a worklist CSV (.csv). Fix: give a DICOM folder or file" in err
    assert "CSV UTF-8" in err and not (tmp_path / "r1").exists()
    rc, err = _err(capsys, "run", str(SAMPLE / "dicom"), str(image), "--out", str(tmp_path / "r2"))
    assert rc == 1 and f"{image}: a NIfTI/MHA/NRRD image, not a DICOM series" in err
    assert f"Fix: analyse the image with `ctpipe detect {image}`" in err and not (tmp_path / "r2").exists()


def test_an_unknown_dicom_output_names_the_option_once(tmp_path, capsys):
    # was: "argument --dicom: --dicom: unknown DICOM output(s) ['foo'] in 'sr,foo'"
    with pytest.raises(SystemExit) as ei:
        main(["detect", str(SAMPLE / "dicom"), "--out", str(tmp_path / "o"), "--dicom", "sr,foo"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert ei.value.code == 2 and last == (
        "ctpipe detect: error: argument --dicom: unknown DICOM output(s) ['foo'] in 'sr,foo'. "
        "Fix: choose from sr, seg, a comma-separated list of them, or none"
    )


def test_a_missing_bundle_stops_the_run_before_its_folder_is_made(tmp_path, capsys):
    # was: the run folder made and the run recorded, ingest and the lungs done, then "stage detect cannot start"
    out = tmp_path / "r"
    rc, err = _err(capsys, "run", str(SAMPLE / "dicom"), "--out", str(out), "--bundle", str(tmp_path / "no_bundle"))
    assert rc == 1 and f"ctpipe run: error: {tmp_path / 'no_bundle'}: no such bundle folder" in err
    assert "Fix: check the path; a bundle is the folder holding configs/ and models/" in err and not out.exists()


def test_device_auto_as_the_device_error_suggests_is_taken_by_detect_and_reconstruct(tmp_path, capsys, monkeypatch):
    # was: a RuntimeError traceback ("Expected one of cpu, cuda, ... at start of device string: auto"), though the
    # error for --device cuda on a machine without a GPU says "Fix: ask for cpu, or auto"
    import torch

    import pipeline.detection.infer as infer

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    out = tmp_path / "recon"
    argv = ["reconstruct", str(SAMPLE / "dicom"), "--out", str(out), "--device", "auto", "--organs", "body"]
    rc, err = _err(capsys, *argv, "--no-render", "--no-dicom")
    assert rc == 0, err
    assert sorted(p.name.split("_", 1)[1] for p in out.iterdir()) == ["body.stl", "labels.npz", "measurements.json"]

    seen = []

    class Stop(Exception):
        pass

    def detector(**kwargs):
        seen.append(kwargs["device"])
        raise Stop

    monkeypatch.setattr(infer, "Detector", detector)
    for given in ("auto", "AUTO"):
        with pytest.raises(Stop):
            main(["detect", str(SAMPLE / "dicom"), "--out", str(tmp_path / "det"), "--device", given])
    assert seen == [expected, expected]


def test_a_metrics_textfile_dir_that_is_a_file_stops_the_run_before_it_starts(tmp_path, capsys, a_file):
    # was: every case processed, then at the end "ctpipe run: error: <file>: File exists. Fix: check the path",
    # exit status 1 and no report
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r"
    argv = ["run", str(tmp_path / "empty"), "--out", str(out), "--workers", "0", "--set", f"metrics.textfile_dir={a_file}"]
    rc, err = _err(capsys, *argv)
    assert rc == 1 and f"{a_file}: metrics.textfile_dir: this is a file, not a folder" in err, err
    assert "Fix: give metrics.textfile_dir a folder path" in err and not out.exists()


def test_a_worklist_root_that_is_not_a_folder_is_refused_before_the_run(tmp_path, capsys, a_file):
    # was: every relative row quarantined, "the path does not exist", and exit status 3
    worklist = tmp_path / "worklist.csv"
    worklist.write_text("path\nphantom_00003/dicom\n")
    for root, what in ((a_file, "is a file"), (tmp_path / "nowhere", "does not exist")):
        out = tmp_path / f"r_{root.name}"
        rc, err = _err(capsys, "run", str(worklist), "--out", str(out), "--set", f"runner.worklist_root={root}")
        assert rc == 1 and f"{root}: runner.worklist_root, the folder relative worklist paths start from, {what}" in err
        assert "Fix: set runner.worklist_root to the folder holding the worklist's series" in err and not out.exists()
