"""The numbers of a throughput report over one or more run folders (:func:`summarize`, JSON-able);
:mod:`.report` writes them out as HTML, CSV and JSON.

Figures: completed cases per hour and per calendar day (UTC, and per local day in a named time zone,
:mod:`.report_days`; an hour or day during which a run was active without completing a case is listed
with 0, and so is every calendar day between the first and the last day of the period on which no run was active,
named in ``days_without_run_utc`` / ``days_without_run_local``: the mean of the daily rows is the mean per calendar
day); the measured
rate (completed cases ÷ hours during which runs were active, overlapping runs
counted once; a run under way, its process alive on this host, is active until the report is made, a killed run
until its last recorded stage; over the runs of several machines, their combined rate, and the
headline names the machines) and its projection to cases per day; latency p50/p90/p99 per
stage (wall time of successful attempts, s), queue waits, and end to end (case
start to publication, s; a stage a case skipped, detection of a scan without lungs, is no sample of the stage's
latency but counted in its ``skipped``); failures by error class; GPU utilisation when NVML
samples exist, per GPU (``host:index`` when the runs come from several hosts); the capacity model (:mod:`.capacity`): cases/day for N GPUs over M nodes
from the runs' own stage times, beside the reference deployment.

The projection states how many completed cases and active minutes it rests on.
A rate measured over fewer than :data:`MIN_CASES_TO_PROJECT` completed cases or
:data:`MIN_MINUTES_TO_PROJECT` active minutes is dominated by start-up (model
loading, worker start, the first case's cold caches) and by chance: the report
then says it is too few to project from, and the figure is indicative only.

Quality: each completed case's flags (:mod:`pipeline.reconstruction.quality`);
the headline counts the cases with at least one warning flag. What discovery left
out is counted from each folder's latest run (:func:`latest_skipped`).

Runs (``runs.csv``): each case is counted once; within a run folder in the run of its latest attempt
(:func:`.tables.finishing_run`), with its outcome there (across folders, see below: its first completion): a run resumed after a
kill does not count again what the killed run finished, and a killed run (no end
record) shows what it finished. A run without an end record that a later run of
its folder followed, or whose process is gone, is shown ``interrupted``, and so
is a case it left ``running`` (:func:`.tables.run_status`). A run found in several of
the folders (a run folder copied or synced elsewhere and named beside the original)
counts once, with its cases (:func:`.tables.drop_copies`); ``copied_runs`` lists the copies.

Cases are distinct series: a series found in several folders (nightly runs, each into a folder of its own, meet a
series quarantined one night and completed the next, or one still in the source, processed again) counts once, at
its first completion (in that run and on that day: the day its results were first published; doing it again later
adds no case and moves it to no other day; so within one run folder, where a case done again after its published
folder was removed keeps its first completion time, ``cases.first_done_at``), else as its latest attempt (:func:`.tables.drop_other_attempts`); ``other_attempts`` lists the
attempts not counted (the failure of the first night, with its reason; a completion again); their runs' time is
still active time.

The per-GPU figures and the comparison with the reference deployment appear only when a run recorded a
GPU device; without one the capacity model speaks of model workers.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .capacity import active_seconds, estimate, model_workers, run_workers, stage_overlap
from .report_days import every_day, per_local_day
from .report_inputs import counted, run_folders
from .report_method import capacity_method, throughput_method
from .tables import (
    case_status,
    drop_copies,
    drop_other_attempts,
    finishing_run,
    process_alive,
    read_tables,
    run_status,
    unfinished_reasons,
    utc_text,
)

log = logging.getLogger(__name__)

PCTS = (50, 90, 99)
#: The fewest completed cases, and active minutes, a cases/day projection is made from (see the module docstring).
MIN_CASES_TO_PROJECT = 10
MIN_MINUTES_TO_PROJECT = 5.0


def _active_hours(intervals: list[tuple[float, float]]) -> Any:
    """The UTC hours (a DatetimeIndex of hour starts) during which any of the runs' ``(start, end)`` intervals (Unix s)
    was active."""
    import pandas as pd

    def hour(t: float) -> Any:
        return pd.Timestamp(t, unit="s", tz="UTC").floor("h")

    # a run that ends on the hour (09:00:00) was not active in the hour that starts then
    hours = [pd.date_range(hour(s), hour(max(s, e - 1e-3)), freq="h") for s, e in intervals]
    return pd.DatetimeIndex([h for r in hours for h in r], tz="UTC").unique()


def _pct(values: Any) -> dict[str, float | None]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PCTS}}
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in PCTS}}


def _span(minutes: float) -> str:
    """Active time in words: seconds below a minute (a short run is not "0.0" minutes), minutes below an hour, else
    hours."""
    if minutes * 60.0 < 59.95:
        return f"{minutes * 60.0:.1f} active seconds" if minutes < 10 / 60.0 else f"{minutes * 60.0:.0f} active seconds"
    return f"{minutes / 60.0:.2f} active hours" if minutes >= 60 else f"{minutes:.1f} active minutes"


def _machines(runs: Any) -> tuple[str, bool]:
    """Where the runs' rate was measured, in words, and whether that is several machines: one machine (its host
    name), several together (the rate is theirs combined), or a Ray cluster (named by its head)."""
    hosts = sorted(set(runs.host.dropna().astype(str))) or ["unknown host"]
    ray = any(str(d).startswith("ray ") for d in runs.device.dropna())
    if ray:
        heads = "head" if len(hosts) == 1 else "heads"
        return f"the Ray cluster(s) of these runs ({heads} {', '.join(hosts)})", True
    if len(hosts) == 1:
        return f"machine {hosts[0]}", False
    return f"{len(hosts)} machines together ({', '.join(hosts)})", True


def _projection(
    rate_h: float, hours_per_day: float, n_done: int, minutes: float, enough: bool, *, where: tuple[str, bool]
) -> str:
    """The cases/day headline: the figure, what it rests on, and whether that is enough to project from.

    ``rate_h``: measured cases/hour; ``minutes``: active minutes; ``where``: :func:`_machines` (the rate of several
    machines is their combined rate). When ``enough`` is false the headline leads with the measured rate and says the
    cases/day projection has not enough data, without its figure.
    """
    machines, several = where
    basis = f"{rate_h:,.1f} cases/hour from {n_done} completed case(s) over {_span(minutes)}"
    if not enough:
        return (
            f"measured {basis} on {machines}; cases/day projection: not enough data (too few to project from: fewer than "
            f"{MIN_CASES_TO_PROJECT} completed cases or {MIN_MINUTES_TO_PROJECT:g} active minutes)"
        )
    return (
        f"at the measured rate {machines} {'handle' if several else 'handles'} {rate_h * hours_per_day:,.0f} cases/day "
        f"({basis}, {hours_per_day:g} operating hours/day)"
    )


#: Devices a run records with a GPU: ``cuda:0 (NVIDIA A100...)``; a Ray cluster's ``..., 4 GPU(s)``.
_CUDA_DEVICE = re.compile(r"\bcuda:\d+")
_RAY_GPUS = re.compile(r"(\d+(?:\.\d+)?) GPU\(s\)")


def _gpu_recorded(runs: Any) -> bool:
    """Whether any run recorded a GPU device (a CUDA device, or a Ray cluster with GPUs)."""
    for device in runs.device.dropna().astype(str):
        ray = _RAY_GPUS.search(device)
        if _CUDA_DEVICE.search(device) or (ray is not None and float(ray.group(1)) > 0):
            return True
    return False


def _cpu_capacity_text(c: dict[str, Any]) -> str:
    """The capacity headline of runs that recorded no GPU: model workers, no per-GPU figure, no reference deployment."""
    where = f"{c['gpus']} model worker(s) over {c['nodes']} node(s), {c['cpu_workers_per_node']} CPU worker(s) per node"
    if c["cases_per_day"] is None:
        return f"capacity model for {where}: no completed stage attempts to project from"
    rate = (
        f"{c['cases_per_day']:,.0f} cases/day ({c['hours_per_day']:g} operating hours/day); bottleneck: {c['bottleneck']} "
        f"stages (model {c['model_busy_s_per_case']:.2f} s/case per model worker, CPU {c['cpu_busy_s_per_case']:.2f} core-s/case)"
    )
    parts = [f"capacity model for {where} (no GPU recorded: the model stages ran on the CPU)"]
    parts.append(
        f"too few to project from (see the cases/day headline); indicative only: {rate}" if not c["enough_to_project"] else rate
    )
    parts.append("model stages scale per model worker, CPU stages per CPU worker (one per core), over every node")
    parts += [a for a in c["assumptions"] if "GPU" not in a]
    parts.append("no per-GPU figure or comparison with the reference without a GPU")
    return "; ".join(parts)


def _capacity_summary(capacity: Any, *, gpu: bool) -> dict[str, Any]:
    """The capacity model's JSON, ``gpu_recorded`` added; when ``gpu`` is false its text speaks of model workers and
    ``cases_per_gpu_day`` is None."""
    out = {**capacity.to_dict(), "gpu_recorded": gpu}
    if not gpu:
        out["text"] = _cpu_capacity_text(out)
        out["cases_per_gpu_day"] = None  # no GPU ran: no per-GPU figure, as the text says
    return out


def _quality_summary(done: Any, quality: Any) -> dict[str, Any]:
    """Counts of flagged cases: ``flagged`` = completed cases with at least one warning flag."""
    q = quality[quality.case_key.isin(set(done.case_key))] if len(quality) else quality
    warn = q[q.severity == "warning"] if len(q) else q
    by_flag = q.groupby("code").case_key.nunique().sort_values(ascending=False).to_dict() if len(q) else {}
    return {
        "done": int(len(done)),
        "flagged": int(warn.case_key.nunique()) if len(warn) else 0,
        "by_flag": {str(k): int(v) for k, v in by_flag.items()},
        "detect_skipped": int(done.detect_skipped.notna().sum()) if "detect_skipped" in done else 0,
    }


def latest_skipped(t: dict) -> Any:
    """The skipped files and series of each run folder's latest run."""
    sk, runs = t["skipped"], t["runs"]
    if not len(sk) or not len(runs):
        return sk.iloc[0:0]
    latest = runs.sort_values("started_at").groupby("run_dir").run_id.last()
    return sk[sk.run_id.isin(set(latest))].reset_index(drop=True)


