"""A case counts at its first completion: done again in its own run folder (its published folder was removed), it
stays on the day its results were first published."""

from __future__ import annotations

import socket

from pipeline.runner import build_report
from pipeline.runner.store import SCHEMA_VERSION, RunStore

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86_400.0


def _start(store: RunStore, run_id: str, at: float) -> None:
    store.start_run(
        run_id, command="ctpipe run", sources=["/src"], config={}, versions={}, device="cpu", host=socket.gethostname(), pid=1
    )
    store.db.execute("UPDATE runs SET started_at=? WHERE run_id=?", (at, run_id))


def test_a_case_done_again_in_its_folder_counts_on_its_first_day(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", T0)
    store.upsert_discovered(case_key="a:fp", case_id="a", series_uid="1.2.3", fingerprint="fp", source="/src/a")
    store.begin_case("a:fp", "r1")
    store.complete_case("a:fp", output_dir="cases/a", findings=[], measurements=[], ended_at=T0 + 60, latency_s=60.0)
    store.end_run("r1", status="completed", n_cases=1, n_done=1, n_failed=0, n_skipped=0, ended_at=T0 + 120)
    # two days later its published folder is gone: the next run of the folder does it again
    store.reset_case("a:fp")
    _start(store, "r2", T0 + 2 * DAY)
    store.begin_case("a:fp", "r2")
    store.complete_case("a:fp", output_dir="cases/a", findings=[], measurements=[], ended_at=T0 + 2 * DAY + 60)
    store.end_run("r2", status="completed", n_cases=1, n_done=1, n_failed=0, n_skipped=0, ended_at=T0 + 2 * DAY + 120)
    row = store.db.execute("SELECT first_done_at, ended_at FROM cases").fetchone()
    assert (row[0], row[1]) == (T0 + 60, T0 + 2 * DAY + 60)
    store.close()
    rep = build_report([run_dir], tmp_path / "rep", timezone="UTC")
    per_day = rep.summary["throughput"]["per_day_utc"]
    assert per_day == {"2027-01-15": 1, "2027-01-16": 0, "2027-01-17": 0}
    assert rep.summary["throughput"]["per_day_local"] == per_day
    assert rep.summary["throughput"]["per_hour_utc"]["2027-01-15 08:00"] == 1


def test_an_older_store_gets_its_first_completions_from_its_end_times(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", T0)
    store.upsert_discovered(case_key="a:fp", case_id="a", series_uid="1.2.3", fingerprint="fp", source="/src/a")
    store.begin_case("a:fp", "r1")
    store.complete_case("a:fp", output_dir="cases/a", findings=[], measurements=[], ended_at=T0 + 60)
    store.db.execute("ALTER TABLE cases DROP COLUMN first_done_at")  # as a ctpipe before the column wrote it
    store.db.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    store.close()
    rep = build_report([run_dir], tmp_path / "rep0", timezone="UTC")  # read as it is: counted at its end
    assert rep.summary["throughput"]["per_day_utc"] == {"2027-01-15": 1}
    store = RunStore(run_dir)  # the runner migrates it
    assert store.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert store.db.execute("SELECT first_done_at FROM cases").fetchone()[0] == T0 + 60
    store.close()
