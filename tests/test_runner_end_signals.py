"""A stop signal (Ctrl-C, SIGTERM) at the end of a run: each is sent from a point the run passes through, so each
moment is met every time."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner import run_batch
from tests._support.runner import db_rows


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines()]


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