def _skipped_summary(sk: Any) -> dict[str, Any]:
    files = sk[sk.what == "file"] if len(sk) else sk
    return {
        "files": int(len(files)),
        "series": int(len(sk) - len(files)),
        "files_by_kind": {str(k): int(v) for k, v in files.groupby("kind").size().items()} if len(files) else {},
    }


def _count(value: Any) -> int | None:
    """A count from the runs table, or None where it is missing (a store of an earlier version)."""
    try:
        n = float(value)
    except (TypeError, ValueError):
        return None
    return int(n) if np.isfinite(n) else None


def _finite_time(value: Any) -> bool:
    try:
        return bool(np.isfinite(float(value)))
    except (TypeError, ValueError):
        return False


def _utc(t: Any) -> str | None:
    """Unix seconds as ISO 8601 UTC text (``2026-12-04T10:15:03Z``), or None where there is no time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(t))) if _finite_time(t) else None


def _pid(value: Any) -> int | None:
    n = _count(value)
    return n if n and n > 0 else None


def run_state(runs: Any) -> dict[str, Any]:
    """Whether the figures of a report are current: the latest run of each run folder (``runs``: the runs table, its
    ``status`` as :func:`.tables.run_status` gives it), in progress, interrupted (killed without an end record, or
    stopped) or ended. Returns ``state`` (``in_progress`` when any folder's latest run is running, else
    ``interrupted`` when any was, else ``ended``; ``none`` without runs), ``text`` (one sentence per folder; over
    several folders, one sentence counts those whose latest run completed, and the others are told each) and
    ``runs`` (per folder its latest run: ``run_dir``, ``run_id``, ``status``, ``started_utc``, ``ended_utc``,
    ``pid``, ``host``, and ``previous``: the run before it, as the same keys, or None)."""
    latest: list[dict[str, Any]] = []
    texts: list[str] = []
    several = runs.run_dir.nunique() > 1
    completed = 0  # of several folders, those whose latest run completed are counted, not each told
    for run_dir, group in runs.sort_values("started_at").groupby("run_dir", sort=False):
        rows = [
            {
                "run_dir": str(run_dir),
                "run_id": str(r["run_id"]),
                "status": str(r["status"]),
                "started_utc": _utc(r["started_at"]),
                "ended_utc": _utc(r["ended_at"]),
                "pid": _pid(r.get("pid")),
                "host": r.get("host") if isinstance(r.get("host"), str) else None,
            }
            for _, r in group.iterrows()
        ]
        last = {**rows[-1], "previous": rows[-2] if len(rows) > 1 else None}
        latest.append(last)
        if several and last["status"] == "completed":
            completed += 1
        else:
            texts.append(_state_text(last, several=several))
    if completed:
        texts.append(f"the latest run of {'every' if completed == len(latest) else 'each other'} folder ({completed}) completed")
    states = {r["status"] for r in latest}
    state = (
        "none" if not latest else "in_progress" if "running" in states else "interrupted" if "interrupted" in states else "ended"
    )
    return {"state": state, "text": "; ".join(texts) or "no runs", "runs": latest}


def _state_text(run: dict[str, Any], *, several: bool) -> str:
    """One run folder's latest run in words (see :func:`run_state`)."""
    where = f" of {run['run_dir']}" if several else ""
    who = f"run {run['run_id']}{where}, started at {run['started_utc']}"
    if run["pid"] is not None:
        who += f" (pid {run['pid']}{' on ' + run['host'] if run['host'] else ''})"
    prev = run["previous"]
    if run["status"] == "running":
        text = f"{who}, is in progress"
        if prev is not None and prev["status"] == "interrupted":
            text += f"; the run before it, {prev['run_id']} (started at {prev['started_utc']}), was interrupted"
        return text
    if run["status"] == "interrupted":
        how = (
            f"was stopped at {run['ended_utc']} before it finished"
            if run["ended_utc"]
            else "was interrupted: it ended without finishing (killed, or the machine stopped)"
        )
        return f"the latest {who}, {how}; figures include what it finished; run the same command again to finish the rest"
    return f"the latest {who}, ended at {run['ended_utc']} ({run['status']})"


