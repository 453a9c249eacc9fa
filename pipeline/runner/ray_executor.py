"""``RayExecutor``: the runner's stages as Ray actors across a cluster (``runner.engine = ray``).

It implements the engine's :class:`~.engine.Executor` protocol (``has_room``/``submit``/``poll``),
so the driver (the ``ctpipe run`` process) stays what it is locally: the single writer of the run
store, admitting cases, recording every stage attempt and publishing outputs; exactly-once and
resume after a killed driver work as with the local executor.

Actors (:class:`.ray_actors.StageActor`, one worker process each, set up once):

* model stages: one actor per GPU of the cluster (``num_gpus=1``); on a cluster without GPUs (or
  ``runner.device = cpu``) one model actor per node (``runner.device = cuda`` waits for GPUs instead).
  Each holds at most ``runner.queue_depth`` + 1 tasks (backpressure through ``has_room``); a case's later
  model stages go to the actor that ran its earlier one when it has room (the loaded model input stays in that process).
* CPU stages: one actor per CPU of the cluster (``num_cpus=1``), one task at a time.

The pools follow the cluster: a node that joins gets actors, a node that leaves takes its actors along.

Failures: an actor lost with its node (``ActorDiedError`` naming the node, the node marked dead, or
``ActorUnavailableError``: the connection to it broke before Ray said why, and the node's raylet does not
answer either) is not the case's fault: the stage it ran is submitted again to another actor, with the same attempt and
staging folder (leftover temporary files removed first), and the tasks queued behind it move too; no
attempt is recorded for the lost run and no case is lost or published twice. After
:data:`MAX_NODE_LOSSES` such losses of the same stage the case is handed to the engine as a worker
death. An actor that dies while its node lives (the case crashed the process; also when Ray's account
of that death comes late, on a busy cluster, and the actor is unavailable meanwhile) is a worker death
(``worker_died``): the engine retries the case ``runner.retries`` times, then quarantines it; others go on.
The death is charged to the task the actor was running, by the marks it keeps in the run folder
(:mod:`.ray_marks`): a task queued before it that finished, its reply lost with the process, runs again on
another actor with no attempt recorded against its case (``reply_lost``).

Data between stages: the run folder, on storage every node mounts at the same path (NFS or similar),
not Ray's object store. Measured with ``scripts/bench_scale.py`` between two Ray nodes on one machine,
a case's cached HU volume (the largest hand-over: 300 x 512 x 512 int16, 150 MB) took 0.22 s through
the object store and 0.26 s as a file written (with fsync) and read back in the run folder: the same
order, so speed does not decide it (across machines both cross the network once). The run folder
keeps what the object store cannot: the stages already hand over through the case cache and the
staging folder, the published outputs must land in the driver's run folder anyway, and after a driver
killed with SIGKILL the next run resumes from the cache on disk, while objects owned by a dead driver
are gone with it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import ClusterError, FatalRunError
from .ray_connect import RaySession, import_ray, probe
from .ray_errors import first_line
from .ray_marks import FINISHED, Mark, clear_mark, marks_dir, read_mark
from .ray_pool import ActorPool, PoolActor
from .stage import Stage, Task, TaskResult

log = logging.getLogger(__name__)

#: Times one stage of one case may be lost with its node before the engine treats it as a worker death.
MAX_NODE_LOSSES = 3
#: Times the same finished task may be cut off from its reply by its actor's death, nothing else running, before it is
#: charged with the death (its reply itself may kill the process: too large to send, say).
MAX_LOST_REPLIES = 3
#: Seconds between two looks at the head's GCS port while it answers, and the first pause after it stopped answering.
HEAD_CHECK_S = 1.0
#: The longest pause between two tries to reach a head that does not answer (the pauses double up to it).
HEAD_RETRY_MAX_S = 30.0


class HeadWatch:
    """Whether the head of a joined cluster (``RaySession.address`` HOST:PORT) still accepts connections.

    Ray's driver does not say when the head goes away: its calls wait for the GCS. A head that refuses connections,
    or whose port does not open (a network outage), is tried again after 1 s, then after pauses that double up to
    :data:`HEAD_RETRY_MAX_S`, each try logged (``head_lost``) while the run waits (the actors go on with the stages
    they hold, and their results are taken when the head answers again); a head that answers again is logged
    (``head_back``) and the run goes on. One that did not answer for ``reconnect_s`` (``runner.ray_reconnect_s``)
    seconds stops the run with a FatalRunError naming the address and the fix (the cases done stay done; the same
    command resumes the rest). A private instance (``local``) dies with this process and is not watched."""

    def __init__(self, cluster: RaySession, *, reconnect_s: float, ray: Any = None):
        self.address = cluster.address if cluster.address.count(":") >= 1 else None
        self.reconnect_s = reconnect_s
        self.ray = ray
        self.cluster_id = _cluster_id(ray) if ray is not None and self.address is not None else None
        self.lost = False
        self._next = 0.0  # time.monotonic() of the next look
        self._down_since: float | None = None
        self._tries = 0
        self._pause = HEAD_CHECK_S

    def answers(self) -> bool:
        """False while the head does not answer (the run waits); FatalRunError once that lasted ``reconnect_s``."""
        now = time.monotonic()
        if self.address is None:
            return True
        if now < self._next:
            return self._down_since is None
        try:
            probe(self.address, timeout_s=HEAD_CHECK_S)
        except ClusterError as exc:
            why = getattr(exc.__cause__, "strerror", None) or type(exc.__cause__).__name__
            if self._down_since is None:
                self._down_since, self._tries, self._pause = now, 0, HEAD_CHECK_S
            self._tries += 1
            down = now - self._down_since
            if down >= self.reconnect_s:
                self.lost = True
                raise FatalRunError(
                    f"the Ray head at {self.address} stopped answering mid-run ({why}; {self._tries} tries over "
                    f"{down:.0f} s, runner.ray_reconnect_s = {self.reconnect_s:g} s); the cases done stay done and no case "
                    "was published half-done. Fix: start the head again (`ray start --head` there, then `ray start "
                    "--address=HEAD:PORT` on the other nodes) and run the same command (with --ray and the new address if "
                    "it changed): it resumes the cases not done; for longer outages raise runner.ray_reconnect_s"
                ) from exc
            pause = min(self._pause, HEAD_RETRY_MAX_S, self.reconnect_s - down)
            log.warning(
                "the Ray head at %s does not answer (%s): try %d, %.1f s since it stopped; the run waits and tries again "
                "in %.1f s, up to runner.ray_reconnect_s = %g s",
                self.address,
                why,
                self._tries,
                down,
                pause,
                self.reconnect_s,
                extra={"event": "head_lost"},
            )
            self._next, self._pause = now + pause, self._pause * 2
            return False
        if self._down_since is not None:
            if not self._same_cluster(now - self._down_since):  # its port opened, its GCS does not answer yet
                self._next = now + min(self._pause, HEAD_RETRY_MAX_S)
                return False
            log.warning(
                "the Ray head at %s answers again after %.0f s (%d tries); the run goes on",
                self.address,
                now - self._down_since,
                self._tries,
                extra={"event": "head_back"},
            )
        self._down_since, self._next = None, now + HEAD_CHECK_S
        return True

    def _same_cluster(self, down: float) -> bool:
        """Whether the head that answers again after ``down`` seconds is this run's cluster (True also where this Ray
        cannot be asked), False while its GCS does not answer yet; FatalRunError when it is a new cluster (a head
        started again: Ray without GCS fault tolerance keeps nothing across a restart), which this process must not
        ask anything: Ray ends a process whose calls reach another cluster's GCS with a native error and stack trace."""
        client = getattr(getattr(self.ray, "_raylet", None), "GcsClient", None)
        if self.cluster_id is None or self.address is None or client is None:
            return True
        try:
            theirs = client(address=self.address).cluster_id
        except Exception as exc:  # noqa: BLE001 - Ray's errors of a GCS that is still starting; the next look decides
            log.debug("the Ray head at %s does not answer as a GCS yet: %s", self.address, exc)
            return False
        if theirs == self.cluster_id:
            return True
        self.lost = True
        raise FatalRunError(
            f"the Ray head at {self.address} answers again after {down:.0f} s, but as a new cluster (the head was started "
            "again, and a Ray head keeps nothing across a restart): this run's actors are not part of it; the cases done "
            "stay done and no case was published half-done. Fix: join the other nodes to the new head (`ray start "
            "--address=HEAD:PORT` on each) and run the same command: it resumes the cases not done"
        )


