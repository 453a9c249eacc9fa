"""The run store (``RUN_DIR/runs.sqlite``): schema, a case's state transitions, refusals, readers during writes."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest

from pipeline.errors import CtpipeError, RunStoreError
from pipeline.runner.store import DB_NAME, SCHEMA_VERSION, TRANSITIONS, RunStore, open_readonly

FINDING = {"center_lps": [-10.5, 20.0, 31.25], "diameter_mm": 6.0, "score": 0.91}


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "run")
    s.start_run(
        "r1",
        command="ctpipe run x",
        sources=["x"],
        config={"runner": {"workers": 1}},
        versions={"python": "3"},
        device="cpu",
        host="h",
        pid=1,
    )
    yield s
    s.close()


def _add(store: RunStore, key: str = "uid:f1", cid: str = "a") -> str:
    store.upsert_discovered(case_key=key, case_id=cid, series_uid=key.split(":")[0], fingerprint="f1", source="/src")
    return key


def _status(store: RunStore, key: str) -> str:
    return store.case(key)["status"]


def _attempt(store: RunStore, key: str, stage: str, attempt: int, status: str, **kw) -> None:
    args = {
        "ready_at": 100.0,
        "started_at": 101.5,
        "ended_at": 103.0,
        "wall_s": 1.5,
        "peak_rss_mb": 50.0,
        "peak_cuda_mb": None,
        **kw,
    }
    store.record_attempt(
        run_id="r1", case_key=key, stage=stage, attempt=attempt, status=status, worker="cpu-1", device="cpu", **args
    )


# -- schema ---------------------------------------------------------------------------------------------------
def test_schema_tables_columns_and_journal(store):
    db = store.db
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "runs", "cases", "stage_attempts", "findings", "measurements", "gpu_samples"} <= tables
    cols = {r[1] for r in db.execute("PRAGMA table_info(stage_attempts)")}
    assert {"case_key", "stage", "attempt", "status", "wall_s", "queue_wait_s", "peak_rss_mb", "peak_cuda_mb", "detail"} <= cols
    assert {r[1] for r in db.execute("PRAGMA table_info(findings)")} >= {"center_x", "center_y", "center_z", "data"}
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # a status outside the life cycle is refused by the table itself
    _add(store)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        db.execute("UPDATE cases SET status='finished'")


def test_reopening_keeps_everything(tmp_path):
    store = RunStore(tmp_path / "run")
    key = _add(store)
    store.begin_case(key, "r1")
    store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[("lungs.volume_ml", 4.5e3, "mL")])
    store.close()
    again = RunStore(tmp_path / "run", create=False)
    try:
        assert _status(again, key) == "done" and again.case(key)["n_findings"] == 1
        assert again.db.execute("SELECT COUNT(*) FROM meta").fetchone()[0] == 1  # no second schema_version row
    finally:
        again.close()


def test_missing_or_damaged_database_is_refused(tmp_path):
    with pytest.raises(RunStoreError, match="no run database here") as err:
        RunStore(tmp_path / "empty", create=False)
    assert err.value.where == str(tmp_path / "empty" / DB_NAME) and "ctpipe run --out" in err.value.fix
    with pytest.raises(RunStoreError, match="no run database here"):
        open_readonly(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / DB_NAME).write_bytes(b"this is not a database file" * 200)
    with pytest.raises(RunStoreError, match="unreadable"):
        RunStore(tmp_path / "bad")
    with pytest.raises(RunStoreError, match="unreadable"):
        open_readonly(tmp_path / "bad")


# -- a case's life ------------------------------------------------------------------------------------------------
def test_case_life_pending_running_done(store):
    key = _add(store)
    assert _status(store, key) == "pending" and store.case(key)["attempts"] == 0
    assert store.begin_case(key, "r1") == 1
    row = store.case(key)
    assert row["status"] == "running" and row["run_id"] == "r1" and row["started_at"] is not None
    _attempt(store, key, "ingest", 1, "ok", detail={"read": 0.25})
    store.complete_case(
        key,
        output_dir="cases/a",
        findings=[FINDING, {"center_lps": None, "score": 0.2}],
        measurements=[("lungs.volume_ml", 4500.0, "mL"), ("nodules.count", 2.0, "count")],
        ended_at=row["started_at"] + 2.5,
    )
    row = store.case(key)
    assert row["status"] == "done" and row["output_dir"] == "cases/a" and row["n_findings"] == 2
    assert row["latency_s"] == pytest.approx(2.5)
    f = store.db.execute("SELECT idx, center_x, center_y, center_z, diameter_mm, score, data FROM findings").fetchall()
    assert [tuple(r)[:6] for r in f] == [(1, -10.5, 20.0, 31.25, 6.0, 0.91), (2, None, None, None, None, 0.2)]
    assert json.loads(f[0]["data"]) == FINDING
    assert sorted(tuple(r) for r in store.db.execute("SELECT name, value, unit FROM measurements")) == [
        ("lungs.volume_ml", 4500.0, "mL"),
        ("nodules.count", 2.0, "count"),
    ]
    att = store.db.execute("SELECT queue_wait_s, detail FROM stage_attempts").fetchone()
    assert att["queue_wait_s"] == pytest.approx(1.5) and json.loads(att["detail"]) == {"read": 0.25}
    assert [r["case_id"] for r in store.cases_with_status("done")] == ["a"]


def test_text_holding_undecodable_file_name_bytes_is_stored_escaped(store):
    """A folder or file name whose bytes are not valid UTF-8 (Python holds them as lone surrogates, which SQLite
    refuses) is stored with those bytes escaped: quarantining such a case never fails the run."""
    name = os.fsdecode(b"/archive/Sch\xe4del")
    key = "uid:f1"
    store.upsert_discovered(case_key=key, case_id="a", series_uid="uid", fingerprint="f1", source=name)
    store.begin_case(key, "r1")
    store.fail_case(key, reason=f"1 slice(s) missing between {name}/6.dcm and {name}/8.dcm", error_class="X", stage="ingest")
    row = store.case(key)
    assert row["source"] == "/archive/Sch\\xe4del" and row["status"] == "failed"
    assert row["reason"] == "1 slice(s) missing between /archive/Sch\\xe4del/6.dcm and /archive/Sch\\xe4del/8.dcm"


def test_a_new_attempt_closes_the_earlier_ones(store):
    key = _add(store)
    store.begin_case(key, "r1")
    _attempt(store, key, "ingest", 1, "ok")
    _attempt(store, key, "detect", 1, "running")
    _attempt(store, key, "load", 1, "failed", error="boom")
    assert store.begin_case(key, "r2") == 2  # e.g. after a crash, or a worker death
    rows = dict(store.db.execute("SELECT stage, status FROM stage_attempts WHERE attempt=1").fetchall())
    assert rows == {"ingest": "superseded", "detect": "interrupted", "load": "failed"}
    assert store.case(key)["run_id"] == "r2" and store.case(key)["attempts"] == 2


def test_each_stage_attempt_is_one_row(store):
    key = _add(store)
    store.begin_case(key, "r1")
    _attempt(store, key, "ingest", 1, "running", started_at=None, ended_at=None, wall_s=None)
    _attempt(store, key, "ingest", 1, "ok", started_at=99.0)  # started before it was ready: no negative wait
    rows = store.db.execute("SELECT status, wall_s, queue_wait_s FROM stage_attempts").fetchall()
    assert [tuple(r) for r in rows] == [("ok", 1.5, 0.0)]


def test_findings_are_stored_once_per_case(store):
    key = _add(store)
    store.begin_case(key, "r1")
    store.complete_case(key, output_dir="cases/a", findings=[FINDING, FINDING], measurements=[("m", 1.0, "mL")])
    store.reset_case(key)  # its folder was lost: back to pending, run again
    assert _status(store, key) == "pending" and store.case(key)["output_dir"] is None
    store.begin_case(key, "r1")
    store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[("m", 2.0, "mL")])
    assert store.db.execute("SELECT COUNT(*) FROM findings").fetchone()[0] == 1
    assert [tuple(r) for r in store.db.execute("SELECT name, value FROM measurements")] == [("m", 2.0)]
    # discovering the series again changes its source only
    store.upsert_discovered(case_key=key, case_id="other", series_uid="x", fingerprint="f9", source="/elsewhere")
    row = store.case(key)
    assert (row["case_id"], row["status"], row["source"]) == ("a", "done", "/elsewhere")


def test_failing_records_stage_class_and_reason(store):
    key = _add(store)
    before = time.time()
    store.begin_case(key, "r1")
    store.fail_case(key, reason="pixel data cut short", error_class="TruncatedFileError", stage="ingest")
    after = time.time()
    row = store.case(key)
    assert (row["status"], row["failed_stage"], row["error_class"], row["reason"]) == (
        "failed",
        "ingest",
        "TruncatedFileError",
        "pixel data cut short",
    )
    # the case's latency: from its start to its failure, both within this test's clock readings
    assert before <= row["started_at"] <= row["ended_at"] <= after
    assert 0 <= row["latency_s"] <= after - before
    assert row["latency_s"] == pytest.approx(row["ended_at"] - row["started_at"], abs=1e-3)
    store.begin_case(key, "r2")  # retried on request: the old reason is cleared
    row = store.case(key)
    assert row["status"] == "running" and row["reason"] is None and row["error_class"] is None


@pytest.mark.parametrize(
    ("setup", "change"),
    [
        ("done", "begin"),
        ("done", "complete"),
        ("done", "fail"),
        ("pending", "fail"),
        ("pending", "reset"),
        ("running", "reset"),
        ("failed", "complete"),
        ("failed", "reset"),
    ],
)
def test_an_illegal_transition_is_refused_and_changes_nothing(store, setup, change):
    key = _add(store)
    if setup != "pending":
        store.begin_case(key, "r1")
    if setup == "done":
        store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[("m", 1.0, "mL")])
    elif setup == "failed":
        store.fail_case(key, reason="r", error_class="E", stage="ingest")
    assert setup not in TRANSITIONS[change]
    before = dict(store.case(key))
    n_findings = store.db.execute("SELECT COUNT(*) FROM findings").fetchone()[0]
    calls = {
        "begin": lambda: store.begin_case(key, "r2"),
        "complete": lambda: store.complete_case(
            key, output_dir="cases/b", findings=[FINDING, FINDING], measurements=[("m", 9.0, "mL")]
        ),
        "fail": lambda: store.fail_case(key, reason="late", error_class="E2", stage="write"),
        "reset": lambda: store.reset_case(key),
    }
    with pytest.raises(RunStoreError) as err:
        calls[change]()
    assert isinstance(err.value, CtpipeError)
    assert f"cannot {change} case a ({key})" in str(err.value) and f"its status is {setup!r}" in str(err.value)
    assert err.value.where == str(store.run_dir / DB_NAME)
    assert dict(store.case(key)) == before  # rolled back
    assert store.db.execute("SELECT COUNT(*) FROM findings").fetchone()[0] == n_findings
    assert not store.db.in_transaction


@pytest.mark.parametrize("change", ["begin", "complete", "fail", "reset"])
def test_a_case_the_store_does_not_know_is_refused(store, change):
    calls = {
        "begin": lambda: store.begin_case("nope:1", "r1"),
        "complete": lambda: store.complete_case(
            "nope:1", output_dir="cases/x", findings=[FINDING], measurements=[("m", 1.0, "mL")]
        ),
        "fail": lambda: store.fail_case("nope:1", reason="r", error_class="E", stage=None),
        "reset": lambda: store.reset_case("nope:1"),
    }
    with pytest.raises(RunStoreError, match="no such case in the run store"):
        calls[change]()
    for table in ("findings", "measurements", "cases"):  # no orphan rows
        assert store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0


def test_a_transaction_is_all_or_nothing(store):
    key = _add(store)
    with pytest.raises(RuntimeError, match="half way"), store.tx():
        store.db.execute("UPDATE cases SET status='running' WHERE case_key=?", (key,))
        raise RuntimeError("failed half way through the transaction")
    assert _status(store, key) == "pending" and not store.db.in_transaction


def test_runs_killed_mid_way_are_marked_interrupted(store):
    store.start_run("r2", command="c", sources=[], config={}, versions={}, device="cpu", host="h", pid=2)
    store.end_run("r1", status="completed", n_cases=3, n_done=2, n_failed=1, n_skipped=0)
    assert store.mark_abandoned_runs() == 1
    rows = {r["run_id"]: (r["status"], r["n_done"]) for r in store.db.execute("SELECT * FROM runs")}
    assert rows == {"r1": ("completed", 2), "r2": ("interrupted", 0)}
    assert store.mark_abandoned_runs() == 0


def test_gpu_samples_are_appended(store):
    store.add_gpu_samples("r1", [(1.0, 0, 50.0, 1000.0, 8000.0), (2.0, 0, 70.0, 1200.0, 8000.0)])
    store.add_gpu_samples("r1", [])
    assert [tuple(r) for r in store.db.execute("SELECT t, util_pct FROM gpu_samples ORDER BY t")] == [(1.0, 50.0), (2.0, 70.0)]


# -- readers while the runner writes -------------------------------------------------------------------------------
def test_a_reader_sees_committed_state_while_a_write_is_open(store):
    key = _add(store)
    store.begin_case(key, "r1")
    reader = open_readonly(store.run_dir)
    try:
        with store.tx():  # the writer holds the write lock, its changes not yet committed
            store.db.execute("UPDATE cases SET status='done', n_findings=7 WHERE case_key=?", (key,))
            row = reader.execute("SELECT status, n_findings FROM cases").fetchone()
            assert tuple(row) == ("running", None)
        assert tuple(reader.execute("SELECT status, n_findings FROM cases").fetchone()) == ("done", 7)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("DELETE FROM cases")
    finally:
        reader.close()


def test_a_reader_does_not_block_the_writer(store):
    key = _add(store)
    store.begin_case(key, "r1")
    reader = open_readonly(store.run_dir)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT status FROM cases").fetchone()[0] == "running"  # a snapshot is held now
        store.db.execute("PRAGMA busy_timeout = 500")  # "database is locked" after 0.5 s if the reader blocked it
        store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[])
        assert _status(store, key) == "done"
        assert reader.execute("SELECT status FROM cases").fetchone()[0] == "running"  # still its snapshot
        reader.execute("COMMIT")
        assert reader.execute("SELECT status FROM cases").fetchone()[0] == "done"
    finally:
        reader.close()


def test_a_completion_undone_leaves_the_case_as_it_was_before_it(store):
    """A case whose series changed in the moment its completion was committed: ``uncomplete_case`` puts back the row
    as it was (a first completion's ``first_done_at`` empty, a redo's first completion kept) without its results."""
    from pipeline.errors import RunStoreError

    key = _add(store)
    store.begin_case(key, "r1")
    before = dict(store.case(key))
    store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[("m", 1.0, "mL")], ended_at=100.0)
    store.uncomplete_case(key, before=before)
    assert dict(store.case(key)) == before and before["first_done_at"] is None and before["status"] == "running"
    for table in ("findings", "measurements", "quality_flags"):
        assert store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0, table
    with pytest.raises(RunStoreError, match="cannot uncomplete case a"):  # only a done case
        store.uncomplete_case(key, before=before)

    store.complete_case(key, output_dir="cases/a", findings=[FINDING], measurements=[], ended_at=100.0)
    store.reset_case(key)  # its published folder removed: done again next
    store.begin_case(key, "r2")
    again = dict(store.case(key))
    store.complete_case(key, output_dir="cases/a", findings=[], measurements=[], ended_at=200.0)
    store.uncomplete_case(key, before=again)
    row = store.case(key)
    assert dict(row) == again and row["first_done_at"] == 100.0 and key in store.completed_before([key])
