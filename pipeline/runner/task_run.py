"""Running one stage of one case in this process: :func:`run_task` (wall time in s, peak memory in MiB),
:func:`setup_stages`, and :class:`InlineExecutor`, which runs every stage in the calling process one task at a time
(the sequential mode, ``runner.workers = 0``). The worker processes of :mod:`.workers` and the Ray actors of
:mod:`.ray_actors` run their tasks with the same :func:`run_task`.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CtpipeError, FatalRunError
from .faults import environment_failure
from .logs import collect_for_console, log_context
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
