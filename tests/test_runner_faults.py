"""Faults that must never lose or falsify a case.

A full, read-only or forbidden run folder is the machine's fault, not the case's: the run stops admitting
cases, says so in one line, records itself as interrupted, exits 4, and a plain rerun finishes the rest.
A case is published only with every output its stages declared. Leftovers of killed runs are cleaned.
Damaged inputs (the fault corpus) are each a named skip, a quarantine with the true reason, or processed;
split series run as ``ctpipe ingest`` caches them; patient identifiers stay out of the run folder.
A full disk during real runs: tests/test_runner_disk_full.py.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipeline.atomic import atomic_write_bytes
from pipeline.config import load_config
from pipeline.errors import IncompleteOutputError, RunEnvironmentError
from pipeline.runner import run_batch
from pipeline.runner.engine import Engine
from pipeline.runner.faults import check_writable, environment_failure, errno_in_text
from pipeline.runner.resume import plan, reconcile
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, Task, WorkerInfo
from pipeline.runner.store import SCHEMA_VERSION, RunStore
from pipeline.runner.task_run import InlineExecutor, run_task
from tests._support.runner import (
    PHANTOM,
    PRIVATE_STRINGS,
    QUICK,
    as_cli,
    can_mount,
    case_hashes,
    ctpipe,
    db_rows,
    disk_full_after,
    mark_patient,
    small_tmpfs,
    write_fault_corpus,
)

pytest_plugins = ["tests._support.runner"]


# -- telling the machine's faults from the case's ---------------------------------------------------------------
def test_environmental_errors_are_told_from_case_defects(tmp_path):
    run_dir = tmp_path / "run"
    full = environment_failure(OSError(errno.ENOSPC, "No space left on device"), run_dir=run_dir)
    assert full is not None and full.name == "ENOSPC" and full.folder == str(run_dir)
    assert full.describe() == f"cannot write in {run_dir}: No space left on device (ENOSPC)"
    ro = environment_failure(OSError(errno.EROFS, "Read-only file system", str(run_dir / "cases" / "x.json")), run_dir=run_dir)
    assert ro is not None and ro.folder == str(run_dir / "cases")
    assert environment_failure(OSError(errno.EDQUOT, "Disk quota exceeded"), run_dir=None).name == "EDQUOT"
    # permission: the machine's fault inside the run folder, the case's on an input file
    assert environment_failure(PermissionError(errno.EACCES, "denied", str(run_dir / "tmp" / "a")), run_dir=run_dir)
    assert environment_failure(PermissionError(errno.EACCES, "denied", "/data/dicom/1.dcm"), run_dir=run_dir) is None
    # found behind a wrapping error, and in SQLite's words
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise ValueError("could not save") from exc
    except ValueError as wrapped:
        assert environment_failure(wrapped, run_dir=run_dir).name == "ENOSPC"
    assert environment_failure(sqlite3.OperationalError("database or disk is full"), run_dir=run_dir).name == "ENOSPC"
    assert environment_failure(sqlite3.OperationalError("attempt to write a readonly database"), run_dir=run_dir).name == "EROFS"
    short = environment_failure(OSError("98304 requested and 12224 written"), run_dir=run_dir)  # numpy, disk full
    assert short is not None and short.name == "ENOSPC" and short.folder == str(run_dir)
    # case defects stay case defects
    assert environment_failure(OSError(errno.EIO, "Input/output error"), run_dir=run_dir) is None
    assert environment_failure(ValueError("bad pixels"), run_dir=run_dir) is None
    assert errno_in_text("x: could not write the stl mesh ([Errno 28] No space left on device: 'x')") == 28
    assert errno_in_text("no lungs found") is None


_FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    import numpy as np
    from pipeline.runner.faults import environment_failure
    from pipeline.runner.run_summary import RunSummary

    run_dir = Path(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))  # ulimit -f 64
    out = {}
    for how in ("numpy", "write"):
        try:
            with open(run_dir / f"{how}.bin", "wb") as fh:
                np.save(fh, np.zeros(100_000)) if how == "numpy" else fh.write(b"x" * 100_000)
        except OSError as exc:
            env = environment_failure(exc, run_dir=run_dir)
            out[how] = None if env is None else [env.name, env.describe(), str(env.error())]
    summary = RunSummary(run_dir, "r")
    summary.stopped, summary.unfinished = out["numpy"][1], 1
    out["summary"] = summary.lines()[1]
    print(json.dumps(out))
    """
)


