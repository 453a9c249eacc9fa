"""What an operator sees when a Ray cluster is not what the run needs: a head that refuses the driver (no token, another
Ray or Python version), a cluster whose CPUs another run holds, ``--device cuda`` on a cluster without GPUs.

Ray itself is replaced by small stand-ins here (no cluster is started): these are the messages and decisions of
pipeline/runner/ray_connect.py and ray_pool.py, each for an answer the real Ray gives.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.errors import ClusterError, FatalRunError
from pipeline.runner import ray_connect
from pipeline.runner.ray_connect import RaySession, connect
from pipeline.runner.ray_pool import ActorPool
from pipeline.runner.stages import build_stages
from tests._support.runner import QUICK, as_cli, db_rows

ROOT = Path(__file__).resolve().parents[1]


class _RefusingRay:
    """A ``ray`` whose ``init`` fails as the real one does for a head that answers but refuses this driver."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: Any) -> None:
        raise self.exc


@pytest.fixture
def head():
    """HOST:PORT of a socket that answers as a GCS's gRPC server does (an HTTP/2 SETTINGS frame), so the TCP probe and
    the protocol check pass; what Ray answers then is up to the stand-in."""
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty HTTP/2 SETTINGS frame
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.settimeout(0.2)
        stop = threading.Event()

        def answer() -> None:
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                with conn:
                    conn.sendall(settings)

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        yield f"127.0.0.1:{s.getsockname()[1]}"
        stop.set()
        t.join(timeout=5)


def _refused(monkeypatch, address: str, exc: BaseException) -> str:
    monkeypatch.setattr(ray_connect, "import_ray", lambda **_: _RefusingRay(exc))
    with pytest.raises(ClusterError) as info:
        connect(address, timeout_s=10)
    return str(info.value)


def test_a_head_wanting_a_token_the_driver_lacks_is_named_in_the_fix(monkeypatch, head):
    # `ray start --head` turns token authentication on where ~/.ray/auth_token exists; a driver without
    # RAY_AUTH_MODE=token then gets only "Failed to connect to Ray cluster at ..." from ray.init
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    msg = _refused(monkeypatch, head, ConnectionError(f"Failed to connect to Ray cluster at {head}"))
    assert head in msg and "RAY_AUTH_MODE=token" in msg and "auth_token" in msg
    assert "\n" not in msg


def test_a_ray_or_python_version_mismatch_shows_both_versions(monkeypatch, head):
    exc = RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n"
        "This process on node 127.0.0.1 was started with:\n    Ray: 2.59.0\n    Python: 3.12.1\n"
    )
    msg = _refused(monkeypatch, head, exc)
    assert "Ray: 2.60.0" in msg and "Ray: 2.59.0" in msg and "Python: 3.12.1" in msg
    assert "\n" not in msg and "install the cluster's Ray and Python versions" in msg


class _Remote:
    def __init__(self, started: list[dict[str, Any]]):
        self.started = started

    def options(self, **resources: Any) -> _Remote:
        self.started.append(resources)
        return self

    def remote(self, **kwargs: Any) -> Any:
        call = SimpleNamespace(remote=lambda *args, **kwargs: object())
        return SimpleNamespace(place=call, setup=call)


class _ClusterRay:
    """A ``ray`` connected to a cluster of ``nodes`` (``ray.nodes()`` records) with ``free`` resources left."""

    def __init__(self, nodes: list[dict[str, Any]], free: dict[str, float]):
        self._nodes, self.free = nodes, free
        self.started: list[dict[str, Any]] = []

    def remote(self, cls: type) -> _Remote:
        return _Remote(self.started)

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def available_resources(self) -> dict[str, float]:
        return self.free

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        pass


class _Session(RaySession):
    def describe(self) -> str:
        return "ray 127.0.0.1:6379: 1 node(s), 2 CPU(s), 0 GPU(s)"


def _pool(ray: _ClusterRay, tmp_path, **overrides: Any) -> ActorPool:
    pytest.importorskip("ray")
    cfg = load_config(environ={}, overrides=overrides)
    return ActorPool(
        ray, build_stages(cfg), config=cfg, run_dir=tmp_path, cluster=_Session("127.0.0.1:6379", owned=False), timeout_s=0.0
    )


CPU_NODE = {"Alive": True, "NodeID": "a" * 56, "Resources": {"CPU": 2.0}}