def _runs_table(runs: Any, cases: Any, finished_in: Any, durations: dict[str, float]) -> list[dict[str, Any]]:
    """One row per run: status as the report shows it, start and end (ISO 8601 UTC; no end record: None), active
    time (s) and the cases of its latest attempts by outcome (``finished_in``: :func:`.tables.finishing_run`),
    so that each case is counted in one run only; ``n_failed_earlier``: the cases quarantined by earlier runs that it
    left as they were (not retried), and where that figure comes from (:func:`_failed_earlier`). A case that no run
    started is unfinished in the latest run of its folder, the run that left it."""
    latest = runs.sort_values("started_at").groupby("run_dir").run_id.last()
    finished_in = finished_in.where(finished_in.notna(), cases.run_dir.map(latest))
    outcome = cases.status.map({"done": "n_done", "failed": "n_failed"}).fillna("n_unfinished")
    counts = outcome.groupby([cases.run_dir, finished_in]).value_counts().to_dict() if len(cases) else {}
    started, ended = utc_text(runs.started_at), utc_text(runs.ended_at)
    rows = []
    for i, r in runs.iterrows():
        rows.append(
            {
                "run_dir": r["run_dir"],
                "run_id": r["run_id"],
                "status": r["status"],
                "started_utc": started[i],
                "ended_utc": ended[i],
                "active_s": durations.get(str(r["run_id"]), 0.0),
                "device": r["device"],
                "host": r["host"],
                **{k: int(counts.get((r["run_dir"], r["run_id"], k), 0)) for k in ("n_done", "n_failed", "n_unfinished")},
                **_failed_earlier(r, cases, latest),
            }
        )
    return rows


