"""The actors of a run on Ray: how many of each kind, where, and their start (placed, then set up).

:class:`ActorPool` follows the cluster (see :mod:`.ray_executor` for the layout): every
:data:`REFRESH_S` seconds it compares the actors with the live nodes' resources and starts actors for
what no actor of the run uses yet (a node that joined, a GPU freed by a dead actor). An actor starts in
two steps, each answered through a Ray reference the executor waits on with its tasks: ``place()``
(where Ray put it, which device) and ``setup()`` (stages set up, model loaded); only then does it take
tasks. ``runner.ray_max_cpus`` / ``runner.ray_max_gpus`` cap the run's CPU and GPU actors (0: the whole
cluster), so that runs sharing a cluster each keep a part of it. A group left without any placed actor for
``runner.ray_timeout_s`` stops the run with the reason (an actor to which Ray gave a process, with the CPU or GPU it
asked for, is placed while that process starts, however slowly on a busy machine). An actor whose node cannot import the run's code (ctpipe, or
the module of a stage, missing from that node's Python) stops the run at once, naming the import error and the node:
every actor started there would fail the same way. Any other start-up failure on a node that stays in the cluster (an
exception in a stage's ``setup`` or in the actor's ``__init__``: a model file missing there, a CUDA error, out of
memory; or its process dying) is retried: the pool starts another actor, as for a node lost. The run stops, naming the
error, the node and the fix, once :data:`START_FAILURES` actors in a row failed to start on one node, each started
after the one before had failed (actors started together and failing together are one failure): like a node that
cannot import the run's code, such a node is not left by Ray, so its resources would be offered to new actors, each
failing the same way, until ``runner.ray_timeout_s``, whose message would then blame other jobs for the GPUs the run's
own failing actors held.

A model actor that failed after ``place()`` named its GPU (``ray.get_gpu_ids()``) counts against that GPU of its node,
not the whole node: a GPU server with one bad card (a CUDA error, out of memory, a dead card) keeps working on the
others. Once :data:`START_FAILURES` actors in a row failed on one GPU, that GPU is retired for the run (one warning
naming the node, the GPU, the error and the fix; event ``gpu_retired``): an actor of the run holds it unused, so that
Ray offers it to no other actor of the run (Ray picks a node's GPU itself; it cannot be asked to avoid one), and the
run counts the node's other GPUs only. A failure that is not the GPU's stops the run as for a node: the same error on
every GPU of the node, or every GPU of the node retired. A group that then has no actor placed for
``runner.ray_timeout_s`` stops the run with a reason that names the retired GPUs and why.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import FatalRunError
from .ray_actors import StageActor, software
from .ray_connect import RaySession, raylet_answers
from .ray_errors import ANSI, first_line, import_failure, start_error
from .redact_active import active as active_redactor
from .stage import Stage, Task

log = logging.getLogger(__name__)

#: Seconds between two looks at the cluster's nodes (actors for joined nodes, none for departed ones).
REFRESH_S = 2.0
#: Actors in a row failing to start on one node (each started after the one before failed) that stop the run.
START_FAILURES = 3
#: Seconds the raylet of a node whose actor became unavailable has to accept a connection to count as alive.
RAYLET_CHECK_S = 2.0


@dataclass
class PoolActor:
    """One actor of the run and the tasks it holds."""

    name: str
    group: str
    handle: Any
    pending: Any  # the ref of place() then of setup(); None once ready
    phase: str = "placing"  # placing -> setting_up -> ready
    node: str | None = None
    pinned: str | None = None  # node id of a model actor pinned to a node without GPUs
    device: str = "cpu"
    gpu: str | None = None  # the GPU id(s) Ray granted it on its node (ray.get_gpu_ids()), once placed; None: no GPU
    held: deque[tuple[Task, Any]] = field(default_factory=deque)  # in order of execution: the first runs
    started: float = field(default_factory=time.monotonic)  # time.monotonic() when it was asked to start


@dataclass
class StartFailures:
    """Actors in a row that failed to start on one node: how many, the last one's time and error, where."""

    count: int
    at: float  # time.monotonic() of the last one
    error: str
    where: str


