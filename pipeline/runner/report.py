"""Throughput reports over one or more run folders: HTML (plots embedded), CSV and JSON.

Figures: completed cases per hour and per calendar day (UTC); the measured
rate (completed cases ÷ hours during which runs were active, overlapping runs
counted once) and its projection to cases per day; latency p50/p90/p99 per
stage (wall time of successful attempts, s), queue waits, and end to end (case
start to publication, s); failures by error class; GPU utilisation when NVML
samples exist; the capacity model (:mod:`.capacity`): cases/day for N GPUs over M nodes
from the runs' own stage times, beside the reference deployment.

The projection states how many completed cases and active minutes it rests on.
A rate measured over fewer than :data:`MIN_CASES_TO_PROJECT` completed cases or
:data:`MIN_MINUTES_TO_PROJECT` active minutes is dominated by start-up (model
loading, worker start, the first case's cold caches) and by chance: the report
then says it is too few to project from, and the figure is indicative only.

Quality: each completed case's flags (:mod:`pipeline.reconstruction.quality`);
the headline counts the cases with at least one warning flag. Per case: status,
latency, findings, lung volumes (marked when a flag makes them unreliable),
flags and links to the case's PNGs. What discovery left out (files and series,
with reasons) is listed too (``skipped.csv``).

Runs (``runs.csv``): each case is counted once, in the run of its latest attempt
(:func:`.tables.finishing_run`), with its outcome there: a run resumed after a
kill does not count again what the killed run finished, and a killed run (no end
record) shows what it finished. A run without an end record that a later run of
its folder followed, or whose process is gone, is shown ``interrupted``, and so
is a case it left ``running`` (:func:`.tables.run_status`).

The CSV files are UTF-8 with a byte-order mark (Excel reads them as UTF-8), their
times ISO 8601 UTC (``2026-12-04T10:15:03Z``, columns named ``..._utc``), their
column names carry the unit (``p50_s``: seconds).

The per-GPU figures and the comparison with the reference deployment appear only when a run recorded a
GPU device; without one the capacity model speaks of model workers.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes
from .capacity import estimate
from .report_html import case_rows, render_html
from .tables import case_status, finishing_run, read_tables, run_status, utc_text

log = logging.getLogger(__name__)

PCTS = (50, 90, 99)
#: The fewest completed cases, and active minutes, a cases/day projection is made from (see the module docstring).
MIN_CASES_TO_PROJECT = 10
MIN_MINUTES_TO_PROJECT = 5.0


@dataclass
class Report:
    """Paths of a written report and its summary numbers."""

    out_dir: Path
    html: Path
    json: Path
    csv: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _active_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length (s) of the union of ``(start, end)`` intervals: time covered by overlapping runs counts once."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    total = 0.0
    for s, e in merged:
        total += e - s
    return total


def _pct(values: Any) -> dict[str, float | None]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PCTS}}
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in PCTS}}


def _span(minutes: float) -> str:
    """Active time in words: minutes below an hour, else hours."""
    return f"{minutes / 60.0:.2f} active hours" if minutes >= 60 else f"{minutes:.1f} active minutes"


def _projection(rate_h: float, hours_per_day: float, n_done: int, minutes: float, enough: bool) -> str:
    """The cases/day headline: the figure, what it rests on, and whether that is enough to project from.

    ``rate_h``: measured cases/hour; ``minutes``: active minutes. When ``enough`` is false the headline leads with
    the measured rate and says the cases/day projection has not enough data, without its figure.
    """
    basis = f"{rate_h:,.1f} cases/hour from {n_done} completed case(s) over {_span(minutes)}"
    if not enough:
        return (
            f"measured {basis}; cases/day projection: not enough data (too few to project from: fewer than "
            f"{MIN_CASES_TO_PROJECT} completed cases or {MIN_MINUTES_TO_PROJECT:g} active minutes)"
        )
    return (
        f"at the measured rate this machine handles {rate_h * hours_per_day:,.0f} cases/day "
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
    """The capacity model's JSON, ``gpu_recorded`` added; its text speaks of model workers when ``gpu`` is false."""
    out = {**capacity.to_dict(), "gpu_recorded": gpu}
    if not gpu:
        out["text"] = _cpu_capacity_text(out)
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


def _runs_table(runs: Any, cases: Any, finished_in: Any, durations: dict[str, float]) -> list[dict[str, Any]]:
    """One row per run: status as the report shows it, start and end (ISO 8601 UTC; no end record: None), active
    time (s) and the cases of its latest attempts by outcome (``finished_in``: :func:`.tables.finishing_run`),
    so that each case is counted in one run only."""
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
            }
        )
    return rows


