"""A run stopped by Ctrl-C, SIGTERM or SIGHUP (``ctpipe run`` turns the signals into KeyboardInterrupt) leaves the
same trail as any other end: a ``run_end`` record in run.log with exit status 130, a report whose status says
interrupted (not "in progress" until the next run), and metrics with exit status 130; then the interruption is
raised again to the caller."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner import run_batch
from pipeline.runner.stage import CaseContext, Stage
from pipeline.runner.stages import IngestStage
from tests._support.runner import PHANTOM, db_rows


class _StopAtSecondCase(Stage):
    """Completes the first case; the second one is "signalled" (KeyboardInterrupt, as ctpipe run's SIGTERM handler)."""

    name = "stop_at_second"

    def __init__(self) -> None:
        self.seen = 0

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        self.seen += 1
        if self.seen == 2:
            raise KeyboardInterrupt
        return {}


def _two_cases(root: Path) -> Path:
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    for seed in (51, 52):
        write_phantom_case(generate_phantom(seed, n_nodules=0, **{**PHANTOM, "slices": 12}), root / "src" / f"case{seed}")
    return root / "src"


def test_an_interrupted_run_is_logged_reported_and_counted_as_interrupted(tmp_path):
    src, out = _two_cases(tmp_path), tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_batch([src], out=out, stages=[IngestStage(), _StopAtSecondCase()], workers=0)
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    end = [r for r in records if r.get("event") == "run_end"]
    assert len(end) == 1 and end[0]["exit_status"] == 130 and end[0]["run_status"] == "interrupted"
    assert end[0]["done"] == 1 and end[0]["level"] == "warning" and "the same command resumes it" in end[0]["msg"]
    # the line an operator reads on the console accounts for every case, as the record's fields do
    assert end[0]["unfinished"] == 1 and end[0]["cases"] == 2
    assert "1 done, 0 newly quarantined" in end[0]["msg"] and "1 unfinished (left for the next run)" in end[0]["msg"]
    assert "0 already done earlier, of 2" in end[0]["msg"]
    status = json.loads((out / "report" / "status.json").read_text())
    assert status["state"] == "interrupted", status
    assert 'ctpipe_run_exit_status{node="' in (prom := (out / "metrics.prom").read_text())
    assert [ln for ln in prom.splitlines() if ln.startswith("ctpipe_run_exit_status")][0].endswith(" 130.0")
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    s = run_batch([src], out=out, stages=[IngestStage(), _StopAtSecondCase()], workers=0)  # resumes: the second case
    assert s.exit_code == 0 and s.done == 1 and s.skipped == 1


def test_a_worker_whose_main_process_is_gone_exits_without_a_traceback(tmp_path, capfd):
    """After a SIGKILL of ``ctpipe run``, its workers find nobody at the other end of their pipe: they exit quietly
    (a note in run.log), not with a BrokenPipeError traceback in the cron job's mail."""
    import multiprocessing as mp

    from pipeline.config import load_config
    from pipeline.runner.worker_process import worker_main

    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    inq = ctx.Queue()
    args = ("cpu-9", "cpu", [], load_config(None).to_dict(), str(tmp_path), inq, writer, os.getpid(), 1)
    proc = ctx.Process(target=worker_main, args=args)
    reader.close()  # the main process is gone: nobody reads what the worker sends
    proc.start()
    writer.close()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert [r["event"] for r in records if r.get("event")] == ["worker_orphaned"]