class ActorPool:
    """The CPU and model actors of one run (see the module docstring)."""

    def __init__(
        self, ray: Any, stages: Sequence[Stage], *, config: Config, run_dir: Path, cluster: RaySession, timeout_s: float
    ):
        self.ray = ray
        self.stages = list(stages)
        self.config = config
        self.run_dir = run_dir
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.groups = {s.group for s in self.stages}
        self.actors: list[PoolActor] = []
        self._n = 0
        self._refreshed = 0.0
        self._unserved: dict[str, float] = {g: time.monotonic() for g in self.groups}
        # (node id, GPU id or None for the node) -> its start-up failures since an actor last started there
        self._failed: dict[tuple[str, str | None], StartFailures] = {}
        self.retired: dict[tuple[str, str], StartFailures] = {}  # (node id, GPU id) -> why it was retired
        self.holders: list[PoolActor] = []  # actors holding retired GPUs unused (see the module docstring)
        self._last_failure: dict[str, StartFailures] = {}  # group -> the latest since the group was last served
        self._remote = ray.remote(StageActor)
        self.software = software()  # every actor must run the same (see advance)
        self.refresh(force=True)

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes (``ray.nodes()`` records)."""
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def ready(self, group: str) -> list[PoolActor]:
        return [a for a in self.actors if a.group == group and a.phase == "ready"]

    def pending_refs(self) -> list[Any]:
        return [a.pending for a in self.actors if a.pending is not None]

    def refresh(self, *, force: bool = False) -> None:
        """Start actors for resources the cluster offers and no actor of this run uses yet."""
        now = time.monotonic()
        if not force and now - self._refreshed < REFRESH_S:
            return
        self._refreshed = now
        nodes = self.nodes()
        runner = self.config.runner
        live = {n["NodeID"] for n in nodes}
        self.holders = [h for h in self.holders if h.node in live]  # gone with their nodes
        if "cpu" in self.groups:
            cpus = _capped(sum(int(n["Resources"].get("CPU", 0)) for n in nodes), runner.ray_max_cpus)
            for _ in range(cpus - sum(a.group == "cpu" for a in self.actors)):
                self._start("cpu", {"num_cpus": 1})
        if "model" in self.groups:
            gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes) if runner.device != "cpu" else 0
            if gpus:
                usable = _capped(gpus - sum(node in live for node, _ in self.retired), runner.ray_max_gpus)
                for _ in range(usable - sum(a.group == "model" and a.pinned is None for a in self.actors)):
                    self._start("model", {"num_gpus": 1, "num_cpus": 0})
            elif not runner.device.startswith("cuda"):  # runner.device = cuda: no model on a CPU
                from ray.util.scheduling_strategies import (
                    NodeAffinitySchedulingStrategy,
                )

                have = {a.pinned for a in self.actors if a.group == "model"}
                for n in nodes:
                    if n["Resources"].get("CPU", 0) >= 1 and n["NodeID"] not in have:
                        where = NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
                        self._start("model", {"num_cpus": 0, "scheduling_strategy": where}, pinned=n["NodeID"])

    def _start(self, group: str, resources: dict[str, Any], *, pinned: str | None = None) -> None:
        self._n += 1
        name = f"{group}-{self._n}"
        handle = self._remote.options(max_restarts=0, **resources).remote(
            name=name,
            group=group,
            stages=[s for s in self.stages if s.group == group],
            config=self.config.to_dict(),
            run_dir=str(self.run_dir),
            device=self.config.runner.device,
            torch_threads=self.config.runner.torch_threads,
        )
        self.actors.append(PoolActor(name, group, handle, handle.place.remote(), pinned=pinned))
        log.info("started Ray actor %s (%s)", name, resources, extra={"event": "worker_start"})

    def advance(self, actor: PoolActor) -> None:
        """place() or setup() of ``actor`` answered."""
        try:
            info = self.ray.get(actor.pending)
        except self.ray.exceptions.RayError as exc:  # its node went away while it started: the pool refills
            missing = import_failure(exc)
            if missing is not None:  # no retry cures it: every actor on that node fails the same way
                raise FatalRunError(
                    f"the Ray node {self._where(actor, exc)} cannot import the code of this run's {actor.group} stages "
                    f"({missing}); install ctpipe and every module its stages import on every node of the cluster, the "
                    "same versions as here (pip install on each, or one shared environment; a site's own stage module "
                    "installed there, or on the PYTHONPATH that node's `ray start` was run with), and run the same "
                    "command again (see README 'Scale out')"
                ) from exc
            self._start_failed(actor, exc)
            return
        if actor.phase == "placing":
            theirs = info.get("software", self.software)
            if theirs != self.software:  # other code on that node: other findings, or failures no retry cures
                differ = ", ".join(
                    f"{k} {theirs.get(k, 'missing')} there, {v} here" for k, v in self.software.items() if theirs.get(k) != v
                )
                raise FatalRunError(
                    f"the Ray node {info['ip']} ({info['node'][:8]}) runs other software than this driver ({differ}); "
                    "install the same ctpipe and packages on every node (pip install on each, or one shared environment) "
                    "and run the same command again"
                )
            actor.node, actor.device, actor.phase = info["node"], info["device"], "setting_up"
            actor.gpu = ",".join(str(g) for g in info.get("gpus", ())) or None
            if actor.gpu is not None and (actor.node, actor.gpu) in self.retired:
                self._hold(actor)
                log.info(
                    "Ray actor %s placed on the retired GPU %s of node %s: it holds it unused", actor.name, actor.gpu, info["ip"]
                )
                return
            if info.get("note"):
                log.warning("Ray actor %s on node %s: %s", actor.name, info["ip"], info["note"])
            log.info(
                "Ray actor %s placed on node %s (%s, pid %s), device %s",
                actor.name,
                info["ip"],
                actor.node[:8],
                info["pid"],
                actor.device,
                extra={"event": "worker_placed"},
            )
            redactor = active_redactor()  # the run's patient-named path components: kept out of its run.log records
            actor.pending = actor.handle.setup.remote(redactor.shared if redactor is not None else None)
            return
        if info["fatal"]:
            raise FatalRunError(info["fatal"])
        actor.phase, actor.pending = "ready", None
        if actor.node is not None:
            self._failed.pop((actor.node, None), None)
            self._failed.pop((actor.node, actor.gpu), None)
        self._last_failure.pop(actor.group, None)

    def _start_failed(self, actor: PoolActor, exc: BaseException) -> None:
        """``actor`` failed to start with ``exc`` (not an import error): dropped, and another started in its place,
        unless its node (its GPU, for a model actor placed on one) has now failed :data:`START_FAILURES` times in a
        row: a GPU is then retired (:meth:`_retire`), a node stops the run (FatalRunError with the error, the node and
        the fix). A node lost meanwhile is no failure of the node: the pool follows the cluster."""
        node = actor.node or _actor_node(self.ray, getattr(exc, "actor_id", None))
        raised = isinstance(exc, self.ray.exceptions.RayTaskError) or getattr(exc, "actor_init_failed", False)
        self._forget(actor)
        if not raised and self.lost_with_node(node, exc):
            self.ray.kill(actor.handle, no_restart=True)
            log.warning("Ray actor %s did not start: %s", actor.name, first_line(exc), extra={"event": "worker_died"})
            return
        error, where, now = start_error(exc), self._where(actor, exc, node), time.monotonic()
        gpu = actor.gpu if node is not None else None
        key = (node or where, gpu)
        before = self._failed.get(key)
        count = before.count if before is not None else 0
        if before is None or actor.started > before.at:  # a retry after the last failure there, not one started beside it
            count += 1
        failure = self._failed[key] = self._last_failure[actor.group] = StartFailures(count, now, error, where)
        log.info("Ray's account of the failed start of actor %s: %s", actor.name, ANSI.sub("", str(exc)).strip())
        same = self._same_error_gpus(node, error) if node is not None and gpu is not None else set()
        if count >= START_FAILURES and node is not None and gpu is not None and len(same) < self._gpus_on(node):
            # its process lives when place()/setup() raised: it holds the GPU, so Ray offers it to no other actor
            self._retire(actor, node, gpu, failure, alive=isinstance(exc, self.ray.exceptions.RayTaskError))
            return
        self.ray.kill(actor.handle, no_restart=True)
        if count >= START_FAILURES:
            on = f" on its GPU {gpu}" if gpu is not None else ""
            also = f"; the same error on {_gpu_list(same)}" if len(same) > 1 else ""
            raise FatalRunError(
                f"Ray actors for this run's {actor.group} stages fail to start on the node {where}: {error} ({count} "
                f"tries in a row{on}, each started after the one before failed{also}); fix that on the node (a model or "
                "data file missing there, its GPU or driver, its memory; the traceback is in the run's run.log), or take "
                "the node out of the cluster (`ray stop` on it), and run the same command again: it resumes the cases not "
                "done (see README 'Scale out')"
            )
        log.warning(
            "Ray actor %s did not start on %sthe node %s: %s; another is started in its place (try %d of %d there)",
            actor.name,
            f"GPU {gpu} of " if gpu is not None else "",
            where,
            error,
            count,
            START_FAILURES,
            extra={"event": "worker_died"},
        )

    def _retire(self, actor: PoolActor, node: str, gpu: str, failure: StartFailures, *, alive: bool) -> None:
        """Retire the GPU ``gpu`` of ``node`` for this run after ``failure`` (one warning naming the node, the GPU, the
        error and the fix); FatalRunError once every GPU of the node is retired. ``alive``: ``actor``'s process lives
        and holds the GPU (kept as its holder), else the next actor Ray places there becomes its holder."""
        self.retired[(node, gpu)] = failure
        self._failed.pop((node, gpu), None)
        self._last_failure.pop(actor.group, None)  # not the reason why the group may go unserved: the retired GPUs say it
        if alive:
            self._hold(actor)
        else:
            self.ray.kill(actor.handle, no_restart=True)
        mine = {g: f.error for (n, g), f in self.retired.items() if n == node}
        if len(mine) >= self._gpus_on(node):
            each = "; ".join(f"GPU {g}: {e}" for g, e in sorted(mine.items()))
            raise FatalRunError(
                f"Ray actors for this run's {actor.group} stages fail to start on every GPU of the node {failure.where} "
                f"({each}; {START_FAILURES} tries in a row on each, each started after the one before failed); fix that "
                "on the node (a model or data file missing there, its GPUs or driver, its memory; the traceback is in the "
                "run's run.log), or take the node out of the cluster (`ray stop` on it), and run the same command again: "
                "it resumes the cases not done (see README 'Scale out')"
            )
        log.warning(
            "GPU %s of the Ray node %s is retired for this run: %s (%d tries in a row there, each started after the one "
            "before failed); the run goes on with the node's other GPUs and places no actor on it again. Fix that GPU (its "
            "driver, its memory, the card; the traceback is in the run's run.log), or leave it out of that node's Ray "
            "(`ray stop`, then `ray start` with CUDA_VISIBLE_DEVICES naming the other GPUs), before the next run",
            gpu,
            failure.where,
            failure.error,
            failure.count,
            extra={"event": "gpu_retired"},
        )

    def _hold(self, actor: PoolActor) -> None:
        """Keep ``actor`` (placed on a retired GPU) alive and idle: Ray offers the GPU it holds to no other actor."""
        self._forget(actor)
        actor.phase, actor.pending = "retired", None
        self.holders.append(actor)

    def _same_error_gpus(self, node: str, error: str) -> set[str]:
        """The GPUs of ``node`` whose latest failed start (since an actor last started there) failed with ``error``."""
        both = [*self._failed.items(), *self.retired.items()]
        return {g for (n, g), f in both if n == node and g is not None and f.error == error}

    def _gpus_on(self, node: str) -> int:
        """The GPUs ``node`` declares (at least 1: a node gone meanwhile counts as one GPU)."""
        found = [int(n["Resources"].get("GPU", 0)) for n in self.nodes() if n["NodeID"] == node]
        return max(found[0] if found else 1, 1)

    def retired_text(self) -> str:
        """The GPUs this run retired and why (for a run's stop), or ``""``."""
        return "; ".join(
            f"GPU {g} of the node {f.where} retired for this run ({f.error})" for (_, g), f in sorted(self.retired.items())
        )

    def _where(self, actor: PoolActor, exc: BaseException, node: str | None = None) -> str:
        """``IP (node id)`` of the node on which ``actor`` failed with ``exc``, as far as Ray says: the address from
        Ray's message (``ip=...``), the node from ``node``, the actor or Ray's record of the dead actor."""
        found = re.search(r"\bip=([0-9A-Fa-f.:]+)", ANSI.sub("", str(exc)))
        node = node or actor.node or _actor_node(self.ray, getattr(exc, "actor_id", None))
        ip = found.group(1) if found else None
        if ip and node:
            return f"{ip} ({node[:8]})"
        return ip or (node[:8] if node else "where it was placed")

    def drop(self, actor: PoolActor) -> None:
        self._forget(actor)
        self.ray.kill(actor.handle, no_restart=True)

    def _forget(self, actor: PoolActor) -> None:
        """``actor`` is no actor of the pool any more (its process is left as it is)."""
        if actor in self.actors:
            self.actors.remove(actor)
        self._refreshed = 0.0  # look at the cluster again at the next poll

    def check_served(self) -> None:
        """A group without any ready actor for longer than ``runner.ray_timeout_s`` stops the run (clear reason)."""
        now = time.monotonic()
        for g in self.groups:
            if any(a.group == g and a.phase == "ready" for a in self.actors):
                self._unserved[g] = now
            elif any(a.group == g and a.phase == "setting_up" for a in self.actors):
                continue  # placed, loading its model: no deadline here (a setup that keeps failing stops the run: advance)
            elif now - self._unserved[g] > self.timeout_s:
                if any(a.group == g and a.phase == "placing" and self._has_a_process(a) for a in self.actors):
                    continue  # Ray gave it a node's CPU/GPU and a process, which starts (slowly, on a busy machine)
                failed = self._last_failure.get(g)
                retired = (
                    f" ({self.retired_text()}: it failed to start every actor placed there; fix it, or leave it out of "
                    "its node's Ray: `ray stop`, then `ray start` with CUDA_VISIBLE_DEVICES naming the other GPUs)"
                    if g == "model" and self.retired
                    else ""
                )
                if failed is not None:  # the run's own failing actors held what the cluster offers
                    raise FatalRunError(
                        f"no Ray actor for the {g} stages could start within {self.timeout_s:g} s{retired}: the last one "
                        f"failed on the node {failed.where}: {failed.error}; fix that on the node (a model or data file "
                        "missing there, its GPU or driver, its memory), or take the node out of the cluster (`ray stop` on "
                        "it), and run the same command again (see README 'Scale out')"
                    )
                raise FatalRunError(
                    f"no Ray actor for the {g} stages could be placed within {self.timeout_s:g} s{retired} "
                    f"({self.cluster.describe()}; {self._why_unplaced(g)}"
                )

    def _has_a_process(self, actor: PoolActor) -> bool:
        """Whether Ray gave ``actor``, whose ``place()`` has not answered yet, a worker process (its actor-table record
        has a process id): it holds the CPU or GPU it asked for, and is placed; one waiting for them has none."""
        actor_id = getattr(actor.handle, "_actor_id", None)
        return int(_actor_record(self.ray, actor_id.hex() if actor_id is not None else None).get("Pid") or 0) > 0

    def _why_unplaced(self, group: str) -> str:
        """What the actors of ``group`` need that the cluster does not offer now, and what to do."""
        nodes = self.nodes()
        later = "raise runner.ray_timeout_s"
        if not nodes:
            return "no node of the cluster is alive); start its nodes again (`ray start`) and rerun the same command"
        device = self.config.runner.device
        gpus = sum(n["Resources"].get("GPU", 0.0) for n in nodes)
        if group == "model" and not gpus and not device.startswith("cuda"):
            return f"each node with a CPU runs one model actor); add nodes to the cluster or {later}"
        res, need = ("GPU", "one GPU (num_gpus=1) per model actor") if group == "model" else ("CPU", "one CPU per CPU actor")
        total = gpus if res == "GPU" else sum(n["Resources"].get("CPU", 0.0) for n in nodes)
        free = self.ray.available_resources().get(res, 0.0)
        if total > 0 and free < 1:
            return (
                f"each needs {need}, {free:g} {res}(s) free: other Ray jobs, e.g. another ctpipe run, hold the rest); "
                f"run again when they end, give each run a share of the cluster (runner.ray_max_cpus / "
                f"runner.ray_max_gpus), add nodes to the cluster or {later}"
            )
        alt = f", or use --device auto (runner.device = {device})" if group == "model" and device.startswith("cuda") else ""
        return f"each needs {need}); add nodes to the cluster or {later}{alt}"

    def lost_with_node(self, node: str | None, exc: BaseException) -> bool:
        """Whether an actor of ``node`` that failed with ``exc`` (a Ray error, not one its code raised) went with its node
        rather than with its own process: Ray says the node died, or marks it dead (:meth:`node_dead`). An
        ``ActorUnavailableError`` (the connection to the actor broke before the GCS said why) is a node lost only where
        the node's raylet does not answer either: on a busy cluster the GCS's account of a process that died on a live
        node (a case that crashed it) can come after Ray's wait for it (``RAY_timeout_ms_task_wait_for_death_info``)."""
        if "node has died" in str(exc):
            return True
        if isinstance(exc, self.ray.exceptions.ActorUnavailableError):
            record = next((n for n in self.nodes() if n["NodeID"] == node), None)
            return record is None or not raylet_answers(record, timeout_s=RAYLET_CHECK_S)
        return self.node_dead(node)

    def node_dead(self, node: str | None, grace_s: float = 2.0) -> bool:
        """Whether Ray marked ``node`` dead, waiting up to ``grace_s`` for its verdict."""
        if node is None:
            return False
        end = time.monotonic() + grace_s
        while True:
            alive = {n["NodeID"] for n in self.nodes()}
            if node not in alive:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.2)

    def close(self) -> None:
        """Stop every actor of the run."""
        for actor in [*self.actors, *self.holders]:
            self.ray.kill(actor.handle, no_restart=True)
        self.actors.clear()
        self.holders.clear()


def _gpu_list(gpus: set[str]) -> str:
    return ", ".join(f"GPU {g}" for g in sorted(gpus))


def _capped(total: int, cap: int) -> int:
    """``total`` limited to a run's share ``cap`` (``runner.ray_max_cpus`` / ``ray_max_gpus``; 0 = no limit)."""
    return min(total, cap) if cap else total


def _actor_node(ray: Any, actor_id: str | None) -> str | None:
    """The id of the node that ran the dead actor ``actor_id`` (hex), from Ray's actor table; None where not known."""
    address = _actor_record(ray, actor_id).get("Address")
    node = address.get("NodeID") if isinstance(address, dict) else None
    return str(node) if node else None


def _actor_record(ray: Any, actor_id: str | None) -> dict[str, Any]:
    """Ray's actor-table record of the actor ``actor_id`` (hex); empty where it cannot be read."""
    state = getattr(getattr(ray, "_private", None), "state", None)
    if not actor_id or state is None:
        return {}
    try:
        record = state.actors(actor_id=actor_id)
    except Exception as exc:  # noqa: BLE001 - the node is named by its address alone then
        log.debug("Ray's record of actor %s could not be read: %s", actor_id, exc)
        return {}
    return record if isinstance(record, dict) else {}