def test_a_file_size_limit_is_named_as_such_not_as_a_full_disk(tmp_path):
    # ulimit -f in a cron script or LimitFSIZE= in a unit: the disk has room, the process may not write big files
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT, str(run_dir)], capture_output=True, text=True, check=True, timeout=60
    )
    out = json.loads(done.stdout)
    for how in ("numpy", "write"):  # numpy's short write has no error number; a plain write's is EFBIG
        name, describe, error = out[how]
        assert name == "EFBIG", how
        assert describe.startswith(f"cannot write in {run_dir}")
        assert "File too large (EFBIG): a file would pass this process's file-size limit of 65536 bytes" in describe
        assert "No space" not in error and "ulimit -f unlimited" in error and "LimitFSIZE=infinity" in error
    assert "raise the file-size limit" in out["summary"] and "free the space" not in out["summary"]


# -- a full disk inside a run (engine, real stores and folders; writes injected) -----------------------------------
class _Ingest(Stage):
    """Caches a 'volume' and writes a file, through the atomic writer (as every real stage does)."""

    name = "ingest"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        atomic_write_bytes(ctx.cache_dir / f"{ctx.case.case_id}.npy", ctx.case.case_id.encode() * 50)
        atomic_write_bytes(ctx.workdir / "a.txt", ctx.case.case_id.encode())
        return {"declared": ["a.txt"]}


class _Write(Stage):
    name = "write"

    def __init__(self, forget: str = ""):
        self.forget = forget  # a case whose declared file this stage does not write

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if ctx.case.case_id != self.forget:
            atomic_write_bytes(ctx.workdir / "out" / "b.txt", b"b" + ctx.case.case_id.encode())
        return {
            "declared": ["out/b.txt"],
            "quality": {
                "lung_coverage": "complete",
                "contrast_phase": "non_contrast",
                "flags": [{"code": "thick_slices", "severity": "warning", "message": "thick slices"}],
            },
        }


def _spec(cid: str) -> CaseSpec:
    return CaseSpec(cid, f"{cid}:fp", cid, "fp" * 12, f"/src/{cid}", (f"/src/{cid}/1.dcm",))