def _cluster_id(ray: Any) -> Any:
    """The id of the cluster this process joined (Ray's ClusterID), or None where this Ray does not say."""
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    return getattr(getattr(node, "node", None), "cluster_id", None)


class RayExecutor:
    """CPU and model actors on a Ray cluster (see the module docstring)."""

    def __init__(
        self, stages: Sequence[Stage], *, config: Config, run_dir: Path, cluster: RaySession, queue_depth: int, timeout_s: float
    ):
        self.ray = import_ray()
        self.stages = list(stages)
        self.depth = queue_depth
        self.backlog: dict[str, deque[Task]] = {g: deque() for g in ("cpu", "model")}
        self.run_dir = run_dir
        self.losses: dict[tuple[str, str, int], int] = {}  # (case_key, stage, attempt) -> node losses
        self.replies_lost: dict[tuple[str, str, int], int] = {}  # (case_key, stage, attempt) -> replies lost, none running
        self.sticky: dict[str, str] = {}  # case_key -> model actor that ran its last model stage
        self.last_model_stage = max((i for i, s in enumerate(self.stages) if s.group == "model"), default=-1)
        self.head = HeadWatch(cluster, reconnect_s=config.runner.ray_reconnect_s, ray=self.ray)
        self.pool = ActorPool(self.ray, self.stages, config=config, run_dir=run_dir, cluster=cluster, timeout_s=timeout_s)

    # -- the Executor protocol ---------------------------------------------------------------------
    def has_room(self, group: str) -> bool:
        self._dispatch_backlog(group)
        return not self.backlog[group] and self._free(group) is not None

    def submit(self, task: Task) -> None:
        group = self._group_of(task)
        actor = self._free(group, task)
        if actor is None:  # the engine asked has_room first; an actor lost since then: keep the task for later
            self.backlog[group].append(task)
            return
        self._send(actor, task)

    def poll(self, timeout: float) -> list[TaskResult]:
        pool = self.pool
        if not self.head.answers():  # Ray's calls to a dead GCS block for a minute, then Ray ends the process
            time.sleep(timeout)
            return []
        pool.refresh()
        for g in pool.groups:
            self._dispatch_backlog(g)
        refs = pool.pending_refs() + [r for a in pool.actors for _, r in a.held]
        if not refs:
            time.sleep(timeout)
            pool.check_served()
            return []
        done, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if done:
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(done)
        out: list[TaskResult] = []
        for actor in list(pool.actors):
            if actor.pending is not None and actor.pending in ready:
                pool.advance(actor)
            while actor in pool.actors and actor.held and actor.held[0][1] in ready:
                task, ref = actor.held[0]
                res = self._collect(actor, task, ref)
                if res is not None:
                    out.append(res)
        pool.check_served()
        return out

    def close(self) -> None:
        """Stop this run's actors (the cluster and the connection stay; see :meth:`.RaySession.close`). With the head
        lost there is no one to ask: the actors end with their nodes, which lose the head too."""
        if self.head.lost:
            self.pool.actors.clear()
            return
        self.pool.close()
        shutil.rmtree(marks_dir(self.run_dir), ignore_errors=True)

    def capacity(self) -> int:
        """Tasks the actors run at once (CPU actors + model actors): the engine admits about twice this."""
        return len(self.pool.actors)

    # -- tasks -------------------------------------------------------------------------------------
    def _group_of(self, task: Task) -> str:
        return next(s.group for s in self.stages if s.name == task.stage)

    def _limit(self, group: str) -> int:
        return self.depth + 1 if group == "model" else 1

    def _free(self, group: str, task: Task | None = None) -> PoolActor | None:
        cands = [a for a in self.pool.ready(group) if len(a.held) < self._limit(group)]
        if not cands:
            return None
        if task is not None and group == "model":
            mine = next((a for a in cands if a.name == self.sticky.get(task.case.case_key)), None)
            if mine is not None:
                return mine
        return min(cands, key=lambda a: len(a.held))

    def _send(self, actor: PoolActor, task: Task) -> None:
        actor.held.append((task, actor.handle.run.remote(task)))
        if actor.group == "model":
            self.sticky[task.case.case_key] = actor.name

    def _dispatch_backlog(self, group: str) -> None:
        queue = self.backlog[group]
        while queue:
            actor = self._free(group, queue[0])
            if actor is None:
                return
            self._send(actor, queue.popleft())

    def _collect(self, actor: PoolActor, task: Task, ref: Any) -> TaskResult | None:
        """The answer for the first task ``actor`` holds: its result, or what its death means for the case."""
        try:
            res: TaskResult = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:  # raised past run_task (e.g. the task could not be unpickled)
            actor.held.popleft()
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return _failed(
                task, actor, type(cause).__name__, f"stage {task.stage} failed on Ray actor {actor.name}: {first_line(cause)}"
            )
        except self.ray.exceptions.RayError as exc:  # the actor (its process or its node) is gone
            return self._lost(actor, exc)
        actor.held.popleft()
        if (
            res.ok
            and actor.group == "model"
            and task.stage_index == max(i for i, s in enumerate(self.stages) if s.group == "model")
        ):
            self.sticky.pop(task.case.case_key, None)
        return res

    def _lost(self, actor: PoolActor, exc: BaseException) -> TaskResult | None:
        """``actor`` died holding tasks: rerun them elsewhere (node lost) or report the running one (case crashed it).

        The running task is the one the actor marked started and not finished (:mod:`.ray_marks`); those before it
        finished, their replies lost with the process: they run again, with no attempt recorded against them. Where the
        actor marked the last task it held finished, none ran: all run again, unless the same finished task was cut off
        so :data:`MAX_LOST_REPLIES` times (its reply itself may kill the process): it is the running one then. Where the
        mark names no task it held, the first one is taken as the running one."""
        held = list(actor.held)
        actor.held.clear()
        self.pool.drop(actor)
        mark = read_mark(self.run_dir, actor.name)
        clear_mark(self.run_dir, actor.name)
        # a process that dies on a live node is reported by its raylet (ActorDiedError: "worker process has died"), or,
        # when that account comes late, the actor is unavailable while its raylet answers; a lost node has no raylet
        # left to tell or to answer: its actors become unavailable, or are declared dead with the node
        node_lost = self.pool.lost_with_node(actor.node, exc)
        why = first_line(exc)
        at, done = _running(held, mark)
        if at is None:  # the last task it marked finished, and none after it started: none ran
            last = held[done - 1][0]
            cut = (last.case.case_key, last.stage, last.attempt)
            self.replies_lost[cut] = self.replies_lost.get(cut, 0) + 1
            if not node_lost and self.replies_lost[cut] > MAX_LOST_REPLIES:  # its reply itself may kill the process
                at = done = done - 1
            else:
                at = len(held)
        again = [t for i, (t, _) in enumerate(held) if i != at]
        for task in reversed(again):  # to another actor first; those that finished run again, no attempt recorded
            self.backlog[actor.group].appendleft(task)
        for task in again[:done]:
            _clear_partial_files(Path(task.workdir))
            log.warning(
                "Ray actor %s died after it finished stage %s of case %s, before its result came back; the stage runs "
                "again on another actor (no attempt counted against the case)",
                actor.name,
                task.stage,
                task.case.case_id,
                extra={"event": "reply_lost", "case_id": task.case.case_id, "stage": task.stage},
            )
        if at >= len(held):
            return None
        task = held[at][0]
        self.sticky.pop(task.case.case_key, None)
        key = (task.case.case_key, task.stage, task.attempt)
        if node_lost:
            self.losses[key] = self.losses.get(key, 0) + 1
        if node_lost and self.losses[key] <= MAX_NODE_LOSSES:
            log.warning(
                "node %s lost with Ray actor %s while it ran stage %s of case %s; the stage runs again on another actor",
                (actor.node or "?")[:8],
                actor.name,
                task.stage,
                task.case.case_id,
                extra={"event": "node_lost", "case_id": task.case.case_id, "stage": task.stage},
            )
            _clear_partial_files(Path(task.workdir))
            self.backlog[actor.group].appendleft(task)
            return None
        log.error(
            "Ray actor %s died (%s) while running stage %s of case %s",
            actor.name,
            why,
            task.stage,
            task.case.case_id,
            extra={"event": "worker_died", "case_id": task.case.case_id, "stage": task.stage},
        )
        where = "its node was lost" if node_lost else f"the case crashed it: {why}"
        return _failed(
            task,
            actor,
            "WorkerDiedError",
            f"Ray actor {actor.name} died while running stage {task.stage} ({where})",
            worker_died=True,
        )


