"""Capacity model: cases/day for N GPUs over M nodes, from a report's own stage times.

Each completed stage attempt ran on a worker of one of two groups: a model
worker (one per GPU; ``model-cuda:0``, ``model-cpu``) or a CPU worker (one per
core; ``cpu-0``, ``cpu-1``...). A run with ``workers: 0`` ran every stage in
one process (``main``); there a stage's group is taken from its name (``load``
and ``detect``, plus ``reconstruct``/``lungs`` when the run's config put the
reconstruction on the model worker).

The model, per stage: its busy time per case = wall time (s) of its successful
attempts plus that of its failed ones, divided by its successful attempts. The
model group's busy time ``T_model`` (s per case on one GPU) and the CPU group's
``T_cpu`` (core-s per case) decide the rate::

    cases/s = efficiency × min(gpus / T_model, nodes × cpu_workers / T_cpu)

whichever group is slower is the bottleneck. ``efficiency`` is measured:
completed cases ÷ the cases those stage times (of all runs together) predict for
the time the runs were active with their own workers (the same formula with the
runs' model and CPU workers, ``1 / (T_model + T_cpu)`` for a one-process run; runs
side by side on one host share their time once, as in the measured rate); it takes
in start-up, queueing, imperfect overlap and runs that completed nothing. At the
runs' own workers on one machine the projection is therefore the measured rate. Where no run can measure it, 1.0 is assumed and
the text says so. Cross-node traffic is not measured: nodes are assumed to add
capacity as the measured node does.

The reference deployment to compare with: 15,000 cases/day on 32 A100 GPUs, about 469
cases per GPU per day.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

REFERENCE_CASES_PER_DAY = 15_000
REFERENCE_GPUS = 32
REFERENCE_GPU = "A100"
#: Cases per GPU per day of the reference deployment (15,000 / 32 = 468.75).
REFERENCE_CASES_PER_GPU_DAY = REFERENCE_CASES_PER_DAY / REFERENCE_GPUS
#: Stages that run on the model worker whatever the configuration.
MODEL_STAGES = ("load", "detect")
#: Stages that run on the model worker when ``reconstruct.device`` is ``model``.
RECON_STAGES = ("reconstruct", "lungs")

_CUDA = re.compile(r"\bcuda:\d+")


@dataclass(frozen=True)
class StageLoad:
    """One stage's busy time: ``busy_s`` worker-seconds per case (s) on its ``group`` ("model" or "cpu")."""

    stage: str
    group: str
    busy_s: float
    passes: int


@dataclass
class Capacity:
    """A projection and what it rests on (rates in cases/day at ``hours_per_day`` operating hours)."""

    gpus: int
    nodes: int
    cpu_workers_per_node: int
    hours_per_day: float
    loads: list[StageLoad]
    efficiency: float
    efficiency_measured: float | None
    model_device: str
    enough: bool
    cases_per_day: float | None = None
    model_cases_per_day: float | None = None
    cpu_cases_per_day: float | None = None
    bottleneck: str | None = None
    assumptions: list[str] = field(default_factory=list)

    def busy(self, group: str) -> float:
        """Busy time per case of a group: s on one GPU (model) or core-s (cpu)."""
        return sum(x.busy_s for x in self.loads if x.group == group)

    @property
    def per_gpu_day(self) -> float | None:
        return None if self.cases_per_day is None else self.cases_per_day / self.gpus

    def text(self) -> str:
        """The capacity headline: the figure, the reference deployment beside it, the bottleneck and the efficiency."""
        where = f"{self.gpus} GPU(s) over {self.nodes} node(s), {self.cpu_workers_per_node} CPU worker(s) per node"
        if self.cases_per_day is None or self.per_gpu_day is None:
            return f"capacity model for {where}: no completed stage attempts to project from"
        ref = (
            f"reference deployment: {REFERENCE_CASES_PER_DAY:,} cases/day on {REFERENCE_GPUS} {REFERENCE_GPU}s = "
            f"{REFERENCE_CASES_PER_GPU_DAY:,.0f} cases/GPU/day"
        )
        caveat = "" if self.enough else "too few to project from (see the cases/day headline), indicative only: "
        parts = [
            f"capacity model for {where}: {caveat}{self.cases_per_day:,.0f} cases/day ({self.hours_per_day:g} operating hours/day), "
            f"{self.per_gpu_day:,.0f} cases/GPU/day ({self.per_gpu_day / REFERENCE_CASES_PER_GPU_DAY:.2f}× the {ref})",
            f"bottleneck: {self.bottleneck} stages (model {self.busy('model'):.2f} s/case per GPU -> "
            f"{_fmt(self.model_cases_per_day)} cases/day; CPU {self.busy('cpu'):.2f} core-s/case -> "
            f"{_fmt(self.cpu_cases_per_day)} cases/day)",
        ]
        parts += self.assumptions
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "nodes": self.nodes,
            "cpu_workers_per_node": self.cpu_workers_per_node,
            "hours_per_day": self.hours_per_day,
            "cases_per_day": self.cases_per_day,
            "cases_per_gpu_day": self.per_gpu_day,
            "model_cases_per_day": self.model_cases_per_day,
            "cpu_cases_per_day": self.cpu_cases_per_day,
            "bottleneck": self.bottleneck,
            "model_busy_s_per_case": self.busy("model"),
            "cpu_busy_s_per_case": self.busy("cpu"),
            "stages": {x.stage: {"group": x.group, "busy_s": x.busy_s, "passes": x.passes} for x in self.loads},
            "efficiency": self.efficiency,
            "efficiency_measured": self.efficiency_measured,
            "model_device": self.model_device,
            "enough_to_project": self.enough,
            "reference_deployment": {
                "cases_per_day": REFERENCE_CASES_PER_DAY,
                "gpus": REFERENCE_GPUS,
                "gpu": REFERENCE_GPU,
                "cases_per_gpu_day": REFERENCE_CASES_PER_GPU_DAY,
            },
            "assumptions": list(self.assumptions),
            "text": self.text(),
        }