def summarize(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    hours_per_day: float = 24.0,
    gpus: int | None = None,
    nodes: int = 1,
    cpu_workers: int | None = None,
) -> tuple[dict[str, Any], dict]:
    """Summary numbers (JSON-able) and the combined DataFrames of ``run_dirs``.

    ``run_dirs`` are resolved and named once each, in the order given. In the DataFrames, ``runs.status`` and
    ``cases.status`` are as the report shows them (killed runs and their cases ``interrupted``; see
    :func:`.tables.run_status`). ``gpus``, ``nodes``, ``cpu_workers`` (per node): the capacity model's cluster
    (see :func:`.capacity.estimate`; defaults: the runs' own GPUs and CPU workers, one node).
    """
    import pandas as pd

    # a run folder named twice (or by two paths) is one run: counted once
    unique = list(dict.fromkeys(Path(d).resolve() for d in run_dirs))
    tables = [read_tables(d) for d in unique]
    t = {k: pd.concat([x[k] for x in tables], ignore_index=True) for k in tables[0]}
    runs, cases, stages = t["runs"], t["cases"], t["stages"]
    runs["status"] = run_status(runs)
    cases["status"] = case_status(cases, runs)
    done = cases[cases.status == "done"].copy()
    failed = cases[cases.status == "failed"].copy()
    intervals = []
    durations: dict[str, float] = {}
    for _, r in runs.iterrows():
        end = r["ended_at"]
        if not np.isfinite(end if end is not None else np.nan):  # killed run: up to its last recorded stage
            sub = stages[(stages.run_id == r["run_id"]) & stages.ended_at.notna()]
            end = float(sub.ended_at.max()) if len(sub) else float(r["started_at"])
        intervals.append((float(r["started_at"]), float(end)))
        durations[str(r["run_id"])] = max(0.0, float(end) - float(r["started_at"]))
    active_s = _active_seconds(intervals)
    rate_h = 3600.0 * len(done) / active_s if active_s > 0 else 0.0
    ended = pd.to_datetime(done.ended_at, unit="s", utc=True)
    hourly = ended.dt.floor("h").value_counts().sort_index()
    daily = ended.dt.strftime("%Y-%m-%d").value_counts().sort_index()
    ok = stages[stages.status == "ok"]
    stage_order = list(dict.fromkeys(ok.sort_values("id").stage)) if len(ok) else []
    latency = {s: _pct(ok[ok.stage == s].wall_s) for s in stage_order}
    by_node = _node_latency(ok, runs, stage_order)
    waits = {s: _pct(ok[ok.stage == s].queue_wait_s) for s in stage_order}
    peak = {
        s: float(ok[ok.stage == s].peak_rss_mb.max()) if ok[ok.stage == s].peak_rss_mb.notna().any() else None
        for s in stage_order
    }
    failures = failed.groupby("error_class").size().sort_values(ascending=False).to_dict() if len(failed) else {}
    gpu = t["gpu"]
    gpu_summary = (
        {
            str(g): {
                "util_mean_pct": float(d.util_pct.mean()),
                "util_max_pct": float(d.util_pct.max()),
                "mem_max_mb": float(d.mem_used_mb.max()),
                "samples": int(len(d)),
            }
            for g, d in gpu.groupby("gpu")
        }
        if len(gpu)
        else {}
    )
    minutes = active_s / 60.0
    enough = len(done) >= MIN_CASES_TO_PROJECT and minutes >= MIN_MINUTES_TO_PROJECT
    capacity = estimate(t, durations, gpus=gpus, nodes=nodes, cpu_workers=cpu_workers, hours_per_day=hours_per_day, enough=enough)
    interrupted = int((cases.status == "interrupted").sum())
    summary = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_dirs": [str(d) for d in unique],
        "runs": int(len(runs)),
        "devices": sorted(set(runs.device.dropna())),
        "cases": {
            "total": int(len(cases)),
            "done": int(len(done)),
            "failed": int(len(failed)),
            "unfinished": int(len(cases) - len(done) - len(failed)),
            "interrupted": interrupted,
        },
        "runs_table": _runs_table(runs, cases, finishing_run(cases, stages), durations),
        "active_hours": active_s / 3600.0,
        "throughput": {
            "cases_per_hour": rate_h,
            "cases_per_day_projected": rate_h * hours_per_day,
            "hours_per_day": hours_per_day,
            "cases_done": int(len(done)),
            "active_minutes": minutes,
            "enough_to_project": enough,
            "projection_rule": f"at least {MIN_CASES_TO_PROJECT} completed cases and {MIN_MINUTES_TO_PROJECT:g} active minutes",
            "per_hour_utc": {k.strftime("%Y-%m-%d %H:00"): int(v) for k, v in hourly.items()},
            "per_day_utc": {str(k): int(v) for k, v in daily.items()},
        },
        "latency_s": {"end_to_end": _pct(done.latency_s), **latency},
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
        "projection": _projection(rate_h, hours_per_day, len(done), minutes, enough),
        "capacity": _capacity_summary(capacity, gpu=_gpu_recorded(runs)),
    }
    return summary, t


