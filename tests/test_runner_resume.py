"""Crash safety and resume: what a rerun picks up, what it skips, stale leftovers; SIGKILL a run and rerun it.

The unit tests drive ``pipeline.runner.resume`` on a real run store in a temporary folder; the slow ones run
the whole pipeline and kill it.
"""

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

from pipeline.errors import RunStoreError
from pipeline.runner import run_batch
from pipeline.runner.resume import MANIFEST, RunLock, plan, publish, read_manifest, reconcile, write_quarantine
from pipeline.runner.stage import CaseSpec
from pipeline.runner.stages import IngestStage
from pipeline.runner.store import RunStore
from tests._support.runner import FAST, DieOnceStage, case_hashes, ctpipe, db_rows

pytest_plugins = ["tests._support.runner"]


def _done_count(out: Path) -> int:
    try:
        return db_rows(out, "SELECT COUNT(*) FROM cases WHERE status='done'")[0][0]
    except sqlite3.Error:
        return 0  # not created yet


def _stages_done(out: Path) -> int:
    """Stage attempts that workers of the run in ``out`` have finished (0 before its store exists)."""
    try:
        return db_rows(out, "SELECT COUNT(*) FROM stage_attempts WHERE status='ok'")[0][0]
    except sqlite3.Error:
        return 0


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _run_until_a_case_is_done(
    dicom_data, out: Path, *, mid_case: bool = False, report: bool = True
) -> tuple[subprocess.Popen, list[str]]:
    """``ctpipe run`` of the good cases into ``out`` in its own process group, once its first case is done (with
    ``mid_case``: once its workers have finished a case's first stage, the case still under way); the process and its
    arguments. ``report``: whether the run writes its throughput report (its plots are a good part of a run's time)."""
    fast = FAST if report else [a.replace("report.enabled=true", "report.enabled=false") for a in FAST]
    args = ["run", str(dicom_data["good"]), "--out", str(out), "--workers", "1", "--quiet", *fast]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while (_stages_done(out) if mid_case else _done_count(out)) < 1:
        assert proc.poll() is None, "the run ended before its first case was done: " + proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no case completed in time"
        time.sleep(0.05)
    return proc, args


@pytest.mark.slow
def test_sigkill_then_rerun_every_case_exactly_once(dicom_data, full_run, tmp_path):
    out = tmp_path / "killed"
    # no throughput report: the killed run never gets to it, and nothing here reads the rerun's
    proc, args = _run_until_a_case_is_done(dicom_data, out, report=False)
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
    assert len(ok) == 3 * 7 and all(r[2] == 1 for r in ok)  # one successful attempt per case and stage (7 stages)
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


@pytest.mark.slow
def test_a_stopped_run_says_how_to_resume_and_is_recorded_as_interrupted(dicom_data, tmp_path):
    out = tmp_path / "stopped"
    proc, _ = _run_until_a_case_is_done(dicom_data, out, mid_case=True)  # its workers busy with a case
    proc.send_signal(signal.SIGTERM)  # what systemd or a scheduler sends; Ctrl-C takes the same path
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert "interrupted; run the same command again to resume" in err.decode()
    assert "Traceback" not in err.decode()
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    assert _wait_group_gone(proc.pid, 15), "worker processes outlived the stopped run"


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
    publish(
        staging,
        run_dir / "cases" / "a",
        {
            "case_key": "a:1",
            "findings": [{"center_lps": [1, 2, 3], "score": 0.9}],
            "measurements": [["lungs.total_volume_ml", 5000.0, "mL"]],
        },
    )
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
    lock = RunLock(tmp_path)
    with pytest.raises(RunStoreError, match=r"another ctpipe run \(pid \d+\) is using this folder") as err:
        RunLock(tmp_path)
    assert f"another ctpipe run (pid {os.getpid()}) is using this folder" in str(err.value)  # which process to wait for
    assert f"kill -TERM {os.getpid()}" in str(err.value)
    lock.release()
    RunLock(tmp_path).release()


@pytest.mark.slow
def test_worker_death_retries_the_case_then_quarantines(dicom_data, tmp_path):
    always = dicom_data["good_uids"][0]
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "run"
    s = run_batch(
        [dicom_data["good"]],
        out=out,
        workers=1,
        stages=[IngestStage(), DieOnceStage(str(markers), always)],
        **{"report.enabled": False, "runner.retries": 1},
    )
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


