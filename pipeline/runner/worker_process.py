"""A worker process of :class:`~pipeline.runner.workers.ProcessExecutor`: its entry point :func:`worker_main`, which
sets up its stages and runs the tasks its queue brings, and how such processes are started (:func:`mp_context`,
:func:`main_module_hidden`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext
from pathlib import Path
from typing import Any

from ..config import Config, from_dict
from ..errors import ConfigError, FatalRunError
from .logs import log_as_worker
from .redact_active import redact_in_worker
from .stage import Stage, Task, WorkerInfo
from .task_run import run_task, setup_stages

log = logging.getLogger(__name__)


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
def main_module_hidden(needed: bool) -> Iterator[None]:
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
