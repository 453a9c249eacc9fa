"""``ProcessExecutor``: runs :class:`~pipeline.runner.stage.Task` objects in worker processes.

It keeps a pool of CPU worker processes and one model worker per device (each
started by :mod:`.worker_process`); each worker has
its own bounded task queue and its own result pipe, so the main process always
knows which task a worker holds and can recover when a worker dies: a worker
killed in the middle of a write damages only its own pipe, never the results
of the others. A worker tells the main process when it starts a task, so a
stage that runs longer than ``runner.stage_timeout_s`` (a hung library call, a
pathological series) is stopped: the worker is killed and replaced, and the case
fails with :class:`~pipeline.errors.StageTimeoutError` while the batch goes on.
The sequential mode (``runner.workers = 0``) runs every stage in the calling
process instead (:class:`~pipeline.runner.task_run.InlineExecutor`).
"""

from __future__ import annotations

import logging
import multiprocessing.connection as mpc
import os
import queue
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import FatalRunError, StageTimeoutError
from .redact_active import active as active_redactor
from .stage import Stage, Task, TaskResult
from .worker_process import ctrl_c_held, main_module_hidden, mp_context, worker_main

log = logging.getLogger(__name__)

#: environment variables the worker processes are started with (the hash seed, native thread pools' sizes)
_WORKER_ENVIRON = ("PYTHONHASHSEED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


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
            mods = sorted({m for s in stages for m in s.preload} | {"pipeline.runner.worker_process"})
            self.ctx.set_forkserver_preload([*mods, "pipeline.runner.forkserver_freeze"])  # imported in this order
        self.workers: list[_Worker] = []
        self._n = 0
        groups = {s.group for s in stages}
        try:
            if "cpu" in groups:
                for _ in range(max(1, workers)):
                    self._spawn("cpu", "cpu")
            if "model" in groups:
                for dev in devices:
                    self._spawn("model", dev)
        except BaseException:  # Ctrl-C while they start: those started are stopped, not left reading queues gone
            self.close()
            raise

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
        # a stop signal meanwhile raises KeyboardInterrupt here once the worker is started and listed
        with ctrl_c_held():
            with main_module_hidden(any(type(s).__module__ == "__main__" for s in stages)):
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
