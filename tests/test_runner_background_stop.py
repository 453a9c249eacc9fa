"""``ctpipe run`` started in the background by a shell script (no job control): the shell has it ignore SIGINT, so
that a Ctrl-C at the script's terminal does not stop its background jobs. The run keeps that choice, as nohup's
SIGHUP is kept, says so in run.log, and stops on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._support.orthanc import free_port

pytestmark = pytest.mark.slow


def _events(run_dir: Path) -> list[dict]:
    log = run_dir / "run.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def _wait_for(what, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_run_started_in_the_background_by_a_script_says_to_stop_it_with_sigterm(tmp_path):
    (tmp_path / "incoming").mkdir()
    run = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", str(tmp_path / "incoming"), "--out", str(run), "--quiet",
        "--set", f"metrics.port={free_port()}", "--set", "metrics.linger_s=120", "--set", "report.enabled=false",
    ]  # fmt: skip
    script = " ".join(f"'{c}'" for c in cmd) + ' & echo "$!"; wait "$!"; echo "exit $?"'  # as a nightly script does
    pid = None
    sh = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert sh.stdout is not None
        pid = int(sh.stdout.readline())
        lingering = _wait_for(lambda: [e for e in _events(run) if e.get("event") == "metrics_linger"])
        assert lingering
        notes = [e for e in _events(run) if e.get("event") == "stop_signals"]
        assert len(notes) == 1 and "SIGTERM" in notes[0]["msg"] and f"kill {pid}" in notes[0]["msg"], notes

        os.kill(pid, signal.SIGINT)  # ignored, as the shell asked
        time.sleep(1.0)
        assert sh.poll() is None
        os.kill(pid, signal.SIGTERM)
        out, _ = sh.communicate(timeout=30)
        # the run had ended (its summary printed before the metrics' linger): SIGTERM only ended that wait
        assert out.strip().splitlines()[-1] == "exit 0", out
    finally:
        if sh.poll() is None:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            sh.kill()
