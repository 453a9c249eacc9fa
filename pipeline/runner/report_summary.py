"""The numbers of a throughput report over one or more run folders (:func:`summarize`, JSON-able);
:mod:`.report` writes them out as HTML, CSV and JSON.

Figures: completed cases per hour and per calendar day (UTC, and per local day in a named time zone,
beside them the cases done again then, their published folder removed: ``redone_per_*``, each at its latest
completion, so that new + done again is the work done;
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
A rate measured over fewer than :data:`.report_headline.MIN_CASES_TO_PROJECT` completed cases or
:data:`.report_headline.MIN_MINUTES_TO_PROJECT` active minutes is dominated by start-up (model
loading, worker start, the first case's cold caches) and by chance: the report
then says it is too few to project from, and the figure is indicative only.

Quality: each completed case's flags (:mod:`pipeline.reconstruction.quality`);
the headline counts the cases with at least one warning flag. What discovery left
out is counted from each folder's latest run (:func:`latest_skipped`).

Runs (``runs.csv``): each case is counted once; within a run folder a completed case in the run that first completed it
(:func:`.report_runs.first_completion_run`; one that did it again counts it in ``n_redone``), any other in the run of
its latest attempt (:func:`.tables.finishing_run`), with its outcome there (across folders, see below: its first
completion): a run resumed after a
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

The headlines' text is :mod:`.report_headline`'s, the runs' state and ``runs.csv`` rows :mod:`.report_runs`'s, the
latency percentiles and the skipped attempts :mod:`.report_latency`'s; this module counts and puts them together.

The per-GPU figures and the comparison with the reference deployment appear only when a run recorded a
GPU device; without one the capacity model speaks of model workers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .capacity import active_seconds, estimate, model_workers, run_workers, stage_overlap
from .report_days import every_day, per_local_day, redo_ends
from .report_headline import MIN_CASES_TO_PROJECT, MIN_MINUTES_TO_PROJECT, capacity_summary, gpu_recorded, machines, projection
from .report_inputs import counted, run_folders
from .report_latency import node_latency, pct, skipped_attempts
from .report_method import capacity_method, throughput_method
from .report_runs import run_state, runs_table
from .tables import (
    case_status,
    drop_copies,
    drop_other_attempts,
    finishing_run,
    process_alive,
    read_tables,
    run_status,
    unfinished_reasons,
)

log = logging.getLogger(__name__)


def _active_hours(intervals: list[tuple[float, float]]) -> Any:
    """The UTC hours (a DatetimeIndex of hour starts) during which any of the runs' ``(start, end)`` intervals (Unix s)
    was active."""
    import pandas as pd

    def hour(t: float) -> Any:
        return pd.Timestamp(t, unit="s", tz="UTC").floor("h")

    # a run that ends on the hour (09:00:00) was not active in the hour that starts then
    hours = [pd.date_range(hour(s), hour(max(s, e - 1e-3)), freq="h") for s, e in intervals]
    return pd.DatetimeIndex([h for r in hours for h in r], tz="UTC").unique()


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


def _left_folders(run_dirs: Sequence[Path]) -> dict[tuple[str, str], str]:
    """(run folder, case id) → the command that adopts the case's folder, of the folders a run killed as it recorded
    their case left in place in each of ``run_dirs`` (:func:`pipeline.runner.left_unsent.left_cases`)."""
    from .left_unsent import left_cases

    return {(str(d), c.case_id): c.fix(str(d)) for d in run_dirs for c in left_cases(d)}


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
    t["cases"]["reason"] = unfinished_reasons(t["cases"], t["runs"], t["stages"], left=_left_folders(unique))
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
    redo_s = redo_ends(done)  # a case done again, at its latest completion: work done, no new case
    redos = pd.to_datetime(pd.Series(redo_s, dtype=float), unit="s", utc=True).dt.floor("h").value_counts()
    hours = active.union(counts.index).union(redos.index) if len(redos) else active.union(counts.index)
    hourly = counts.reindex(hours, fill_value=0).sort_index()
    hourly_redone = redos.reindex(hours, fill_value=0).sort_index() if len(redos) else hourly * 0
    daily = hourly.groupby(hourly.index.strftime("%Y-%m-%d")).sum().sort_index()
    daily_redone = hourly_redone.groupby(hourly_redone.index.strftime("%Y-%m-%d")).sum()
    per_day_utc, no_run_utc = every_day({str(k): int(v) for k, v in daily.items()})
    stages["skipped"] = skipped_attempts(stages, cases)
    ok = stages[stages.status == "ok"]
    stage_order = list(dict.fromkeys(ok.sort_values("id").stage)) if len(ok) else []
    n_skipped = {s: int((ok.skipped & (ok.stage == s)).sum()) for s in stage_order}
    ok = ok[~ok.skipped]  # a stage that returned at once without its work is no latency sample: counted as skipped
    latency = {s: {**pct(ok[ok.stage == s].wall_s), "skipped": n_skipped[s]} for s in stage_order}
    by_node = node_latency(ok, runs, stage_order)
    waits = {s: pct(ok[ok.stage == s].queue_wait_s) for s in stage_order}
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
    capacity_out = capacity_summary(capacity, gpu=gpu_recorded(runs))
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
        "runs_table": runs_table(runs, cases, finishing_run(cases, stages), durations),
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
            "cases_redone": len(redo_s),  # done again (their published folder removed): apart from the new cases
            "cases_redone_per_hour": 3600.0 * len(redo_s) / active_s if active_s > 0 else 0.0,
            "active_minutes": minutes,
            "enough_to_project": enough,
            "projection_rule": f"at least {MIN_CASES_TO_PROJECT} completed cases and {MIN_MINUTES_TO_PROJECT:g} active minutes",
            "per_hour_utc": {k.strftime("%Y-%m-%d %H:00"): int(v) for k, v in hourly.items()},
            "redone_per_hour_utc": {k.strftime("%Y-%m-%d %H:00"): int(v) for k, v in hourly_redone.items()},
            "per_day_utc": per_day_utc,
            "redone_per_day_utc": {day: int(daily_redone.get(day, 0)) for day in per_day_utc},
            "days_without_run_utc": no_run_utc,
            **per_local_day(done, intervals, timezone),
        },
        "latency_s": {"end_to_end": {**pct(done.latency_s), "skipped": None}, **latency},
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
        "projection": projection(rate_h, hours_per_day, len(done), minutes, enough, where=machines(runs)),
        "capacity": capacity_out,
    }
    return summary, t


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
