"""Throughput reports over one or more run folders: HTML (plots embedded), CSV and JSON.

:func:`build_report` writes the numbers of :func:`.report_summary.summarize` (what they are and how they are
counted: :mod:`.report_summary`) as ``report.json``, CSV tables and ``report.html`` with plots of throughput,
latency, the stage breakdown and GPU utilisation. A series found in several folders counts once (at its first
completion); the attempts not counted are listed (``other_attempts.csv``). Per case the HTML shows status, latency, findings, lung
volumes (marked when a flag makes them unreliable), flags and links to the case's PNGs (:mod:`.report_html`).
What discovery left out (files and series, with reasons) is listed too (``skipped.csv``), with the series left for
the next run because they were still being written into the source while their case ran (kind ``still_written``).

Whether the figures are current: ``report.json`` ``status``, ``status.json`` (the same, alone) and the page's
run-status line say whether the latest run of each folder is in progress, was interrupted or ended
(:func:`.report_runs.run_state`). A run marks its folder's report as in progress when it starts
(:func:`mark_run_started`), before it rebuilds the report at its end; should it be killed, the next run's start or
``ctpipe report`` shows it as interrupted.

The CSV files are UTF-8 with a byte-order mark (Excel reads them as UTF-8), their
times ISO 8601 UTC (``2026-12-04T10:15:03Z``, columns named ``..._utc``), their
column names carry the unit (``p50_s``: seconds). Completed cases per day (every calendar day of the period, a day
on which no run was active with 0 and ``run_active`` False) are given per UTC day
(``throughput_daily.csv``) and per local day of a named time zone (``throughput_daily_local.csv``, whose
``timezone`` column names it with that day's UTC offset, both on the day of a daylight-saving change) and per UTC
hour (``throughput_hourly.csv``): ``cases`` the new cases (a case counts at its first completion), beside them
``cases_redone`` the cases done again then (their published folder removed; each at its latest completion) and
``cases_total_work`` the two together, the cases worked on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import published_together
from ..errors import refuse_unexpanded_home
from .report_days import throughput_tables
from .report_headline import MIN_CASES_TO_PROJECT, MIN_MINUTES_TO_PROJECT
from .report_html import STATUS_END, STATUS_START, case_rows, render_html, status_banner
from .report_latency import PCTS
from .report_plots import draw_plots, latency_figure, shared_bins
from .report_runs import run_state
from .report_summary import latest_skipped, summarize
from .tables import read_runs, utc_text

__all__ = [
    "CAPACITY_COLUMNS",
    "CASES_COLUMNS",
    "OTHER_ATTEMPTS_COLUMNS",
    "MIN_CASES_TO_PROJECT",
    "MIN_MINUTES_TO_PROJECT",
    "PCTS",
    "RUNS_COLUMNS",
    "Report",
    "STATUS_JSON",
    "build_report",
    "latency_figure",
    "latest_skipped",
    "mark_not_rebuilt",
    "mark_run_started",
    "shared_bins",
    "summarize",
]

log = logging.getLogger(__name__)

#: The report's run status alone (``report.json`` ``status``), for a monitoring check that reads one small file.
STATUS_JSON = "status.json"


@dataclass
class Report:
    """Paths of a written report and its summary numbers."""

    out_dir: Path
    html: Path
    json: Path
    csv: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


#: Columns of ``runs.csv``: the rows of ``summary["runs_table"]`` (see :func:`.report_summary.summarize`).
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
    "n_failed_earlier",
    "n_redone",
]
#: Columns of ``capacity.csv``: per stage its worker group (model or cpu), its busy time per completed attempt (s; failed
#: attempts' time included) and the successful attempts that figure rests on.
CAPACITY_COLUMNS = ["stage", "group", "busy_s_per_case", "successful_attempts"]
#: Columns of ``other_attempts.csv``: the attempts at a series in another folder than the one it is counted in
#: (``summary["other_attempts"]``, see :func:`.tables.drop_other_attempts`), the end time ISO 8601 UTC.
OTHER_ATTEMPTS_COLUMNS = [
    "case_id",
    "series_uid",
    "run_dir",
    "run_id",
    "status",
    "error_class",
    "reason",
    "ended_utc",
    "counted_in",
    "counted_status",
]
#: Columns of ``cases.csv``: times ISO 8601 UTC, latency in s; ``first_done_utc``: the case's first completion, the time
#: the daily and hourly tables count it at (``ended_utc`` is its latest end: later for a case done again).
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
    "first_done_utc",
]


def _node_latency_table(by_node: dict[str, dict[str, dict[str, Any]]]) -> Any:
    """``latency_by_node.csv``: per node and stage the count and the mean and percentiles in seconds."""
    import pandas as pd

    rows = [
        {"node": node, **_latency_table({stage: pct}).iloc[0].to_dict()}
        for node, stages in by_node.items()
        for stage, pct in stages.items()
    ]
    return pd.DataFrame(rows, columns=["node", "stage", "n", "mean_s", *(f"p{p}_s" for p in PCTS)])


def _runs_csv(rows: list[dict[str, Any]]) -> Any:
    """``runs.csv``: counts as whole numbers, ``n_failed_earlier`` "unknown" where it cannot be known (a killed run
    that later runs of its folder followed; see :func:`.report_summary.summarize`)."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=RUNS_COLUMNS)
    known = pd.to_numeric(df.n_failed_earlier, errors="coerce").astype("Int64")
    return df.assign(n_failed_earlier=known.astype(object).where(known.notna(), "unknown"))