def _failed_earlier(run: Any, cases: Any, latest: Any) -> dict[str, Any]:
    """``n_failed_earlier`` of ``run`` (a row of ``runs``): the cases quarantined by earlier runs of its folder that
    it left as they were, and ``n_failed_earlier_from``, where that figure comes from: ``end record`` (as the run
    recorded it at its end), ``run store`` (a run without an end record, killed or under way, that is the latest of
    its folder: the store is as it left it, so the figure is counted as its end would have counted it: the folder's
    quarantined cases whose latest attempt is not this run's), or ``unknown`` (None: a later run of the folder has
    retried or quarantined cases since, and the store keeps no earlier state; or a store of an earlier version)."""
    if _finite_time(run["ended_at"]):
        n = _count(run.get("n_failed_earlier"))
        return {"n_failed_earlier": n, "n_failed_earlier_from": "end record" if n is not None else "unknown"}
    if latest.get(run["run_dir"]) != run["run_id"]:
        return {"n_failed_earlier": None, "n_failed_earlier_from": "unknown"}
    mine = cases[(cases.run_dir == run["run_dir"]) & (cases.status == "failed")]
    return {"n_failed_earlier": int((mine.run_id != run["run_id"]).sum()), "n_failed_earlier_from": "run store"}


def summarize(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    hours_per_day: float = 24.0,
    gpus: int | None = None,
    nodes: int = 1,
    cpu_workers: int | None = None,
    timezone: str | None = None,
) -> tuple[dict[str, Any], dict]:
    """Summary numbers (JSON-able) and the combined DataFrames of ``run_dirs``.

    ``run_dirs`` are resolved and named once each, in the order given; entries that are plainly not run folders (a
    file, a folder without a run store: what a glob such as ``runs/*`` also catches) are left out and counted per
    reason in ``left_out`` (``{"reason", "count"}``, never named: one may be named after a patient) (see :func:`.report_inputs.run_folders`, which names the errors that stay). In the DataFrames, ``runs.status`` and
    ``cases.status`` are as the report shows them (killed runs and their cases ``interrupted``; see
    :func:`.tables.run_status`). ``gpus``, ``nodes``, ``cpu_workers`` (per node): the capacity model's cluster
    (see :func:`.capacity.estimate`; defaults: the runs' own GPUs and CPU workers, one node). ``timezone``: the IANA
    zone of the completed cases per local day (``throughput.per_day_local``; default: this machine's local time).
    """
    import pandas as pd

    # what is plainly not a run folder (a log file, an earlier report) left out, named; each run folder once
    unique, given = run_folders(run_dirs)
    left_out = counted(given)  # by reason, never by name: a folder beside the run folders may name a patient
    for e in left_out:
        log.info("left out %d path(s): %s", e["count"], e["reason"], extra={"event": "report_left_out"})
    tables = [read_tables(d) for d in unique]
    t = {k: pd.concat([x[k] for x in tables], ignore_index=True) for k in tables[0]}
    t["runs"]["status"] = run_status(t["runs"])
    t["cases"]["status"] = case_status(t["cases"], t["runs"])
    t["cases"]["reason"] = unfinished_reasons(t["cases"], t["runs"], t["stages"])
    state = run_state(t["runs"])
    t, copies = drop_copies(t)  # a copied run folder named beside its original: its runs and cases count once
    for c in copies:
        log.warning(
            "run %s of %s is also in %s (a copy of the folder): counted once, in %s",
            c["run_id"],
            c["kept_in"],
            c["run_dir"],
            c["kept_in"],
            extra={"event": "report_copied_run"},
        )
    t, others = drop_other_attempts(t)  # a series quarantined one night, done the next: one case
    if others:
        log.info(
            "%d attempt(s) at series counted in another run folder (e.g. %s of %s, counted in %s)",
            len(others),
            others[0]["case_id"],
            others[0]["run_dir"],
            others[0]["counted_in"],
            extra={"event": "report_other_attempts"},
        )
    runs, cases, stages = t["runs"], t["cases"], t["stages"]
    done = cases[cases.status == "done"].copy()
    failed = cases[cases.status == "failed"].copy()
    intervals = []
    durations: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    now = time.time()
    for _, r in runs.iterrows():
        end = r["ended_at"]
        if not np.isfinite(end if end is not None else np.nan):  # killed run: up to its last recorded stage
            end = _end_so_far(r, stages, now)
        intervals.append((float(r["started_at"]), float(end)))
        durations[str(r["run_id"])] = max(0.0, float(end) - float(r["started_at"]))
        spans[str(r["run_id"])] = (float(r["started_at"]), max(float(r["started_at"]), float(end)))
    active_s = active_seconds(intervals)
    rate_h = 3600.0 * len(done) / active_s if active_s > 0 else 0.0
    ended = pd.to_datetime(done.first_done_at, unit="s", utc=True)  # a case counts at its first completion
    active = _active_hours(intervals)  # an hour or day a run was active without completing a case counts 0
    counts = ended.dt.floor("h").value_counts()
    hourly = counts.reindex(active.union(counts.index), fill_value=0).sort_index()
    daily = hourly.groupby(hourly.index.strftime("%Y-%m-%d")).sum().sort_index()
    per_day_utc, no_run_utc = every_day({str(k): int(v) for k, v in daily.items()})
    stages["skipped"] = skipped_attempts(stages, cases)
    ok = stages[stages.status == "ok"]
    stage_order = list(dict.fromkeys(ok.sort_values("id").stage)) if len(ok) else []
    n_skipped = {s: int((ok.skipped & (ok.stage == s)).sum()) for s in stage_order}
    ok = ok[~ok.skipped]  # a stage that returned at once without its work is no latency sample: counted as skipped
    latency = {s: {**_pct(ok[ok.stage == s].wall_s), "skipped": n_skipped[s]} for s in stage_order}
    by_node = _node_latency(ok, runs, stage_order)
    waits = {s: _pct(ok[ok.stage == s].queue_wait_s) for s in stage_order}
    peak = {
        s: float(ok[ok.stage == s].peak_rss_mb.max()) if ok[ok.stage == s].peak_rss_mb.notna().any() else None
        for s in stage_order
    }
    failures = failed.groupby("error_class").size().sort_values(ascending=False).to_dict() if len(failed) else {}
    gpu = t["gpu"]
    gpu["label"] = _gpu_labels(gpu, runs)
    gpu_summary = (
        {
            str(g): {
                "util_mean_pct": float(d.util_pct.mean()),
                "util_max_pct": float(d.util_pct.max()),
                "mem_max_mb": float(d.mem_used_mb.max()),
                "samples": int(len(d)),
            }
            for g, d in gpu.groupby("label", sort=True)
        }
        if len(gpu)
        else {}
    )
    minutes = active_s / 60.0
    enough = len(done) >= MIN_CASES_TO_PROJECT and minutes >= MIN_MINUTES_TO_PROJECT
    capacity = estimate(t, spans, gpus=gpus, nodes=nodes, cpu_workers=cpu_workers, hours_per_day=hours_per_day, enough=enough)
    asked = gpus is not None or nodes != 1 or cpu_workers is not None
    own = estimate(t, spans, hours_per_day=hours_per_day, enough=enough) if asked else capacity
    wall_s = max(e for _, e in intervals) - min(s for s, _ in intervals) if intervals else 0.0
    capacity_out = _capacity_summary(capacity, gpu=_gpu_recorded(runs))
    capacity_out["method"] = capacity_method(
        cap=capacity_out,
        own=own.to_dict(),
        measured_per_day=rate_h * hours_per_day,
        hosts=runs.host.dropna().nunique(),
        shapes={(model_workers(r.get("device")), run_workers(r)) for r in runs.to_dict("records")},
        side_by_side_s=_side_by_side(runs, spans),
    )
    interrupted = int((cases.status == "interrupted").sum())
    summary = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_dirs": [str(d) for d in unique],
        "left_out": left_out,
        "runs": int(len(runs)),
        "devices": sorted(set(runs.device.dropna())),
        "cases": {
            "total": int(len(cases)),
            "done": int(len(done)),
            "failed": int(len(failed)),
            "unfinished": int(len(cases) - len(done) - len(failed)),
            "interrupted": interrupted,
        },
        "status": state,
        "copied_runs": copies,
        "other_attempts": others,
        "runs_table": _runs_table(runs, cases, finishing_run(cases, stages), durations),
        "active_hours": active_s / 3600.0,
        "overlap": stage_overlap(stages, active_s),
        "throughput": {
            "cases_per_hour": rate_h,
            "cases_per_hour_wall": 3600.0 * len(done) / wall_s if wall_s > 0 else 0.0,
            "wall_s": wall_s,
            "method": throughput_method(n_done=len(done), active_s=active_s, wall_s=wall_s, hours_per_day=hours_per_day),
            "cases_per_day_projected": rate_h * hours_per_day if enough else None,  # too few to project: no figure
            "hours_per_day": hours_per_day,
            "cases_done": int(len(done)),
            "active_minutes": minutes,
            "enough_to_project": enough,
            "projection_rule": f"at least {MIN_CASES_TO_PROJECT} completed cases and {MIN_MINUTES_TO_PROJECT:g} active minutes",
            "per_hour_utc": {k.strftime("%Y-%m-%d %H:00"): int(v) for k, v in hourly.items()},
            "per_day_utc": per_day_utc,
            "days_without_run_utc": no_run_utc,
            **per_local_day(done, intervals, timezone),
        },
        "latency_s": {"end_to_end": {**_pct(done.latency_s), "skipped": None}, **latency},
        "latency_by_node_s": by_node,
        "queue_wait_s": waits,
        "peak_rss_mb": peak,
        "failures_by_reason": {str(k): int(v) for k, v in failures.items()},
        "failed_cases": [
            {
                "case_id": r.case_id,
                "stage": r.failed_stage,
                "error_class": r.error_class,
                "reason": r.reason,
                "run_dir": r.run_dir,
            }
            for r in failed.itertuples()
        ],
        "quality": _quality_summary(done, t["quality"]),
        "skipped": _skipped_summary(latest_skipped(t)),
        "gpu": gpu_summary,
        "projection": _projection(rate_h, hours_per_day, len(done), minutes, enough, where=_machines(runs)),
        "capacity": capacity_out,
    }
    return summary, t


