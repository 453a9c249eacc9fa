"""The report of a run that found nothing to do, or whose every case was quarantined: it says what there is (no
rate, no capacity figure, the failures with their reasons) instead of blank figures, 'none' bottlenecks, 0.00 s
stage times and empty plots."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.runner import build_report
from pipeline.runner.store import RunStore
from tests.test_runner_report_tables import _begin, _dead_pid, _start


def _empty(run_dir):
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    store.end_run("r1", status="completed", n_cases=0, n_done=0, n_failed=0, n_skipped=0)
    store.close()
    return run_dir


def _all_failed(run_dir):
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for cid in ("x", "y"):
        _begin(store, cid, "r1", {"ingest": "failed"})
        store.fail_case(
            f"{cid}:fp", reason=f"{cid}/CT1.dcm cut short. Fix: copy it again", error_class="TruncatedFileError", stage="ingest"
        )
    store.end_run("r1", status="completed", n_cases=2, n_done=0, n_failed=2, n_skipped=0)
    store.close()
    return run_dir


def _no_nan(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_no_nan(v) for v in value.values())
    if isinstance(value, list):
        return all(_no_nan(v) for v in value)
    return True


@pytest.mark.parametrize("make", [_empty, _all_failed])
def test_a_run_without_a_completed_case_gives_a_sensible_page(tmp_path, make):
    rep = build_report([make(tmp_path / "run")], tmp_path / "rep")
    page = rep.html.read_text()
    capacity = page.split("<h2>Capacity model</h2>", 1)[1].split("<h2>", 1)[0]
    assert "no completed stage attempts to project from" in capacity
    assert "none stages" not in page and "0.00 s/case" not in capacity and ":  cases/day" not in capacity
    assert "<b></b>" not in page  # no blank figure
    assert "data:image/png" not in page  # no empty axes
    assert "no plot: no case completed" in page and "no plot: no stage completed" in page
    assert rep.summary["throughput"]["cases_per_day_projected"] is None
    assert _no_nan(json.loads(rep.json.read_text()))


def test_every_quarantined_case_is_listed_with_its_reason_and_fix(tmp_path):
    rep = build_report([_all_failed(tmp_path / "run")], tmp_path / "rep")
    page = rep.html.read_text()
    failures = page.split("<h2>Failures by reason</h2>", 1)[1].split("<h2>", 1)[0]
    assert failures.count("cut short. Fix: copy it again") == 2 and "TruncatedFileError" in failures
    empty = build_report([_empty(tmp_path / "empty")], tmp_path / "rep-empty").html.read_text()
    assert "<th>error class</th><th>reason</th></tr></table>" not in empty  # no header over nothing
