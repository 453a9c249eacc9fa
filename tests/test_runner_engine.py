"""The engine: admission and backpressure, stage order, retries after worker deaths, quarantine, publication.

The engine runs here on a real run store and real run folder, with :class:`FakeExecutor`, a test double of
the runner's ``Executor`` protocol that runs the (small, real) test stages in this process and completes one
held task per poll, so that the order of events is deterministic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.errors import CtpipeError, FatalRunError, ReconstructionError
from pipeline.runner.engine import Engine, EngineResult
from pipeline.runner.resume import plan as plan_cases
from pipeline.runner.resume import read_manifest
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, Task, TaskResult, WorkerInfo
from pipeline.runner.store import RunStore
from pipeline.runner.task_run import run_task


class FakeExecutor:
    """The ``Executor`` protocol in this process: at most ``capacity[group]`` tasks held per stage group; each
    ``poll`` completes the oldest held task with the real stage code (:func:`run_task`).

    ``deaths[(case_id, stage)]``: how many times the worker running that stage of that case dies first.
    ``fatal``: a stage whose worker cannot start. ``late``: a dead worker's answer still arrives, one poll later.
    """

    def __init__(
        self,
        stages: list[Stage],
        worker: WorkerInfo,
        *,
        capacity: dict[str, int] | None = None,
        deaths: dict[tuple[str, str], int] | None = None,
        fatal: str | None = None,
        late: bool = False,
    ):
        self.stages = {s.name: s for s in stages}
        self.group = {s.name: s.group for s in stages}
        self.worker = worker
        self.capacity = capacity or {"cpu": 1, "model": 1}
        self.deaths = dict(deaths or {})
        self.fatal = fatal
        self.late = late
        self.held: list[Task] = []
        self.pending: list[TaskResult] = []
        self.submitted: list[tuple[str, str, int]] = []  # (case_id, stage, attempt), in submission order
        self.max_held = dict.fromkeys(self.capacity, 0)
        self.both_busy = False  # a CPU and a model task were held at the same time
        self.watch: list[Any] = []  # called with each submitted task

    def _held(self, group: str) -> int:
        return sum(self.group[t.stage] == group for t in self.held)

    def has_room(self, group: str) -> bool:
        return self._held(group) < self.capacity[group]

    def submit(self, task: Task) -> None:
        group = self.group[task.stage]
        if not self.has_room(group):
            raise AssertionError(f"stage {task.stage} of {task.case.case_id} submitted to a full {group} pool")
        self.held.append(task)
        self.submitted.append((task.case.case_id, task.stage, task.attempt))
        self.max_held[group] = max(self.max_held[group], self._held(group))
        self.both_busy |= all(self._held(g) for g in ("cpu", "model"))
        for fn in self.watch:
            fn(task)

    def poll(self, timeout: float) -> list[TaskResult]:
        out, self.pending = self.pending, []
        if not self.held:
            return out
        task = self.held.pop(0)
        if task.stage == self.fatal:
            return [*out, self._result(task, ok=False, error="weights file missing", fatal=True)]
        if self.deaths.get((task.case.case_id, task.stage), 0) > 0:
            self.deaths[(task.case.case_id, task.stage)] -= 1
            if self.late:
                self.pending.append(self._result(task, ok=True, outputs={"findings": [{"center_lps": [0, 0, 0]}]}))
            return [
                *out,
                self._result(
                    task,
                    ok=False,
                    error_class="WorkerDiedError",
                    worker_died=True,
                    error=f"worker process cpu-1 died (signal 9) while running stage {task.stage}",
                ),
            ]
        return [*out, run_task(self.stages[task.stage], task, self.worker)]

    def _result(self, task: Task, *, ok: bool, **kw: Any) -> TaskResult:
        return TaskResult(task.case.case_key, task.stage, task.stage_index, task.attempt, ok, "cpu-1", "cpu", task.ready_at, **kw)


# -- small real stages ---------------------------------------------------------------------------------------------
class Ingest(Stage):
    """Writes a file into the case's folder and a cached 'volume' like the real ingest."""

    name = "ingest"
    group = "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        (ctx.workdir / "ingest.txt").write_text(ctx.case.case_id)
        ctx.cache_dir.mkdir(exist_ok=True)
        for suffix in (".json", ".npy"):
            (ctx.cache_dir / f"{ctx.case.case_id}{suffix}").write_bytes(b"hu")
        return {"slices": 24}


class Detect(Stage):
    name = "detect"
    group = "model"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        z = float(ctx.state["slices"])  # an earlier stage's output
        return {
            "findings": [{"center_lps": [1.0, 2.0, z], "diameter_mm": 5.0, "score": 0.75}],
            "measurements": [("lungs.volume_ml", 4200.0, "mL")],
            "timings": {"model": 0.01},
        }


