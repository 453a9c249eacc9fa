"""``ctpipe listen`` tells the operator, at the default log level, one line per series handed to the runner with its
outcome: done with its case, or quarantined with the reason (the library logs it; the command prints it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.pacs import Listener
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import cstore, free_port, write_phantom_series

pytestmark = pytest.mark.pacs

AET = "CTPIPE_L"


def test_ctpipe_listen_prints_each_quarantined_series_with_its_reason(tmp_path):
    uid, files = write_phantom_series(tmp_path / "case", 7)
    gap = files[:7] + files[8:]  # slice 8 never arrives: handed over after pacs.series_limit_s, then quarantined
    run, port, log = tmp_path / "run", free_port(), tmp_path / "listen.log"
    cmd = [sys.executable, "-m", "pipeline", "listen", "--out", str(run), "--port", str(port), "--ae-title", AET]
    cmd += ["--allow", "ORTHANC", "--quiet-period", "0.5", "--set", "pacs.series_limit_s=2", "--set", "report.enabled=false"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTPIPE_")}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while "listening as" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert cstore(gap, port, called=AET) == [0] * len(gap)
        deadline = time.monotonic() + 90
        while "quarantined" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    (line,) = [ln for ln in log.read_text().splitlines() if ln.startswith(f"series {uid}")]
    assert f"{len(gap)} instance(s) from ORTHANC" in line and ": quarantined" in line, line
    assert "MissingSliceError" in line and "1 slice(s) missing" in line and "case " in line, line


def test_a_series_processed_successfully_is_said_with_its_case(tmp_path, capsys):
    from pipeline.pacs.cli import print_series_outcome  # what ctpipe listen prints each outcome with

    uid, files = write_phantom_series(tmp_path / "case", 8)
    opts = {
        "pacs.ae_title": AET,
        "pacs.port": free_port(),
        "pacs.allowed_aets": ["ORTHANC"],
        "pacs.quiet_period_s": 0.5,
        "report.enabled": False,
        "workers": 0,
    }
    cfg = load_config(overrides=opts, environ={})
    lst = Listener(tmp_path / "run", cfg, stages=[IngestStage(), WriteStage()], poll_s=0.1, on_series=print_series_outcome)
    with lst:
        assert cstore(files, lst.port, called=AET) == [0] * len(files)
        deadline = time.monotonic() + 30
        while not lst.step():
            assert time.monotonic() < deadline, "no series was handed to the runner in time"
            time.sleep(0.2)
    lines = capsys.readouterr().out.splitlines()
    (case_dir,) = (Path(tmp_path / "run") / "cases").iterdir()
    assert lines == [f"series {uid} (generation 1, {len(files)} instance(s) from ORTHANC): done, case {case_dir.name}"]
