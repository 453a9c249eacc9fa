"""Executors: run :class:`~pipeline.runner.stage.Task` objects inline or in worker processes.

``InlineExecutor`` runs every stage in the calling process, one task at a
time (the sequential mode, ``runner.workers = 0``). ``ProcessExecutor`` keeps a
pool of CPU worker processes and one model worker per device; each worker has
its own bounded task queue and its own result pipe, so the main process always
knows which task a worker holds and can recover when a worker dies: a worker
killed in the middle of a write damages only its own pipe, never the results
of the others. A worker tells the main process when it starts a task, so a
stage that runs longer than ``runner.stage_timeout_s`` (a hung library call, a
pathological series) is stopped: the worker is killed and replaced, and the case
fails with :class:`~pipeline.errors.StageTimeoutError` while the batch goes on.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext
from pathlib import Path
from typing import Any

from ..config import Config, from_dict
from ..errors import ConfigError, CtpipeError, FatalRunError, StageTimeoutError
from .faults import environment_failure
from .logs import collect_for_console, log_as_worker, log_context
from .redact import active as active_redactor
from .redact import redact_in_worker
from .stage import CaseContext, Stage, Task, TaskResult, WorkerInfo

log = logging.getLogger(__name__)


# -- measurement ---------------------------------------------------------------------------
def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux; no-op elsewhere)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    """Peak resident memory (MiB: 2**20 bytes, the unit of every ``*_mb`` memory figure) of this process since the last
    reset."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except (ImportError, OSError):
        return None


def _cuda_device(device: str) -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch


def run_task(stage: Stage, task: Task, worker: WorkerInfo) -> TaskResult:
    """Run one stage of one case, measuring wall time (s) and peak memory (MB)."""
    res = TaskResult(
        task.case.case_key, task.stage, task.stage_index, task.attempt, False, worker.name, worker.device, task.ready_at
    )
    torch = _cuda_device(worker.device)
    if torch is not None:
        torch.cuda.reset_peak_memory_stats(worker.device)
    _reset_peak_rss()
    ctx = CaseContext(task.case, task.attempt, Path(task.workdir), worker, dict(task.state))
    res.started_at = time.time()
    t0 = time.perf_counter()
    with collect_for_console() as console:  # a worker's warnings, for the main process' console
        try:
            with log_context(case_id=task.case.case_id, stage=task.stage):  # the stage's own records name the case
                out = stage.process(ctx) or {}
            if torch is not None:
                torch.cuda.synchronize(worker.device)  # the stage's GPU work is part of its wall time
            res.outputs = dict(out)
            res.ok = True
        except Exception as exc:  # noqa: BLE001 - a bug or library error in one case must not stop the batch
            _describe_failure(res, exc, task, worker)
    res.log_records = console
    res.wall_s = time.perf_counter() - t0
    res.ended_at = time.time()
    res.peak_rss_mb = peak_rss_mb()
    if torch is not None:
        res.peak_cuda_mb = torch.cuda.max_memory_allocated(worker.device) / 2**20
    return res


def _describe_failure(res: TaskResult, exc: Exception, task: Task, worker: WorkerInfo) -> None:
    """Fill ``res`` with what went wrong: the run folder (environment), the case (its error), or a bug (traceback logged)."""
    env = environment_failure(exc, run_dir=worker.run_dir)
    if env is not None:  # not the case's fault: one line, no traceback; the case is retried by the next run
        res.environment = True
        res.error_class, res.error = "RunEnvironmentError", f"stage {task.stage}: {env.describe()}"
        log.warning(
            "case %s stage %s: %s",
            task.case.case_id,
            task.stage,
            env.describe(),
            extra={"case_id": task.case.case_id, "stage": task.stage, "event": "environment_failure"},
        )
    elif isinstance(exc, CtpipeError):
        res.error_class, res.error = type(exc).__name__, str(exc)
    elif isinstance(exc, MemoryError):
        res.error_class, res.error = "MemoryError", f"out of memory in stage {task.stage}: {exc}"
    else:
        res.error_class = type(exc).__name__
        res.error = f"unexpected {type(exc).__name__} in stage {task.stage}: {exc}"
        log.error(
            "case %s stage %s raised\n%s",
            task.case.case_id,
            task.stage,
            traceback.format_exc(),
            extra={"case_id": task.case.case_id, "stage": task.stage, "event": "stage_error"},
        )