def _csv_bytes(df: Any) -> bytes:
    """``df`` as a CSV file: UTF-8 with a byte-order mark (Excel on Windows reads it as UTF-8), no index."""
    return df.to_csv(index=False).encode("utf-8-sig")


def _latency_table(latency: dict[str, dict[str, Any]]) -> Any:
    """``latency.csv``: per stage (and end to end) the count and the mean and percentiles in seconds (``_s``) of the
    attempts that did the stage's work, and ``n_skipped``: the cases that skipped the stage (empty for end to end)."""
    import pandas as pd

    cols = ["n", "mean", *(f"p{p}" for p in PCTS)]
    rows = [
        {"stage": k, **{(c if c == "n" else f"{c}_s"): v.get(c) for c in cols}, "n_skipped": v.get("skipped")}
        for k, v in latency.items()
    ]
    out = pd.DataFrame(rows, columns=["stage", "n", "mean_s", *(f"p{p}_s" for p in PCTS), "n_skipped"])
    return out.astype({"n_skipped": "Int64"})


def _cases_table(cases: Any) -> Any:
    """``cases.csv``: times as ISO 8601 UTC text, findings as whole numbers (empty where the case is not done)."""
    import pandas as pd

    out = cases.assign(
        started_utc=utc_text(cases.started_at),
        ended_utc=utc_text(cases.ended_at),
        first_done_utc=utc_text(cases.first_done_at.where(cases.status == "done")),
        n_findings=pd.to_numeric(cases.n_findings, errors="coerce").round().astype("Int64").where(cases.status == "done"),
    )
    return out[CASES_COLUMNS]


def build_report(
    run_dirs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    bin_minutes: int = 0,
    hours_per_day: float = 24.0,
    gpus: int | None = None,
    nodes: int = 1,
    cpu_workers: int | None = None,
    timezone: str | None = None,
) -> Report:
    """Write ``report.html``, ``report.json`` and CSV tables for ``run_dirs`` into ``out_dir``.

    The files are published together (:func:`~pipeline.atomic.published_together`): should the report fail
    partway, ``out_dir`` keeps the earlier report's files, all of them as they were.

    ``gpus``, ``nodes`` and ``cpu_workers`` (per node) set the cluster of the capacity model (``summary["capacity"]``;
    defaults: the runs' own GPUs and CPU workers, one node). ``bin_minutes``: the throughput plot's bin width (minutes;
    0, the default: chosen from the runs' span, :func:`~.report_bins.throughput_bin_s`). ``timezone``: the IANA time zone of the completed cases per
    local day (``throughput_daily_local.csv``, the page's daily table; default: this machine's local time).
    """
    out = Path(out_dir)
    refuse_unexpanded_home(out_dir, what="out")  # not a new folder named '~' in the working folder
    out.mkdir(parents=True, exist_ok=True)
    summary, t = summarize(
        run_dirs, hours_per_day=hours_per_day, gpus=gpus, nodes=nodes, cpu_workers=cpu_workers, timezone=timezone
    )
    summary["status"]["figures_from"] = figures_from(summary)
    summary["status"]["figures_current"] = True  # built now; a run start or a run without a report says false
    if summary["status"]["state"] == "in_progress":
        summary["status"]["note"] = f"the figures below are as of {summary['generated_at']}, while it runs"
    plots = draw_plots(summary, t, bin_minutes)
    rep = Report(out, out / "report.html", out / "report.json")
    rows = case_rows(t, out)
    skipped = latest_skipped(t)
    with published_together(out) as write:  # all files or none: a failure leaves the earlier report whole
        write(rep.html.name, render_html(summary, plots, rows, skipped).encode())
        write(rep.json.name, json.dumps(summary, indent=1).encode())
        write(STATUS_JSON, json.dumps({**summary["status"], "updated_at": summary["generated_at"]}, indent=1).encode())
        rep.csv = [write(name, _csv_bytes(df)) for name, df in _tables(summary, t, skipped).items()]
    rep.summary = summary
    log.info("report written to %s", rep.html, extra={"event": "report"})
    return rep