def test_a_run_whose_cpus_another_run_holds_says_so(tmp_path):
    ray = _ClusterRay([CPU_NODE], free={"CPU": 0.0})
    pool = _pool(ray, tmp_path)
    for a in pool.actors:
        if a.group == "model":
            a.phase = "ready"  # needs no CPU of its own; the CPU actors wait for CPUs the other run holds
    time.sleep(0.01)
    with pytest.raises(FatalRunError) as info:
        pool.check_served()
    msg = str(info.value)
    assert "0 CPU(s) free" in msg and "another ctpipe run" in msg and "runner.ray_timeout_s" in msg


def test_a_runs_share_of_the_cluster_caps_its_actors(tmp_path):
    nodes = [{"Alive": True, "NodeID": c * 56, "Resources": {"CPU": 4.0, "GPU": 2.0}} for c in "ab"]

    def started(**overrides: Any) -> tuple[int, int]:
        ray = _ClusterRay(nodes, free={"CPU": 8.0, "GPU": 4.0})
        pool = _pool(ray, tmp_path, **overrides)
        pool.refresh(force=True)  # a second look at the cluster starts nothing more
        return sum(r.get("num_cpus") == 1 for r in ray.started), sum(r.get("num_gpus") == 1 for r in ray.started)

    assert started() == (8, 4)  # the whole cluster
    assert started(**{"runner.ray_max_cpus": 3, "runner.ray_max_gpus": 1}) == (3, 1)
    assert started(**{"runner.ray_max_cpus": 20}) == (8, 4)  # a share larger than the cluster is the cluster
    ray = _ClusterRay([CPU_NODE], free={"CPU": 0.0})
    pool = _pool(ray, tmp_path)
    for a in pool.actors:
        if a.group == "model":
            a.phase = "ready"
    time.sleep(0.01)
    with pytest.raises(FatalRunError, match=r"runner\.ray_max_cpus"):  # the fix names the shares
        pool.check_served()


def test_device_cuda_on_a_cluster_without_gpus_runs_no_model_on_a_cpu(tmp_path):
    ray = _ClusterRay([CPU_NODE], free={"CPU": 2.0})
    pool = _pool(ray, tmp_path, device="cuda")
    assert not [a for a in pool.actors if a.group == "model"], ray.started
    for a in pool.actors:
        a.phase = "ready"  # the CPU actors started; the model stages have none
    time.sleep(0.01)
    with pytest.raises(FatalRunError, match=r"model stages.*0 GPU\(s\).*--device auto"):
        pool.check_served()
    # runner.device = auto on the same cluster: the model runs on a CPU of the node, as before
    assert [a for a in _pool(_ClusterRay([CPU_NODE], free={}), tmp_path).actors if a.group == "model"]


def test_a_cluster_without_live_nodes_is_named_as_such(tmp_path):
    # the only node's raylet was killed mid-run: the head answers but lists no live node
    ray = _ClusterRay([CPU_NODE], free={"CPU": 2.0})
    pool = _pool(ray, tmp_path)
    ray._nodes = []
    pool.actors.clear()
    time.sleep(0.01)
    with pytest.raises(FatalRunError) as info:
        pool.check_served()
    msg = str(info.value)
    assert "no node of the cluster is alive" in msg and "rerun the same command" in msg and "GPU (num_gpus" not in msg


