"""A stop signal (Ctrl-C, SIGTERM) at any moment once a run's work is over, from the recording of its end to the exit of
``ctpipe run``, leaves the run recorded as it ended and its exit status the run's: it only ends the metrics linger
early. One that comes while a case is still running interrupts the run, as always, and nothing of that case is
published. Each signal is sent from a point the run passes through, so each moment is met every time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner import run_batch
from pipeline.runner.cli import stop_once
from pipeline.runner.stage import CaseContext, Stage
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import free_port
from tests._support.runner import PHANTOM, db_rows

ROOT = Path(__file__).resolve().parents[1]

# ``ctpipe run`` (as the console command) with a stop signal sent to itself at one point of its end: argv[1] names the
# point (a function the run calls), argv[2] the signal, after it returns; the command's arguments follow
_SIGNAL_AT = """
import gc, os, signal, sys
import pipeline.cli as top
import pipeline.runner.batch as batch
import pipeline.runner.cli as run_cli
from pipeline.runner.metrics import RunMetrics
from pipeline.runner.resume import RunLock
from pipeline.runner.store import RunStore

point, sig = sys.argv[1], getattr(signal, sys.argv[2])
owner, name = {
    "store_end": (RunStore, "end_run"),  # the run store records the run's end
    "report": (batch, "build_or_mark_report"),
    "run_end": (batch, "log_run_end"),  # run_end in run.log
    "summary": (run_cli, "_print_summary"),  # the summary printed, the metrics linger about to begin
    "metrics_stop": (RunMetrics, "stop"),
    "lock": (RunLock, "release"),  # the run folder handed back
    "exit": (gc, "freeze"),  # ctpipe about to exit
}[point]
real = getattr(owner, name)

def then_signal(*args, **kwargs):
    out = real(*args, **kwargs)
    os.kill(os.getpid(), sig)
    return out

setattr(owner, name, then_signal)
sys.argv = ["ctpipe", *sys.argv[3:]]
top.console_main()
"""


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines()]


@pytest.mark.parametrize(
    ("point", "signame", "linger_s"),
    [
        ("store_end", "SIGINT", 300),
        ("report", "SIGTERM", 300),
        ("run_end", "SIGINT", 300),
        ("summary", "SIGINT", 300),
        ("metrics_stop", "SIGINT", 0),
        ("lock", "SIGINT", 0),
        ("exit", "SIGINT", 0),
        ("exit", "SIGTERM", 0),
    ],
)
def test_a_stop_signal_once_the_run_has_ended_leaves_it_complete_and_exit_0(tmp_path, point, signame, linger_s):
    (tmp_path / "incoming").mkdir()  # a night without new studies: every case (none) finished
    run = tmp_path / "run"
    cmd = [
        sys.executable, "-c", _SIGNAL_AT, point, signame,
        "run", str(tmp_path / "incoming"), "--out", str(run), "--workers", "0", "--set", "report.enabled=true",
        "--set", f"metrics.port={free_port()}", "--set", f"metrics.linger_s={linger_s}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a terminal's Ctrl-C reaches the run whatever this test process does with SIGINT; in less than the linger: the
    # signal, come before it, also ends it
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "interrupted" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stdout.startswith("run ") and "0 case(s) done" in p.stdout.splitlines()[0], p.stdout
    if point in ("store_end", "report", "run_end"):  # come before the summary: it says the endpoint is not kept up
        assert "stays up" not in p.stdout, p.stdout
    assert db_rows(run, "SELECT status FROM runs") == [("completed",)]
    (end,) = [r for r in _records(run) if r.get("event") == "run_end"]
    assert end["run_status"] == "completed" and end["exit_status"] == 0, end
    assert json.loads((run / "report" / "status.json").read_text())["runs"][0]["status"] == "completed"
    prom = (run / "metrics.prom").read_text()
    assert [ln for ln in prom.splitlines() if ln.startswith("ctpipe_run_exit_status")][0].endswith(" 0.0")


def test_a_stop_signal_as_a_run_of_run_batch_records_its_end_reaches_the_caller_after(tmp_path, monkeypatch):
    """Python's own Ctrl-C (KeyboardInterrupt) is held while the run's end is recorded, then raised to the caller: the
    run recorded complete, its report and run_end written (as ``ctpipe listen`` stops after a batch so ended)."""
    import pipeline.runner.batch as batch

    real = batch.build_or_mark_report

    def then_ctrl_c(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the run's end is being recorded: its report comes next
        real(*args, **kwargs)

    monkeypatch.setattr(batch, "build_or_mark_report", then_ctrl_c)
    (tmp_path / "src").mkdir()
    out = tmp_path / "run"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        run_batch([tmp_path / "src"], out=out, workers=0, **{"report.enabled": True})
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert db_rows(out, "SELECT status FROM runs") == [("completed",)]
    events = [r.get("event") for r in _records(out)]
    assert "report" in events and events[-1] == "stop_after_end", events
    (end,) = [r for r in _records(out) if r.get("event") == "run_end"]
    assert end["run_status"] == "completed" and end["exit_status"] == 0, end


class _StopAtLastCase(Stage):
    """Sends ``ctpipe run`` a SIGTERM (handled as it handles it) while the last of two cases runs."""

    name = "stop_at_last_case"

    def __init__(self) -> None:
        self.seen = 0

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        self.seen += 1
        if self.seen == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return {}


def test_a_stop_signal_while_the_last_case_runs_interrupts_the_run_and_publishes_nothing_of_it(tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    for seed in (61, 62):
        write_phantom_case(generate_phantom(seed, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / "src" / f"c{seed}")
    out = tmp_path / "run"
    replaced = stop_once(str(out))
    try:
        with pytest.raises(KeyboardInterrupt):
            run_batch([tmp_path / "src"], out=out, stages=[IngestStage(), _StopAtLastCase(), WriteStage()], workers=0)
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    (end,) = [r for r in _records(out) if r.get("event") == "run_end"]
    assert end["run_status"] == "interrupted" and end["exit_status"] == 130 and end["unfinished"] == 1, end
    done = [cid for (cid,) in db_rows(out, "SELECT case_id FROM cases WHERE status = 'done'")]
    assert len(done) == 1 and sorted(p.name for p in (out / "cases").iterdir()) == done  # the last case not published
    assert json.loads((out / "report" / "status.json").read_text())["state"] == "interrupted"


def test_a_stop_signal_while_the_run_closes_its_workers_is_recorded_as_an_interruption(tmp_path, monkeypatch):
    """Ctrl-C after the engine's last case, while the workers close (before the run's end is recorded): the run is
    recorded as interrupted (run store, run_end, report), not left "in progress" with no end at all."""
    from pipeline.runner.task_run import InlineExecutor

    real = InlineExecutor.close

    def then_ctrl_c(self: InlineExecutor) -> None:
        real(self)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(InlineExecutor, "close", then_ctrl_c)
    (tmp_path / "src").mkdir()
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_batch([tmp_path / "src"], out=out, workers=0, **{"report.enabled": True})
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    (end,) = [r for r in _records(out) if r.get("event") == "run_end"]
    assert end["run_status"] == "interrupted" and end["exit_status"] == 130, end
    assert json.loads((out / "report" / "status.json").read_text())["state"] == "interrupted"
