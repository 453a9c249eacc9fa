"""The pipelined executor: moves each case through the stages, keeps the store and folders consistent.

The main process admits at most ``max_in_flight`` cases at a time (so memory
and disk stay bounded whatever the number of cases), hands each ready stage of
each case to a worker of the stage's group (CPU pool or the model worker of a
device), records every stage attempt in the store as its result arrives, and
publishes a case's outputs (atomic rename, then the store) when its last stage
is done and every file its stages declared is there. Later stages of admitted
cases are dispatched before first stages of new ones, so cases finish in order
and the pipeline stays full.

When the run folder cannot be written (disk full, read-only, no permission;
see :mod:`.faults`), no new case is admitted; the cases in flight finish if
they can, and those that cannot are released (back to pending, no verdict) for
the next run. A failure of the run store itself stops the engine at once (its
cases stay 'running' and are retried by the next run). The same holds when a
source folder of the run goes away (a network mount that drops, see
:mod:`.source_roots`): a case that fails while its source folder cannot be read
is released, not quarantined, and no new case is admitted.

A series still being written into the source while its case ran (files of it that arrived, or changed size or
modification time, since discovery; see :mod:`.arrivals`, checked just before publishing and again once the folder
is in place, which withdraws it when a file landed in between, and the ingest and DICOM
stages' :class:`~pipeline.errors.SeriesStillWrittenError`) is not published either: its case goes back to pending
with the reason, is listed in ``EngineResult.still_written``, and the run goes on. The next run finds the series with
its new content (a new fingerprint) and analyses it whole. The check once the folder is in place is made inside the
run store's transaction that records the case done, just before it commits: a file that landed up to then, also
while the case's results were being recorded, rolls the completion back and withdraws the folder, so no case is
recorded done without a file of its series that was in the source before its commit. A file that landed after that
check, as the transaction committed, is found by a check once the commit is made: the folder is withdrawn and the
completion undone (:meth:`RunStore.uncomplete_case`) before the case counts anywhere (metrics, progress, log).
Until that check has passed the case is recorded done *unconfirmed* (:meth:`RunStore.confirm_case`): a PACS sender
(:mod:`pipeline.pacs.sender`) sends nothing of it before.
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

from ..errors import FatalRunError, IncompleteOutputError, SeriesStillWrittenError
from .adopt import source_digest
from .arrivals import SourceSnapshot
from .faults import environment_failure
from .logs import to_console
from .resume import drop_cached, publish, remove_quarantine, withdraw, write_quarantine
from .source_roots import SourceRoots
from .stage import CaseSpec, Stage, Task, TaskResult
from .store import RunStore

log = logging.getLogger(__name__)


class Observer(Protocol):
    def on_stage(self, result: TaskResult) -> None: ...
    def on_case_done(self, case: CaseSpec, latency_s: float, n_findings: int) -> None: ...
    def on_case_failed(self, case: CaseSpec, reason: str, error_class: str) -> None: ...
    def on_case_released(self, case: CaseSpec, reason: str) -> None: ...


class Executor(Protocol):
    def has_room(self, group: str) -> bool: ...
    def submit(self, task: Task) -> None: ...
    def poll(self, timeout: float) -> list[TaskResult]: ...


@dataclass
class _Live:
    case: CaseSpec
    attempt: int
    workdir: Path
    started: float  # Unix s (wall clock): when the case started, as recorded
    index: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    tries: int = 1
    declared: list[str] = field(default_factory=list)  # files (relative to workdir) the stages promised
    #: time.monotonic() at the start: the case's latency, whatever the wall clock does meanwhile (an NTP step)
    began: float = field(default_factory=time.monotonic)


@dataclass
class EngineResult:
    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # (case_id, error class, reason)
    fatal: str | None = None
    released: list[tuple[str, str]] = field(default_factory=list)  # (case_id, why): left for the next run
    stopped: str | None = None  # why no more cases were admitted (the run folder could not be written)
    #: (case_id, why): not published because the series was still being written into the source; left for the next run
    still_written: list[tuple[str, str]] = field(default_factory=list)


def _file_entry(path: Path, root: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        os.fsync(fh.fileno())  # on disk before the folder is published (power loss, not only a killed process)
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": h.hexdigest()}


class Engine:
    """Drives cases through ``stages`` on ``executor``, recording everything in ``store``."""

    def __init__(
        self,
        stages: Sequence[Stage],
        executor: Executor,
        store: RunStore,
        *,
        run_dir: Path,
        run_id: str,
        max_in_flight: int,
        retries: int,
        keep_cache: bool,
        observers: Sequence[Observer] = (),
        sources: SourceRoots | None = None,
        started: float | None = None,
        snapshot: SourceSnapshot | None = None,
    ):
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
        self.sources = sources  # the run's source folders: one that goes away stops the run (None: not watched)
        self.started = time.monotonic() if started is None else started  # the run's start, on the monotonic clock
        self.snapshot = snapshot  # what discovery saw of the source folders (None: files arriving are not looked for)
        self._seq = itertools.count()
        self.stopping: str | None = None

    # -- public --------------------------------------------------------------------------
    def run(self, cases: Sequence[CaseSpec], rejected: Sequence[CaseSpec] = ()) -> EngineResult:
        result = EngineResult()
        for case in rejected:
            assert case.rejected is not None
            if self.stopping is None:
                self._quarantine(case, case.rejected[1], case.rejected[0], "discover", result)
        todo = iter(cases)
        live: dict[str, _Live] = {}
        ready: list[Task] = []
        exhausted = False
        while True:
            while not exhausted and self.stopping is None and len(live) < self.max_in_flight:
                nxt = next(todo, None)
                if nxt is None:
                    exhausted = True
                    break
                lv = self._admit(nxt, result)
                if lv is not None:
                    live[nxt.case_key] = lv
                    ready.append(self._task(lv))
            if not live:
                break
            ready.sort(key=lambda t: (-t.stage_index, t.seq))
            for task in list(ready):
                if self.executor.has_room(self.groups[task.stage_index]):
                    self.executor.submit(task)
                    ready.remove(task)
            for res in self.executor.poll(0.05):
                self._handle(res, live, ready, result)
        result.stopped = self.stopping
        return result

    # -- steps -------------------------------------------------------------------------------
    def _admit(self, case: CaseSpec, result: EngineResult, tries: int = 1) -> _Live | None:
        """Start an attempt of ``case`` (None when its staging folder cannot be made, or its source folder is gone:
        the run stops admitting)."""
        gone = self.sources.gone(case) if self.sources is not None else None
        if gone is not None:  # the case stays pending, untouched: the next run starts it
            self._stop(gone)
            return None
        attempt = self.store.begin_case(case.case_key, self.run_id)
        workdir = self.run_dir / "tmp" / f"{case.case_id}.a{attempt}"
        shutil.rmtree(workdir, ignore_errors=True)
        try:
            remove_quarantine(self.run_dir, case.case_id)  # retried: an earlier verdict no longer stands
            workdir.mkdir(parents=True)
        except OSError as exc:
            self._release_or_raise(_Live(case, attempt, workdir, time.time(), tries=tries), exc, "admit", result)
            return None
        log.info(
            "case %s started (attempt %d)",
            case.case_id,
            attempt,
            extra={"event": "case_start", "case_id": case.case_id, "run_id": self.run_id},
        )
        return _Live(case, attempt, workdir, time.time(), tries=tries)

    def _task(self, lv: _Live) -> Task:
        stage = self.stages[lv.index]
        return Task(lv.case, lv.index, stage.name, lv.attempt, str(lv.workdir), dict(lv.state), time.time(), next(self._seq))

    def _handle(self, res: TaskResult, live: dict[str, _Live], ready: list[Task], result: EngineResult) -> None:
        if res.fatal:
            raise FatalRunError(f"stage {res.stage} cannot start on {res.device}: {res.error}")
        to_console(res.log_records)  # what the stage warned of in a worker process, as with workers=0
        lv = live.get(res.case_key)
        if lv is None or lv.attempt != res.attempt:
            return  # a late answer about an abandoned attempt
        interrupted = res.worker_died or res.environment
        self.store.record_attempt(
            run_id=self.run_id,
            case_key=res.case_key,
            stage=res.stage,
            attempt=res.attempt,
            status="ok" if res.ok else ("interrupted" if interrupted else "failed"),
            worker=res.worker,
            device=res.device,
            ready_at=res.ready_at,
            started_at=res.started_at,
            ended_at=res.ended_at,
            wall_s=res.wall_s,
            peak_rss_mb=res.peak_rss_mb,
            peak_cuda_mb=res.peak_cuda_mb,
            error=res.error,
            detail=res.outputs.pop("timings", None),
            skip_reason=res.outputs.pop("skipped", None),  # recorded now: the case may still fail in a later stage
        )
        self.store.mark_active(self.run_id, active_s=time.monotonic() - self.started)  # its time should it be killed
        for obs in self.observers:
            obs.on_stage(res)
        if not res.ok:
            del live[res.case_key]
            shutil.rmtree(lv.workdir, ignore_errors=True)
            reason = res.error or "unknown error"
            gone = self.sources.gone(lv.case) if self.sources is not None and not res.environment else None
            if res.environment or gone is not None:
                self._stop(gone or reason)
            if self.stopping is not None:  # the run folder or source failed: no verdict on this case now, the next run retries it
                why = reason if res.environment else gone or f"{reason} (not judged: the run was stopping: {self.stopping})"
                self._release(lv, why, res.stage, result)
                return
            if res.error_class == SeriesStillWrittenError.__name__:  # not the data's fault: the next run takes it whole
                self._release(lv, reason, res.stage, result, still_written=True)
                return
            if res.worker_died and lv.tries <= self.retries:
                log.warning(
                    "case %s: %s; retrying", lv.case.case_id, res.error, extra={"event": "case_retry", "case_id": lv.case.case_id}
                )
                again = self._admit(lv.case, result, tries=lv.tries + 1)
                if again is not None:
                    again.started = lv.started  # end to end: from the first attempt, the crashed one included
                    again.began = lv.began
                    live[res.case_key] = again
                    ready.append(self._task(again))
                return
            if res.worker_died:  # the retries are spent: say how often, and what usually kills a worker
                reason = (
                    f"{reason}, on each of {lv.tries} attempt(s) (runner.retries = {self.retries}). Fix: a worker killed "
                    "by signal 9 is usually the kernel's out-of-memory killer (dmesg names it): lower --workers or "
                    "runner.max_in_flight, or free memory, then run again with --retry-failed"
                )
            self._quarantine_live(lv, reason, res.error_class or "Error", res.stage, result)
            return
        lv.declared.extend(res.outputs.pop("declared", None) or ())
        lv.state.update(res.outputs)
        lv.index += 1
        if lv.index < len(self.stages):
            ready.append(self._task(lv))
            return
        del live[res.case_key]
        written = self.snapshot.still_written(lv.case) if self.snapshot is not None else None
        if written is not None:  # files of the series arrived (or changed) while it ran: nothing of it is published
            shutil.rmtree(lv.workdir, ignore_errors=True)
            self._release(lv, str(written), "publish", result, still_written=True)
            return
        try:
            self._finish(lv, result)
        except SeriesStillWrittenError as exc:  # a file of the series landed while it was published: withdrawn
            shutil.rmtree(lv.workdir, ignore_errors=True)
            self._release(lv, str(exc), "publish", result, still_written=True)
        except IncompleteOutputError as exc:
            shutil.rmtree(lv.workdir, ignore_errors=True)
            if self.stopping is not None:
                self._release(lv, f"{exc} (not judged: the run was stopping: {self.stopping})", "publish", result)
            else:
                self._quarantine_live(lv, str(exc), type(exc).__name__, "publish", result)
        except OSError as exc:
            self._release_or_raise(lv, exc, "publish", result)

    def _finish(self, lv: _Live, result: EngineResult) -> None:
        case = lv.case
        missing = [p for p in dict.fromkeys(lv.declared) if not (lv.workdir / p).is_file()]
        if missing:
            raise IncompleteOutputError(
                f"{len(missing)} declared output file(s) were not written: {', '.join(missing[:5])}"
                + (", ..." if len(missing) > 5 else ""),
                where=f"case {case.case_id}",
                fix="see run.log for the stage that wrote them; the case was not published",
            )
        findings = list(lv.state.get("findings", []))
        measurements = [tuple(m) for m in lv.state.get("measurements", [])]
        quality = lv.state.get("quality")
        skipped = lv.state.get("detect_skipped")
        files = sorted(p for p in lv.workdir.rglob("*") if p.is_file())
        manifest = {
            "case_id": case.case_id,
            "case_key": case.case_key,
            "series_uid": case.series_uid,
            "fingerprint": case.fingerprint,
            # the source as discovery saw it: the next run checks it again before adopting a folder a kill left
            "source_files": len(case.files),
            "source": source_digest(case.files, self.snapshot) if self.snapshot is not None else None,
            "files": [_file_entry(p, lv.workdir) for p in files],
            "findings": findings,
            "measurements": [list(m) for m in measurements],
            "quality": quality,
            "detect_skipped": skipped,
        }
        final = self.run_dir / "cases" / case.case_id
        publish(lv.workdir, final, manifest)

        def unchanged() -> None:  # once the folder is in place, in the last moment before the commit
            late = self.snapshot.still_written(case) if self.snapshot is not None else None
            if late is not None:  # the series changed after the check before publishing: not recorded done
                raise late

        latency = time.monotonic() - lv.began
        before = self.store.case(case.case_key)
        try:
            self.store.complete_case(
                case.case_key,
                output_dir=str(final.relative_to(self.run_dir)),
                findings=findings,
                measurements=measurements,
                quality=quality,
                detect_skipped=skipped,
                latency_s=latency,
                before_commit=unchanged,  # checked inside the store's transaction: rolled back, never recorded done
                unconfirmed=self.snapshot is not None,  # not sent to a PACS until the check after the commit passed
            )
        except SeriesStillWrittenError:  # nor left published as whole
            withdraw(final, self.run_dir / "tmp")
            raise
        late = self.snapshot.still_written(case) if self.snapshot is not None else None
        if late is not None and before is not None:  # landed after that check, as the commit was made: undone
            withdraw(final, self.run_dir / "tmp")  # first: killed before the next step, the next run redoes the case
            self.store.uncomplete_case(case.case_key, before=dict(before))
            raise late
        if self.snapshot is not None:  # the series is as its case read it: the results may go to a PACS now
            self.store.confirm_case(case.case_key)
        self._drop_cache(case)
        result.done.append(case.case_id)
        log.info(
            "case %s done in %.2f s, %d finding(s)",
            case.case_id,
            latency,
            len(findings),
            extra={"event": "case_done", "case_id": case.case_id, "latency_s": round(latency, 4), "run_id": self.run_id},
        )
        for obs in self.observers:
            obs.on_case_done(case, latency, len(findings))
            hook = getattr(obs, "on_case_quality", None)
            if hook is not None and quality:
                hook(case, quality)

    def _quarantine_live(self, lv: _Live, reason: str, error_class: str, stage: str | None, result: EngineResult) -> None:
        try:
            self._quarantine(lv.case, reason, error_class, stage, result)
        except OSError as exc:
            self._release_or_raise(lv, exc, "quarantine", result)

    def _quarantine(self, case: CaseSpec, reason: str, error_class: str, stage: str | None, result: EngineResult) -> None:
        # the quarantine file first: should it fail (disk full), the case is still unjudged in the store
        write_quarantine(self.run_dir, case, reason=reason, error_class=error_class, stage=stage)
        row = self.store.case(case.case_key) if case.case_key else None
        if row is not None:
            if row["status"] != "running" or row["run_id"] != self.run_id:
                # refused at discovery: an attempt of this run (a retried failure too), not of the run that last tried it
                self.store.begin_case(case.case_key, self.run_id)
            self.store.fail_case(
                case.case_key, reason=reason, error_class=error_class, stage=stage, measured=case.rejected is None
            )
        self._drop_cache(case)
        result.failed.append((case.case_id, error_class, reason))
        log.error(
            "case %s quarantined at stage %s: %s",
            case.case_id,
            stage,
            reason,
            extra={
                "event": "case_failed",
                "case_id": case.case_id,
                "stage": stage,
                "reason": reason,
                "error_class": error_class,
                "run_id": self.run_id,
            },
        )
        for obs in self.observers:
            obs.on_case_failed(case, reason, error_class)

    # -- the run folder or a source folder failed -------------------------------------------------------------
    def _stop(self, why: str) -> None:
        if self.stopping is None:
            self.stopping = why
            log.error(
                "run stopped: %s; no new cases are started",
                why,
                extra={"event": "run_stopping", "run_id": self.run_id, "reason": why},
            )

    def _release_or_raise(self, lv: _Live, exc: OSError, step: str, result: EngineResult) -> None:
        """An OSError of the main process: release the case if the run folder failed, else it is a bug (raise)."""
        env = environment_failure(exc, run_dir=self.run_dir)
        if env is None:
            raise exc
        why = f"{step}: {env.describe()}"
        self._stop(why)
        shutil.rmtree(lv.workdir, ignore_errors=True)
        self._release(lv, why, step, result)

    def _release(self, lv: _Live, why: str, stage: str | None, result: EngineResult, *, still_written: bool = False) -> None:
        """Back to pending, no verdict: the run folder or source failed, or (``still_written``) the series was still
        being written into the source; the next run takes the case."""
        row = self.store.case(lv.case.case_key)
        if row is not None and row["status"] == "running":
            error_class = SeriesStillWrittenError.__name__ if still_written else None
            self.store.release_case(lv.case.case_key, reason=why, stage=stage, error_class=error_class)
        drop_cached(self.run_dir, lv.case.case_id)  # possibly half-written: the next run ingests it again
        (result.still_written if still_written else result.released).append((lv.case.case_id, why))
        event = "case_still_written" if still_written else "case_released"
        log.warning(
            "case %s %sleft for the next run: %s",
            lv.case.case_id,
            "not published, " if still_written else "",
            why,
            extra={"event": event, "case_id": lv.case.case_id, "stage": stage, "reason": why, "run_id": self.run_id},
        )
        for obs in self.observers:
            hook = getattr(obs, "on_case_released", None)
            if hook is not None:
                hook(lv.case, why)

    def _drop_cache(self, case: CaseSpec) -> None:
        if not self.keep_cache:
            drop_cached(self.run_dir, case.case_id)