def _engine_run(run_dir: Path, ids: list[str], run_id: str, stages: list[Stage] | None = None):
    stages = stages or [_Ingest(), _Write()]
    store = RunStore(run_dir)
    reconcile(store, run_dir)
    store.start_run(run_id, command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    chosen = plan(store, [_spec(c) for c in ids], retry_failed=False)
    executor = InlineExecutor(stages, WorkerInfo("main", "cpu", load_config(environ={}), run_dir))
    engine = Engine(stages, executor, store, run_dir=run_dir, run_id=run_id, max_in_flight=1, retries=1, keep_cache=False)
    result = engine.run(chosen.to_run, chosen.rejected)
    return result, store, chosen


# each case makes 4 atomic writes (cache, a.txt, out/b.txt, manifest): the disk fills inside a stage (5, 6),
# between the last stage and publication (7: the manifest of the second case) or in the first case (2)
@pytest.mark.parametrize("room", [2, 5, 6, 7])
def test_a_full_disk_stops_admission_and_a_plain_rerun_finishes_identically(tmp_path, room):
    ref_dir = tmp_path / "undisturbed"
    ref, store, _ = _engine_run(ref_dir, ["a", "b", "c"], "r0")
    store.close()
    assert ref.done == ["a", "b", "c"]

    run_dir = tmp_path / "run"
    with disk_full_after(run_dir, room) as counts:
        result, store, _ = _engine_run(run_dir, ["a", "b", "c"], "r1")
    assert counts["failed"] >= 1
    n_done = room // 4
    assert result.done == ["a", "b", "c"][:n_done] and result.failed == []
    ((released, why),) = result.released  # the case at work when the disk filled: no verdict, kept for the next run
    assert released == "abc"[n_done]
    assert "No space left on device (ENOSPC)" in why and str(run_dir) in why
    assert result.stopped and "ENOSPC" in result.stopped
    rows = {r["case_id"]: r for r in store.cases_with_status("pending", "running", "done", "failed")}
    assert rows[released]["status"] == "pending" and rows[released]["error_class"] == "RunEnvironmentError"
    for later in "abc"[n_done + 1 :]:
        assert rows[later]["status"] == "pending" and rows[later]["attempts"] == 0  # never admitted
    assert not store.cases_with_status("failed") and not (run_dir / "quarantine").exists()
    # nothing incomplete is published; nothing half-written of the released case is left in the cache
    for case_dir in (run_dir / "cases").iterdir() if (run_dir / "cases").exists() else ():
        man = json.loads((case_dir / "manifest.json").read_text())
        assert {f["path"] for f in man["files"]} == {"a.txt", "out/b.txt"}
    assert not (run_dir / "cache" / f"{released}.npy").exists()
    store.close()

    # space is back: one plain rerun (no --retry-failed) finishes every case, as the undisturbed run made them
    again, store, chosen = _engine_run(run_dir, ["a", "b", "c"], "r2")
    assert chosen.failed_before == [] and again.released == [] and again.stopped is None
    assert sorted(again.done + chosen.done) == ["a", "b", "c"]
    assert [r["case_id"] for r in store.cases_with_status("done")] == ["a", "b", "c"]
    assert case_hashes(run_dir) == case_hashes(ref_dir)
    assert sorted(p.name for p in run_dir.rglob("*.tmp")) == []
    store.close()


def test_a_case_missing_a_declared_output_is_not_published(tmp_path):
    result, store, _ = _engine_run(tmp_path / "run", ["a", "b"], "r1", [_Ingest(), _Write(forget="b")])
    assert result.done == ["a"]
    ((cid, cls, reason),) = result.failed
    assert (cid, cls) == ("b", "IncompleteOutputError") and "out/b.txt" in reason
    row = store.case("b:fp")
    assert (row["status"], row["failed_stage"]) == ("failed", "publish")
    assert not (tmp_path / "run" / "cases" / "b").exists()
    # the quality of the published case is in the store
    assert (store.case("a:fp")["flags"], store.case("a:fp")["lung_coverage"]) == ("thick_slices", "complete")
    store.close()


def test_a_stage_that_cannot_write_its_folder_is_not_the_cases_fault(tmp_path):
    class NoPermission(Stage):
        name = "write"

        def process(self, ctx: CaseContext) -> dict[str, Any]:
            raise PermissionError(errno.EACCES, "Permission denied", str(ctx.workdir / "findings.json"))

    run_dir = tmp_path / "run"
    ctx_task = Task(_spec("a"), 0, "write", 1, str(run_dir / "tmp" / "a.a1"), {}, 0.0)
    res = run_task(NoPermission(), ctx_task, WorkerInfo("w", "cpu", load_config(environ={}), run_dir))
    assert res.environment and res.error_class == "RunEnvironmentError"
    assert res.error == f"stage write: cannot write in {run_dir / 'tmp' / 'a.a1'}: Permission denied (EACCES)"


# -- leftovers of killed runs ---------------------------------------------------------------------------------------
def test_reconcile_removes_temporary_files_and_stale_quarantine_files(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    plan(store, [_spec("bad"), _spec("retried"), _spec("ok")], retry_failed=False)
    for cid in ("bad", "retried"):
        store.begin_case(f"{cid}:fp", "r1")
        store.fail_case(f"{cid}:fp", reason="slice 3 is missing", error_class="MissingSliceError", stage="discover")
    store.begin_case("retried:fp", "r1")  # a later run retried it (--retry-failed) and was killed
    leftovers = [
        run_dir / ".config.yaml.a1b2c3d4.tmp",
        run_dir / "metrics.prom.4242.139912",
        run_dir / "report" / ".report.html.zz_9y8x7.tmp",
        run_dir / "cache" / ".x.npy.k3j4h5g6.tmp",
        run_dir / "quarantine" / ".bad.json.0a1b2c3d.tmp",
    ]
    keep = [
        run_dir / "report" / "report.html",
        run_dir / "cache" / "ok.npy",
        run_dir / "quarantine" / "bad.json",
        run_dir / "notes.tmp",
    ]
    for p in [*leftovers, *keep, run_dir / "quarantine" / "retried.json"]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    (run_dir / "tmp" / "retried.a2" / "recon").mkdir(parents=True)

    rec = reconcile(store, run_dir)
    assert sorted(rec.temp_files) == sorted(leftovers) and rec.stale_quarantine == ["retried"]
    assert all(not p.exists() for p in leftovers) and all(p.exists() for p in keep)
    assert not (run_dir / "quarantine" / "retried.json").exists() and not (run_dir / "tmp").exists()
    store.close()


def test_a_released_case_runs_again_without_retry_failed(tmp_path):
    store = RunStore(tmp_path / "run")
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    plan(store, [_spec("a")], retry_failed=False)
    store.begin_case("a:fp", "r1")
    store.release_case("a:fp", reason="ingest: cannot write in /run: No space left on device (ENOSPC)", stage="ingest")
    row = store.case("a:fp")
    assert (row["status"], row["error_class"], row["failed_stage"]) == ("pending", "RunEnvironmentError", "ingest")
    again = plan(store, [_spec("a")], retry_failed=False)
    assert [c.case_id for c in again.to_run] == ["a"] and again.failed_before == []
    store.begin_case("a:fp", "r2")
    assert store.case("a:fp")["reason"] is None  # a new attempt starts clean
    store.close()


# -- the run store of an earlier version --------------------------------------------------------------------------
_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (run_id TEXT PRIMARY KEY, started_at REAL NOT NULL, ended_at REAL, status TEXT NOT NULL,
    command TEXT, sources TEXT, config TEXT, versions TEXT, device TEXT, host TEXT, pid INTEGER,
    n_cases INTEGER DEFAULT 0, n_done INTEGER DEFAULT 0, n_failed INTEGER DEFAULT 0, n_skipped INTEGER DEFAULT 0);
CREATE TABLE cases (case_key TEXT PRIMARY KEY, case_id TEXT NOT NULL UNIQUE, series_uid TEXT, fingerprint TEXT NOT NULL,
    source TEXT, status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    reason TEXT, error_class TEXT, failed_stage TEXT, attempts INTEGER NOT NULL DEFAULT 0, run_id TEXT,
    discovered_at REAL, started_at REAL, ended_at REAL, latency_s REAL, n_findings INTEGER, output_dir TEXT);
CREATE TABLE stage_attempts (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, case_key TEXT NOT NULL,
    stage TEXT NOT NULL, attempt INTEGER NOT NULL, status TEXT NOT NULL, worker TEXT, device TEXT, ready_at REAL,
    started_at REAL, ended_at REAL, wall_s REAL, queue_wait_s REAL, peak_rss_mb REAL, peak_cuda_mb REAL, error TEXT,
    detail TEXT, UNIQUE (case_key, stage, attempt));
CREATE TABLE findings (case_key TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL, center_x REAL, center_y REAL,
    center_z REAL, diameter_mm REAL, score REAL, PRIMARY KEY (case_key, idx));
CREATE TABLE measurements (case_key TEXT NOT NULL, name TEXT NOT NULL, value REAL, unit TEXT, PRIMARY KEY (case_key, name));
CREATE TABLE gpu_samples (run_id TEXT NOT NULL, t REAL NOT NULL, gpu INTEGER NOT NULL, util_pct REAL, mem_used_mb REAL,
    mem_total_mb REAL);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO runs (run_id, started_at, ended_at, status, device) VALUES ('r0', 1000.0, 1100.0, 'completed', 'cpu');
INSERT INTO cases (case_key, case_id, fingerprint, status, attempts, started_at, ended_at, latency_s, n_findings, output_dir)
    VALUES ('old:1', 'old', 'f', 'done', 1, 1000.0, 1050.0, 50.0, 0, 'cases/old');
INSERT INTO measurements VALUES ('old:1', 'lungs.lungs_total_volume_ml', 5100.0, 'mL');
"""


def test_a_store_of_schema_version_1_reads_and_is_migrated(tmp_path):
    from pipeline.runner import open_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    db = sqlite3.connect(run_dir / "runs.sqlite")
    db.executescript(_V1)
    db.close()
    old = open_run(run_dir)  # read-only: the new columns read as empty
    assert old.cases["flags"].isna().all() and len(old.quality) == 0 and len(old.skipped) == 0
    assert old.measurements.reliable.tolist() == [True]

    store = RunStore(run_dir)  # the runner migrates it
    assert store.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert {"flags", "lung_coverage", "contrast_phase", "detect_skipped"} <= {
        r[1] for r in store.db.execute("PRAGMA table_info(cases)")
    }
    assert store.case("old:1")["status"] == "done"  # nothing lost
    store.close()
    new = open_run(run_dir)
    assert new.measurements.value.tolist() == [5100.0] and new.measurements.reliable.tolist() == [True]


# -- a run folder that cannot be written at all ----------------------------------------------------------------------
def _read_only_folder(tmp_path: Path):
    """A context giving a read-only folder: a read-only tmpfs for root (whom chmod does not stop), else chmod."""
    from contextlib import contextmanager

    @contextmanager
    def ro():
        folder = tmp_path / "ro"
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            why = can_mount()
            if why:
                pytest.skip(f"root ignores chmod and {why}")
            with small_tmpfs(folder, 64, read_only=True):
                yield folder
        else:
            folder.mkdir()
            folder.chmod(0o500)
            try:
                yield folder
            finally:
                folder.chmod(0o700)

    return ro()


def test_a_read_only_out_is_one_clear_line_and_exit_4(tmp_path, capsys):
    from pipeline.cli import main

    with _read_only_folder(tmp_path) as ro:
        with pytest.raises(RunEnvironmentError, match=r"(Read-only file system \(EROFS\)|Permission denied \(EACCES\))"):
            check_writable(ro / "run")
        (tmp_path / "src").mkdir()
        assert main(["run", str(tmp_path / "src"), "--out", str(ro / "run"), "--quiet"]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("ctpipe run: error: cannot write the run folder:") and str(ro / "run") in err
    assert "Fix:" in err


def test_log_records_that_cannot_be_written_are_dropped_quietly(capfd):
    import logging

    from pipeline.runner.logs import attach_jsonl, detach

    handler = attach_jsonl(Path("/dev/full"), process="main")
    try:
        logging.getLogger("pipeline.runner.test").warning("this line cannot be written")
    finally:
        detach(handler)
    assert handler.lost >= 1  # type: ignore[attr-defined]
    assert "Traceback" not in capfd.readouterr().err


# -- the reconstruction: a file not written fails the stage, an organ not found does not ----------------------------
def _recon_task(tmp_path: Path, volume) -> tuple[Task, WorkerInfo]:
    from pipeline.cache import CaseCache

    run_dir = tmp_path / "run"
    cfg = load_config(overrides={"reconstruct.organs": ["lung_left", "lung_right"], "reconstruct.renderings": False}, environ={})
    CaseCache(run_dir / "cache").write("c1", volume)
    workdir = run_dir / "tmp" / "c1.a1"
    workdir.mkdir(parents=True)
    case = CaseSpec("c1", "c1:fp", "c1", "fp" * 12, "/src/c1")
    return Task(case, 1, "reconstruct", 1, str(workdir), {}, 0.0), WorkerInfo("w", "cpu", cfg, run_dir)


@pytest.mark.parametrize(("code", "environmental"), [(errno.ENOSPC, True), (errno.EIO, False)])
def test_a_mesh_that_cannot_be_written_fails_the_reconstruction(tmp_path, monkeypatch, code, environmental):
    import pipeline.reconstruction.export as export
    from pipeline.runner.recon_stages import ReconstructStage
    from tests._support.shapes import synthetic_chest

    def no_room(mesh, out, fmt, *, stem):
        raise OSError(code, os.strerror(code), str(out / f"{stem}.{fmt}"))

    monkeypatch.setattr(export, "write_mesh", no_room)
    vol, _ = synthetic_chest(n=64, slices=24)
    task, worker = _recon_task(tmp_path, vol)
    res = run_task(ReconstructStage(before_detect=True), task, worker)
    assert not res.ok and res.environment is environmental
    if environmental:
        assert res.error_class == "RunEnvironmentError" and "No space left on device (ENOSPC)" in res.error
    else:
        assert res.error_class == IncompleteOutputError.__name__ and "could not write the stl mesh" in res.error


def test_the_reconstruction_declares_its_files_and_keeps_one_lung_mask(tmp_path):
    from pipeline.runner.recon_stages import ReconstructStage, detect_skip_reason, load_lung_mask
    from tests._support.shapes import synthetic_chest

    vol, truth = synthetic_chest(n=64, slices=24)
    task, worker = _recon_task(tmp_path, vol)
    res = run_task(ReconstructStage(before_detect=True), task, worker)
    assert res.ok, res.error
    workdir = Path(task.workdir)
    assert res.outputs["declared"] and all((workdir / p).is_file() for p in res.outputs["declared"])
    assert any(p.endswith("_lung_left.stl") for p in res.outputs["declared"])
    assert res.outputs["quality"]["lung_coverage"] in ("complete", "partial")
    assert detect_skip_reason(res.outputs) is None
    mask = load_lung_mask(worker.cache_dir, "c1", vol.shape)
    assert mask is not None and mask.shape == vol.shape and mask.sum() > 0.5 * (truth["lung_left"] | truth["lung_right"]).sum()


def test_a_scan_without_lungs_is_reconstructed_and_flagged_not_failed(tmp_path):
    from pipeline.runner.recon_stages import ReconstructStage, detect_skip_reason
    from pipeline.volume import CTVolume, Geometry

    _, j, i = np.meshgrid(np.arange(16), np.arange(64), np.arange(64), indexing="ij")
    hu = np.where(((i - 32) / 27.0) ** 2 + ((j - 34) / 20.0) ** 2 <= 1, 40, -1000).astype(np.int16)
    vol = CTVolume(hu, Geometry(shape=hu.shape, spacing=(2.0, 2.0, 5.0), origin=(0.0, 0.0, 0.0), direction=np.eye(3)))
    task, worker = _recon_task(tmp_path, vol)
    res = run_task(ReconstructStage(before_detect=True), task, worker)
    assert res.ok, res.error  # an organ that is not there is a property of the case
    assert res.outputs["quality"]["lung_coverage"] == "absent"
    assert detect_skip_reason(res.outputs).startswith("no lungs in the scan")
    assert res.outputs["recon_errors"]  # recorded (and in the measurements JSON)
    doc = json.loads((Path(task.workdir) / "recon" / "c1_measurements.json").read_text())
    assert doc["errors"] and doc["quality"]["lung_coverage"] == "absent"


# -- identifiers stay home (cheap stages: ingest and write) -----------------------------------------------------------
def test_patient_identifiers_are_left_out_unless_kept(tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage, WriteStage

    files = write_dicom_series(generate_phantom(61, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=61)
    mark_patient(files)
    opts = {"workers": 0, "report.enabled": True, "detector.write_png": False}
    for keep in (False, True):
        out = tmp_path / f"keep_{keep}"
        s = run_batch([tmp_path / "src"], out=out, stages=[IngestStage(), WriteStage()], keep_identifiers=keep, **opts)
        assert s.exit_code == 0 and s.done == 1
        (case,) = (out / "cases").iterdir()
        meta = json.loads((case / "volume.json").read_text())["metadata"]
        assert ("PatientID" in meta) is keep and ("PatientName" in meta) is keep
        if keep:
            assert meta["PatientID"] == "ZQX-PRIV-77310" and "Quillfeather" in meta["PatientName"]
        # outside the case's own volume.json, never: store, logs, metrics, report, manifest
        others = [p for p in out.rglob("*") if p.is_file() and p.name != "volume.json"]
        assert _files_holding(others, PRIVATE_STRINGS) == []
        if not keep:
            assert _files_holding(list(out.rglob("*")), PRIVATE_STRINGS) == []
    saved = yaml.safe_load((tmp_path / "keep_True" / "config.yaml").read_text())
    assert saved["privacy"]["keep_identifiers"] is True


def _files_holding(paths: list[Path], needles: tuple[str, ...]) -> list[tuple[str, str]]:
    """(file, needle) for every file whose bytes contain a needle (UTF-8; the needles are ASCII, so Latin-1 text too),
    except a case's DICOM results (``cases/*/dicom/*.dcm``), which copy Patient and Study from the source by design."""
    hits = []
    for p in paths:
        if not p.is_file() or (p.suffix == ".dcm" and p.parent.name == "dicom" and p.parent.parent.parent.name == "cases"):
            continue
        data = p.read_bytes()
        hits += [(str(p), n) for n in needles if n.encode() in data]
    return hits


# -- the fault corpus, end to end ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    expected = write_fault_corpus(root / "archive")
    out = root / "run"
    args = [
        "run",
        str(root / "archive"),
        "--out",
        str(out),
        "--workers",
        "0",
        *as_cli(QUICK),
    ]
    p = ctpipe(*args)
    return {"root": root / "archive", "out": out, "expected": expected, "proc": p, "args": args}


@pytest.mark.slow
def test_fault_corpus_every_input_is_handled_as_stated(corpus_run):
    from pipeline.runner import open_run

    out, exp, p = corpus_run["out"], corpus_run["expected"], corpus_run["proc"]
    root = corpus_run["root"]
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 3, p.stdout + p.stderr  # one quarantined case; the run itself went through
    run = open_run(out)
    assert run.runs.status.tolist() == ["completed"]
    # processed: the non-ASCII folder, the axial part of the split series, both parts of the mixed spacings
    done = run.cases[run.cases.status == "done"]
    by_folder: dict[str, int] = {}
    for src in done.source:
        rel = Path(src).relative_to(root).as_posix()
        top = rel if rel in exp["done"] else rel.split("/")[0]
        by_folder[top] = by_folder.get(top, 0) + 1
    assert by_folder == exp["done"]
    keys = set(done.series_uid)
    assert f"{exp['split']['scout']}#1" in keys
    assert {f"{exp['split']['spacing']}#1", f"{exp['split']['spacing']}#2"} <= keys
    # quarantined with the true reason, named in the summary
    failed = run.cases[run.cases.status == "failed"]
    assert {Path(s).name: c for s, c in zip(failed.source, failed.error_class)} == exp["quarantined"]
    assert "quarantined" in p.stdout and "no PixelData" in p.stdout
    # every skipped file, with its kind, in the store and the report, its name and folder written as tokens (no
    # --keep-identifiers); series not taken, with the reason
    files = run.skipped[run.skipped.what == "file"]
    assert sorted(files.kind) == sorted(exp["skipped_files"].values())
    for item in files.item:
        assert Path(item).is_relative_to(root), item
        assert Path(item).name.startswith("<file:") or Path(item).name == "DICOMDIR", item
    for name in {Path(k).name for k in exp["skipped_files"]} - {"DICOMDIR"}:
        assert not any(Path(i).name == name for i in files.item), name
    series = run.skipped[run.skipped.what == "series"]
    reasons = {Path(s).name: r for s, r in zip(series.source, series.reason)}
    for folder, words in exp["not_selected"].items():
        assert words in reasons[folder], (folder, reasons.get(folder))
    summary = [ln for ln in p.stdout.splitlines() if "skipped by discovery" in ln]
    assert len(summary) == 1 and "6 file(s)" in summary[0] and "5 series not selected" in summary[0]
    assert str(out / "report" / "skipped.csv") in summary[0]
    import pandas as pd

    csv = pd.read_csv(out / "report" / "skipped.csv")
    assert len(csv) == 11 and set(csv.what) == {"file", "series"}
    html = (out / "report" / "report.html").read_text()
    assert "Skipped by discovery" in html and "symbolic link loop" in html and "<file:" in html.replace("&lt;", "<")
    assert "cut.dcm" not in html


@pytest.mark.slow
def test_split_series_parts_are_cached_as_ctpipe_ingest_caches_them(corpus_run, tmp_path):
    from pipeline.cache import CaseCache
    from pipeline.ingest import ingest_to_cache

    rep = ingest_to_cache(corpus_run["root"], CaseCache(tmp_path / "cache"))
    parts = {k: e for k, e in rep.written.items() if "#" in k}
    assert len(parts) == 3
    for key, entry in parts.items():
        case = corpus_run["out"] / "cases" / entry.case_id
        vol = json.loads((case / "volume.json").read_text())
        assert vol["metadata"]["SeriesKey"] == key
        assert vol["metadata"] == entry.sidecar["metadata"] and vol["fingerprint"] == entry.sidecar["fingerprint"]
        assert vol["geometry"] == entry.sidecar["geometry"]


@pytest.mark.slow
def test_no_patient_identifier_in_the_run_folder_outside_its_dicom_results_nor_in_its_output(corpus_run):
    out, p = corpus_run["out"], corpus_run["proc"]
    hits = _files_holding([f for f in out.rglob("*") if f.is_file()], PRIVATE_STRINGS)
    assert hits == [], hits
    assert not [n for n in PRIVATE_STRINGS if n in p.stdout + p.stderr]
    # and the identifiers were there to be found in the inputs
    sources = [f for f in corpus_run["root"].rglob("*.dcm") if f.is_file() and not f.is_symlink()]
    assert any(PRIVATE_STRINGS[0].encode() in f.read_bytes() for f in sources)


# -- an unexpected error of the main process ------------------------------------------------------------------------
def test_a_run_ended_by_an_unexpected_error_is_recorded_as_failed_not_completed(tmp_path, monkeypatch):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    write_dicom_series(generate_phantom(62, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=62)

    def broken(self: Engine, cases: Any, rejected: Any = ()) -> Any:
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "/elsewhere/x")  # not the run folder's: a bug

    monkeypatch.setattr(Engine, "run", broken)
    out = tmp_path / "run"
    with pytest.raises(NotADirectoryError):
        run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0)
    (status,) = db_rows(out, "SELECT status FROM runs")
    assert status == ("failed",)  # not 'completed': monitoring must see that this run did not finish
    prom = (out / "metrics.prom").read_text()
    assert 'ctpipe_run_exit_status{node="' in prom and prom.split("ctpipe_run_exit_status{")[-1].split()[-1] == "1.0"
    log = (out / "run.log").read_text()
    assert '"event": "run_failed"' in log and "NotADirectoryError" in log and '"exc": "Traceback' in log


@pytest.mark.parametrize("where", ["run.log", "config.yaml", "metrics.prom"])
def test_a_folder_where_the_run_folder_keeps_a_file_is_named_with_exit_4(tmp_path, where):
    # was: run.log "Is a directory. Fix: check the path" and exit status 1; metrics.prom named the temporary file
    # beside it (metrics.prom.<pid>.<n>) as the folder in the way
    (tmp_path / "src").mkdir()
    out = tmp_path / "run"
    (out / where).mkdir(parents=True)
    try:
        s = run_batch([tmp_path / "src"], out=out, workers=0)
    except RunEnvironmentError as exc:  # before the run started: ctpipe run prints it and exits 4
        text = str(exc)
    else:
        assert s.exit_code == 4
        text = "\n".join(s.lines())
    assert f"{out / where}: Is a directory (EISDIR): it is a folder, where the run folder keeps a file" in text, text
    assert "move " in text and "out of the run folder" in text, text  # and the fix (was none for metrics.prom)
    assert (out / where).is_dir()  # never removed: it may be someone's


@pytest.mark.parametrize("where", ["cache", "tmp", "cases"])
def test_a_file_where_the_run_folder_keeps_a_folder_is_named_with_exit_4(tmp_path, where):
    # found at the start (cache: cleaning up after an earlier run), when the first case is admitted (tmp) or when it
    # is published (cases: was "FileExistsError: ... Fix: check the path", exit status 1 and the run recorded failed)
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    write_dicom_series(generate_phantom(63, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=63)
    out = tmp_path / "run"
    out.mkdir()
    (out / where).write_text("not a folder")
    try:
        s = run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0)
    except RunEnvironmentError as exc:  # before the run started: ctpipe run prints it and exits 4
        text = str(exc)
    else:
        assert s.exit_code == 4 and s.unfinished == 1 and s.done == 0
        text = "\n".join(s.lines())
        assert "move the file or folder named above out of the run folder" in text and "free the space" not in text
    assert f"{out / where}: Not a directory (ENOTDIR): it is a file, where the run folder keeps a folder" in text
    assert (out / where).read_text() == "not a folder"  # never removed: it may be someone's file
