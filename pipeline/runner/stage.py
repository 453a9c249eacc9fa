"""The small interface every pipeline stage implements, and the records passed between stages.

A :class:`Stage` is a picklable object with a ``name``, a ``group`` (``"cpu"``:
runs in the CPU worker processes; ``"model"``: runs in the model worker of a
device), ``setup(worker)`` called once per worker process before its first
case, and ``process(ctx) -> dict`` called once per case. ``process`` writes
its files under ``ctx.workdir`` (the case's private staging folder) and returns
small, picklable outputs that later stages see in ``ctx.state``. The outputs
``findings`` (list of dicts with ``center_lps`` in LPS mm), ``measurements``
(list of :class:`Measurement` or plain ``(name, value, unit)``), ``quality``
(the case's quality report, :meth:`QualityReport.to_json`) and
``detect_skipped`` (why detection did not run) are stored in the run database
when the case completes. ``skipped`` (why the stage returned without its work) is
stored with the attempt when it ends, and the report leaves such attempts out of the stage's latency. ``declared`` (a list of paths relative to
``ctx.workdir``) names files the stage wrote and promises: the case is
published only when every declared file is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..config import Config
from ..errors import ConfigError, described


class Measurement(NamedTuple):
    """One measurement of a case: dotted name, value, unit; ``reliable`` False (with the ``reason``) when a
    quality flag makes the figure meaningless (e.g. the volume of lungs cut by the scan range)."""

    name: str
    value: float
    unit: str
    reliable: bool = True
    reason: str | None = None


@dataclass(frozen=True)
class CaseSpec:
    """One case to process: a DICOM series (or a discovery-time rejection).

    ``case_key`` = ``<SeriesInstanceUID>:<fingerprint>`` identifies the case across
    runs; ``fingerprint`` hashes the SOPInstanceUIDs and sizes of its files.
    """

    case_id: str
    case_key: str
    series_uid: str | None
    fingerprint: str
    source: str
    files: tuple[str, ...] = ()
    rejected: tuple[str, str] | None = None  # (error class name, message) when discovery refused it

    def with_id(self, case_id: str) -> CaseSpec:
        return CaseSpec(case_id, self.case_key, self.series_uid, self.fingerprint, self.source, self.files, self.rejected)


@dataclass(frozen=True)
class WorkerInfo:
    """Where a stage runs: the worker's name, its torch device, the run's config and folders."""

    name: str
    device: str
    config: Config
    run_dir: Path

    @property
    def cache_dir(self) -> Path:
        return self.run_dir / "cache"


@dataclass
class CaseContext:
    """What ``Stage.process`` gets: the case, its staging folder and the earlier stages' outputs."""

    case: CaseSpec
    attempt: int
    workdir: Path
    worker: WorkerInfo
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> Config:
        return self.worker.config

    @property
    def cache_dir(self) -> Path:
        return self.worker.cache_dir


class Stage:
    """Base class of pipeline stages (see the module docstring)."""

    name: str = "stage"
    group: str = "cpu"  # "cpu" or "model"
    # modules worth importing once in the process that forks the workers
    preload: tuple[str, ...] = ()

    def setup(self, worker: WorkerInfo) -> None:
        """Load models, compile, warm up: called once per worker process, before its first case."""

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, group={self.group!r})"


def stage_list(stages: Any) -> list[Stage] | None:
    """``run_batch``'s ``stages`` as a list of :class:`Stage` objects (``None``: the standard stages); else a
    :class:`ConfigError` naming ``stages`` and what was given (a stage's name, a Stage class not made into one), before
    the run folder is made."""
    if stages is None:
        return None
    fix = (
        "pass Stage objects (instances of pipeline.runner.stage.Stage subclasses), e.g. stages=[MyStage()], or leave "
        "stages out for the standard stages (pipeline.runner.stages.build_stages(config) builds them)"
    )
    if not isinstance(stages, Iterable) or isinstance(stages, (str, bytes, Mapping)):
        raise ConfigError(f"must be a list of Stage objects, got {described(stages)}", where="stages", fix=fix)
    items = list(stages)
    for item in items:
        if isinstance(item, Stage):
            continue
        if isinstance(item, type) and issubclass(item, Stage):
            raise ConfigError(
                f"holds the class {item.__name__}, not a stage made from it", where="stages", fix=f"pass {item.__name__}()"
            )
        raise ConfigError(f"must be a list of Stage objects, one is {described(item)}", where="stages", fix=fix)
    return items


@dataclass
class Task:
    """One stage of one case, sent to a worker."""

    case: CaseSpec
    stage_index: int
    stage: str
    attempt: int
    workdir: str
    state: dict[str, Any]
    ready_at: float
    seq: int = 0


@dataclass
class TaskResult:
    """What a worker sends back for a :class:`Task`."""

    case_key: str
    stage: str
    stage_index: int
    attempt: int
    ok: bool
    worker: str
    device: str
    ready_at: float
    started_at: float | None = None
    ended_at: float | None = None
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    peak_cuda_mb: float | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    error_class: str | None = None
    error: str | None = None
    fatal: bool = False  # the worker itself cannot work (setup failed): stop the run
    worker_died: bool = False
    environment: bool = False  # the run folder could not be written (disk full, read-only, ...): not the case's fault
    #: warnings and errors the stage logged in a worker process, for the main process' console (:func:`.logs.to_console`)
    log_records: list[dict[str, Any]] = field(default_factory=list)
