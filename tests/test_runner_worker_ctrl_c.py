"""Ctrl-C reaches the whole process group of ``ctpipe run``, its worker processes included: a worker still starting
(its start method's bootstrap unpickling its stages, importing torch and MONAI) or already exiting (multiprocessing's
exit handlers, a second Ctrl-C while the run stops) ends quietly, with exit status 0, not with Python's
"Process ctpipe-…: Traceback … KeyboardInterrupt" on the run's stderr; and so does one whose start the main process was
in the middle of.

Each case is a real main process with a :class:`~pipeline.runner.workers.ProcessExecutor` in its own process group;
its worker announces the moment by creating a file and waits there (:mod:`tests._support.worker_start`) until the test,
having sent SIGINT to the group, lets it go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# argv: start method, folder, moment ("start", "exit" or "spawned": the main process starting its worker). Polls its worker until Ctrl-C, then closes it as ctpipe run
# does, a second Ctrl-C being for the workers alone (ctpipe run's own notes it and goes on recording the stop)
_MAIN = """
import signal, sys
from pathlib import Path
from pipeline.config import load_config
from pipeline.runner.workers import ProcessExecutor
from tests._support.worker_start import HeldWorkerStage

method, folder, at = sys.argv[1:4]
if at == "spawned":  # the main process announces each worker it has spawned, and waits, before it sends its arguments
    import multiprocessing.util as util, threading
    from multiprocessing import active_children
    from tests._support.worker_start import wait_for

    spawnv = util.spawnv_passfds
    def announced(path, args, passfds):
        pid = spawnv(path, args, passfds)
        if any("spawn_main" in str(a) for a in args):
            (Path(folder) / "starting").touch()
            wait_for(Path(folder) / "go")
        return pid
    util.spawnv_passfds = announced
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # a thread of the run's, SIGINT not blocked
    try:
        ProcessExecutor([HeldWorkerStage(folder, "")], config=load_config(environ={}), run_dir=Path(folder), workers=1,
                        devices=[], queue_depth=1, start_method=method, torch_threads=0)
    except KeyboardInterrupt:  # the executor stopped the worker it started
        print("worker exit status", *[p.exitcode for p in active_children()] or [0])
    sys.exit(0)
ex = ProcessExecutor([HeldWorkerStage(folder, at)], config=load_config(environ={}), run_dir=Path(folder), workers=1,
                     devices=[], queue_depth=1, start_method=method, torch_threads=0)
procs = [w.proc for w in ex.workers]
try:
    while True:
        ex.poll(0.05)
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
finally:
    ex.close()
print("worker exit status", *[p.exitcode for p in procs])
"""

METHODS = ["forkserver", "spawn", "fork"]


def _start(method: str, folder: Path, at: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _MAIN, method, str(folder), at],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, f"the main process ended before {path.name}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {path.name} in time"
        time.sleep(0.01)


def _ended_quietly(proc: subprocess.Popen) -> None:
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err and "KeyboardInterrupt" not in err, err
    assert out.split() == ["worker", "exit", "status", "0"], out + err  # ended by worker_main, not killed by close()


@pytest.mark.parametrize("method", METHODS)
def test_ctrl_c_while_a_worker_starts_ends_it_without_a_traceback(method, tmp_path):
    proc = _start(method, tmp_path, "start")
    _wait_for(tmp_path / "starting", proc)  # the worker is in its start method's bootstrap, before worker_main
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    (tmp_path / "go").touch()
    _ended_quietly(proc)


@pytest.mark.parametrize("method", METHODS)
def test_a_second_ctrl_c_while_a_worker_exits_ends_it_without_a_traceback(method, tmp_path):
    proc = _start(method, tmp_path, "exit")
    _wait_for(tmp_path / "set_up", proc)
    os.killpg(proc.pid, signal.SIGINT)  # the run stops: worker_main returns
    _wait_for(tmp_path / "exiting", proc)  # the worker is in multiprocessing's exit handlers
    os.killpg(proc.pid, signal.SIGINT)  # pressed again while the run stops
    (tmp_path / "go").touch()
    _ended_quietly(proc)


def test_ctrl_c_while_the_main_process_starts_a_worker_ends_it_without_a_traceback(tmp_path):
    """Ctrl-C between the spawn of a worker and the sending of its arguments: the main process finishes the start
    (the signal held, even when a thread of its own takes it) and stops the worker, rather than leaving it to read
    arguments never sent ("EOFError: Ran out of input") or a queue whose semaphore is gone."""
    proc = _start("spawn", tmp_path, "spawned")
    _wait_for(tmp_path / "starting", proc)  # the worker spawned, its arguments not yet sent
    os.killpg(proc.pid, signal.SIGINT)
    (tmp_path / "go").touch()
    _ended_quietly(proc)