# -- choosing what to run ---------------------------------------------------------------------------------
def _spec(cid: str, key: str, *, fingerprint: str = "0123456789abcdef01234567", rejected=None) -> CaseSpec:
    return CaseSpec(cid, key, cid, fingerprint, f"/src/{cid}", (f"/src/{cid}/1.dcm",), rejected)


def _store(tmp_path: Path, run_id: str = "r1") -> RunStore:
    store = RunStore(tmp_path / "run")
    store.start_run(run_id, command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    return store


def test_plan_registers_new_cases_and_runs_them(tmp_path):
    store = _store(tmp_path)
    p = plan(store, [_spec("a", "a:1"), _spec("b", "b:1")], retry_failed=False)
    assert [c.case_id for c in p.to_run] == ["a", "b"] and p.done == [] and p.failed_before == [] and p.rejected == []
    assert [(r["case_id"], r["status"], r["source"]) for r in store.cases_with_status("pending")] == [
        ("a", "pending", "/src/a"),
        ("b", "pending", "/src/b"),
    ]
    store.close()


def test_plan_skips_done_cases_and_earlier_failures_unless_asked(tmp_path):
    store = _store(tmp_path)
    cases = [_spec("done", "d:1"), _spec("failed", "f:1"), _spec("interrupted", "i:1"), _spec("pending", "p:1")]
    plan(store, cases, retry_failed=False)
    for key in ("d:1", "f:1", "i:1"):
        store.begin_case(key, "r1")
    store.complete_case("d:1", output_dir="cases/done", findings=[], measurements=[])
    store.fail_case("f:1", reason="bad pixels", error_class="TruncatedFileError", stage="ingest")

    again = plan(store, cases, retry_failed=False)
    assert again.done == ["done"] and again.failed_before == ["failed"]
    assert [c.case_id for c in again.to_run] == ["interrupted", "pending"]
    retry = plan(store, cases, retry_failed=True)
    assert retry.done == ["done"] and retry.failed_before == []
    assert [c.case_id for c in retry.to_run] == ["failed", "interrupted", "pending"]
    store.close()


def test_plan_runs_a_series_reached_twice_once_and_keeps_case_ids_stable(tmp_path):
    store = _store(tmp_path)
    plan(store, [_spec("case", "uid1:aaaa")], retry_failed=False)
    # the same series through a second source, and another series whose folder gives the same case id
    other = _spec("case", "uid2:bbbb", fingerprint="feedfacecafe000011112222")
    p = plan(store, [_spec("case", "uid1:aaaa"), _spec("case", "uid1:aaaa"), other], retry_failed=False)
    assert [(c.case_id, c.case_key) for c in p.to_run] == [("case", "uid1:aaaa"), ("case-feedface", "uid2:bbbb")]
    # a later discovery under another name keeps the stored id (outputs stay in the same folder)
    p2 = plan(store, [_spec("renamed", "uid2:bbbb")], retry_failed=False)
    assert [c.case_id for c in p2.to_run] == ["case-feedface"]
    assert store.case_ids_in_use() == {"case": "uid1:aaaa", "case-feedface": "uid2:bbbb"}
    store.close()


def test_plan_sets_cases_refused_at_discovery_aside(tmp_path):
    store = _store(tmp_path)
    bad = _spec("bad", "bad:1", rejected=("MissingSliceError", "slice 12 is missing"))
    p = plan(store, [bad, _spec("good", "good:1")], retry_failed=False)
    assert [c.case_id for c in p.rejected] == ["bad"] and [c.case_id for c in p.to_run] == ["good"]
    assert store.case("bad:1")["status"] == "pending"  # registered, so the engine can record its quarantine
    store.close()


def _series(cid: str, key: str, series: str, *, fingerprint: str) -> CaseSpec:
    return CaseSpec(cid, key, series, fingerprint, f"/src/{cid}", (f"/src/{cid}/1.dcm",), None)


def test_plan_runs_a_quarantined_series_again_under_its_id_once_its_content_changed(tmp_path):
    store = _store(tmp_path)
    plan(store, [_series("s", "uid:old", "uid", fingerprint="a" * 24)], retry_failed=False)
    store.begin_case("uid:old", "r1")
    store.fail_case("uid:old", reason="slice 12 is missing", error_class="MissingSliceError", stage="ingest")
    fixed = _series("s", "uid:new", "uid", fingerprint="b" * 24)
    p = plan(store, [fixed], retry_failed=False)  # no --retry-failed needed: it is other content
    assert [(c.case_id, c.case_key) for c in p.to_run] == [("s", "uid:new")]
    assert p.replaced == ["s"] and p.failed_before == [] and p.changed_done == []
    assert store.case_ids_in_use() == {"s": "uid:new"} and store.case("uid:old") is None
    assert store.case("uid:new")["status"] == "pending"
    assert plan(store, [fixed], retry_failed=False).replaced == []  # seen now: nothing changes on a rerun
    store.close()


def test_plan_keeps_the_results_of_an_analysed_series_whose_content_changed(tmp_path):
    store = _store(tmp_path)
    plan(store, [_series("s", "uid:old", "uid", fingerprint="a" * 24)], retry_failed=False)
    store.begin_case("uid:old", "r1")
    store.complete_case("uid:old", output_dir="cases/s", findings=[], measurements=[])
    p = plan(store, [_series("s", "uid:new", "uid", fingerprint="b" * 24)], retry_failed=False)
    assert [c.case_id for c in p.to_run] == ["s-bbbbbbbb"] and p.changed_done == [("s", "s-bbbbbbbb")]
    assert p.replaced == [] and store.case("uid:old")["status"] == "done"
    store.close()


def test_plan_takes_two_copies_of_a_series_in_one_run_as_two_cases_and_counts_cases_not_found(tmp_path):
    store = _store(tmp_path)
    plan(store, [_series("gone", "g:1", "g", fingerprint="c" * 24)], retry_failed=False)
    copies = [_series("s", "uid:a", "uid", fingerprint="a" * 24), _series("s", "uid:b", "uid", fingerprint="b" * 24)]
    p = plan(store, copies, retry_failed=False)
    assert [c.case_id for c in p.to_run] == ["s", "s-bbbbbbbb"] and p.replaced == [] and p.changed_done == []
    assert p.not_found == 1  # 'gone' is no longer among the sources
    store.close()


@pytest.mark.slow
def test_a_series_quarantined_for_a_missing_slice_is_analysed_once_the_slice_arrives(tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.runner import PHANTOM

    src, out = tmp_path / "src", tmp_path / "run"
    ph = generate_phantom(21, **PHANTOM)
    write_dicom_series(ph.volume, src, quirks=["missing_slice"], seed=21)
    first = run_batch([src], out=out, workers=0, stages=[IngestStage()], **{"report.enabled": False})
    assert first.done == 0 and len(first.quarantined) == 1 and first.quarantined[0][1] == "MissingSliceError"
    cid = first.quarantined[0][0]
    assert (out / "quarantine" / f"{cid}.json").is_file()
    write_dicom_series(ph.volume, src, seed=21)  # the whole series: the missing file arrives
    second = run_batch([src], out=out, workers=0, stages=[IngestStage()], **{"report.enabled": False})
    assert second.done == 1 and second.quarantined == []
    assert db_rows(out, "SELECT case_id, status FROM cases") == [(cid, "done")]
    assert not (out / "quarantine" / f"{cid}.json").exists() and (out / "cases" / cid).is_dir()


# -- stale leftovers after a crash --------------------------------------------------------------------------------
def test_reconcile_clears_staging_and_the_cache_of_interrupted_cases_only(tmp_path):
    store = _store(tmp_path)
    run_dir = store.run_dir
    plan(store, [_spec("run", "run:1"), _spec("wait", "wait:1")], retry_failed=False)
    store.begin_case("run:1", "r1")
    (run_dir / "tmp" / "run.a1" / "recon").mkdir(parents=True)
    (run_dir / "tmp" / "run.a1" / "recon" / "half.stl").write_bytes(b"solid")
    (run_dir / "cache").mkdir()
    for cid in ("run", "wait"):
        for suffix in (".json", ".npy"):
            (run_dir / "cache" / f"{cid}{suffix}").write_bytes(b"x")

    rec = reconcile(store, run_dir)
    assert rec.interrupted == ["run"] and rec.recovered == [] and rec.redo == []
    assert not (run_dir / "tmp").exists()
    # the interrupted case's cached volume may be half-made: gone; a case that never started keeps its cache
    assert sorted(p.name for p in (run_dir / "cache").iterdir()) == ["wait.json", "wait.npy"]
    assert db_rows(run_dir, "SELECT status FROM runs") == [("interrupted",)]
    store.close()


def test_reconcile_ignores_a_folder_that_belongs_to_another_case(tmp_path):
    store = _store(tmp_path)
    run_dir = store.run_dir
    plan(store, [_spec("a", "a:new")], retry_failed=False)
    store.begin_case("a:new", "r1")
    stale = run_dir / "tmp" / "old"
    stale.mkdir(parents=True)
    publish(stale, run_dir / "cases" / "a", {"case_key": "a:old", "findings": [], "measurements": []})

    rec = reconcile(store, run_dir)
    assert rec.recovered == [] and rec.interrupted == ["a"]
    assert store.case("a:new")["status"] == "running"
    store.close()


def test_reconcile_twice_changes_nothing_more(tmp_path):
    store = _store(tmp_path)
    run_dir = store.run_dir
    plan(store, [_spec("a", "a:1")], retry_failed=False)
    store.begin_case("a:1", "r1")
    staging = run_dir / "tmp" / "a.a1"
    staging.mkdir(parents=True)
    publish(
        staging,
        run_dir / "cases" / "a",
        {
            "case_key": "a:1",
            "findings": [{"center_lps": [1, 2, 3], "score": 0.7}],
            "measurements": [["lungs.volume_ml", 4000.0, "mL"]],
        },
    )
    assert reconcile(store, run_dir).recovered == ["a"]
    second = reconcile(store, run_dir)
    assert second.recovered == second.interrupted == second.redo == []
    assert db_rows(run_dir, "SELECT COUNT(*) FROM findings") == [(1,)]
    assert db_rows(run_dir, "SELECT name, value, unit FROM measurements") == [("lungs.volume_ml", 4000.0, "mL")]
    store.close()


def test_publish_replaces_a_stale_folder_and_leaves_nothing_behind(tmp_path):
    final = tmp_path / "cases" / "a"
    final.mkdir(parents=True)
    (final / "old_only.txt").write_text("from an abandoned attempt")
    staging = tmp_path / "tmp" / "a.a2"
    staging.mkdir(parents=True)
    (staging / "findings.json").write_text("{}")
    publish(staging, final, {"case_key": "a:1", "files": []})
    assert sorted(p.name for p in final.iterdir()) == ["findings.json", MANIFEST]
    assert read_manifest(final) == {"case_key": "a:1", "files": []}
    assert not staging.exists() and list((tmp_path / "tmp").iterdir()) == []  # no trash folder left


def test_read_manifest_of_a_missing_or_damaged_manifest_is_none(tmp_path):
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST).write_text('{"case_key": "a:1", "files": [')  # cut short
    assert read_manifest(tmp_path) is None


def test_quarantine_file_says_why_and_where_from(tmp_path):
    case = _spec("bad", "bad:1")
    path = write_quarantine(tmp_path, case, reason="slice 12 is missing", error_class="MissingSliceError", stage="discover")
    assert path == tmp_path / "quarantine" / "bad.json"
    assert json.loads(path.read_text()) == {
        "case_id": "bad",
        "case_key": "bad:1",
        "series_uid": "bad",
        "source": "/src/bad",
        "stage": "discover",
        "error_class": "MissingSliceError",
        "reason": "slice 12 is missing",
        "files": 1,
    }


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_run_stops_does_not_cut_its_record_short(dicom_data, tmp_path):
    """An impatient Ctrl-C pressed again (or a second SIGTERM) while the run records its stop: the run still ends
    with its ``run_end`` record, an interrupted report and metrics, not a folder that says "in progress" (a third
    stops it at once, as a run that swallowed the first must still be stoppable)."""
    out = tmp_path / "twice"
    proc, _ = _run_until_a_case_is_done(dicom_data, out, mid_case=True)  # its workers busy with a case
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # pressed again while the run records its stop
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert "already stopping" in err.decode()
    records = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    end = [r for r in records if r.get("event") == "run_end"]
    assert len(end) == 1 and end[0]["exit_status"] == 130 and end[0]["run_status"] == "interrupted", end
    assert json.loads((out / "report" / "status.json").read_text())["state"] == "interrupted"
    prom = (out / "metrics.prom").read_text()
    assert [ln for ln in prom.splitlines() if ln.startswith("ctpipe_run_exit_status")][0].endswith(" 130.0")
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    assert _wait_group_gone(proc.pid, 15), "worker processes outlived the stopped run"
