"""A crash and a stop signal in one ``ctpipe run``: the crash's exit status (1, with its traceback) stands, whether the
signal came once the run's work was over (held while the run's end is recorded: it stopped nothing) or interrupted
the run before the crash; the run store keeps the run as it ended. A stop signal alone still exits 130 only when it
stopped the run (tests/test_runner_end_signals.py, tests/test_runner_interrupted.py).

Each run is a real ``ctpipe run`` process; the signal is sent to it by its PID once it has reached the moment the test
is about, which it announces by creating a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._support.runner import db_rows

ROOT = Path(__file__).resolve().parents[1]

# ``ctpipe run`` (as the console command) that crashes while its report is written. argv[1] names the moment the
# signal comes: "after_end" (the run's work over, its end being recorded: the report writer waits for the signal, held
# by then, and crashes) or "closing" (the workers closing, before the end is recorded: the signal interrupts the run,
# then the report writer crashes). argv[2]: the file created once that moment is reached; the command's arguments follow
_CRASH_AT = """
import os, sys, time
import pipeline.cli as top
import pipeline.runner.batch as batch
from pipeline.runner.end_signals import EndSignals
from pipeline.runner.task_run import InlineExecutor

moment, ready = sys.argv[1], sys.argv[2]
holders = []
real_hold, real_close = EndSignals.hold, InlineExecutor.close

def hold(self):
    holders.append(self)
    real_hold(self)

def announce_then_wait(received):
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not received() and time.monotonic() < deadline:
        time.sleep(0.01)

def close(self):
    real_close(self)
    if moment == "closing":  # the signal's KeyboardInterrupt ends this wait
        announce_then_wait(lambda: False)

def report(*args, **kwargs):
    if moment == "after_end":
        announce_then_wait(lambda: holders[-1].noted is not None)
    raise RuntimeError("the report writer broke")

EndSignals.hold, InlineExecutor.close, batch.build_or_mark_report = hold, close, report
sys.argv = ["ctpipe", *sys.argv[3:]]
top.console_main()
"""


def _run_and_signal(tmp_path: Path, moment: str, signum: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "incoming").mkdir()
    ready = tmp_path / "ready"
    cmd = [
        sys.executable, "-c", _CRASH_AT, moment, str(ready),
        "run", str(tmp_path / "incoming"), "--out", str(tmp_path / "run"), "--workers", "0",
        "--set", "report.enabled=true",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a terminal's Ctrl-C reaches the run whatever this test process does with SIGINT
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"ctpipe run never reached {moment}: {p.poll()}"
        os.kill(p.pid, signum)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_crash_while_a_stop_signal_is_held_exits_with_the_crash_not_130(tmp_path, signame):
    p = _run_and_signal(tmp_path, "after_end", getattr(signal, signame))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" in p.stderr and "RuntimeError: the report writer broke" in p.stderr, p.stderr
    assert "interrupted" not in p.stderr, p.stderr
    assert f"{signame} came after the run's work was over" in p.stderr, p.stderr  # the traceback says so too
    assert db_rows(tmp_path / "run", "SELECT status FROM runs") == [("completed",)]
    records = [json.loads(line) for line in (tmp_path / "run" / "run.log").read_text().splitlines()]
    (held,) = [r for r in records if r.get("event") == "stop_after_crash"]
    assert held["msg"].startswith(f"{signame} came after") and held["level"] == "warning", held


def test_a_crash_after_a_stop_signal_interrupted_the_run_exits_with_the_crash(tmp_path):
    """Both: the signal stopped the run (recorded as interrupted), then recording its end crashed. The crash's status
    and traceback: the run's record is incomplete (no report), which a scheduler must see as a failure."""
    p = _run_and_signal(tmp_path, "closing", signal.SIGTERM)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" in p.stderr and "RuntimeError: the report writer broke" in p.stderr, p.stderr
    assert db_rows(tmp_path / "run", "SELECT status FROM runs") == [("interrupted",)]


@pytest.mark.parametrize("handler", ["python", "listen"])
def test_a_crash_while_a_stop_signal_is_held_reaches_the_caller_of_run_batch_marked_with_the_signal(
    tmp_path, monkeypatch, handler
):
    """Python's own Ctrl-C, and ``ctpipe listen``'s handler (which outlives a failed batch, and stops on the mark)."""
    import pipeline.runner.batch as batch
    from pipeline.runner import run_batch
    from pipeline.runner.cli import stop_once
    from pipeline.runner.end_signals import held_stop

    def ctrl_c_then_crash(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # held: the run's end is being recorded
        raise RuntimeError("the report writer broke")

    monkeypatch.setattr(batch, "build_or_mark_report", ctrl_c_then_crash)
    (tmp_path / "src").mkdir()
    out = tmp_path / "run"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    replaced = stop_once(str(out)) if handler == "listen" else {}
    installed = signal.getsignal(signal.SIGINT)
    caught: BaseException | None = None
    try:
        run_batch([tmp_path / "src"], out=out, workers=0, **{"report.enabled": True})
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt too: what the crash must not become
        caught = exc
    finally:
        ours = signal.getsignal(signal.SIGINT)
        for signum, old in replaced.items():
            signal.signal(signum, old)
    assert isinstance(caught, RuntimeError) and str(caught) == "the report writer broke", repr(caught)
    assert held_stop(caught) == signal.SIGINT
    assert ours is installed  # the caller's handler back, not the one that held the signal
    assert db_rows(out, "SELECT status FROM runs") == [("completed",)]