def _fmt(v: float | None) -> str:
    return "unlimited" if v is None else f"{v:,.0f}"


def _config(run: Mapping[str, Any]) -> dict[str, Any]:
    raw = run.get("config")
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else {}
    except json.JSONDecodeError:
        log.warning("run %s: its recorded config is not JSON; default stage groups assumed", run.get("run_id"))
        cfg = {}
    return cfg if isinstance(cfg, dict) else {}


def _group(stage: str, workers: set[str], cfg: Mapping[str, Any]) -> str:
    if any(w.startswith("model-") for w in workers):
        return "model"
    if any(w.startswith("cpu-") for w in workers):
        return "cpu"
    recon_on_model = (cfg.get("reconstruct") or {}).get("device") == "model"
    return "model" if stage in MODEL_STAGES or (recon_on_model and stage in RECON_STAGES) else "cpu"


#: What the report's stage times count (:func:`counted_attempts`), as the page and README say it.
COUNTED_ATTEMPTS = (
    "successful and failed stage attempts, as capacity.csv counts them; attempts replaced by a later one (a case done "
    "again because its published folder was removed, a retried case's earlier stages) or interrupted are left out"
)


def counted_attempts(stages: Any) -> Any:
    """The attempts of the ``stages`` table whose time the report counts, in the capacity model and in the summed
    stage time alike: successful and failed ones with a wall time (:data:`COUNTED_ATTEMPTS`)."""
    return stages[stages.status.isin(("ok", "failed")) & stages.wall_s.notna()]


def stage_loads(stages: Any, runs: Any) -> list[StageLoad]:
    """Busy time per case (s) of each stage in the ``stages`` table (attempts), in pipeline order.

    Failed attempts' time is charged to the successful ones; superseded and interrupted attempts are left out
    (:func:`counted_attempts`).
    """
    cfgs = {r["run_id"]: _config(r) for r in runs.to_dict("records")}
    att = counted_attempts(stages)
    ok = att[att.status == "ok"]
    out = []
    for stage in dict.fromkeys(ok.sort_values("id").stage):
        mine = att[att.stage == stage]
        n = int((mine.status == "ok").sum())
        cfg = cfgs.get(mine.run_id.iloc[-1], {})
        group = _group(stage, set(mine.worker.dropna()), cfg)
        out.append(StageLoad(stage, group, float(mine.wall_s.sum()) / n, n))
    return out


def model_workers(device: str | None) -> int:
    """Model workers of a run from its recorded device ("cpu" -> 1; "cuda:0 (A100), cuda:1 (A100)" -> 2)."""
    return max(1, len(_CUDA.findall(device or "")))


def _rate(loads: list[StageLoad], gpus: float, cpu_workers: float) -> tuple[float | None, float | None]:
    """Cases/s the model group and the CPU group can sustain (None: the group has no stages)."""
    tm = sum(x.busy_s for x in loads if x.group == "model")
    tc = sum(x.busy_s for x in loads if x.group == "cpu")
    return (gpus / tm if tm > 0 else None), (cpu_workers / tc if tc > 0 else None)


