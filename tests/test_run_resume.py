"""Crash safety: SIGKILL a run after its first case completes, rerun, and get every case exactly once."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_run_support import FAST, case_hashes, ctpipe, db_rows, dicom_data, full_run  # noqa: F401

from pipeline.runner.resume import publish, reconcile
from pipeline.runner.store import RunStore


def _done_count(out: Path) -> int:
    try:
        return db_rows(out, "SELECT COUNT(*) FROM cases WHERE status='done'")[0][0]
    except sqlite3.Error:
        return 0  # not created yet


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_sigkill_then_rerun_every_case_exactly_once(dicom_data, full_run, tmp_path):  # noqa: F811
    out = tmp_path / "killed"
    args = ["run", str(dicom_data["good"]), "--out", str(out), "--workers", "1", "--quiet", *FAST]
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while _done_count(out) < 1:
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no case completed in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the workers notice that the main process is gone and exit on their own
    assert _wait_group_gone(proc.pid, 15), "worker processes outlived the killed run"
    n_at_kill = _done_count(out)
    assert 1 <= n_at_kill < 3, "the kill came too late to interrupt anything"
    # whatever was published at the moment of the kill is complete
    for case_dir in (out / "cases").iterdir():
        assert (case_dir / "manifest.json").is_file()
    assert db_rows(out, "SELECT status FROM runs") == [("running",)]

    p = ctpipe(*args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{n_at_kill} already done earlier" in p.stdout
    rows = db_rows(out, "SELECT case_key, status FROM cases")
    assert len(rows) == 3 and all(r[1] == "done" for r in rows)
    ok = db_rows(out, "SELECT case_key, stage, COUNT(*) FROM stage_attempts WHERE status='ok' GROUP BY case_key, stage")
    assert len(ok) == 3 * 5 and all(r[2] == 1 for r in ok)  # one successful attempt per case and stage (5 stages)
    assert {r[0] for r in db_rows(out, "SELECT status FROM runs")} == {"interrupted", "completed"}
    assert db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='running'") == [(0,)]
    assert not list((out / "tmp").iterdir()) if (out / "tmp").exists() else True
    # outputs identical to those of the uninterrupted run, file by file
    ref = case_hashes(full_run["out"])
    got = case_hashes(out)
    assert set(got) <= set(ref) and len(got) == 3
    for cid, files in got.items():
        assert files == ref[cid], f"case {cid} differs from the uninterrupted run"
    # findings stored once per case
    dup = db_rows(out, "SELECT case_key, idx, COUNT(*) FROM findings GROUP BY case_key, idx HAVING COUNT(*) > 1")
    assert dup == []


def _fake_case(store: RunStore, key: str, cid: str, run_id: str) -> None:
    store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="f" * 24, source="src")
    store.begin_case(key, run_id)


def test_reconcile_after_a_crash_between_rename_and_commit(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    # case a: published (renamed) but the kill came before the store said done
    _fake_case(store, "a:1", "a", "r1")
    staging = run_dir / "tmp" / "a.a1"
    staging.mkdir(parents=True)
    (staging / "findings.json").write_text("{}")
    publish(staging, run_dir / "cases" / "a", {"case_key": "a:1", "findings": [{"center_lps": [1, 2, 3], "score": 0.9}],
                                               "measurements": [["lungs.total_volume_ml", 5000.0, "mL"]]})
    # case b: killed while running (a staging folder, nothing published)
    _fake_case(store, "b:1", "b", "r1")
    (run_dir / "tmp" / "b.a1").mkdir()
    (run_dir / "tmp" / "b.a1" / "half.stl").write_bytes(b"partial")
    # case c: marked done but its folder was deleted by someone
    _fake_case(store, "c:1", "c", "r1")
    store.complete_case("c:1", output_dir="cases/c", findings=[], measurements=[])
    rec = reconcile(store, run_dir)
    assert rec.recovered == ["a"] and rec.interrupted == ["b"] and rec.redo == ["c"]
    assert store.case("a:1")["status"] == "done" and store.case("a:1")["n_findings"] == 1
    assert store.case("b:1")["status"] == "running"  # retried by the next run
    assert store.case("c:1")["status"] == "pending"
    assert not (run_dir / "tmp").exists()
    assert db_rows(run_dir, "SELECT status FROM runs") == [("interrupted",)]
    assert json.loads(db_rows(run_dir, "SELECT data FROM findings")[0][0])["score"] == 0.9
    store.close()


def test_second_run_on_a_busy_folder_is_refused(tmp_path):
    from pipeline.errors import RunStoreError
    from pipeline.runner.resume import RunLock

    lock = RunLock(tmp_path)
    with pytest.raises(RunStoreError, match="another ctpipe run is using this folder"):
        RunLock(tmp_path)
    lock.release()
    RunLock(tmp_path).release()


@pytest.mark.slow
def test_worker_death_retries_the_case_then_quarantines(dicom_data, tmp_path):  # noqa: F811
    from test_run_support import DieOnceStage

    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage

    always = dicom_data["good_uids"][0]
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    s = run_batch([dicom_data["good"]], out=out, workers=1, stages=[IngestStage(), DieOnceStage(str(markers), always)],
                  **{"report.enabled": False, "runner.retries": 1})
    assert s.exit_code == 3 and s.done == 2
    assert [q[0] for q in s.quarantined] == [always] and s.quarantined[0][1] == "WorkerDiedError"
    assert "died (signal 9) while running stage die_once" in s.quarantined[0][2]
    rows = dict(db_rows(out, "SELECT series_uid, attempts FROM cases"))
    assert set(rows.values()) == {2}  # every case needed a second attempt
    ok = db_rows(out, "SELECT case_key, stage, COUNT(*) FROM stage_attempts WHERE status='ok' GROUP BY case_key, stage")
    assert sorted(r[2] for r in ok) == [1] * 5  # 2 cases x 2 stages + the quarantined case's ingest
    died = db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='interrupted' AND stage='die_once'")
    assert died == [(4,)]
    assert sorted(p.name for p in (out / "cases").iterdir()) == sorted(u for u in dicom_data["good_uids"] if u != always)