def setup_stages(stages: Sequence[Stage], worker: WorkerInfo) -> None:
    """Call every stage's ``setup`` once (model loading, imports); raise FatalRunError when one cannot start."""
    for stage in stages:
        t0 = time.perf_counter()
        try:
            stage.setup(worker)
        except CtpipeError as exc:
            raise FatalRunError(f"stage {stage.name} cannot start on {worker.device}: {exc}") from exc
        log.info(
            "%s: stage %s ready in %.2f s",
            worker.name,
            stage.name,
            time.perf_counter() - t0,
            extra={"event": "stage_setup", "stage": stage.name, "wall_s": round(time.perf_counter() - t0, 4)},
        )


# -- inline ------------------------------------------------------------------------------------
class InlineExecutor:
    """Runs each task in this process when submitted (sequential mode)."""

    def __init__(self, stages: Sequence[Stage], worker: WorkerInfo):
        self.stages = {s.name: s for s in stages}
        self.worker = worker
        self._results: deque[TaskResult] = deque()
        setup_stages(list(stages), worker)

    def devices(self) -> list[str]:
        return [self.worker.device]

    def has_room(self, group: str) -> bool:
        return not self._results

    def submit(self, task: Task) -> None:
        self._results.append(run_task(self.stages[task.stage], task, self.worker))

    def poll(self, timeout: float) -> list[TaskResult]:
        out = list(self._results)
        self._results.clear()
        return out

    def close(self) -> None:
        pass


