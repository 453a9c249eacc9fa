"""A report over several run folders counts every run and case once: a run folder copied (a backup, a sync to an
archive) and named beside its original adds nothing, and a copy resumed elsewhere counts each case once, with its
latest outcome."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.report import summarize
from pipeline.runner.store import RunStore
from tests.test_runner_report_tables import T0, _begin, _clock, _dead_pid, _done, _start


def _finished(run_dir: Path) -> Path:
    """One completed run (r1, 10 minutes) that finished cases a and b."""
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1", findings=1)
    _done(store, "b", "r1")
    store.end_run("r1", status="completed", n_cases=2, n_done=2, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (T0, T0 + 600))
    return run_dir


def test_a_copied_run_folder_beside_its_original_counts_once(tmp_path):
    original = _finished(tmp_path / "runs" / "night1")
    copy = tmp_path / "archive" / "night1"
    shutil.copytree(original, copy)
    alone, _ = summarize([original])
    both = build_report([original, copy], tmp_path / "rep")
    s = both.summary
    assert s["cases"] == alone["cases"] and s["cases"]["done"] == 2  # not 4
    assert s["throughput"]["cases_per_hour"] == alone["throughput"]["cases_per_hour"] == 12.0  # 2 cases in 10 min
    assert s["runs"] == 1 and [r["run_id"] for r in s["runs_table"]] == ["r1"]
    assert s["latency_s"]["ingest"]["n"] == 2  # each stage attempt once
    assert s["quality"]["done"] == 2
    assert s["copied_runs"] == [{"run_id": "r1", "run_dir": str(copy.resolve()), "kept_in": str(original.resolve())}]
    assert [r["n_done"] for r in read_table(both.out_dir / "runs.csv").rows] == ["2"]
    assert len(read_table(both.out_dir / "cases.csv").rows) == 2
    page = both.html.read_text()
    assert "Copied runs, counted once" in page and str(copy.resolve()) in page


def test_a_copy_resumed_elsewhere_counts_each_case_once_with_its_latest_outcome(tmp_path):
    original = tmp_path / "node-a"
    store = RunStore(original)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1")
    _begin(store, "b", "r1", {"ingest": "ok", "detect": "running"})  # killed here
    store.close()
    resumed = tmp_path / "node-b"
    shutil.copytree(original, resumed)  # moved to another machine, which resumes it
    store = RunStore(resumed)
    store.mark_abandoned_runs()
    _start(store, "r2", pid=_dead_pid())
    _done(store, "b", "r2")
    _done(store, "c", "r2")
    store.end_run("r2", status="completed", n_cases=3, n_done=2, n_failed=0, n_skipped=0)
    store.close()
    _clock(resumed, "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = 'r2'", (T0 + 600, T0 + 900))
    s, _ = summarize([original, resumed])
    assert s["cases"]["total"] == 3 and s["cases"]["done"] == 3 and s["cases"]["interrupted"] == 0
    runs = {r["run_id"]: r for r in s["runs_table"]}
    assert sorted(runs) == ["r1", "r2"] and (runs["r1"]["n_done"], runs["r2"]["n_done"]) == (1, 2)
    assert [c["run_id"] for c in s["copied_runs"]] == ["r1"]


def test_the_runs_table_of_several_folders_names_each_runs_folder(tmp_path):
    night1, night2 = _finished(tmp_path / "night1"), tmp_path / "night2"
    store = RunStore(night2)
    _start(store, "r2", pid=_dead_pid())
    _done(store, "d", "r2")
    store.end_run("r2", status="completed", n_cases=1, n_done=1, n_failed=0, n_skipped=0)
    store.close()
    page = build_report([night1, night2], tmp_path / "rep").html.read_text()
    runs = page.split("<h2>Runs</h2>", 1)[1].split("</table>", 1)[0]
    assert "<th>run</th><th>folder</th><th>status</th>" in runs
    assert f"<td>r1</td><td>{night1.resolve()}</td>" in runs and f"<td>r2</td><td>{night2.resolve()}</td>" in runs
    assert '<td>all runs (each case once)</td><td colspan="6"></td><td>3</td>' in runs  # under the done column
    single = build_report([night1], tmp_path / "rep1").html.read_text()
    assert "<th>folder</th>" not in single  # one folder: named above the table


def test_the_report_sets_summed_stage_time_against_wall_time(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1")  # ingest and detect, 2 s each, side by side with b's (two workers)
    _done(store, "b", "r1")
    store.end_run("r1", status="completed", n_cases=2, n_done=2, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (T0, T0 + 4.0))
    rep = build_report([run_dir], tmp_path / "rep")
    overlap = rep.summary["overlap"]
    assert (overlap["stage_busy_s"], overlap["active_s"], overlap["mean_busy_workers"]) == (8.0, 4.0, 2.0)
    assert "stages busy 8.0 worker-s in 4.0 s of active wall time: 2.00 stage(s) at work at once" in rep.html.read_text()


def test_one_stage_at_a_time_is_not_said_to_overlap(tmp_path):
    from pipeline.runner.capacity import stage_overlap

    run_dir = _finished(tmp_path / "run")  # 8 s of stages in 600 s
    s, t = summarize([run_dir])
    assert s["overlap"]["mean_busy_workers"] < 1.0 and "cases overlap" not in s["overlap"]["text"]
    assert stage_overlap(t["stages"], 0.0)["mean_busy_workers"] is None


def test_the_run_status_of_many_folders_tells_only_what_did_not_complete(tmp_path):
    nights = [_finished(tmp_path / f"night{n}") for n in range(3)]
    killed = tmp_path / "night3"
    store = RunStore(killed)
    _start(store, "k1", pid=_dead_pid())  # killed: no end record, its process gone
    _begin(store, "x", "k1", {"ingest": "ok", "detect": "running"})
    store.close()
    s, _ = summarize([*nights, killed])
    text = s["status"]["text"]
    assert s["status"]["state"] == "interrupted" and len(s["status"]["runs"]) == 4
    assert f"run k1 of {killed.resolve()}" in text and "was interrupted" in text
    assert text.endswith("the latest run of each other folder (3) completed") and "(completed)" not in text
    every, _ = summarize(nights)
    assert every["status"]["text"] == "the latest run of every folder (3) completed"


def _night(run_dir: Path, run_id: str, day: int, cases: dict[str, str]) -> Path:
    """A nightly run folder (its own run ``run_id``, 10 minutes on day ``day`` after T0) whose cases (case id, which is
    also its SeriesInstanceUID, -> ``done`` or ``failed``) ran in it."""
    store = RunStore(run_dir)
    _start(store, run_id, pid=_dead_pid())
    for cid, outcome in cases.items():
        if outcome == "done":
            _done(store, cid, run_id)
        else:
            _begin(store, cid, run_id, {"ingest": "failed"})
            store.fail_case(f"{cid}:fp", reason="no pixel data in 3 files", error_class="IngestError", stage="ingest")
    n_done = sum(v == "done" for v in cases.values())
    store.end_run(run_id, status="completed", n_cases=len(cases), n_done=n_done, n_failed=len(cases) - n_done, n_skipped=0)
    store.close()
    start = T0 + day * 86400
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (start, start + 600))
    _clock(run_dir, "UPDATE cases SET started_at = ?, ended_at = ?, first_done_at = ?2", (start + 1, start + 300))
    return run_dir


def test_a_series_quarantined_one_night_and_done_the_next_counts_once_as_done(tmp_path):
    night1 = _night(tmp_path / "2027-01-15", "r1", 0, {"a": "done", "b": "failed"})
    night2 = _night(tmp_path / "2027-01-16", "r2", 1, {"b": "done", "c": "done"})
    rep = build_report([night1, night2], tmp_path / "rep")
    s = rep.summary
    assert s["cases"] == {"total": 3, "done": 3, "failed": 0, "unfinished": 0, "interrupted": 0}  # a, b, c: not 4
    assert s["failures_by_reason"] == {} and s["failed_cases"] == []
    assert s["throughput"]["per_day_utc"] == {"2027-01-15": 1, "2027-01-16": 2}
    runs = {r["run_id"]: r for r in s["runs_table"]}
    assert (runs["r1"]["n_done"], runs["r1"]["n_failed"], runs["r2"]["n_done"]) == (1, 0, 2)
    others = s["other_attempts"]
    assert [(e["case_id"], e["status"], e["error_class"], e["run_dir"], e["counted_in"]) for e in others] == [
        ("b", "failed", "IngestError", str(night1.resolve()), str(night2.resolve()))
    ]
    assert [(r["case_id"], r["status"]) for r in read_table(rep.out_dir / "other_attempts.csv").rows] == [("b", "failed")]
    assert sorted((r["case_id"], r["status"]) for r in read_table(rep.out_dir / "cases.csv").rows) == [
        ("a", "done"),
        ("b", "done"),
        ("c", "done"),
    ]
    page = rep.html.read_text()
    assert "Series tried in several run folders, counted once" in page and "no pixel data in 3 files" in page


def test_a_series_quarantined_two_nights_running_counts_once_as_failed_in_the_latest(tmp_path):
    night1 = _night(tmp_path / "n1", "r1", 0, {"b": "failed"})
    night2 = _night(tmp_path / "n2", "r2", 1, {"b": "failed"})
    s, _ = summarize([night2, night1])  # folders in any order: the latest attempt is the one counted
    assert s["cases"]["total"] == s["cases"]["failed"] == 1
    assert [f["run_dir"] for f in s["failed_cases"]] == [str(night2.resolve())]
    assert [(e["run_dir"], e["status"]) for e in s["other_attempts"]] == [(str(night1.resolve()), "failed")]


def test_a_series_processed_again_the_next_night_is_one_case_counted_on_the_first(tmp_path):
    # the source still holds it, and the next night's run into a new folder processes it again
    night1 = _night(tmp_path / "n1", "r1", 0, {"a": "done"})
    night2 = _night(tmp_path / "n2", "r2", 1, {"a": "done", "d": "done"})
    s, _ = summarize([night2, night1])
    assert s["cases"]["total"] == s["cases"]["done"] == 2  # a and d
    assert s["throughput"]["per_day_utc"] == {"2027-01-15": 1, "2027-01-16": 1}  # a on the 15th, d on the 16th
    assert [(e["case_id"], e["run_dir"], e["status"], e["counted_in"]) for e in s["other_attempts"]] == [
        ("a", str(night2.resolve()), "done", str(night1.resolve()))
    ]


def test_the_page_says_how_a_series_done_twice_is_counted_as_the_figures_count_it(tmp_path):
    """A series done on the 15th and again, from a new folder, on the 16th: one case, on the 15th, in r1's row; the
    page's rule says so, not only that a case counts in the run that last worked on it (r2)."""
    night1 = _night(tmp_path / "n1", "r1", 0, {"a": "done"})
    night2 = _night(tmp_path / "n2", "r2", 1, {"a": "done", "d": "done"})
    rep = build_report([night1, night2], tmp_path / "rep")
    runs = {r["run_id"]: r["n_done"] for r in rep.summary["runs_table"]}
    assert runs == {"r1": 1, "r2": 1}  # a in r1, where it was first done; d in r2
    assert rep.summary["throughput"]["per_day_utc"] == {"2027-01-15": 1, "2027-01-16": 1}
    page = rep.html.read_text()
    rule = page.split("<h2>Runs</h2>", 1)[1].split("<table", 1)[0]
    assert "several run folders" in rule and "at its first completion: in that run and on the day" in rule