#: The stages a completed case can skip, and its column in ``cases`` saying why (None: the stage ran).
SKIPPABLE = {"detect": "detect_skipped"}


def skipped_attempts(stages: Any, cases: Any) -> Any:
    """Per stage attempt (row of ``stages``) whether it is a stage its case skipped (detection of a scan without
    lungs): the attempt is recorded ``ok`` with the fraction of a millisecond it took to return, which is
    no measure of the stage's latency. The attempt's own ``skip_reason`` says so, whatever became of its case; a
    store of a ctpipe before it says so only of completed cases (:data:`SKIPPABLE`)."""
    import pandas as pd

    out = stages.skip_reason.notna() if "skip_reason" in stages else pd.Series(False, index=stages.index)
    out = out.astype(bool)
    for stage, col in SKIPPABLE.items():
        if col not in cases:
            continue
        why = cases[cases.status == "done"].set_index(["run_dir", "case_key"])[col]
        keys = set(why[why.notna()].index)
        out |= (stages.stage == stage) & pd.Series(
            [(d, k) in keys for d, k in zip(stages.run_dir, stages.case_key)], index=stages.index, dtype=bool
        )
    return out


def _side_by_side(runs: Any, spans: dict[str, tuple[float, float]]) -> float:
    """Seconds (s) during which runs of one host worked at the same time, added up over the hosts: each run's
    active time, less the union of its host's runs' (``spans``: each run's active ``(start, end)``, Unix s)."""
    by_host: dict[str, list[tuple[float, float]]] = {}
    for rid, host in zip(runs.run_id, runs.host):
        if str(rid) in spans:
            by_host.setdefault(str(host), []).append(spans[str(rid)])
    return sum(sum(e - s for s, e in v) - active_seconds(v) for v in by_host.values())