class _TaskError(Exception):
    """Ray's RayTaskError: an actor's method raised ``cause`` (its process lives on)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def test_a_retired_gpu_is_held_not_counted_named_in_the_runs_stop_and_a_node_left_without_gpus_stops_the_run(tmp_path, caplog):
    from pipeline.runner.ray_pool import START_FAILURES

    node = "b" * 56
    ray = _ClusterRay([{"Alive": True, "NodeID": node, "Resources": {"CPU": 2.0, "GPU": 2.0}}], free={"CPU": 0.0, "GPU": 0.0})
    ray.exceptions = SimpleNamespace(RayTaskError=_TaskError, ActorUnavailableError=ConnectionError)  # type: ignore[attr-defined]
    pool = _pool(ray, tmp_path)
    for a in pool.actors:
        if a.group == "cpu":
            a.phase = "ready"
    for _ in range(START_FAILURES):  # each actor placed on GPU 1 fails in its setup, each started after the last failed
        pool.refresh(force=True)
        actor = [a for a in pool.actors if a.group == "model"][-1]
        actor.node, actor.gpu, actor.phase = node, "1", "setting_up"
        pool._start_failed(actor, _TaskError(RuntimeError("CUDA error: out of memory")))
    models = [a for a in pool.actors if a.group == "model"]
    assert len(models) == 1 and [(h.node, h.gpu) for h in pool.holders] == [(node, "1")]  # the failed one holds GPU 1
    pool.refresh(force=True)
    assert [a for a in pool.actors if a.group == "model"] == models  # no actor started for the retired GPU
    retired = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "gpu_retired"]
    assert len(retired) == 1 and "GPU 1 of the Ray node bbbbbbbb" in retired[0], retired
    time.sleep(0.01)
    with pytest.raises(FatalRunError) as info:  # GPU 0 held by another job: the model stages cannot be placed
        pool.check_served()
    msg = str(info.value)
    assert "GPU 1 of the node bbbbbbbb retired for this run (RuntimeError: CUDA error: out of memory)" in msg, msg
    assert "CUDA_VISIBLE_DEVICES" in msg and "runner.ray_timeout_s" in msg, msg
    for n in range(1, START_FAILURES + 1):  # GPU 0 fails too, otherwise: the node has no GPU left, the run stops
        actor = [a for a in pool.actors if a.group == "model"][-1]
        actor.node, actor.gpu, actor.phase = node, "0", "setting_up"
        if n < START_FAILURES:
            pool._start_failed(actor, _TaskError(RuntimeError("CUDA error: unknown error")))
            pool.refresh(force=True)
            continue
        with pytest.raises(FatalRunError) as info:
            pool._start_failed(actor, _TaskError(RuntimeError("CUDA error: unknown error")))
    msg = str(info.value)
    assert "every GPU of the node bbbbbbbb" in msg and "GPU 0: RuntimeError: CUDA error: unknown error" in msg, msg
    assert "GPU 1: RuntimeError: CUDA error: out of memory" in msg and "ray stop" in msg, msg


def test_a_failed_attempt_names_the_node_as_the_successful_ones_do():
    # stages.csv and the run store group attempts by worker: a crashed actor's attempt keeps its node
    from pipeline.runner.ray_executor import _failed
    from pipeline.runner.ray_pool import PoolActor
    from pipeline.runner.stage import Task

    actor = PoolActor("cpu-2", "cpu", handle=None, pending=None, phase="ready", node="52559417" + "f" * 48)
    task = Task(SimpleNamespace(case_key="k"), 1, "reconstruct", 1, "/nowhere", {}, 0.0)  # type: ignore[arg-type]
    res = _failed(task, actor, "WorkerDiedError", "died", worker_died=True)
    assert res.worker == "cpu-2@52559417"
    actor.node = None  # lost before place() answered
    assert _failed(task, actor, "WorkerDiedError", "died").worker == "cpu-2"


def test_a_private_instance_keeps_the_runs_sigterm_handler(monkeypatch):
    # ray.init in the main thread sets a SIGTERM handler that exits with status 1 at once: ctpipe run's own (stop as
    # for Ctrl-C, record the run as interrupted, exit 130) must stay
    import signal

    class _PrivateRay(_RefusingRay):
        def init(self, **options: Any) -> None:
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does

    def ours(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_connect, "import_ray", lambda **_: _PrivateRay(RuntimeError()))
    # a token of the user's: the private instance needs none of its own in this process's environment, which the
    # session left open here would keep
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 32)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        session = connect("local", timeout_s=10)
        assert session.owned and signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)


def test_joining_a_cluster_leaves_the_working_folder_as_it_is(monkeypatch, head, tmp_path):
    # the working folder is the process's, not the thread's: changed while Ray joins, a notebook's or a threaded
    # program's other threads would open their relative paths in another folder meanwhile
    seen: list[str] = []

    class _JoiningRay(_RefusingRay):
        def init(self, **options: Any) -> None:
            seen.append(os.getcwd())

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_connect, "import_ray", lambda **_: _JoiningRay(RuntimeError()))
    session = connect(head, timeout_s=10)
    assert session.owned and seen == [str(tmp_path)] and os.getcwd() == str(tmp_path)


def test_a_node_with_another_ctpipe_stops_the_run_before_it_takes_a_case(tmp_path):
    from pipeline.runner.ray_actors import software

    ray = _ClusterRay([CPU_NODE], free={"CPU": 2.0})
    pool = _pool(ray, tmp_path)
    actor = pool.actors[0]
    info = {"node": CPU_NODE["NodeID"], "ip": "10.1.2.3", "pid": 1, "device": "cpu", "note": None}
    ray.get = lambda ref: {**info, "software": software()}  # type: ignore[attr-defined]
    pool.advance(actor)
    assert actor.phase == "setting_up"
    other = pool.actors[1]
    ray.get = lambda ref: {**info, "software": {**software(), "ctpipe": "0.0.9"}}  # type: ignore[attr-defined]
    with pytest.raises(FatalRunError, match=r"10\.1\.2\.3.*ctpipe 0\.0\.9 there, .* here.*same ctpipe"):
        pool.advance(other)


def _ray_pids(session: int) -> set[int]:
    """The live Ray processes (GCS, raylet, agents, workers) of the process session ``session``: those a driver
    started in its own session (``start_new_session``) starts keep it, and another test's Ray processes on the
    machine (pytest -n 2) never have it."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = entry.joinpath("stat").read_text().rsplit(") ", 1)[1].split()
            cmd = entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session and any(m in cmd for m in ("raylet", "gcs_server", "ray::")):
            out.add(int(entry.name))
    return out