# -- plots --------------------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def shared_bins(series: Sequence[Any], *, n: int = 30) -> np.ndarray:
    """``n`` equal bins (edges, s) from 0 to just past the largest value of any of ``series``: every histogram of a
    plot on one scale, so that one case's bar is as wide as a thirtieth of the axis, not of its own zero range."""
    longest = max((float(np.max(v)) for v in series if len(v)), default=0.0)
    return np.linspace(0.0, max(longest, 1e-3) * 1.02, n + 1)


def _plots(summary: dict[str, Any], t: dict, bin_minutes: int) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import pandas as pd

    out: dict[str, str] = {}
    done = t["cases"][t["cases"].status == "done"]
    fig, ax = plt.subplots(figsize=(8, 3))
    if len(done):
        ended = pd.to_datetime(done.ended_at, unit="s", utc=True)
        counts = ended.dt.floor(f"{bin_minutes}min").value_counts().sort_index()
        ax.bar(counts.index, counts.values, width=bin_minutes / 1440.0 * 0.9, align="edge", color="#3a7bd5")
        fig.autofmt_xdate()
    ax.set_title(f"Completed cases per {bin_minutes} min (UTC)")
    ax.set_ylabel("cases")
    out["throughput"] = _png(fig)

    ok = t["stages"][t["stages"].status == "ok"]
    fig, ax = plt.subplots(figsize=(8, 3))
    series = [("end to end", done.latency_s.dropna())] if len(done) else []
    series += [(s, ok[ok.stage == s].wall_s.dropna()) for s in summary["latency_s"] if s != "end_to_end"]
    edges = [float(e) for e in shared_bins([v for _, v in series])]
    for n, (label, values) in enumerate(series):
        if len(values):
            end_to_end = n == 0 and len(done) > 0
            ax.hist(values, bins=edges, alpha=0.8 if end_to_end else 0.5, label=label, color="#333333" if end_to_end else None)
    ax.set_xlabel("seconds")
    ax.set_ylabel("cases")
    ax.set_title("Latency histogram")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: no bar hidden
        fig.tight_layout()
    out["latency"] = _png(fig)

    stages = [s for s in summary["latency_s"] if s != "end_to_end"]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.5 * max(1, len(stages))))
    means = [summary["latency_s"][s]["mean"] or 0.0 for s in stages]
    waits = [summary["queue_wait_s"][s]["mean"] or 0.0 for s in stages]
    y = np.arange(len(stages))
    ax.barh(y, means, color="#3a7bd5", label="wall time (mean)")
    ax.barh(y, waits, left=means, color="#f0a030", label="queue wait (mean)")
    ax.set_yticks(y, stages)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per case")
    ax.set_title("Stage breakdown")
    ax.legend(fontsize=8)
    out["stages"] = _png(fig)

    gpu = t["gpu"]
    if len(gpu):
        fig, ax = plt.subplots(figsize=(8, 3))
        for g, d in gpu.groupby("gpu"):
            ax.plot(pd.to_datetime(d.t, unit="s", utc=True), d.util_pct, label=f"GPU {g}")
        ax.set_ylabel("utilisation %")
        ax.set_title("GPU utilisation (NVML)")
        ax.legend(fontsize=8)
        fig.autofmt_xdate()
        out["gpu"] = _png(fig)
    return out


#: Columns of ``runs.csv`` (see :func:`_runs_table`).
RUNS_COLUMNS = [
    "run_dir",
    "run_id",
    "status",
    "started_utc",
    "ended_utc",
    "active_s",
    "device",
    "host",
    "n_done",
    "n_failed",
    "n_unfinished",
]
#: Columns of ``cases.csv``: times ISO 8601 UTC, latency in s.
CASES_COLUMNS = [
    "run_dir",
    "case_id",
    "status",
    "latency_s",
    "n_findings",
    "lung_coverage",
    "contrast_phase",
    "flags",
    "detect_skipped",
    "error_class",
    "reason",
    "origin",  # where a PACS delivered the case from (no credentials), and its remote UIDs
    "origin_via",
    "origin_study_uid",
    "origin_series_uid",
    "started_utc",
    "ended_utc",
]


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


