"""A case a run left unfinished is named in the report with why and what to do, as a quarantined case is: the
run that stopped while the case was at a stage, or before it started it."""

from __future__ import annotations

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.store import RunStore
from tests.test_runner_report_tables import _begin, _dead_pid, _done, _start


def _stopped(tmp_path, *, end_record: bool):
    """Run r1 finished case a, was stopped with case b at its detect stage, and never started case c."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    store.upsert_discovered(case_key="c:fp", case_id="c", series_uid="c", fingerprint="f", source="/src/c")
    _done(store, "a", "r1")
    _begin(store, "b", "r1", {"ingest": "ok", "detect": "running"})
    if end_record:  # SIGTERM: the run records its stop
        store.end_run("r1", status="interrupted", n_cases=3, n_done=1, n_failed=0, n_skipped=0)
    store.close()
    return build_report([run_dir], tmp_path / "rep")


def _reasons(rep):
    rows = read_table(rep.out_dir / "cases.csv").rows
    return {r["case_id"]: (r["status"], r["reason"]) for r in rows}


def test_cases_a_stopped_run_left_say_where_it_stopped_and_that_the_same_command_finishes_them(tmp_path):
    for end_record in (False, True):
        rep = _stopped(tmp_path / str(end_record), end_record=end_record)
        reasons = _reasons(rep)
        assert reasons["a"] == ("done", "")
        status, why = reasons["b"]
        assert status == "interrupted"
        assert "run r1 stopped while the case was at stage detect" in why
        assert "not quarantined" in why and "the same ctpipe run command" in why
        status, why = reasons["c"]
        assert status == "pending"
        assert "not started: run r1 stopped before it reached the case" in why and "the same ctpipe run command" in why
        page = rep.html.read_text()
        assert "run r1 stopped while the case was at stage detect" in page
        assert rep.summary["cases"]["unfinished"] == 2 and rep.summary["cases"]["interrupted"] == 1


def test_the_page_calls_quarantined_cases_quarantined_as_the_run_summary_and_metrics_do(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1")
    _begin(store, "b", "r1", {"ingest": "failed"})
    store.fail_case(
        "b:fp", reason="1 slice(s) missing. Fix: copy the missing files", error_class="MissingSliceError", stage="ingest"
    )
    store.end_run("r1", status="completed", n_cases=2, n_done=1, n_failed=1, n_skipped=0)
    store.close()
    page = build_report([run_dir], tmp_path / "rep").html.read_text()
    assert "Cases: 1 done, 1 quarantined (failed: listed with the reason and the fix under Failures), 0 unfinished" in page
    assert "<th>quarantined</th>" in page and "<th>still quarantined from earlier runs</th>" in page
    assert "still failed" not in page


def test_a_case_the_latest_completed_run_did_not_find_says_so(tmp_path):
    """Run r1 was stopped before case c; r2 completed without finding c's series (removed from the source)."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    store.upsert_discovered(case_key="c:fp", case_id="c", series_uid="c", fingerprint="f", source="/src/c")
    store.end_run("r1", status="interrupted", n_cases=1, n_done=0, n_failed=0, n_skipped=0)
    _start(store, "r2", pid=_dead_pid())
    store.end_run("r2", status="completed", n_cases=0, n_done=0, n_failed=0, n_skipped=0)
    store.close()
    status, why = _reasons(build_report([run_dir], tmp_path / "rep"))["c"]
    assert status == "pending" and "the latest run, r2, completed without it" in why and "not found" in why


def test_a_case_stopped_between_recorded_stages_names_the_last_stage_it_finished(tmp_path):
    """Worker processes record a stage when it ends: a case stopped mid-stage has its finished stages only."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _begin(store, "b", "r1", {"ingest": "ok", "reconstruct": "ok"})
    _begin(store, "c", "r1", {})
    store.end_run("r1", status="interrupted", n_cases=2, n_done=0, n_failed=0, n_skipped=0)
    store.close()
    reasons = _reasons(build_report([run_dir], tmp_path / "rep"))
    assert reasons["b"][1].startswith("run r1 stopped while the case was at work (its last finished stage: reconstruct);")
    assert reasons["c"][1].startswith("run r1 stopped while the case was at work (before its first stage finished);")


def test_a_case_no_run_started_is_counted_unfinished_in_the_run_that_left_it(tmp_path):
    """runs.csv and the page's runs table add up to the case counts: c, never started, is r1's unfinished case."""
    for end_record in (False, True):
        rep = _stopped(tmp_path / str(end_record), end_record=end_record)
        rows = read_table(rep.out_dir / "runs.csv").rows
        assert [(r["run_id"], r["n_done"], r["n_unfinished"]) for r in rows] == [("r1", "1", "2")]
        assert sum(int(r["n_unfinished"]) for r in rows) == rep.summary["cases"]["unfinished"]
