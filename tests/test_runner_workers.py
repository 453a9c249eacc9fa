"""Executors and what a worker does with a task: measuring, classifying failures, setup, process workers.

The process-executor tests start real worker processes with the ``fork`` start method (quick to start; the
standard ``forkserver`` is exercised by the slow end-to-end runs).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.errors import ConfigError, CtpipeError, FatalRunError, ReconstructionError
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, Task, TaskResult, WorkerInfo
from pipeline.runner.task_run import InlineExecutor, _reset_peak_rss, peak_rss_mb, run_task, setup_stages
from pipeline.runner.worker_process import main_module_hidden, mp_context
from pipeline.runner.workers import ProcessExecutor

CONFIG = load_config(environ={})


class Echo(Stage):
    """Sleeps ``pause`` s, then writes a file and returns what it saw."""

    name = "echo"
    group = "cpu"

    def __init__(self, pause: float = 0.0, group: str = "cpu"):
        self.pause = pause
        self.group = group
        self.setups: list[str] = []

    def setup(self, worker: WorkerInfo) -> None:
        self.setups.append(worker.name)

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        time.sleep(self.pause)
        ctx.state["scribble"] = True  # the stage's own copy of the state
        (ctx.workdir / "echo.txt").write_text(ctx.case.case_id)
        return {"seen": sorted(ctx.state), "attempt": ctx.attempt, "pid": os.getpid()}


class Raises(Stage):
    name = "raises"

    def __init__(self, exc: BaseException):
        self.exc = exc

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        raise self.exc


class Silent(Stage):
    name = "silent"

    def process(self, ctx: CaseContext) -> Any:
        return None


class Dies(Stage):
    """The worker process exits in the middle of the stage (as if killed) for case ``victim``."""

    name = "dies"
    group = "model"

    def __init__(self, victim: str):
        self.victim = victim

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if ctx.case.case_id == self.victim:
            os._exit(9)
        return {"pid": os.getpid()}


class Hangs(Stage):
    """Never returns for case ``victim`` (a hung library call); returns at once for the others."""

    name = "hangs"
    group = "model"

    def __init__(self, victim: str):
        self.victim = victim

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        while ctx.case.case_id == self.victim:
            time.sleep(0.1)
        return {"pid": os.getpid()}


class Big(Stage):
    """Returns ``size`` bytes for case ``big`` (more than a pipe holds, so the worker blocks while sending them)."""

    name = "big"
    group = "cpu"

    def __init__(self, size: int):
        self.size = size

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        return {"blob": b"x" * (self.size if ctx.case.case_id == "big" else 1), "pid": os.getpid()}


class CannotStart(Stage):
    name = "detect"
    group = "model"

    def setup(self, worker: WorkerInfo) -> None:
        raise ReconstructionError("weights not found", where="/models/x.pt", fix="pass --bundle")


def _task(tmp_path: Path, stage: str, cid: str = "a", *, index: int = 0, state: dict | None = None) -> Task:
    workdir = tmp_path / "tmp" / f"{cid}.a1"
    workdir.mkdir(parents=True, exist_ok=True)
    case = CaseSpec(cid, f"{cid}:fp", cid, "fp", f"/src/{cid}")
    return Task(case, index, stage, 1, str(workdir), dict(state or {}), time.time())


def _worker(tmp_path: Path) -> WorkerInfo:
    return WorkerInfo("main", "cpu", CONFIG, tmp_path)


# -- one task -------------------------------------------------------------------------------------------------------
def test_run_task_runs_the_stage_and_measures_it(tmp_path):
    task = _task(tmp_path, "echo", state={"findings": []})
    res = run_task(Echo(pause=0.05), task, _worker(tmp_path))
    assert res.ok and (res.case_key, res.stage, res.attempt, res.worker, res.device) == ("a:fp", "echo", 1, "main", "cpu")
    assert res.outputs == {"seen": ["findings", "scribble"], "attempt": 1, "pid": os.getpid()}
    assert task.state == {"findings": []}  # the task's own state is not changed by the stage
    assert 0.05 <= res.wall_s < 30 and res.started_at <= res.ended_at and res.ready_at == task.ready_at
    assert res.peak_rss_mb is not None and res.peak_rss_mb > 10
    assert res.peak_cuda_mb is None and res.error is None and not res.fatal and not res.worker_died
    assert (tmp_path / "tmp" / "a.a1" / "echo.txt").read_text() == "a"


def test_a_stage_that_returns_nothing_has_no_outputs(tmp_path):
    res = run_task(Silent(), _task(tmp_path, "silent"), _worker(tmp_path))
    assert res.ok and res.outputs == {}


def test_a_ctpipe_error_fails_the_case_with_its_message(tmp_path):
    exc = ReconstructionError("no lungs found", where="case a", fix="check the series")
    res = run_task(Raises(exc), _task(tmp_path, "raises"), _worker(tmp_path))
    assert not res.ok and res.error_class == "ReconstructionError"
    assert res.error == "case a: no lungs found. Fix: check the series"
    assert not res.fatal and not res.worker_died and res.wall_s is not None


def test_an_unexpected_error_fails_the_case_and_is_logged_with_its_traceback(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="pipeline.runner.task_run"):
        res = run_task(Raises(KeyError("spacing")), _task(tmp_path, "raises"), _worker(tmp_path))
    assert not res.ok and res.error_class == "KeyError"
    assert res.error == "unexpected KeyError in stage raises: 'spacing'"
    (rec,) = [r for r in caplog.records if getattr(r, "event", None) == "stage_error"]
    assert rec.case_id == "a" and "Traceback" in rec.getMessage() and "KeyError" in rec.getMessage()


def test_running_out_of_memory_fails_the_case(tmp_path):
    res = run_task(Raises(MemoryError("cannot allocate 8 GiB")), _task(tmp_path, "raises"), _worker(tmp_path))
    assert not res.ok and res.error_class == "MemoryError"
    assert res.error == "out of memory in stage raises: cannot allocate 8 GiB"


def test_peak_memory_is_reset_and_follows_an_allocation():
    import mmap

    # fresh anonymous mappings: their pages become resident when written, whatever the heap already holds
    high = mmap.mmap(-1, 96 << 20)
    high.write(b"\x01" * (96 << 20))
    high.close()
    _reset_peak_rss()  # the mark drops back to what is resident now
    before = peak_rss_mb()
    block = mmap.mmap(-1, 64 << 20)
    block.write(b"\x01" * (64 << 20))  # 64 MB, written
    after = peak_rss_mb()
    assert before is not None and after is not None and after >= before + 50
    block.close()


# -- setup ---------------------------------------------------------------------------------------------------------
def test_a_stage_that_cannot_start_stops_the_run(tmp_path):
    first = Echo()
    with pytest.raises(FatalRunError) as err:
        setup_stages([first, CannotStart()], _worker(tmp_path))
    assert isinstance(err.value, CtpipeError) and first.setups == ["main"]
    assert str(err.value) == "stage detect cannot start on cpu: /models/x.pt: weights not found. Fix: pass --bundle"
    assert isinstance(err.value.__cause__, ReconstructionError)


def test_fatal_run_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(FatalRunError("stage detect cannot start on cuda:0: no GPU")))
    assert type(err) is FatalRunError and str(err) == "stage detect cannot start on cuda:0: no GPU"


# -- inline executor ---------------------------------------------------------------------------------------------------
def test_inline_executor_runs_each_task_when_submitted(tmp_path):
    stage = Echo()
    ex = InlineExecutor([stage], _worker(tmp_path))
    assert stage.setups == ["main"] and ex.devices() == ["cpu"]
    assert ex.has_room("cpu") and ex.poll(0.0) == []
    ex.submit(_task(tmp_path, "echo", "a"))
    assert not ex.has_room("cpu") and not ex.has_room("model")  # one task at a time, whatever its group
    (res,) = ex.poll(0.0)
    assert res.ok and res.case_key == "a:fp" and ex.has_room("cpu") and ex.poll(0.0) == []
    ex.close()


# -- worker processes ----------------------------------------------------------------------------------------------
def test_start_methods():
    assert [mp_context(m).get_start_method() for m in ("forkserver", "spawn", "fork")] == ["forkserver", "spawn", "fork"]
    with pytest.raises(ConfigError, match="'thread' is not a way to start worker processes") as err:
        mp_context("thread")
    assert err.value.where == "runner.start_method"


def test_the_main_script_is_hidden_from_new_workers_and_restored():
    main = sys.modules["__main__"]
    saved = {k: main.__dict__.get(k, "absent") for k in ("__file__", "__spec__")}
    with main_module_hidden(False):
        assert "__file__" not in main.__dict__ and main.__dict__["__spec__"] is None
    assert {k: main.__dict__.get(k, "absent") for k in ("__file__", "__spec__")} == saved
    with main_module_hidden(True):  # a stage defined in the main script: the workers need it
        assert {k: main.__dict__.get(k, "absent") for k in ("__file__", "__spec__")} == saved


def _poll_until(ex: ProcessExecutor, n: int, timeout: float = 20.0) -> list[TaskResult]:
    out: list[TaskResult] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        out.extend(ex.poll(0.05))
    return out


def test_process_executor_runs_tasks_in_worker_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # the executor sets it for its workers; restored after the test
    ex = ProcessExecutor(
        [Echo()], config=CONFIG, run_dir=tmp_path, workers=1, devices=["cpu"], queue_depth=2, start_method="fork", torch_threads=0
    )
    try:
        assert [w.name for w in ex.workers] == ["cpu-1"] and ex.devices() == ["cpu"]
        ex.submit(_task(tmp_path, "echo", "a"))
        assert not ex.has_room("cpu")  # a CPU worker takes one task at a time
        (res,) = _poll_until(ex, 1)
        assert res.ok and res.worker == "cpu-1" and res.outputs["pid"] == ex.workers[0].proc.pid != os.getpid()
        assert ex.has_room("cpu") and (tmp_path / "tmp" / "a.a1" / "echo.txt").read_text() == "a"
    finally:
        ex.close()
    assert not ex.workers[0].proc.is_alive()
    assert '"process": "cpu-1"' in (tmp_path / "run.log").read_text()  # the worker logs to the run's log


def test_a_dead_worker_is_replaced_and_its_queued_task_handed_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ex = ProcessExecutor(
        [Dies("a")],
        config=CONFIG,
        run_dir=tmp_path,
        workers=1,
        devices=["cpu"],
        queue_depth=1,
        start_method="fork",
        torch_threads=0,
    )
    try:
        first = ex.workers[0].proc.pid
        ex.submit(_task(tmp_path, "dies", "a"))
        ex.submit(_task(tmp_path, "dies", "b"))  # a model worker keeps queue_depth more tasks queued
        assert not ex.has_room("model")
        results = {r.case_key: r for r in _poll_until(ex, 2)}
        dead, ok = results["a:fp"], results["b:fp"]
        assert not dead.ok and dead.worker_died and dead.error_class == "WorkerDiedError"
        assert dead.error == "worker process model-cpu died (exit status 9) while running stage dies"
        assert ok.ok and ok.outputs["pid"] != first  # run by the fresh worker
        (w,) = ex.workers
        assert w.name == "model-cpu" and w.proc.pid != first and w.proc.is_alive() and not w.held
    finally:
        ex.close()


def test_a_stage_over_the_time_limit_is_stopped_and_the_next_task_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ex = ProcessExecutor(
        [Hangs("a")],
        config=CONFIG,
        run_dir=tmp_path,
        workers=1,
        devices=["cpu"],
        queue_depth=1,
        start_method="fork",
        torch_threads=0,
        stage_timeout_s=1.0,
    )
    try:
        first = ex.workers[0].proc.pid
        ex.submit(_task(tmp_path, "hangs", "a"))
        ex.submit(_task(tmp_path, "hangs", "b"))  # queued behind the hung one
        with _fails_after(30):
            results = {r.case_key: r for r in _poll_until(ex, 2, timeout=25)}
        hung, ok = results["a:fp"], results["b:fp"]
        assert not hung.ok and not hung.worker_died and hung.error_class == "StageTimeoutError"  # a verdict, no retry
        assert hung.error is not None
        assert "case a (/src/a)" in hung.error and "stage hangs ran" in hung.error
        assert "runner.stage_timeout_s = 1 s" in hung.error and "--retry-failed" in hung.error
        # the time it ran before it was stopped counts: the capacity model charges it, the report's busy time has it
        assert hung.wall_s is not None and 1.0 <= hung.wall_s < 25, hung.wall_s
        assert hung.started_at is not None and hung.ended_at is not None
        assert hung.ready_at <= hung.started_at and abs(hung.ended_at - hung.started_at - hung.wall_s) < 1e-6
        assert ok.ok and ok.outputs["pid"] != first  # run by the worker that replaced the stopped one
        (w,) = ex.workers
        assert w.proc.pid != first and w.proc.is_alive() and not w.held
    finally:
        ex.close()


def test_a_worker_killed_while_sending_its_result_does_not_block_the_others(tmp_path, monkeypatch):
    # a worker killed (OOM killer, SIGKILL) half-way through writing a result must not hold any lock or
    # channel the other workers need: every worker has its own result pipe
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ex = ProcessExecutor(
        [Big(8 << 20)],
        config=CONFIG,
        run_dir=tmp_path,
        workers=2,
        devices=["cpu"],
        queue_depth=1,
        start_method="fork",
        torch_threads=0,
    )
    try:
        ex.submit(_task(tmp_path, "big", "big"))
        victim = next(w for w in ex.workers if w.held)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _blocked_in_write(victim.proc.pid):
            time.sleep(0.05)
        assert _blocked_in_write(victim.proc.pid), "the worker never started sending its 8 MiB result"
        os.kill(victim.proc.pid, 9)
        victim.proc.join(10)
        ex.submit(_task(tmp_path, "big", "small"))
        with _fails_after(30):  # a half-written message on a shared channel would block this read for ever
            results = {r.case_key: r for r in _poll_until(ex, 2)}
        assert results["small:fp"].ok and results["small:fp"].outputs["blob"] == b"x"
        assert results["big:fp"].worker_died and results["big:fp"].error_class == "WorkerDiedError"
        assert len(ex.workers) == 2 and all(w.proc.is_alive() and not w.held for w in ex.workers)
    finally:
        ex.close()


@contextmanager
def _fails_after(seconds: int) -> Iterator[None]:
    def _expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _blocked_in_write(pid: int) -> bool:
    """Whether a thread of process ``pid`` sleeps in a pipe write (Linux /proc)."""
    try:
        return any("pipe_write" in (t / "wchan").read_text() for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


def test_a_worker_that_cannot_start_is_reported_as_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ex = ProcessExecutor(
        [CannotStart()],
        config=CONFIG,
        run_dir=tmp_path,
        workers=1,
        devices=["cpu"],
        queue_depth=1,
        start_method="fork",
        torch_threads=0,
    )
    try:
        with pytest.raises(FatalRunError, match="stage detect cannot start on cpu: /models/x.pt: weights not found"):
            _poll_until(ex, 1)
    finally:
        ex.close()


def test_the_resource_tracker_of_the_worker_processes_outlives_a_sighup():
    """SIGHUP sent to ctpipe run's process group (its terminal closed) stops the run as SIGTERM does; it no longer kills
    multiprocessing's resource tracker, a member of that group that ignores only SIGINT and SIGTERM, whose death made
    the run end with Python's "resource_tracker: process died unexpectedly ... Some resources might leak" and a
    KeyError traceback per semaphore after its summary."""
    script = (
        "import os, signal, time\n"
        "from multiprocessing import resource_tracker\n"
        "from pipeline.runner.worker_process import mp_context\n"
        "queue = mp_context('forkserver').Queue()\n"  # a semaphore: registered with the tracker, which starts
        "pid = resource_tracker._resource_tracker._pid\n"
        "os.kill(pid, signal.SIGHUP)\n"
        "time.sleep(0.5)\n"
        "print('alive' if os.waitpid(pid, os.WNOHANG) == (0, 0) else 'killed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.stdout.strip() == "alive", (done.stdout, done.stderr)
    assert "resource_tracker" not in done.stderr, done.stderr
