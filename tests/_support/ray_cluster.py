"""A real multi-node Ray cluster on this machine for the runner's Ray tests and ``scripts/bench_scale.py``.

:class:`LocalCluster` starts a head node and extra nodes with ``ray.cluster_utils.Cluster`` (each
node its own raylet, object store and worker processes; GPUs declared with ``num_gpus`` exist only
as Ray resources), with token authentication on (``RAY_AUTH_MODE=token`` and a random
``RAY_AUTH_TOKEN`` for this process and everything it starts), usage statistics off, small object
stores and no dashboard or autoscaler. ``stop()`` ends every Ray process the cluster started and :meth:`LocalCluster.leftovers`
lists any still alive (found by the cluster's session folder in their command lines).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OBJECT_STORE_BYTES = 80 * 2**20
# one token per process: Ray caches the token it first reads, so every cluster this process starts uses the same
_TOKEN = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(16)


SINGLE_MACHINE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ray_environment() -> dict[str, str]:
    """The environment every Ray process of a test cluster and its driver need (token authentication on).

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is Ray's single-machine mode: every node takes the loopback
    address as its own, so no Ray service listens on, or is reached through, another interface. Ray reads it
    when first imported, so tests/conftest.py sets it for the whole pytest process.
    """
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _TOKEN,
        **SINGLE_MACHINE,
        "PYTHONPATH": _nodes_pythonpath(),
    }


def _nodes_pythonpath() -> str:
    """The checkout first on the nodes' import path: the stages the tests define (``tests._support``) must be
    importable by the nodes' workers, as a site installs its own stages on every node. ctpipe keeps the driver's
    working folder off the workers' path, so the checkout is not there through it."""
    root = str(Path(__file__).resolve().parents[2])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return os.pathsep.join([root, *rest])


def reload_ray_authentication() -> None:
    """Make Ray, if already imported, read the authentication mode and token from the environment again (it caches
    them when first used, so a test that changes them after another test started a cluster in the same process
    would otherwise go on with the old ones)."""
    if "ray" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


LOOPBACK = "127.0.0.1"  # every node of a test cluster listens on the loopback interface only