class Reconstruct(Stage):
    name = "reconstruct"
    group = "cpu"

    def __init__(self, broken: tuple[str, ...] = ()):
        self.broken = broken

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if ctx.case.case_id in self.broken:
            raise ReconstructionError("the lungs are empty", where=ctx.case.case_id, fix="check the series")
        (ctx.workdir / "recon").mkdir()
        (ctx.workdir / "recon" / "lungs.stl").write_bytes(b"solid lungs " + ctx.case.case_id.encode())
        return {}


class Recorder:
    """An engine observer that records what it is told."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, bool]] = []
        self.done: list[tuple[str, int]] = []  # (case_id, number of findings)
        self.failed: list[tuple[str, str]] = []

    def on_stage(self, result: TaskResult) -> None:
        self.stages.append((result.stage, result.ok))

    def on_case_done(self, case: CaseSpec, latency_s: float, n_findings: int) -> None:
        assert 0 <= latency_s < 60, latency_s  # seconds from the case's start: these stages take milliseconds
        self.done.append((case.case_id, n_findings))

    def on_case_failed(self, case: CaseSpec, reason: str, error_class: str) -> None:
        self.failed.append((case.case_id, error_class))


STAGES: list[Stage] = [Ingest(), Detect(), Reconstruct()]


def _spec(cid: str, rejected: tuple[str, str] | None = None) -> CaseSpec:
    return CaseSpec(cid, f"{cid}:fp", cid, "fp" * 12, f"/src/{cid}", (f"/src/{cid}/1.dcm",), rejected)


def _run(
    tmp_path: Path,
    ids: list[str],
    *,
    stages: list[Stage] = STAGES,
    rejected: tuple[str, ...] = (),
    max_in_flight: int = 2,
    retries: int = 1,
    keep_cache: bool = False,
    **fake: Any,
) -> tuple[EngineResult, RunStore, FakeExecutor, Recorder]:
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    specs = [_spec(c) for c in ids] + [_spec(c, ("MissingSliceError", f"{c}: slice 3 is missing")) for c in rejected]
    chosen = plan_cases(store, specs, retry_failed=False)
    executor = FakeExecutor(stages, WorkerInfo("test", "cpu", load_config(environ={}), run_dir), **fake)
    rec = Recorder()
    engine = Engine(
        stages,
        executor,
        store,
        run_dir=run_dir,
        run_id="r1",
        max_in_flight=max_in_flight,
        retries=retries,
        keep_cache=keep_cache,
        observers=[rec],
    )
    executor.watch.append(lambda task: _check_bounded(store, run_dir, max_in_flight))
    result = engine.run(chosen.to_run, chosen.rejected)
    return result, store, executor, rec


def _check_bounded(store: RunStore, run_dir: Path, max_in_flight: int) -> None:
    running = len(store.cases_with_status("running"))
    staging = len(list((run_dir / "tmp").iterdir()))
    assert 1 <= running <= max_in_flight and staging == running, (running, staging)


def _rows(store: RunStore, sql: str, *args: Any) -> list[tuple]:
    return [tuple(r) for r in store.db.execute(sql, args)]


# -- tests -------------------------------------------------------------------------------------------------------------
def test_every_case_goes_through_every_stage_and_is_published(tmp_path):
    result, store, _, rec = _run(tmp_path, ["a", "b", "c"])
    run_dir = store.run_dir
    assert result.done == ["a", "b", "c"] and result.failed == [] and result.fatal is None
    assert rec.done == [("a", 1), ("b", 1), ("c", 1)] and sorted(rec.stages) == sorted(
        (s.name, True) for s in STAGES for _ in "abc"
    )
    for cid in ("a", "b", "c"):
        folder = run_dir / "cases" / cid
        man = read_manifest(folder)
        assert man is not None and man["case_key"] == f"{cid}:fp"
        assert [f["path"] for f in man["files"]] == ["ingest.txt", "recon/lungs.stl"]
        for f in man["files"]:
            data = (folder / f["path"]).read_bytes()
            assert f["bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
        assert man["findings"] == [{"center_lps": [1.0, 2.0, 24.0], "diameter_mm": 5.0, "score": 0.75}]
        assert man["measurements"] == [["lungs.volume_ml", 4200.0, "mL"]]
        row = store.case(f"{cid}:fp")
        assert (row["status"], row["output_dir"], row["n_findings"], row["attempts"]) == ("done", f"cases/{cid}", 1, 1)
    assert _rows(store, "SELECT COUNT(*), SUM(status = 'ok') FROM stage_attempts") == [(9, 9)]
    detail = _rows(store, "SELECT detail FROM stage_attempts WHERE stage = 'detect'")
    assert {json.loads(d[0])["model"] for d in detail} == {0.01}  # the stage's own timings, stored with the attempt
    assert _rows(store, "SELECT center_z, score FROM findings") == [(24.0, 0.75)] * 3
    assert list((run_dir / "tmp").iterdir()) == [] and list((run_dir / "cache").iterdir()) == []  # nothing left


def test_admission_keeps_at_most_max_in_flight_cases(tmp_path):
    # plenty of room in the executor: only max_in_flight limits how many cases are started
    result, _, executor, _ = _run(
        tmp_path, [f"c{i}" for i in range(5)], max_in_flight=3, capacity={"cpu": 10, "model": 10}
    )  # _check_bounded runs at each submission
    assert len(result.done) == 5
    first_stage = [c for c, stage, _ in executor.submitted if stage == "ingest"]
    assert first_stage == [f"c{i}" for i in range(5)]
    assert executor.max_held["cpu"] == 3  # the pipeline was kept full


def test_no_task_is_submitted_without_room_and_both_groups_overlap(tmp_path):
    result, _, executor, _ = _run(tmp_path, ["a", "b", "c", "d"], max_in_flight=3)
    assert result.done == ["a", "b", "c", "d"]
    assert executor.max_held == {"cpu": 1, "model": 1}  # FakeExecutor.submit refuses a full pool
    assert executor.both_busy  # the model worker ran one case while a CPU worker ran another


def test_later_stages_of_admitted_cases_go_before_new_cases(tmp_path):
    stages: list[Stage] = [Ingest(), Reconstruct()]  # both CPU stages, one CPU slot
    result, _, executor, _ = _run(tmp_path, ["a", "b", "c"], stages=stages, max_in_flight=2)
    # b's ingest was ready before a's reconstruct, yet a's reconstruct runs first: cases finish in order
    assert executor.submitted == [
        ("a", "ingest", 1),
        ("a", "reconstruct", 1),
        ("b", "ingest", 1),
        ("b", "reconstruct", 1),
        ("c", "ingest", 1),
        ("c", "reconstruct", 1),
    ]
    assert result.done == ["a", "b", "c"]


def test_mixed_pipeline_order(tmp_path):
    _, _, executor, _ = _run(tmp_path, ["a", "b", "c"], stages=[Ingest(), Detect()], max_in_flight=3)
    assert [(c, s) for c, s, _ in executor.submitted] == [
        ("a", "ingest"),
        ("a", "detect"),
        ("b", "ingest"),
        ("b", "detect"),
        ("c", "ingest"),
        ("c", "detect"),
    ]


def test_a_worker_death_is_retried_and_the_case_completes(tmp_path):
    result, store, executor, rec = _run(tmp_path, ["a", "b"], retries=1, deaths={("b", "detect"): 1})
    assert result.done == ["a", "b"] and result.failed == [] and rec.failed == []
    assert store.case("b:fp")["attempts"] == 2 and store.case("a:fp")["attempts"] == 1
    assert ("b", "ingest", 2) in executor.submitted  # the retry starts the case again from its first stage
    rows = _rows(store, "SELECT attempt, stage, status FROM stage_attempts WHERE case_key = 'b:fp' ORDER BY id")
    assert rows == [
        (1, "ingest", "superseded"),
        (1, "detect", "interrupted"),
        (2, "ingest", "ok"),
        (2, "detect", "ok"),
        (2, "reconstruct", "ok"),
    ]
    assert _rows(store, "SELECT COUNT(*) FROM findings WHERE case_key = 'b:fp'") == [(1,)]
    # its latency runs end to end, from the first attempt (the crashed one) to the completion
    ((started, ended, latency),) = _rows(store, "SELECT started_at, ended_at, latency_s FROM cases WHERE case_key = 'b:fp'")
    ((first_stage,),) = _rows(store, "SELECT MIN(started_at) FROM stage_attempts WHERE case_key = 'b:fp'")
    # (measured on the monotonic clock from just after the recorded start: it began between that and the first stage)
    assert started <= first_stage and started <= ended - latency <= first_stage + 0.01


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_case_whose_worker_keeps_dying_is_quarantined_after_the_configured_retries(tmp_path, retries):
    result, store, executor, rec = _run(tmp_path, ["a", "b", "c"], retries=retries, deaths={("b", "detect"): 99})
    run_dir = store.run_dir
    assert result.done == ["a", "c"] and rec.failed == [("b", "WorkerDiedError")]
    (failed,) = result.failed
    assert failed[:2] == ("b", "WorkerDiedError") and "died (signal 9) while running stage detect" in failed[2]
    assert f"on each of {retries + 1} attempt(s) (runner.retries = {retries})" in failed[2]
    assert "out-of-memory killer" in failed[2] and "--retry-failed" in failed[2]  # the likely cause, and the fix
    row = store.case("b:fp")
    assert (row["status"], row["failed_stage"], row["error_class"], row["attempts"]) == (
        "failed",
        "detect",
        "WorkerDiedError",
        retries + 1,
    )
    assert sum(1 for c, s, _ in executor.submitted if (c, s) == ("b", "detect")) == retries + 1
    assert _rows(store, "SELECT COUNT(*) FROM stage_attempts WHERE case_key = 'b:fp' AND status = 'interrupted'") == [
        (retries + 1,)
    ]
    q = json.loads((run_dir / "quarantine" / "b.json").read_text())
    assert (q["case_id"], q["stage"], q["error_class"], q["source"]) == ("b", "detect", "WorkerDiedError", "/src/b")
    assert not (run_dir / "cases" / "b").exists() and not (run_dir / "cache" / "b.npy").exists()
    assert list((run_dir / "tmp").iterdir()) == []


def test_a_stage_error_quarantines_at_once_without_retrying(tmp_path):
    stages: list[Stage] = [Ingest(), Detect(), Reconstruct(broken=("b",))]
    result, store, executor, _ = _run(tmp_path, ["a", "b"], stages=stages, retries=3)
    assert result.done == ["a"]
    assert result.failed == [("b", "ReconstructionError", "b: the lungs are empty. Fix: check the series")]
    row = store.case("b:fp")
    assert (row["status"], row["failed_stage"], row["attempts"]) == ("failed", "reconstruct", 1)
    assert [s for c, s, _ in executor.submitted if c == "b"] == ["ingest", "detect", "reconstruct"]
    assert _rows(store, "SELECT error FROM stage_attempts WHERE case_key = 'b:fp' AND status = 'failed'") == [
        ("b: the lungs are empty. Fix: check the series",)
    ]


def test_cases_refused_at_discovery_are_quarantined_without_running(tmp_path):
    result, store, executor, rec = _run(tmp_path, ["a"], rejected=("bad",))
    assert result.done == ["a"] and result.failed == [("bad", "MissingSliceError", "bad: slice 3 is missing")]
    assert rec.failed == [("bad", "MissingSliceError")]
    assert all(c != "bad" for c, _, _ in executor.submitted)
    row = store.case("bad:fp")
    assert (row["status"], row["failed_stage"], row["reason"]) == ("failed", "discover", "bad: slice 3 is missing")
    assert (store.run_dir / "quarantine" / "bad.json").is_file()


def test_a_case_refused_again_when_failures_are_retried_is_an_attempt_of_the_new_run(tmp_path):
    _, store, _, _ = _run(tmp_path, [], rejected=("bad",))
    store.end_run("r1", status="completed", n_cases=1, n_done=0, n_failed=1, n_skipped=0)
    # the first run was an hour ago
    store.db.execute("UPDATE cases SET started_at = started_at - 3600, ended_at = ended_at - 3600")
    store.db.commit()
    store.start_run("r2", command="t", sources=[], config={}, versions={}, device="cpu", host="h", pid=1)
    chosen = plan_cases(store, [_spec("bad", ("MissingSliceError", "bad: slice 3 is missing"))], retry_failed=True)
    executor = FakeExecutor(STAGES, WorkerInfo("test", "cpu", load_config(environ={}), store.run_dir))
    engine = Engine(STAGES, executor, store, run_dir=store.run_dir, run_id="r2", max_in_flight=2, retries=1, keep_cache=False)
    engine.run(chosen.to_run, chosen.rejected)
    row = store.case("bad:fp")
    assert (row["status"], row["run_id"], row["attempts"]) == ("failed", "r2", 2)
    # refused at discovery: no latency was measured (not the time since the first run, nor between two store writes)
    assert row["latency_s"] is None, row["latency_s"]


def test_a_worker_that_cannot_start_stops_the_run(tmp_path):
    with pytest.raises(FatalRunError, match="stage detect cannot start on cpu: weights file missing") as err:
        _run(tmp_path, ["a", "b"], fatal="detect")
    assert isinstance(err.value, CtpipeError)


def test_a_late_answer_about_an_abandoned_attempt_is_ignored(tmp_path):
    result, store, _, _ = _run(tmp_path, ["a"], deaths={("a", "detect"): 1}, late=True)
    assert result.done == ["a"]
    rows = _rows(store, "SELECT attempt, status FROM stage_attempts WHERE stage = 'detect' ORDER BY id")
    assert rows == [(1, "interrupted"), (2, "ok")]  # the dead attempt's late 'ok' is not recorded
    assert _rows(store, "SELECT center_z FROM findings") == [(24.0,)]


def test_keep_cache_keeps_the_cached_volumes(tmp_path):
    _, store, _, _ = _run(tmp_path, ["a", "b"], keep_cache=True)
    assert sorted(p.name for p in (store.run_dir / "cache").iterdir()) == ["a.json", "a.npy", "b.json", "b.npy"]