def _node_latency_table(by_node: dict[str, dict[str, dict[str, Any]]]) -> Any:
    """``latency_by_node.csv``: per node and stage the count and the mean and percentiles in seconds."""
    import pandas as pd

    rows = [
        {"node": node, **_latency_table({stage: pct}).iloc[0].to_dict()}
        for node, stages in by_node.items()
        for stage, pct in stages.items()
    ]
    return pd.DataFrame(rows, columns=["node", "stage", "n", "mean_s", *(f"p{p}_s" for p in PCTS)])


def _csv_bytes(df: Any) -> bytes:
    """``df`` as a CSV file: UTF-8 with a byte-order mark (Excel on Windows reads it as UTF-8), no index."""
    return df.to_csv(index=False).encode("utf-8-sig")


def _latency_table(latency: dict[str, dict[str, Any]]) -> Any:
    """``latency.csv``: per stage (and end to end) the count and the mean and percentiles in seconds (``_s``)."""
    import pandas as pd

    cols = ["n", "mean", *(f"p{p}" for p in PCTS)]
    rows = [{"stage": k, **{(c if c == "n" else f"{c}_s"): v.get(c) for c in cols}} for k, v in latency.items()]
    return pd.DataFrame(rows, columns=["stage", "n", "mean_s", *(f"p{p}_s" for p in PCTS)])


def _cases_table(cases: Any) -> Any:
    """``cases.csv``: times as ISO 8601 UTC text, findings as whole numbers (empty where the case is not done)."""
    import pandas as pd

    out = cases.assign(
        started_utc=utc_text(cases.started_at),
        ended_utc=utc_text(cases.ended_at),
        n_findings=pd.to_numeric(cases.n_findings, errors="coerce").round().astype("Int64").where(cases.status == "done"),
    )
    return out[CASES_COLUMNS]


def build_report(
    run_dirs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    bin_minutes: int = 60,
    hours_per_day: float = 24.0,
    gpus: int | None = None,
    nodes: int = 1,
    cpu_workers: int | None = None,
) -> Report:
    """Write ``report.html``, ``report.json`` and CSV tables for ``run_dirs`` into ``out_dir``.

    ``gpus``, ``nodes`` and ``cpu_workers`` (per node) set the cluster of the capacity model (``summary["capacity"]``;
    defaults: the runs' own GPUs and CPU workers, one node).
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary, t = summarize(run_dirs, hours_per_day=hours_per_day, gpus=gpus, nodes=nodes, cpu_workers=cpu_workers)
    plots = _plots(summary, t, bin_minutes)
    rep = Report(out, out / "report.html", out / "report.json")
    rows = case_rows(t, out)
    skipped = latest_skipped(t)
    atomic_write_bytes(rep.html, render_html(summary, plots, rows, skipped).encode())
    atomic_write_bytes(rep.json, json.dumps(summary, indent=1).encode())
    tables = {
        "runs.csv": pd.DataFrame(summary["runs_table"], columns=RUNS_COLUMNS),
        "latency.csv": _latency_table(summary["latency_s"]),
        "latency_by_node.csv": _node_latency_table(summary["latency_by_node_s"]),
        "throughput_daily.csv": pd.DataFrame(list(summary["throughput"]["per_day_utc"].items()), columns=["day_utc", "cases"]),
        "throughput_hourly.csv": pd.DataFrame(
            [(f"{hour.replace(' ', 'T')}:00Z", n) for hour, n in summary["throughput"]["per_hour_utc"].items()],
            columns=["hour_utc", "cases"],
        ),
        "capacity.csv": pd.DataFrame(
            [{"stage": k, **v} for k, v in summary["capacity"]["stages"].items()], columns=["stage", "group", "busy_s", "passes"]
        ),
        "failures.csv": pd.DataFrame(summary["failed_cases"], columns=["case_id", "stage", "error_class", "reason", "run_dir"]),
        "cases.csv": _cases_table(t["cases"]),
        "quality_flags.csv": t["quality"][["run_dir", "case_id", "code", "severity", "message"]],
        "skipped.csv": skipped[["run_dir", "run_id", "what", "item", "kind", "reason", "source"]],
        "stages.csv": t["stages"][
            [
                "run_dir",
                "case_id",
                "stage",
                "attempt",
                "status",
                "worker",
                "device",
                "wall_s",
                "queue_wait_s",
                "peak_rss_mb",
                "peak_cuda_mb",
            ]
        ],
    }
    for name, df in tables.items():
        atomic_write_bytes(out / name, _csv_bytes(df))
        rep.csv.append(out / name)
    rep.summary = summary
    log.info("report written to %s", rep.html, extra={"event": "report"})
    return rep