class LocalCluster:
    """A head node with ``head_cpus`` CPUs plus one node per entry of ``nodes`` (``num_cpus``, ``num_gpus``)."""

    def __init__(self, *, head_cpus: int = 1, nodes: Sequence[dict[str, Any]] = (), object_store_bytes: int = OBJECT_STORE_BYTES):
        self.head_cpus = head_cpus
        self.node_specs = list(nodes)
        self.object_store_bytes = object_store_bytes
        self.cluster: Any = None
        self.session_dir: str | None = None
        self._saved_env: dict[str, str | None] = {}
        self.pids: set[int] = set()
        self.head_killed = False

    def start(self, timeout_s: float = 90.0) -> LocalCluster:
        env = ray_environment()
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        reload_ray_authentication()  # Ray read the authentication mode when first used: make it read it again
        from ray.cluster_utils import Cluster

        t0 = time.monotonic()
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": self.head_cpus,
                "node_ip_address": LOOPBACK,
                "include_dashboard": False,
                "object_store_memory": self.object_store_bytes,
                "no_monitor": True,  # no autoscaler process: nothing here scales (one Python process fewer to start)
            },
        )
        self.session_dir = self.cluster.head_node.get_session_dir_path()
        for spec in self.node_specs:
            self.add_node(**spec)
        self.cluster.wait_for_nodes(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        self._remember()
        return self

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, **spec: Any) -> Any:
        node = self.cluster.add_node(object_store_memory=self.object_store_bytes, node_ip_address=LOOPBACK, **spec)
        self._remember()
        return node

    def remove_node(self, node_id: str, *, graceful: bool = False) -> None:
        """Kill the node ``node_id`` (hex), as a machine that fails (SIGKILL unless ``graceful``)."""
        node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        self._remember()
        self.cluster.remove_node(node, allow_graceful=graceful)

    def kill_head(self) -> None:
        """The head machine fails: SIGKILL of every process of the head node (GCS, raylet, and the agents the raylet
        started, which a failed machine loses too), none of which comes back."""
        head = self.cluster.head_node
        self._remember()
        mine = {info.process.pid for infos in head.all_processes.values() for info in infos if info.process is not None}
        below = _descendants(mine)
        head.kill_all_processes(check_alive=False, allow_graceful=False)
        for pid in below:
            _kill(pid)
        self.head_killed = True

    def worker_node_ids(self) -> list[str]:
        return [n.node_id for n in self.cluster.worker_nodes]

    def _remember(self) -> None:
        for node in self.cluster.list_all_nodes():
            for infos in node.all_processes.values():
                self.pids.update(info.process.pid for info in infos if info.process is not None)
        self.pids.update(_session_pids(self.session_dir))
        self.pids.update(_descendants(self.pids))  # worker processes and agents rename themselves (ray::...)

    def stop(self) -> None:
        """Disconnect this process and end every process of the cluster (nodes, workers, GCS)."""
        import ray

        if self.cluster is None:
            return
        self._remember()
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()
        self.cluster = None
        if self.head_killed:
            # without a GCS to tell them to stop, the other nodes' agents would wait Ray's
            # gcs_rpc_server_reconnect_timeout_s (60 s) for the head before ending: end them as their machines would be
            # (Ray's processes only: a PID the cluster once had may since belong to another program)
            for line in self.leftovers():
                pid, cmd = line.split(" ", 1)
                if "ray" in cmd:
                    _kill(int(pid))
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        deadline = time.monotonic() + 60
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)

    def processes(self, marker: str) -> list[str]:
        """``pid command`` of every live process of this cluster (its nodes' processes, those naming its session
        folder and everything below them, such as the worker processes that hold its actors) whose command line
        holds ``marker`` (e.g. ``ray::StageActor``): another cluster's processes on the machine are never among them."""
        if self.cluster is not None:
            self._remember()
        alive = []
        for pid in sorted(self.pids | _descendants(self.pids)):
            cmd = _cmdline(pid)
            if cmd is not None and marker in cmd:
                alive.append(f"{pid} {cmd[:120]}")
        return alive

    def leftovers(self) -> list[str]:
        """``pid command`` of every process the cluster started that is still alive (zombies excepted)."""
        alive = []
        for pid in sorted(self.pids | _session_pids(self.session_dir)):
            cmd = _cmdline(pid)
            if cmd is not None:
                alive.append(f"{pid} {cmd[:120]}")
        return alive

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cmdline(pid: int) -> str | None:
    """The command line of a live, non-zombie process, else None."""
    proc = Path(f"/proc/{pid}")
    try:
        if proc.joinpath("stat").read_text().split(") ", 1)[1].startswith("Z"):
            return None
        return proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return None


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` if it is still alive."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _session_pids(session_dir: str | None) -> set[int]:
    """Processes whose command line names the cluster's session folder (raylets, GCS, agents, workers)."""
    if not session_dir:
        return set()
    name = os.path.basename(session_dir.rstrip("/"))
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmd = _cmdline(int(entry.name))
            if cmd and name in cmd:
                out.add(int(entry.name))
    return out


def _descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots`` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(entry.joinpath("stat").read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


# -- stages for the fault tests (model group: they run in the model actors, one per declared GPU) -----------------------
from pipeline.runner.stage import CaseContext, Stage  # noqa: E402


class HoldOnce(Stage):
    """A model stage that, the first time it runs anywhere, writes ``<marker_dir>/held`` (the node id) and waits
    ``hold_s`` seconds, so that a test can take that node away while the stage runs; afterwards it does nothing."""

    name = "hold"
    group = "model"

    def __init__(self, marker_dir: str, hold_s: float = 20.0):
        self.marker_dir = marker_dir
        self.hold_s = hold_s

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        import ray

        marker = Path(self.marker_dir) / "held"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return {}
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{ray.get_runtime_context().get_node_id()} {ctx.case.case_id}")
        time.sleep(self.hold_s)
        return {}


class CrashOn(Stage):
    """A model stage whose process dies (SIGKILL) whenever it meets the series ``series_uid``."""

    name = "crash"
    group = "model"

    def __init__(self, series_uid: str):
        self.series_uid = series_uid

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        import signal

        if ctx.case.series_uid == self.series_uid:
            os.kill(os.getpid(), signal.SIGKILL)
        (ctx.workdir / "crash_checked.txt").write_text(ctx.case.case_id)
        return {"declared": ["crash_checked.txt"]}


class SlowStart(Stage):
    """A model stage whose actors start ``start_s`` seconds late, as a worker process importing a large framework on a
    busy machine does: unpickled in a Ray worker (the actor's creation, after Ray gave it its GPU), it waits."""

    name = "slow_start"
    group = "model"

    def __init__(self, start_s: float):
        self.start_s = start_s

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "default_worker.py" in " ".join(sys.argv):  # in a Ray worker, not in the driver
            time.sleep(self.start_s)

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        return {}


class FailingSetup(Stage):
    """A model stage that cannot start for a model file missing on the node (``FileNotFoundError``): in its ``setup``
    (``where="setup"``) or as the actor's ``__init__`` receives it (``where="init"``: unpickled in a Ray worker), in
    every actor (``times`` None) or in the first ``times`` actors to start it anywhere (then it works). Each start
    writes a marker ``<marker_dir>/start-N`` (N = 1, 2, ...), so that a test can count them."""

    name = "failing_setup"
    group = "model"

    def __init__(self, marker_dir: str, times: int | None = None, where: str = "setup"):
        self.marker_dir = marker_dir
        self.times = times
        self.where = where

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.where == "init" and "default_worker.py" in " ".join(sys.argv):  # in a Ray worker, not in the driver
            self._start()

    def setup(self, worker: Any) -> None:
        if self.where == "setup":
            self._start()

    def _start(self) -> None:
        n = 1
        while True:
            try:
                os.close(os.open(Path(self.marker_dir) / f"start-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
            except FileExistsError:
                n += 1
        if self.times is None or n <= self.times:
            raise FileNotFoundError(2, "No such file or directory", "/models/site_model.pt")

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        return {}


class FailingOnGpu(Stage):
    """A model stage that cannot start on the GPU ``bad_gpu`` (the id ``ray.get_gpu_ids()`` gives its actor), as a
    card with a CUDA error: its ``setup`` raises ``RuntimeError`` there, every time. On any other GPU its setup waits
    until the run's driver has logged ``failures`` failed starts (its record of Ray's account of each, in run.log; up to
    ``wait_s`` seconds), so that the bad GPU's failures all come while no actor of the node is ready, then it works.
    Each start writes a marker ``<marker_dir>/gpu<ID>-N`` (N = 1, 2, ...), so that a test can count the starts on each
    GPU."""

    name = "failing_on_gpu"
    group = "model"

    def __init__(self, marker_dir: str, *, bad_gpu: str, failures: int, wait_s: float = 120.0):
        self.marker_dir = marker_dir
        self.bad_gpu = bad_gpu
        self.failures = failures
        self.wait_s = wait_s

    def setup(self, worker: Any) -> None:
        import ray

        gpu = ",".join(str(g) for g in ray.get_gpu_ids())
        folder = Path(self.marker_dir)
        n = 1
        while True:
            try:
                os.close(os.open(folder / f"gpu{gpu}-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
            except FileExistsError:
                n += 1
        if gpu == self.bad_gpu:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (GPU {gpu})")
        log = Path(worker.run_dir) / "run.log"
        deadline = time.monotonic() + self.wait_s
        while log.read_text().count("account of the failed start") < self.failures and time.monotonic() < deadline:
            time.sleep(0.1)

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        return {}