def _running(held: Sequence[tuple[Task, Any]], mark: Mark | None) -> tuple[int | None, int]:
    """The index in ``held`` (an actor's tasks, in order) of the task that ran when the actor died, by its ``mark``,
    and how many tasks before it finished; ``(None, n)`` where the ``n``-th finished and none after it started;
    ``(0, 0)`` where the mark names none of them (none written, or an earlier task's)."""
    idx = next((i for i, (t, _) in enumerate(held) if t.seq == mark.seq), None) if mark is not None else None
    if mark is None or idx is None:
        return 0, 0
    if mark.state == FINISHED:
        return None, idx + 1
    return idx, idx


def _clear_partial_files(workdir: Path) -> None:
    """Remove the temporary files of atomic writes a lost process left in a staging folder (never published)."""
    if workdir.is_dir():
        for tmp in workdir.rglob(".*.tmp"):
            tmp.unlink(missing_ok=True)


def _failed(task: Task, actor: PoolActor, error_class: str, error: str, *, worker_died: bool = False) -> TaskResult:
    """The failed result of ``task`` on ``actor``, as a worker would have reported it."""
    return TaskResult(
        task.case.case_key,
        task.stage,
        task.stage_index,
        task.attempt,
        False,
        f"{actor.name}@{actor.node[:8]}" if actor.node else actor.name,  # as the actor names itself in its results
        actor.device,
        task.ready_at,
        error_class=error_class,
        error=error,
        worker_died=worker_died,
    )
