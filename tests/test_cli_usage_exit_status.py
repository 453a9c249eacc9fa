"""A value on the command line that is not allowed is a bad argument, exit status 2, whichever command and whichever
check refuses it (argparse's own or a later one): one line naming the flag, the bad value and what is allowed, before
any work. What the command meets later (a source, a config file, the machine) stays exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"


def _status(capsys, argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of ``ctpipe argv``, whether argparse exits or the command returns."""
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "SRC", "--out", "OUT", "--set", "runner.retries=abc"], ["--set runner.retries=abc", "'abc'", "[0, 10]"]),
        (["run", "SRC", "--out", "OUT", "--set", "runner.retriez=1"], ["--set runner.retriez=1", "did you mean runner.retries"]),
        (["run", "SRC", "--out", "OUT", "--set", "runer.workers=1"], ["--set runer.workers=1", "allowed: ingest"]),
        (["run", "SRC", "--out", "OUT", "--set", "reconstruct.mesh_formats=[stl"], ["'[stl' is not valid YAML"]),
        (["run", "SRC", "--out", "OUT", "--set", "reconstruct.mesh_formats=stl,fbx"], ["fbx", "stl, ply, obj, glb"]),
        (["run", "SRC", "--out", "OUT", "--device", "gpu0"], ["--device", "'gpu0'", "cpu, gpu or cuda"]),
        (["run", "SRC", "--out", "OUT", "--ray", "nowhere"], ["--ray", "'nowhere'", "auto, local or HOST:PORT"]),
        (["listen", "--out", "OUT", "--allow", "X", "--set", "runner.retries=abc"], ["--set runner.retries=abc", "[0, 10]"]),
        (["listen", "--out", "OUT", "--allow", "X", "--device", "gpu0"], ["--device", "'gpu0'", "cpu, gpu or cuda"]),
        (["listen", "--out", "OUT", "--allow", "X", "--ae-title", "A" * 17], ["--ae-title", "A" * 17, "1 to 16"]),
        (["listen", "--out", "OUT", "--allow", "X", "--send-to", "ftp://x"], ["--send-to", "'ftp'", "dimse://"]),
        (["send", "SRC", "--to", "ftp://x"], ["--to", "'ftp'", "dimse://AET@HOST:PORT"]),
        (["send", "SRC", "--set", "pacs.port=abc"], ["--set pacs.port=abc", "[1, 65535]"]),
        (["detect", "SAMPLE", "--out", "OUT", "--device", "cdua"], ["argument --device", "'cdua'", "cpu, gpu or cuda"]),
        (["detect", "SAMPLE", "--out", "OUT", "--case-id", "../x"], ["--case-id", "'../x'", "letters, digits"]),
        (["reconstruct", "SAMPLE", "--out", "OUT", "--device", "cdua"], ["argument --device", "'cdua'", "cuda:N"]),
        (["reconstruct", "SAMPLE", "--out", "OUT", "--formats", "stl,fbx"], ["--formats", "fbx", "stl,ply,obj,glb"]),
        (["reconstruct", "SAMPLE", "--out", "OUT", "--formats", ","], ["--formats", "names no mesh format", "stl,ply"]),
        (["reconstruct", "SAMPLE", "--out", "OUT", "--organs", "lung,heart"], ["--organs", "lung, heart", "lung_left"]),
        (["phantom", "OUT", "--seed", "1", "--nodule-diameter", "30", "3"], ["--nodule-diameter 30 3", "--nodule-diameter 3 30"]),
        (["phantom", "OUT", "--seed", "1", "--seed-offset", "5"], ["--seed-offset", "with --scenario and without --seed"]),
        (["phantom", "OUT"], ["--seed is required without --scenario"]),
        (["ingest", "SAMPLE", "--out", "OUT", "--json", "OUT"], ["--json names the --out cache folder"]),
        # argparse's own, for comparison: the same status
        (["run", "SRC", "--out", "OUT", "--workers", "x"], ["argument --workers", "'x'"]),
        (["report", "SRC", "--out", "OUT", "--timezone", "Mars/Base"], ["argument --timezone", "'Mars/Base'"]),
    ],
)
def test_a_value_that_is_not_allowed_exits_2_naming_flag_value_and_the_allowed(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    (tmp_path / "src").mkdir()
    paths = {"SRC": str(tmp_path / "src"), "OUT": str(tmp_path / "out"), "SAMPLE": str(SAMPLE / "dicom")}
    rc, err = _status(capsys, [paths.get(a, a) for a in argv])
    line = err.strip().splitlines()[-1]
    assert rc == 2, err
    assert line.startswith(f"ctpipe {argv[0]}: error: "), err
    assert all(s in line for s in says), (says, line)
    assert not (tmp_path / "out").exists()  # refused before any output is made


def test_what_the_command_meets_later_stays_exit_status_1(tmp_path, capsys, monkeypatch):
    """A config file, a variable of the environment or a source that is wrong is no bad argument."""
    (tmp_path / "src").mkdir()
    (tmp_path / "c.yaml").write_text("runner:\n  retries: abc\n")
    run = ["run", str(tmp_path / "src"), "--out", str(tmp_path / "out")]
    rc, err = _status(capsys, [*run, "--config", str(tmp_path / "c.yaml")])
    assert rc == 1 and "runner.retries = 'abc' is not allowed" in err and "c.yaml" in err
    rc, err = _status(capsys, [*run, "--config", str(tmp_path / "nope.yaml")])
    assert rc == 1 and "cannot read the config file" in err
    monkeypatch.setenv("CTPIPE_RUNNER_RETRIES", "abc")
    rc, err = _status(capsys, run)
    assert rc == 1 and "environment variable CTPIPE_RUNNER_RETRIES" in err
    monkeypatch.delenv("CTPIPE_RUNNER_RETRIES")
    rc, err = _status(capsys, ["send", str(tmp_path / "src")])
    assert rc == 1 and "not a ctpipe run folder" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "SRC", "--out"],
        ["listen", "--allow", "X", "--out"],
        ["report", "SRC", "--out"],
        ["detect", "SAMPLE", "--out"],
        ["reconstruct", "SAMPLE", "--out"],
        ["ingest", "SAMPLE", "--out"],
        ["evaluate", "--pred", "SRC", "--truth", "SRC", "--out"],
        ["phantom", "--seed", "1"],  # its OUT_DIR
    ],
    ids=lambda a: a[0],
)
@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_out_exits_2_before_writing_into_the_current_folder(tmp_path, capsys, monkeypatch, argv, empty):
    """``--out "$RUN_DIR"`` with the variable unset: ``ctpipe run`` wrote its run folder (cases, cache, report,
    runs.sqlite) into the current folder, ``ctpipe phantom ""`` its case folders."""
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    (tmp_path / "src").mkdir()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    paths = {"SRC": str(tmp_path / "src"), "SAMPLE": str(SAMPLE / "dicom")}
    rc, err = _status(capsys, [*(paths.get(a, a) for a in argv), empty])
    line = err.strip().splitlines()[-1]
    assert rc == 2, err
    named = "--out" if "--out" in argv else "OUT_DIR"
    assert line.startswith(f"ctpipe {argv[0]}: error: argument {named}: "), err
    assert "is empty: it would write into the current folder" in line and "e.g. runs/r1" in line, line
    assert not any(here.iterdir())


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["run", "", "--out", "OUT"], "SRC"),
        (["detect", "", "--out", "OUT"], "SRC"),
        (["reconstruct", "", "--out", "OUT"], "SRC"),
        (["ingest", "", "--out", "OUT"], "SRC"),
        (["report", "", "--out", "OUT"], "RUN_DIR"),
        (["send", "", "--to", "dimse://ARCHIVE@127.0.0.1:11112"], "RUN_DIR"),
        (["evaluate", "--pred", "", "--truth", "SAMPLE", "--out", "OUT"], "--pred"),
        (["evaluate", "--pred", "SAMPLE", "--truth", "", "--out", "OUT"], "--truth"),
    ],
    ids=lambda a: a[0] if isinstance(a, list) else a,
)
def test_an_empty_source_exits_2_naming_it_instead_of_reading_the_current_folder(tmp_path, capsys, monkeypatch, argv, named):
    """``ctpipe detect "$SERIES" --out x`` with the variable unset read the current folder as its source, and said
    only that --out lay inside the source folder '.'."""
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    paths = {"OUT": str(tmp_path / "out"), "SAMPLE": str(SAMPLE)}
    rc, err = _status(capsys, [paths.get(a, a) for a in argv])
    line = err.strip().splitlines()[-1]
    assert rc == 2, err
    assert line.startswith(f"ctpipe {argv[0]}: error: argument {named}: ''"), err
    assert "is empty: it would name the current folder; give the folder or file to read" in line, line
    assert not any(here.iterdir()) and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "SRC", "--out", "OUT", "--wrokers", "4"], ["--wrokers 4", "did you mean --workers?", "ctpipe run --help"]),
        (["detect", "SAMPLE", "--out", "OUT", "--treshold=0.5"], ["--treshold=0.5", "ctpipe detect --help"]),
        (
            ["report", "SRC", "--out", "OUT", "--gpu", "2", "--node", "1", "--bin", "5", "--hours", "8", "--time-zone", "UTC"],
            ["--time-zone UTC", "did you mean --timezone?"],
        ),
        (["ingest", "SRC", "--out", "OUT", "SAMPLE"], ["unrecognized arguments: SAMPLE", "all before or all after the options"]),
        (["detect", "SRC", "SAMPLE", "--out", "OUT"], ["unrecognized arguments: SAMPLE", "ctpipe detect --help"]),
        (["ingest", "SRC", "--out", "OUT", "--wrkers", "2"], ["--wrkers 2; see ctpipe ingest --help"]),  # no hidden name
    ],
)
def test_an_unknown_argument_names_the_command_and_the_likely_option(tmp_path, capsys, argv, says):
    """was: ``ctpipe: error: unrecognized arguments: --wrokers 4`` below the usage of ``ctpipe`` itself, naming
    neither the command nor what was meant."""
    (tmp_path / "src").mkdir()
    paths = {"SRC": str(tmp_path / "src"), "OUT": str(tmp_path / "out"), "SAMPLE": str(SAMPLE / "dicom")}
    rc, err = _status(capsys, [paths.get(a, a) for a in argv])
    line = err.strip().splitlines()[-1]
    assert rc == 2, err
    assert f"usage: ctpipe {argv[0]} " in err, err
    assert line.startswith(f"ctpipe {argv[0]}: error: unrecognized arguments: "), err
    assert all(s.replace("SAMPLE", paths["SAMPLE"]) in line for s in says), (says, line)
    assert not (tmp_path / "out").exists()