def _a_case_running(out: Path) -> bool:
    """Whether the run store in ``out`` records a case running (False while the store is not made yet)."""
    try:
        return bool(db_rows(out, "SELECT 1 FROM cases WHERE status='running'"))
    except sqlite3.Error:  # no file yet, or its tables not yet created
        return False


@pytest.mark.slow
def test_sigterm_of_a_run_on_a_private_instance_is_an_interruption_to_resume(tmp_path):
    pytest.importorskip("ray")
    from tests._support.ray_cluster import ray_environment

    out = tmp_path / "run"
    args = [sys.executable, "-m", "pipeline", "run", str(ROOT / "data_samples"), "--out", str(out), "--ray", "local"]
    args += [*as_cli({**QUICK, "report.enabled": False, "runner.torch_threads": 1}), "--quiet"]
    env = {**os.environ, **ray_environment()}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _a_case_running(out):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        started = _ray_pids(proc.pid)  # the private instance's own processes: the check below proves something
        assert started, "the run's private Ray instance was not found in its process session"
        proc.send_signal(signal.SIGTERM)  # the driver alone, as systemd or kill would
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "SIGTERM received" not in err, err
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    deadline = time.monotonic() + 60
    while _ray_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _ray_pids(proc.pid)
    assert left == set(), f"processes of the run's private Ray instance were left running ({len(started)} while it ran)"