def _tables(summary: dict[str, Any], t: dict, skipped: Any) -> dict[str, Any]:
    """The report's CSV tables by file name (DataFrames), from the summary and tables of :func:`.summarize`."""
    import pandas as pd

    tp = summary["throughput"]
    return {
        # counts as whole numbers; n_failed_earlier "unknown" where it cannot be known (not 0.0 beside it, nor blank)
        "runs.csv": _runs_csv(summary["runs_table"]),
        "latency.csv": _latency_table(summary["latency_s"]),
        "latency_by_node.csv": _node_latency_table(summary["latency_by_node_s"]),
        **throughput_tables(tp),
        "capacity.csv": pd.DataFrame(
            [
                {"stage": k, "group": v["group"], "busy_s_per_case": v["busy_s"], "successful_attempts": v["passes"]}
                for k, v in summary["capacity"]["stages"].items()
            ],
            columns=CAPACITY_COLUMNS,
        ),
        "failures.csv": pd.DataFrame(summary["failed_cases"], columns=["case_id", "stage", "error_class", "reason", "run_dir"]),
        "cases.csv": _cases_table(t["cases"]),
        "other_attempts.csv": pd.DataFrame(summary["other_attempts"], columns=OTHER_ATTEMPTS_COLUMNS),
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


def _earlier_report(report_json: Path) -> dict[str, Any] | None:
    """The summary of the report already in a folder, or None (none there, or not readable as one)."""
    try:
        data = json.loads(report_json.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def figures_from(summary: dict[str, Any]) -> dict[str, Any]:
    """What the figures of a report just built rest on: when it was written and the latest run of its (first) folder
    then (``run_id``, ``status``, ``started_utc``, ``ended_utc``); kept in its ``status`` as ``figures_from``."""
    runs = summary["status"]["runs"]
    latest = {k: runs[0][k] for k in ("run_id", "status", "started_utc", "ended_utc")} if runs else {}
    return {"generated_at": summary["generated_at"], **latest}


def _figures_note(earlier: dict[str, Any] | None) -> str:
    """Where the figures of the page a run finds at its start come from: the report written before it (whose
    figures a run start leaves as they are, so that a later start still names the same report)."""
    if earlier is None:
        return "no report of an earlier run here yet: this run writes the first one when it ends"
    src = (earlier.get("status") or {}).get("figures_from") or {"generated_at": earlier.get("generated_at")}
    note = f"the figures below are from before it, in the report written at {src.get('generated_at') or 'an unknown time'}"
    if src.get("ended_utc"):
        note += f", after run {src['run_id']} ended at {src['ended_utc']} ({src['status']})"
    elif src.get("run_id"):
        note += f", while run {src['run_id']} (started at {src['started_utc']}) was {src['status'].replace('_', ' ')}"
    return note


def mark_run_started(out_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Say in the report folder ``out_dir`` of ``run_dir`` that a run of it is in progress (call once the run is
    recorded in the run store): ``status.json``, ``report.json`` ``status`` and the run-status line of
    ``report.html`` (the page and its figures otherwise left as they are) give the run's start, pid and host, the
    run before it when that one was interrupted, and which report the figures are from (``figures_current``:
    false). The three files change together (:func:`~pipeline.atomic.published_together`): a failure leaves them as
    they were. Returns the status written."""
    return _mark_status(Path(out_dir), run_dir, note_prefix="")


def mark_not_rebuilt(out_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, run_id: str) -> dict[str, Any] | None:
    """Say in the report folder ``out_dir`` of ``run_dir`` that its latest run, ``run_id``, ended without rebuilding
    it (``report.enabled: false``; call once the run's end is recorded): as :func:`mark_run_started`, the status
    (``figures_current``: false) and a note naming the run and the report the figures are from, which stay as they
    were. Nothing is written where no report is (no ``report.json``): returns None; else the status written."""
    if _earlier_report(Path(out_dir) / "report.json") is None:
        return None
    prefix = f"this report was not rebuilt by the latest run, {run_id} (report.enabled: false): "
    return _mark_status(Path(out_dir), run_dir, note_prefix=prefix)


def _mark_status(out: Path, run_dir: str | os.PathLike[str], *, note_prefix: str) -> dict[str, Any]:
    """Write the run status of ``run_dir`` into the report folder ``out`` (``status.json``, ``report.json``
    ``status``, the page's run-status line) together, its note ``note_prefix`` and where the figures are from."""
    status = run_state(read_runs(run_dir))
    earlier = _earlier_report(out / "report.json")
    status["note"] = note_prefix + _figures_note(earlier)
    status["figures_current"] = False
    if earlier is not None and (earlier.get("status") or {}).get("figures_from"):
        status["figures_from"] = earlier["status"]["figures_from"]
    status["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    try:
        page: str | None = (out / "report.html").read_text()
    except (OSError, ValueError):
        page = None  # no page yet (the first run), or not one of ours
    if page is not None:
        banner = status_banner(status)
        start, end = page.find(STATUS_START), page.find(STATUS_END)
        if 0 <= start < end:
            page = page[:start] + banner + page[end + len(STATUS_END) :]
        elif "<body>" in page:  # a page written before it had a run-status line
            page = page.replace("<body>", "<body>\n" + banner, 1)
    with published_together(out) as write:  # the status, the JSON and the page change together or not at all
        write(STATUS_JSON, json.dumps(status, indent=1).encode())
        if earlier is not None:
            write("report.json", json.dumps({**earlier, "status": status}, indent=1).encode())
        if page is not None:
            write("report.html", page.encode())
    return status
