"""The pipelined executor: moves each case through the stages, keeps the store and folders consistent.

The main process admits at most ``max_in_flight`` cases at a time (so memory
and disk stay bounded whatever the number of cases), hands each ready stage of
each case to a worker of the stage's group (CPU pool or the model worker of a
device), records every stage attempt in the store as its result arrives, and
publishes a case's outputs (atomic rename, then the store) when its last stage
is done. Later stages of admitted cases are dispatched before first stages of
new ones, so cases finish in order and the pipeline stays full.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import FatalRunError
from .resume import publish, write_quarantine
from .stage import CaseSpec, Stage, Task, TaskResult
from .store import RunStore

log = logging.getLogger(__name__)


class Observer(Protocol):
    def on_stage(self, result: TaskResult) -> None: ...
    def on_case_done(self, case: CaseSpec, latency_s: float, n_findings: int) -> None: ...
    def on_case_failed(self, case: CaseSpec, reason: str, error_class: str) -> None: ...


class Executor(Protocol):
    def has_room(self, group: str) -> bool: ...
    def submit(self, task: Task) -> None: ...
    def poll(self, timeout: float) -> list[TaskResult]: ...


@dataclass
class _Live:
    case: CaseSpec
    attempt: int
    workdir: Path
    started: float
    index: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    tries: int = 1


@dataclass
class EngineResult:
    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # (case_id, error class, reason)
    fatal: str | None = None


def _file_entry(path: Path, root: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        os.fsync(fh.fileno())  # on disk before the folder is published (power loss, not only a killed process)
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": h.hexdigest()}


class Engine:
    """Drives cases through ``stages`` on ``executor``, recording everything in ``store``."""

    def __init__(self, stages: Sequence[Stage], executor: Executor, store: RunStore, *, run_dir: Path, run_id: str,
                 max_in_flight: int, retries: int, keep_cache: bool, observers: Sequence[Observer] = ()):
        self.stages = list(stages)
        self.groups = [s.group for s in self.stages]
        self.executor = executor
        self.store = store
        self.run_dir = run_dir
        self.run_id = run_id
        self.max_in_flight = max(1, max_in_flight)
        self.retries = retries
        self.keep_cache = keep_cache
        self.observers = list(observers)
        self._seq = itertools.count()

    # -- public --------------------------------------------------------------------------
    def run(self, cases: Sequence[CaseSpec], rejected: Sequence[CaseSpec] = ()) -> EngineResult:
        result = EngineResult()
        for case in rejected:
            assert case.rejected is not None
            self._quarantine(case, case.rejected[1], case.rejected[0], "discover", result)
        todo = iter(cases)
        live: dict[str, _Live] = {}
        ready: list[Task] = []
        exhausted = False
        while True:
            while not exhausted and len(live) < self.max_in_flight:
                nxt = next(todo, None)
                if nxt is None:
                    exhausted = True
                    break
                live[nxt.case_key] = self._admit(nxt)
                ready.append(self._task(live[nxt.case_key]))
            if not live:
                break
            ready.sort(key=lambda t: (-t.stage_index, t.seq))
            for task in list(ready):
                if self.executor.has_room(self.groups[task.stage_index]):
                    self.executor.submit(task)
                    ready.remove(task)
            for res in self.executor.poll(0.05):
                self._handle(res, live, ready, result)
        return result

    # -- steps -------------------------------------------------------------------------------
    def _admit(self, case: CaseSpec, tries: int = 1) -> _Live:
        attempt = self.store.begin_case(case.case_key, self.run_id)
        workdir = self.run_dir / "tmp" / f"{case.case_id}.a{attempt}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        log.info("case %s started (attempt %d)", case.case_id, attempt,
                 extra={"event": "case_start", "case_id": case.case_id, "run_id": self.run_id})
        return _Live(case, attempt, workdir, time.time(), tries=tries)

    def _task(self, lv: _Live) -> Task:
        stage = self.stages[lv.index]
        return Task(lv.case, lv.index, stage.name, lv.attempt, str(lv.workdir), dict(lv.state), time.time(),
                    next(self._seq))

    def _handle(self, res: TaskResult, live: dict[str, _Live], ready: list[Task], result: EngineResult) -> None:
        if res.fatal:
            raise FatalRunError(f"stage {res.stage} cannot start on {res.device}: {res.error}")
        lv = live.get(res.case_key)
        if lv is None or lv.attempt != res.attempt:
            return  # a late answer about an abandoned attempt
        self.store.record_attempt(
            run_id=self.run_id, case_key=res.case_key, stage=res.stage, attempt=res.attempt,
            status="ok" if res.ok else ("interrupted" if res.worker_died else "failed"), worker=res.worker,
            device=res.device, ready_at=res.ready_at, started_at=res.started_at, ended_at=res.ended_at,
            wall_s=res.wall_s, peak_rss_mb=res.peak_rss_mb, peak_cuda_mb=res.peak_cuda_mb, error=res.error,
            detail=res.outputs.pop("timings", None),
        )
        for obs in self.observers:
            obs.on_stage(res)
        if not res.ok:
            del live[res.case_key]
            shutil.rmtree(lv.workdir, ignore_errors=True)
            if res.worker_died and lv.tries <= self.retries:
                log.warning("case %s: %s; retrying", lv.case.case_id, res.error,
                            extra={"event": "case_retry", "case_id": lv.case.case_id})
                live[res.case_key] = self._admit(lv.case, tries=lv.tries + 1)
                ready.append(self._task(live[res.case_key]))
                return
            self._quarantine(lv.case, res.error or "unknown error", res.error_class or "Error", res.stage, result)
            return
        lv.state.update(res.outputs)
        lv.index += 1
        if lv.index < len(self.stages):
            ready.append(self._task(lv))
            return
        del live[res.case_key]
        self._finish(lv, result)

    def _finish(self, lv: _Live, result: EngineResult) -> None:
        case = lv.case
        findings = list(lv.state.get("findings", []))
        measurements = [tuple(m) for m in lv.state.get("measurements", [])]
        files = sorted(p for p in lv.workdir.rglob("*") if p.is_file())
        manifest = {
            "case_id": case.case_id, "case_key": case.case_key, "series_uid": case.series_uid,
            "fingerprint": case.fingerprint, "files": [_file_entry(p, lv.workdir) for p in files],
            "findings": findings, "measurements": [list(m) for m in measurements],
        }
        final = self.run_dir / "cases" / case.case_id
        publish(lv.workdir, final, manifest)
        self.store.complete_case(case.case_key, output_dir=str(final.relative_to(self.run_dir)), findings=findings,
                                 measurements=measurements)
        latency = time.time() - lv.started
        self._drop_cache(case)
        result.done.append(case.case_id)
        log.info("case %s done in %.2f s, %d finding(s)", case.case_id, latency, len(findings),
                 extra={"event": "case_done", "case_id": case.case_id, "latency_s": round(latency, 4), "run_id": self.run_id})
        for obs in self.observers:
            obs.on_case_done(case, latency, len(findings))

    def _quarantine(self, case: CaseSpec, reason: str, error_class: str, stage: str | None, result: EngineResult) -> None:
        row = self.store.case(case.case_key) if case.case_key else None
        if row is not None:
            if row["status"] == "pending":
                self.store.begin_case(case.case_key, self.run_id)
            self.store.fail_case(case.case_key, reason=reason, error_class=error_class, stage=stage)
        write_quarantine(self.run_dir, case, reason=reason, error_class=error_class, stage=stage)
        self._drop_cache(case)
        result.failed.append((case.case_id, error_class, reason))
        log.error("case %s quarantined at stage %s: %s", case.case_id, stage, reason,
                  extra={"event": "case_failed", "case_id": case.case_id, "stage": stage, "reason": reason,
                         "error_class": error_class, "run_id": self.run_id})
        for obs in self.observers:
            obs.on_case_failed(case, reason, error_class)

    def _drop_cache(self, case: CaseSpec) -> None:
        if self.keep_cache:
            return
        for suffix in (".json", ".npy"):  # sidecar first: a cache entry exists only while its sidecar does
            (self.run_dir / "cache" / f"{case.case_id}{suffix}").unlink(missing_ok=True)
