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
from .end_signals import EndSignals
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
    run's patient-named path components and their tokens (:mod:`.redact`), kept out of its run.log records.

    Ctrl-C (SIGINT, sent to the whole process group) is taken here only: the process was started with it blocked
    (:func:`ctrl_c_held`), so one pressed while it started is delivered now, inside the ``try`` that ends the worker
    quietly, and from its end on it is ignored, as the process exits (the main process records the stop)."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()  # SIGINT blocked: not for it
    try:
        _take_ctrl_c()
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
    finally:
        _ignore_ctrl_c()


def _take_ctrl_c() -> None:
    """Unblock SIGINT in this thread (blocked by :func:`ctrl_c_held` while the process started): one already pressed
    is handled at once, by the process' own handler (Python's KeyboardInterrupt, or ignored as its parent ignored it)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _ignore_ctrl_c() -> None:
    """Ignore SIGINT for the rest of a worker process' life: a Ctrl-C pressed again while the run stops would otherwise
    interrupt multiprocessing's exit handlers, with Python's "Process ctpipe-…: Traceback … KeyboardInterrupt"."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C while worker processes start, so that they start with SIGINT blocked and take it only in
    :func:`worker_main`, where it ends them quietly, and this process never stops half way through a start.

    Pressed just after ``ctpipe run`` started, Ctrl-C reached workers still in their start method's bootstrap
    (unpickling their stages, importing torch and MONAI), which died of it with Python's "Process ctpipe-…: Traceback …
    KeyboardInterrupt" on the run's stderr; and this process, stopped in the middle of a start, left a worker with no
    arguments to read ("EOFError: Ran out of input") or with its queue's semaphore gone (FileNotFoundError). SIGINT is
    blocked in the calling thread: the mask is inherited by a forked worker, kept across the exec of a spawned one, and
    inherited by the forkserver (started by the first worker's start, here) and so by every worker it forks. This
    process' own stop signals (Ctrl-C, SIGTERM, SIGHUP) are held (:class:`~.end_signals.EndSignals`) and handed to their
    handlers once the start is over, which then raise KeyboardInterrupt as ever; a second one cuts a start that hangs
    (a forkserver's preloaded imports) short at once."""
    held = EndSignals(at_once=2)
    held.hold()
    try:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
        try:
            yield
        finally:
            if before is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
    finally:
        held.release()


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
