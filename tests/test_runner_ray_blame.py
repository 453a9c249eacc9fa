"""Which case a Ray actor's death is charged to: the task it was running, not the one first in its queue whose reply the
death cut off. Ray is replaced by a stand-in (no cluster); the actor's own code (:class:`StageActor`) runs the tasks
in this process, and a case that "kills the process" raises past it, as nothing after a segfault runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.runner import ray_executor
from pipeline.runner.ray_actors import StageActor
from pipeline.runner.ray_connect import RaySession
from pipeline.runner.ray_executor import MAX_NODE_LOSSES, RayExecutor
from pipeline.runner.ray_pool import PoolActor
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, Task, WorkerInfo

ray = pytest.importorskip("ray")


class _ProcessKilled(BaseException):
    """The actor's process ended mid-task (a segfault, the OOM killer): nothing after it runs there."""


class _Toy(Stage):
    name, group = "toy", "model"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if ctx.case.case_id == "bad":
            raise _ProcessKilled
        return {"seen": ctx.case.case_id}


class _GoneRay:
    """A ``ray`` whose one actor's process is gone: every reference it held answers with ActorDiedError."""

    exceptions = ray.exceptions

    def remote(self, cls: type) -> Any:
        return SimpleNamespace()

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        pass

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return list(refs), []

    def get(self, ref: Any) -> Any:
        raise ray.exceptions.ActorDiedError()


def _setup(monkeypatch, tmp_path: Path, *cases: str) -> tuple[RayExecutor, StageActor, list[Task]]:
    """An executor with one ready model actor holding a task of each of ``cases`` (in that order), and the actor's
    own code that runs them."""
    monkeypatch.setattr(ray_executor, "import_ray", lambda: _GoneRay())
    cfg = load_config(environ={}, overrides={})
    ex = RayExecutor(
        [_Toy()], config=cfg, run_dir=tmp_path, cluster=RaySession("local", owned=False), queue_depth=3, timeout_s=60.0
    )
    ex.pool.actors.append(PoolActor("model-1", "model", _handle(), None, phase="ready"))
    tasks = []
    for seq, case_id in enumerate(cases):
        workdir = tmp_path / "tmp" / f"{case_id}.a1"
        workdir.mkdir(parents=True)
        case = CaseSpec(case_id, f"key-{case_id}", None, "fp", "src")
        tasks.append(Task(case, 0, "toy", 1, str(workdir), {}, 0.0, seq=seq))
        ex.submit(tasks[-1])
    actor = StageActor(
        name="model-1", group="model", stages=[_Toy()], config=cfg.to_dict(), run_dir=str(tmp_path), device="cpu", torch_threads=0
    )
    actor.info = WorkerInfo("model-1@local", "cpu", cfg, tmp_path)  # what place() sets
    return ex, actor, tasks


def test_a_case_that_finished_before_the_next_one_killed_the_actor_is_not_charged(monkeypatch, tmp_path):
    ex, actor, (good, bad, later) = _setup(monkeypatch, tmp_path, "good", "bad", "later")
    assert actor.run(good).ok  # finished; its reply never reaches the driver: the next case kills the process
    with pytest.raises(_ProcessKilled):
        actor.run(bad)
    out = ex.poll(0.1)
    assert [(r.case_key, r.worker_died) for r in out] == [("key-bad", True)], out
    # the finished one runs again (same attempt, none recorded against it), then the one never started
    assert list(ex.backlog["model"]) == [good, later]
    ex.close()
    assert not (tmp_path / "tmp" / "ray-actors").exists()  # the actors' marks go with the run's actors


def test_without_a_mark_of_the_running_task_the_first_task_is_charged(monkeypatch, tmp_path):
    ex, _, (first, second) = _setup(monkeypatch, tmp_path, "a", "b")  # died before it started anything
    out = ex.poll(0.1)
    assert [(r.case_key, r.worker_died) for r in out] == [("key-a", True)]
    assert list(ex.backlog["model"]) == [second]


def test_a_task_whose_reply_keeps_killing_the_actor_is_charged_after_some_reruns(monkeypatch, tmp_path):
    ex, actor, (task,) = _setup(monkeypatch, tmp_path, "good")
    for _ in range(MAX_NODE_LOSSES):  # finished each time, and nothing else ran: rerun without an attempt
        assert actor.run(task).ok
        assert ex.poll(0.1) == [] and list(ex.backlog["model"]) == [task]
        ex.backlog["model"].clear()
        ex.pool.actors.append(PoolActor("model-1", "model", _handle(), None, phase="ready"))  # another actor
        ex.submit(task)
    assert actor.run(task).ok
    out = ex.poll(0.1)
    assert [(r.case_key, r.worker_died) for r in out] == [("key-good", True)]


def _handle() -> Any:
    return SimpleNamespace(run=SimpleNamespace(remote=lambda task: object()))
