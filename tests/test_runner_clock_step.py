"""The machine's clock stepped back (an NTP correction, a VM resumed) while a nightly run works on a case: the case's
latency is the time it took, measured on a clock that never goes back, not a negative figure from the wall clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.runner import open_run, run_batch
from pipeline.runner.stage import CaseContext, Stage
from pipeline.runner.stages import IngestStage

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"
STEP_S = 3600.0


class _ClockStepsBack(Stage):
    """A stage during which the wall clock is set back by an hour (``time.time`` of this process, as a step of the
    system clock moves it; the monotonic clock goes on)."""

    name = "write"

    def __init__(self, monkeypatch: Any) -> None:
        self.monkeypatch = monkeypatch

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        wall = time.time
        self.monkeypatch.setattr(time, "time", lambda: wall() - STEP_S)
        time.sleep(0.2)
        return {}


def test_a_clock_stepped_back_during_a_case_leaves_its_latency_positive(tmp_path, monkeypatch):
    # was: latency_s about -3600 in the run store, the report and the case_done log record
    summary = run_batch(
        [SAMPLE],
        out=tmp_path / "run",
        workers=0,
        stages=[IngestStage(), _ClockStepsBack(monkeypatch)],
        **{"report.enabled": False, "metrics.textfile": False},
    )
    assert summary.exit_code == 0 and summary.done == 1
    (latency,) = open_run(tmp_path / "run").cases.latency_s
    assert 0.2 <= latency < 600.0, latency


def test_a_killed_runs_active_time_is_measured_on_the_monotonic_clock(tmp_path, monkeypatch):
    # was: active_s 0 (its end taken from its last stage's wall-clock end, an hour before its start), so the report's
    # active hours and cases/hour left the run out
    from pipeline.runner.report import summarize
    from tests._support.runner import db_rows
    from tests.test_runner_report_tables import _clock, _dead_pid

    out = tmp_path / "run"
    summary = run_batch(
        [SAMPLE],
        out=out,
        workers=0,
        stages=[IngestStage(), _ClockStepsBack(monkeypatch)],
        **{"report.enabled": False, "metrics.textfile": False},
    )
    assert summary.exit_code == 0 and summary.done == 1
    monkeypatch.undo()  # the clock as it is; then the run as a SIGKILL leaves it: no end record, its process gone
    _clock(out, "UPDATE runs SET ended_at = NULL, status = 'running', pid = ?", (_dead_pid(),))
    ((started,),) = db_rows(out, "SELECT started_at FROM runs")
    ends = dict(db_rows(out, "SELECT stage, ended_at FROM stage_attempts"))
    assert ends["write"] < started < ends["ingest"]  # the wall clock went back during the run's last stage
    (run,) = summarize([out])[0]["runs_table"]
    assert run["status"] == "interrupted"
    assert ends["ingest"] - started + 0.2 <= run["active_s"] < 600.0, run  # ingest, then the 0.2 s of the last stage