def ideal_rate(loads: list[StageLoad], *, gpus: int, cpu_workers: int) -> float | None:
    """Cases/s the stage times predict with ``gpus`` model workers and ``cpu_workers`` CPU workers (0 = one process)."""
    if cpu_workers == 0:
        total = sum(x.busy_s for x in loads)
        return 1.0 / total if total > 0 else None
    rates = [r for r in _rate(loads, gpus, cpu_workers) if r is not None]
    return min(rates) if rates else None


def run_workers(run: Mapping[str, Any]) -> int:
    """CPU workers a run had (its config's ``runner.workers``; 0 = every stage in one process)."""
    workers = (_config(run).get("runner") or {}).get("workers")
    return int(workers) if isinstance(workers, int) else 0


def active_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length (s) of the union of ``(start, end)`` intervals (Unix s): time covered by overlapping runs counts once."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return sum(e - s for s, e in merged)


def measured_efficiency(
    runs: Any, loads: list[StageLoad], n_done: int, intervals: Mapping[str, tuple[float, float]]
) -> float | None:
    """Completed cases ÷ the cases the stage times predict over the time the runs were active.

    ``loads``: the stage times of every run together (:func:`stage_loads`, as the projection uses them); ``n_done``:
    the completed cases the measured rate counts; ``intervals``: each run's active ``(start, end)`` (Unix s) by run id.
    The runs are grouped by host and shape (model workers, CPU workers); each group's active time is the union of its
    runs' intervals (runs side by side on one machine share it once, as the measured rate counts them), and predicts
    :func:`ideal_rate` cases/s for its shape. Runs that completed nothing count too: their active time is in the
    measured rate. So at the runs' own shape on one machine the projection equals the measured rate. None when no
    case completed or no time was active.
    """
    if n_done <= 0:
        return None
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for run in runs.to_dict("records"):
        span = intervals.get(str(run["run_id"]))
        if span is None:
            continue
        shape = (str(run.get("host")), model_workers(run.get("device")), run_workers(run))
        groups.setdefault(shape, []).append(span)
    expected = 0.0
    for (_, gpus, cpu_workers), spans in groups.items():
        rate = ideal_rate(loads, gpus=gpus, cpu_workers=cpu_workers)
        if rate is not None:
            expected += rate * active_seconds(spans)
    return n_done / expected if expected > 0 else None


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} = {value!r} is not a positive whole number", where=f"--{name.replace('_', '-')}", fix=f"give {name} >= 1"
        )
    return value


def project(
    loads: list[StageLoad],
    *,
    gpus: int,
    nodes: int = 1,
    cpu_workers_per_node: int,
    hours_per_day: float = 24.0,
    efficiency: float | None = None,
    model_device: str = "cuda",
    enough: bool = True,
    notes: list[str] | None = None,
) -> Capacity:
    """Cases/day for ``gpus`` GPUs over ``nodes`` nodes with ``cpu_workers_per_node`` CPU workers each.

    ``efficiency``: measured (see :func:`measured_efficiency`; above 1.0 counts as 1.0), or None to assume
    1.0. ``model_device``: where the model stages were measured ("cpu" or "cuda"). ``enough``: whether the
    measurements are enough to project from (the report's rule).
    """
    _positive("gpus", gpus)
    _positive("nodes", nodes)
    _positive("cpu_workers", cpu_workers_per_node)
    eff = 1.0 if efficiency is None else min(1.0, efficiency)
    cap = Capacity(
        gpus=gpus,
        nodes=nodes,
        cpu_workers_per_node=cpu_workers_per_node,
        hours_per_day=hours_per_day,
        loads=list(loads),
        efficiency=eff,
        efficiency_measured=efficiency,
        model_device=model_device,
        enough=enough,
    )
    seconds = 3600.0 * hours_per_day
    model_rate, cpu_rate = _rate(loads, gpus, nodes * cpu_workers_per_node)
    if model_rate is None and cpu_rate is None:
        return cap
    cap.model_cases_per_day = None if model_rate is None else model_rate * seconds * eff
    cap.cpu_cases_per_day = None if cpu_rate is None else cpu_rate * seconds * eff
    cap.bottleneck = "model" if cpu_rate is None or (model_rate is not None and model_rate <= cpu_rate) else "CPU"
    cap.cases_per_day = min(r for r in (cap.model_cases_per_day, cap.cpu_cases_per_day) if r is not None)
    a = [
        "model stages scale per GPU (one model worker each), CPU stages per CPU worker (one per core), over every node",
        (
            f"efficiency {eff:.2f} assumed (no run measured it)"
            if efficiency is None
            else f"efficiency {efficiency:.2f} measured (completed ÷ predicted cases over the runs' active time)"
            + (", counted as 1.00" if efficiency > 1.0 else "")
        ),
    ]
    if model_device == "cpu" and any(x.group == "model" for x in loads):
        a.append("model stages were measured on the CPU: each GPU is assumed to be as slow (an underestimate)")
    if nodes > 1:
        a.append("cross-node traffic not measured: each node assumed to add capacity as the measured one")
    cap.assumptions = a + list(notes or [])
    return cap