def test_auto_with_a_stale_record_of_a_dead_head_says_where_the_address_came_from(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    ray = _RefusingRay(RuntimeError("not reached"))
    ray._private = SimpleNamespace(services=SimpleNamespace(canonicalize_bootstrap_address=lambda a: dead))  # type: ignore[attr-defined]
    monkeypatch.setattr(ray_connect, "import_ray", lambda **_: ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ClusterError) as info:
        connect("auto", timeout_s=10)
    msg = str(info.value)
    assert f"auto found the head {dead}" in msg and "record of the last cluster" in msg and "ray stop" in msg
    monkeypatch.setenv("RAY_ADDRESS", dead)
    with pytest.raises(ClusterError, match="through RAY_ADDRESS"):
        connect("auto", timeout_s=10)


def test_a_head_that_stops_answering_is_tried_again_with_growing_pauses_then_stops_the_run_naming_it(monkeypatch, head, caplog):
    from pipeline.runner import ray_executor

    watch = ray_executor.HeadWatch(RaySession(address=head, owned=True), reconnect_s=1.2)
    assert watch.answers() and not watch.lost
    with socket.socket() as s:  # a port nothing listens on any more: the head's machine is gone
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(ray_executor, "HEAD_CHECK_S", 0.2)
    # the watch's clock is the test's, moved 20 ms a look: a loaded machine's late looks would stretch the pauses the
    # test measures (a first pause of 0.2 s seen as 0.3 s reads as no growth); the probes are real connections
    clock = {"now": 1000.0}
    monkeypatch.setattr(ray_executor, "time", SimpleNamespace(monotonic=lambda: clock["now"]))
    watch = ray_executor.HeadWatch(RaySession(address=gone, owned=True), reconnect_s=1.2)
    tries: list[float] = []
    caplog.set_level("WARNING", logger=ray_executor.__name__)
    t0 = clock["now"]
    with pytest.raises(FatalRunError) as info:
        while clock["now"] - t0 < 10:
            before = len(caplog.records)
            assert watch.answers() is False  # within runner.ray_reconnect_s: the run waits
            if len(caplog.records) > before:
                tries.append(clock["now"] - t0)
            clock["now"] += 0.02
    took = clock["now"] - t0
    msg = str(info.value)
    assert watch.lost and gone in msg and "ray start --head" in msg and "same command" in msg
    assert "runner.ray_reconnect_s = 1.2 s" in msg and "raise runner.ray_reconnect_s" in msg
    assert 1.2 <= took < 3, took
    lost = [r for r in caplog.records if getattr(r, "event", None) == "head_lost"]
    assert len(lost) == len(tries) >= 3 and all(gone in r.getMessage() for r in lost)
    assert "try 1," in lost[0].getMessage() and "runner.ray_reconnect_s = 1.2 s" in lost[0].getMessage()
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps[1] > 1.5 * gaps[0], gaps  # the pauses grow: 0.2 s, 0.4 s, ...
    assert ray_executor.HeadWatch(
        RaySession(address="local", owned=True), reconnect_s=1.0
    ).answers()  # a private instance: not watched


def test_a_head_that_answers_again_within_the_limit_lets_the_run_go_on(monkeypatch, head, caplog):
    from pipeline.runner import ray_executor

    monkeypatch.setattr(ray_executor, "HEAD_CHECK_S", 0.1)
    watch = ray_executor.HeadWatch(RaySession(address=head, owned=True), reconnect_s=30.0)
    real = ray_executor.probe
    down = {"on": True}

    def flaky(address: str, *, timeout_s: float) -> None:  # the link to the real listening head drops, then returns
        if down["on"]:
            real("127.0.0.1:1", timeout_s=timeout_s)
        real(address, timeout_s=timeout_s)

    monkeypatch.setattr(ray_executor, "probe", flaky)
    caplog.set_level("WARNING", logger=ray_executor.__name__)
    assert watch.answers() is False
    time.sleep(0.15)
    assert watch.answers() is False
    down["on"] = False
    deadline = time.monotonic() + 5
    while not watch.answers():
        assert time.monotonic() < deadline, "the head was not tried again"
        time.sleep(0.05)
    assert not watch.lost
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("head_lost") == 2 and events[-1] == "head_back", events
    assert "answers again" in caplog.records[-1].getMessage() and head in caplog.records[-1].getMessage()


def test_a_group_whose_actors_fail_to_start_until_the_timeout_names_the_failure_not_other_jobs(tmp_path):
    # a model whose setup takes longer than runner.ray_timeout_s to fail: when the time is up the group has no actor,
    # and the GPU that its own failing actors held is no other job's
    exceptions = pytest.importorskip("ray.exceptions")
    gpu_node = {**CPU_NODE, "Resources": {"CPU": 2.0, "GPU": 1.0}}
    ray = _ClusterRay([gpu_node], free={"CPU": 0.0, "GPU": 0.0})
    ray.exceptions = exceptions  # type: ignore[attr-defined]
    pool = _pool(ray, tmp_path)
    for a in pool.actors:
        a.phase = "ready" if a.group == "cpu" else "setting_up"
    model = next(a for a in pool.actors if a.group == "model")
    model.node = gpu_node["NodeID"]
    missing = FileNotFoundError(2, "No such file or directory", "/models/site_model.pt")

    def get(ref: Any) -> Any:
        raise exceptions.RayTaskError("StageActor.setup", "Traceback (most recent call last): ...", missing)

    ray.get = get  # type: ignore[attr-defined]
    pool.advance(model)  # the first failure there: another actor is to be started in its place
    assert model not in pool.actors
    time.sleep(0.01)
    with pytest.raises(FatalRunError) as info:
        pool.check_served()
    msg = str(info.value)
    assert "FileNotFoundError" in msg and "/models/site_model.pt" in msg and "aaaaaaaa" in msg, msg
    assert "free" not in msg and "other Ray jobs" not in msg, msg