def _end_so_far(run: Any, stages: Any, now: float) -> float:
    """The end (Unix s) of the active time of ``run`` (a row of ``runs``), which has no end record: killed, or
    under way. Its start plus the time it had been at work when it recorded its last stage, measured on the
    monotonic clock (``runs.active_s``: a wall-clock step during the run changes neither); for a store of an
    earlier version without it, its last recorded stage's end. A run still under way is active until ``now``, also
    while a case is still at work (or hung): on the wall clock, from when its time was last recorded."""
    started = float(run["started_at"])
    active, at = run.get("active_s"), run.get("active_at")
    measured = active is not None and np.isfinite(active) and at is not None and np.isfinite(at)
    if measured:
        end = started + float(active)
    else:
        sub = stages[(stages.run_id == run["run_id"]) & stages.ended_at.notna()]
        end = float(sub.ended_at.max()) if len(sub) else started
    if run["status"] == "running" and process_alive(run.get("pid"), run.get("host"), since=started):
        end = end + max(0.0, now - float(at)) if measured else max(end, now)
    return end


def _gpu_labels(gpu: Any, runs: Any) -> Any:
    """Each GPU sample's GPU (index of ``gpu``): its NVML index, prefixed with the host of its run
    (``node-a:0``) when the runs come from several hosts, whose GPUs of one index are different GPUs."""
    import pandas as pd

    host = {r: str(h) for r, h in zip(runs.run_id, runs.host)}
    hosts = [host.get(r, "unknown host") for r in gpu.run_id]
    if len(set(hosts)) <= 1:
        return gpu.gpu.astype(str)
    return pd.Series([f"{h}:{g}" for h, g in zip(hosts, gpu.gpu)], index=gpu.index, dtype=object)


def _node_latency(ok: Any, runs: Any, stage_order: list[str]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Stage wall times (s) per node: the node of a Ray actor (its worker is ``name@node``), else the host of the
    run (local workers). {node: {stage: percentiles}}."""
    if not len(ok):
        return {}
    host = {(d, r): h for d, r, h in zip(runs.run_dir, runs.run_id, runs.host)}
    workers = ok.worker.fillna("").astype(str)
    nodes = [w.partition("@")[2] or str(host.get((d, r)) or "unknown") for w, d, r in zip(workers, ok.run_dir, ok.run_id)]
    ok = ok.assign(node=nodes)
    return {
        node: {s: _pct(grp[grp.stage == s].wall_s) for s in stage_order if (grp.stage == s).any()}
        for node, grp in ok.groupby("node", sort=True)
    }