def estimate(
    t: Mapping[str, Any],
    intervals: Mapping[str, tuple[float, float]],
    *,
    gpus: int | None = None,
    nodes: int = 1,
    cpu_workers: int | None = None,
    hours_per_day: float = 24.0,
    enough: bool = True,
) -> Capacity:
    """The capacity model over a report's tables (``t``: :func:`~.tables.read_tables`, combined).

    ``intervals``: each run's active ``(start, end)`` (Unix s) by run id, as the measured rate takes them. ``gpus`` defaults to the runs' own model workers (their GPU
    count; 1 for a CPU run), ``cpu_workers`` (per node) to the runs' own CPU workers.
    """
    runs, stages = t["runs"], t["stages"]
    records = runs.to_dict("records")
    loads = stage_loads(stages, runs)
    notes = []
    if gpus is None:
        gpus = max((model_workers(r.get("device")) for r in records), default=1)
        notes.append(f"GPUs: the runs' own {gpus}")
    if cpu_workers is None:
        cpu_workers = max((run_workers(r) for r in records), default=0)
        if cpu_workers == 0:
            cpu_workers = 1
            notes.append("CPU workers per node: 1 assumed (the runs ran every stage in one process)")
        else:
            notes.append(f"CPU workers per node: the runs' own {cpu_workers}")
    if len(loads) and not (t["cases"].status == "done").any():
        notes.append(
            "no case completed: the stages no case reached are not in the model, so this figure is optimistic "
            f"(stages measured: {', '.join(x.stage for x in loads)})"
        )
    model = {x.stage for x in loads if x.group == "model"}
    on_gpu = stages[stages.stage.isin(model) & (stages.status == "ok")].device.dropna().astype(str)
    device = "cuda" if on_gpu.str.startswith("cuda").any() else "cpu"
    eff = measured_efficiency(runs, loads, int((t["cases"].status == "done").sum()), intervals)
    return project(
        loads,
        gpus=gpus,
        nodes=nodes,
        cpu_workers_per_node=cpu_workers,
        hours_per_day=hours_per_day,
        efficiency=eff,
        model_device=device,
        enough=enough,
        notes=notes,
    )


def stage_overlap(stages: Any, active_s: float) -> dict[str, Any]:
    """How much the report's stage attempts overlapped: ``stage_busy_s``, the wall time (s) of the attempts the
    capacity model counts added up (:func:`counted_attempts`: successful and failed; so it is capacity.csv's busy time
    per case times its successful attempts, summed over the stages), against ``active_s``, the runs' active wall time
    (s, overlapping runs once); ``left_out_s``, the wall time (s) of the attempts left out (replaced by a later attempt,
    as the first one of a case done again, or interrupted); ``mean_busy_workers`` the ratio of ``stage_busy_s`` to
    ``active_s`` (stages at work at once on average; None without active time), and ``text``.

    With several workers cases run side by side, so the summed stage time exceeds the wall time and a case's
    end-to-end latency is not the time between two completions (1 / throughput)."""
    busy = float(counted_attempts(stages).wall_s.sum()) if len(stages) else 0.0
    left_out = float(stages.wall_s.fillna(0.0).sum()) - busy if len(stages) else 0.0
    mean = busy / active_s if active_s > 0 else None
    if mean is None:
        text = "no active time measured"
    else:
        text = f"stages busy {busy:,.1f} worker-s in {active_s:,.1f} s of active wall time: {mean:.2f} stage(s) at work at once on average"
        if mean > 1.05:
            text += " (cases overlap, so a case's end-to-end latency is not the time between two completions)"
    if left_out > 0:
        text += f"; {left_out:,.1f} worker-s of replaced or interrupted attempts not counted"
    return {"stage_busy_s": busy, "left_out_s": left_out, "active_s": active_s, "mean_busy_workers": mean, "text": text}