#: environment variables the worker processes are started with (the hash seed, native thread pools' sizes)
_WORKER_ENVIRON = ("PYTHONHASHSEED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# -- worker processes ----------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the main process is gone (e.g. killed with SIGKILL)."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:
            pass


def worker_main(
    name: str,
    device: str,
    stages: list[Stage],
    config: dict,
    run_dir: str,
    inq: Any,
    out: Any,
    parent_pid: int,
    torch_threads: int,
    redacted: dict[str, str] | None = None,
) -> None:
    """Entry point of a worker process: set up stages lazily, then run tasks until told to stop. ``redacted``: the
    run's patient-named path components and their tokens (:mod:`.redact`), kept out of its run.log records."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    log_as_worker(Path(run_dir) / "run.log", process=name)  # run.log only; the main process talks to the user
    if redacted is not None:
        redact_in_worker(redacted)
    if torch_threads > 0:
        os.environ["OMP_NUM_THREADS"] = str(torch_threads)
        try:
            import torch

            torch.set_num_threads(torch_threads)
        except ImportError:
            pass
    cfg: Config = from_dict(config)
    info = WorkerInfo(name, device, cfg, Path(run_dir))
    by_name = {s.name: s for s in stages}
    try:
        try:
            setup_stages(stages, info)
        except FatalRunError as exc:
            out.send(("fatal", name, str(exc)))
            return
        out.send(("ready", name, None))
        while True:
            task: Task | None = inq.get()
            if task is None:
                break
            out.send(("start", name, (task.case.case_key, task.stage)))  # the main process times the stage from here
            out.send(("result", name, run_task(by_name[task.stage], task, info)))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the main process records the interruption
        return
    except (BrokenPipeError, ConnectionResetError, EOFError):  # the main process is gone (SIGKILL): no one to tell
        log.info("worker %s: the main process is gone; the next run redoes its case", name, extra={"event": "worker_orphaned"})
        return


@contextmanager
def _main_module_hidden(needed: bool) -> Iterator[None]:
    """Start workers without re-importing the caller's ``__main__`` script (unless a stage is defined there).

    With the forkserver/spawn start methods Python imports the main script again in every worker, so a
    script calling ``run_batch`` at top level would run again there. The standard stages live in
    importable modules, so the workers do not need ``__main__``.
    """
    main = sys.modules.get("__main__")
    if needed or main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def mp_context(start_method: str) -> ForkContext | ForkServerContext | SpawnContext:
    """The multiprocessing context of ``runner.start_method`` (``forkserver``, ``spawn`` or ``fork``), its resource
    tracker started deaf to SIGHUP (:func:`_start_resource_tracker`)."""
    _start_resource_tracker()
    if start_method == "forkserver":
        return mp.get_context("forkserver")
    if start_method == "spawn":
        return mp.get_context("spawn")
    if start_method == "fork":
        return mp.get_context("fork")
    raise ConfigError(
        f"runner.start_method = {start_method!r} is not a way to start worker processes",
        where="runner.start_method",
        fix="use forkserver, spawn or fork",
    )


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (if not yet running) with SIGHUP blocked, which it then keeps: it is
    in ``ctpipe run``'s process group and ignores only SIGINT and SIGTERM, so a SIGHUP sent to the group (the
    terminal closed, ``kill -HUP -PGID``) killed it while the run stopped as for SIGTERM, and the run ended with
    Python's "resource_tracker: process died unexpectedly ... Some resources might leak" and a KeyError traceback
    for each semaphore the tracker started again in its place had never seen. A SIGHUP for this process during the
    start is delivered once it is done."""
    if not hasattr(signal, "SIGHUP") or not hasattr(signal, "pthread_sigmask"):
        return
    from multiprocessing import resource_tracker

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@dataclass
class _Worker:
    name: str
    group: str
    device: str
    proc: Any
    inq: Any
    conn: Any  # the receiving end of the worker's result pipe
    held: deque[Task] = field(default_factory=deque)
    running_since: float | None = None  # time.monotonic() when it started its current task (None: idle)
    timed_out: float | None = None  # seconds its current task had run when it was killed for runner.stage_timeout_s
    timed_out_at: float | None = None  # Unix time (s) of that kill
    timed_key: tuple[str, str] | None = None  # (case key, stage) of that task


class ProcessExecutor:
    """CPU worker processes plus one model worker per device, each with a bounded queue."""

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        config: Config,
        run_dir: Path,
        workers: int,
        devices: Sequence[str],
        queue_depth: int,
        start_method: str,
        torch_threads: int,
        stage_timeout_s: float = 0.0,
    ):
        self.stages = list(stages)
        self.config = config
        self.run_dir = run_dir
        self.depth = queue_depth
        self.torch_threads = torch_threads
        self.stage_timeout_s = stage_timeout_s  # 0: no limit
        # the calling process' own settings of what the workers are started with, put back by close()
        self._environ_before = {var: os.environ.get(var) for var in _WORKER_ENVIRON}
        # the same hash seed in every worker and run: set/dict iteration orders, and so every output file,
        # are then reproducible from run to run (a resumed run writes exactly what an uninterrupted one would)
        os.environ.setdefault("PYTHONHASHSEED", "0")
        if torch_threads > 0:  # native thread pools read these when their libraries load in the workers
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ.setdefault(var, str(torch_threads))
        self.ctx = mp_context(start_method)
        if start_method == "forkserver":
            mods = sorted({m for s in stages for m in s.preload} | {"pipeline.runner.workers"})
            self.ctx.set_forkserver_preload([*mods, "pipeline.runner.forkserver_freeze"])  # imported in this order
        self.workers: list[_Worker] = []
        self._n = 0
        groups = {s.group for s in stages}
        if "cpu" in groups:
            for _ in range(max(1, workers)):
                self._spawn("cpu", "cpu")
        if "model" in groups:
            for dev in devices:
                self._spawn("model", dev)

    def devices(self) -> list[str]:
        return sorted({w.device for w in self.workers if w.group == "model"}) or ["cpu"]

    def _spawn(self, group: str, device: str) -> _Worker:
        self._n += 1
        name = f"{group}-{self._n}" if group == "cpu" else f"model-{device}"
        stages = [s for s in self.stages if s.group == group]
        inq = self.ctx.Queue(maxsize=self.depth + 1)
        conn, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=worker_main,
            name=f"ctpipe-{name}",
            daemon=True,
            args=(
                name,
                device,
                stages,
                self.config.to_dict(),
                str(self.run_dir),
                inq,
                send,
                os.getpid(),
                self.torch_threads,
                redactor.shared if (redactor := active_redactor()) is not None else None,
            ),
        )
        with _main_module_hidden(any(type(s).__module__ == "__main__" for s in stages)):
            proc.start()
        send.close()  # only the worker writes: its death then reads as end-of-file here
        w = _Worker(name, group, device, proc, inq, conn)
        self.workers.append(w)
        log.info("started worker %s (pid %s) on %s", name, proc.pid, device, extra={"event": "worker_start"})
        return w

    def _group_of(self, task: Task) -> str:
        return next(s.group for s in self.stages if s.name == task.stage)

    def _limit(self, group: str) -> int:
        # a model worker keeps `depth` inputs queued so the device never waits; a CPU worker takes one task
        # at a time, so a later stage of an admitted case never waits behind a new case's ingest
        return self.depth + 1 if group == "model" else 1

    def has_room(self, group: str) -> bool:
        return any(w.group == group and len(w.held) < self._limit(group) for w in self.workers)

    def submit(self, task: Task) -> None:
        group = self._group_of(task)
        cands = [w for w in self.workers if w.group == group and len(w.held) < self._limit(group)]
        w = min(cands, key=lambda w: len(w.held))
        w.held.append(task)
        w.inq.put(task)

    def poll(self, timeout: float) -> list[TaskResult]:
        results: list[TaskResult] = []
        ready = mpc.wait([w.conn for w in self.workers], timeout=max(0.0, timeout))
        for w in list(self.workers):
            if w.conn in ready:
                results.extend(self._drain(w))
        self._stop_overdue()
        results.extend(self._check_alive())
        return results

    def _stop_overdue(self) -> None:
        """Kill every worker whose current task has run past ``stage_timeout_s`` (reported by :meth:`_check_alive`)."""
        if self.stage_timeout_s <= 0:
            return
        now = time.monotonic()
        for w in self.workers:
            if w.running_since is None or w.timed_out is not None or now - w.running_since <= self.stage_timeout_s:
                continue
            w.timed_out, w.timed_out_at = now - w.running_since, time.time()
            task = w.held[0] if w.held else None
            w.timed_key = (task.case.case_key, task.stage) if task else None
            log.error(
                "worker %s: stage %s of case %s has run %.0f s, over runner.stage_timeout_s = %g s; stopping the worker",
                w.name,
                task.stage if task else "?",
                task.case.case_id if task else "?",
                w.timed_out,
                self.stage_timeout_s,
                extra={"event": "stage_timeout", "case_id": task.case.case_id if task else None},
            )
            w.proc.kill()
            w.proc.join(timeout=10)

    def _drain(self, w: _Worker) -> list[TaskResult]:
        """Every message the worker has written so far; stops at end-of-file (the worker is gone)."""
        out: list[TaskResult] = []
        while True:
            try:
                if not w.conn.poll():
                    return out
                msg = w.conn.recv()
            except (EOFError, OSError):  # the worker exited; a message it was writing when killed is lost
                return out
            if msg[0] == "fatal":
                raise FatalRunError(msg[2])
            if msg[0] == "start":
                w.running_since = time.monotonic()
            if msg[0] == "result":
                w.running_since = None
                res: TaskResult = msg[2]
                for i, t in enumerate(w.held):
                    if t.case.case_key == res.case_key and t.stage == res.stage:
                        del w.held[i]
                        break
                out.append(res)

    def _check_alive(self) -> list[TaskResult]:
        out: list[TaskResult] = []
        for w in list(self.workers):
            if w.proc.is_alive():
                continue
            out.extend(self._drain(w))  # results it sent before it died still count
            w.conn.close()
            code = w.proc.exitcode
            self.workers.remove(w)
            how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            held = list(w.held)
            if not held or (held[0].case.case_key, held[0].stage) != w.timed_key:  # not the stop logged for the limit
                log.error("worker %s died (%s) holding %d task(s)", w.name, how, len(w.held), extra={"event": "worker_died"})
            new = self._spawn(w.group, w.device)
            for n, t in enumerate(held):
                if n > 0:  # never started: hand it to the fresh worker
                    new.held.append(t)
                    new.inq.put(t)
                    continue
                if w.timed_key == (t.case.case_key, t.stage):  # stopped on purpose: the case's verdict, not a crash
                    out.append(self._timeout_result(w, t))
                    continue
                out.append(
                    _failed(
                        w,
                        t,
                        "WorkerDiedError",
                        f"worker process {w.name} died ({how}) while running stage {t.stage}",
                        worker_died=True,
                    )
                )
        return out

    def _timeout_result(self, w: _Worker, t: Task) -> TaskResult:
        err = StageTimeoutError(
            f"stage {t.stage} ran {w.timed_out:.0f} s, longer than runner.stage_timeout_s = {self.stage_timeout_s:g} s, "
            f"and was stopped (worker {w.name} killed and replaced)",
            where=f"case {t.case.case_id} ({t.case.source})",
            fix="if the series is simply large or the machine busy, raise the limit (--set runner.stage_timeout_s=SECONDS) "
            "and run again with --retry-failed; otherwise check the series (run.log has the stage's last records)",
        )
        res = _failed(w, t, "StageTimeoutError", str(err))
        if w.timed_out is not None and w.timed_out_at is not None:  # the worker time it took: charged like any failure
            res.wall_s, res.ended_at = w.timed_out, w.timed_out_at
            res.started_at = max(t.ready_at, w.timed_out_at - w.timed_out)
        return res

    def close(self) -> None:
        for w in self.workers:
            try:
                w.inq.put_nowait(None)
            except queue.Full:
                w.proc.terminate()
        for w in self.workers:
            w.proc.join(timeout=10)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(timeout=5)
        for w in self.workers:
            w.conn.close()
        for var, value in self._environ_before.items():  # a notebook's later subprocesses get its own settings
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _failed(w: _Worker, t: Task, error_class: str, error: str, *, worker_died: bool = False) -> TaskResult:
    """The result of task ``t`` that worker ``w`` did not finish (it died, or was stopped for running too long)."""
    return TaskResult(
        t.case.case_key,
        t.stage,
        t.stage_index,
        t.attempt,
        False,
        w.name,
        w.device,
        t.ready_at,
        error_class=error_class,
        error=error,
        worker_died=worker_died,
    )
