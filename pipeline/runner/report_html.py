"""The HTML page of a throughput report: headline, per-case table with quality flags and PNG links, plots.

Self-contained (plots embedded as PNG, no scripts, nothing fetched); links to a
case's PNGs are relative to the report's folder, so a run folder moved as a
whole keeps them working. Every text from the run store is escaped.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .capacity import COUNTED_ATTEMPTS

#: Lung volume measurements shown per case: (column title, measurement name).
LUNG_VOLUMES = (
    ("left lung mL", "lungs.lung_left_volume_ml"),
    ("right lung mL", "lungs.lung_right_volume_ml"),
    ("lungs mL", "lungs.lungs_total_volume_ml"),
)
#: Rows of the skipped list shown on the page (skipped.csv has them all).
SKIPPED_SHOWN = 200
#: Rows of the case table and of the failures list shown on the page (cases.csv and failures.csv have them all): a
#: month of nightly runs holds hundreds of thousands of cases, a page a browser opens a few hundred.
CASES_SHOWN = 500


def shown_cases(cases: Any, quality: Any, limit: int) -> Any:
    """The rows of ``cases`` the page shows, at most ``limit``, in their order: those that need attention first (not
    done: quarantined, interrupted, unfinished), then done cases with a warning flag, then the others, the most
    recent first within each."""
    if len(cases) <= limit:
        return cases
    warn = quality[quality.severity == "warning"] if len(quality) else quality
    warned = set(zip(warn.run_dir, warn.case_key))
    rank = [
        0 if status != "done" else 1 if (d, k) in warned else 2
        for status, d, k in zip(cases.status, cases.run_dir, cases.case_key)
    ]
    when = cases.ended_at.fillna(cases.started_at).fillna(0.0)
    order = cases.assign(_rank=rank, _when=-when).sort_values(["_rank", "_when"], kind="stable")
    return cases[cases.index.isin(order.index[:limit])]  # in the table's own order


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return ""
    return "" if v != v else fmt.format(v)


def case_rows(t: dict, out_dir: Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    """One row per case the page shows (:func:`shown_cases`, at most ``limit``, default :data:`CASES_SHOWN`): status, latency (s), findings, lung
    volumes (mL, with reliability), quality flags and the case's PNGs (links relative to ``out_dir``)."""
    meas, quality = t["measurements"], t["quality"]
    cases = shown_cases(t["cases"], quality, CASES_SHOWN if limit is None else limit)
    wanted = {name for _, name in LUNG_VOLUMES}
    vols: dict[tuple[str, str], dict[str, tuple[float, bool, str | None]]] = {}
    for m in meas[meas.name.isin(wanted)].itertuples():
        vols.setdefault((m.run_dir, m.case_key), {})[m.name] = (m.value, bool(m.reliable), m.reason)
    flags: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for f in quality.itertuples():
        flags.setdefault((f.run_dir, f.case_key), []).append((f.code, f.severity, f.message))
    rows = []
    for c in cases.itertuples():
        key = (c.run_dir, c.case_key)
        pngs: list[tuple[str, str]] = []
        if c.status == "done" and isinstance(c.output_dir, str):
            folder = Path(c.run_dir) / c.output_dir
            for p in sorted(folder.rglob("*.png")) if folder.is_dir() else ():
                name = p.relative_to(folder).as_posix().replace(f"{c.case_id}_", "")  # the row names the case already
                pngs.append((name, quote(os.path.relpath(p, out_dir).replace(os.sep, "/"))))
        rows.append(
            {
                "case_id": c.case_id,
                "run_dir": c.run_dir,
                "status": c.status,
                "latency_s": c.latency_s,
                "n_findings": c.n_findings if c.status == "done" else None,
                "volumes": vols.get(key, {}),
                "flags": flags.get(key, []),
                "detect_skipped": c.detect_skipped if isinstance(c.detect_skipped, str) else None,
                "reason": c.reason if isinstance(c.reason, str) else None,
                "pngs": pngs,
            }
        )
    return rows


#: Column titles of the statistics tables: the median named as such, beside the mean; the GPU figures in words with
#: their unit (report.json keeps the keys).
_STAT_TITLES = {
    "p50": "median (p50)",
    "util_mean_pct": "mean utilisation (%)",
    "util_max_pct": "max utilisation (%)",
    "mem_max_mb": "max memory used (MB)",
}


def _stat_table(rows: dict[str, dict[str, Any]], first: str) -> str:
    if not rows:
        return "<p>none</p>"
    cols = list(next(iter(rows.values())).keys())
    head = "".join(f"<th>{_e(_STAT_TITLES.get(c, c))}</th>" for c in [first, *cols])
    body = ""
    for name, r in rows.items():
        cells = "".join(
            f"<td>{'' if r[c] is None else (f'{r[c]:.3f}' if isinstance(r[c], float) else _e(r[c]))}</td>" for c in cols
        )
        body += f"<tr><td>{_e(name)}</td>{cells}</tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def _case_table(rows: list[dict[str, Any]], total: int) -> str:
    """The case table (``rows``: :func:`case_rows`), with a note when it shows fewer than the ``total`` cases."""
    if not rows:
        return "<p>no cases</p>"
    partial = (
        f"<p>{len(rows)} of {total} cases shown: those not done first, then those with a warning flag, then the most "
        "recent; cases.csv lists them all.</p>"
        if len(rows) < total
        else ""
    )
    head = "".join(
        f"<th>{t}</th>" for t in ["case", "status", "latency s", "findings", *(c for c, _ in LUNG_VOLUMES), "flags", "images"]
    )
    body = []
    for r in rows:
        vols = []
        for _, name in LUNG_VOLUMES:
            v = r["volumes"].get(name)
            if v is None:
                vols.append("<td></td>")
            elif v[1]:
                vols.append(f"<td>{_num(v[0], '{:.0f}')}</td>")
            else:
                vols.append(f'<td class="unreliable" title="{_e(v[2])}">{_num(v[0], "{:.0f}")}*</td>')
        flags = " ".join(f'<span class="{_e(sev)}" title="{_e(msg)}">{_e(code)}</span>' for code, sev, msg in r["flags"])
        note = (
            f"detection skipped: {r['detect_skipped']}" if r["detect_skipped"] else r["reason"] if r["status"] != "done" else None
        )
        if note:
            flags += f"<br><small>{_e(note)}</small>"
        links = " ".join(f'<a href="{href}">{_e(name)}</a>' for name, href in r["pngs"])
        body.append(
            f"<tr><td>{_e(r['case_id'])}</td><td>{_e(r['status'])}</td><td>{_num(r['latency_s'])}</td>"
            f"<td>{'' if r['n_findings'] is None or r['n_findings'] != r['n_findings'] else int(r['n_findings'])}</td>"
            f'{"".join(vols)}<td class="flags">{flags}</td><td class="links">{links}</td></tr>'
        )
    return partial + f'<table class="cases"><tr>{head}</tr>{"".join(body)}</table>'


def _skipped_table(sk: Any) -> str:
    if not len(sk):
        return "<p>nothing was skipped</p>"
    rows = "".join(
        f"<tr><td>{_e(r.what)}</td><td>{_e(r.item)}</td><td>{_e(r.kind)}</td><td>{_e(r.reason)}</td></tr>"
        for r in sk.head(SKIPPED_SHOWN).itertuples()
    )
    more = f"<p>and {len(sk) - SKIPPED_SHOWN} more in skipped.csv</p>" if len(sk) > SKIPPED_SHOWN else ""
    return f"<table><tr><th>what</th><th>file or series</th><th>kind</th><th>reason</th></tr>{rows}</table>{more}"


def _folder_cell(run: dict[str, Any], shown: bool) -> str:
    return f"<td>{_e(run['run_dir'])}</td>" if shown else ""


def active_time(seconds: float) -> str:
    """A run's active time as the runs table shows it: seconds under a minute (a short run is not "0.0" minutes),
    minutes under an hour, then hours."""
    if seconds < 59.95:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60.0:.1f} min" if seconds < 3600 else f"{seconds / 3600.0:.2f} h"


def _runs_table(runs: list[dict[str, Any]], cases: dict[str, int]) -> str:
    """Per run: status, start and end (UTC), active time (:func:`active_time`), device and its cases by outcome, and its run folder when
    the runs come from several; the last row counts each case once over all runs (``cases``: the summary's case
    counts)."""
    if not runs:
        return "<p>no runs</p>"
    folders = len({r["run_dir"] for r in runs}) > 1
    titles = ["run", *(["folder"] if folders else []), "status", "started (UTC)", "ended (UTC)", "active", "device"]
    titles += [
        "done",
        "quarantined",
        "unfinished",
        "still quarantined from earlier runs",
        "done again (counted where first done)",
    ]
    head = "".join(f"<th>{t}</th>" for t in titles)
    body = "".join(
        f"<tr><td>{_e(r['run_id'])}</td>{_folder_cell(r, folders)}<td>{_e(r['status'])}</td>"
        f"<td>{_e(r['started_utc'])}</td>"
        f"<td>{_e(r['ended_utc'] or 'no end record')}</td><td>{active_time(r['active_s'])}</td><td>{_e(r['device'])}</td>"
        f"<td>{r['n_done']}</td><td>{r['n_failed']}</td><td>{r['n_unfinished']}</td>"
        f"<td>{'unknown' if r.get('n_failed_earlier') is None else r['n_failed_earlier']}</td><td>{r['n_redone']}</td></tr>"
        for r in runs
    )
    total = (
        f'<tr><td>all runs (each case once)</td><td colspan="{6 if folders else 5}"></td><td>{cases["done"]}</td>'
        f"<td>{cases['failed']}</td><td>{cases['unfinished']}</td><td></td><td></td></tr>"
    )
    return f"<table><tr>{head}</tr>{body}{total}</table>"


def _quality_headline(q: dict[str, Any]) -> str:
    by = ", ".join(f"{_e(k)} {v}" for k, v in q["by_flag"].items())
    text = f"{q['flagged']} of {q['done']} completed case(s) flagged (warnings)"
    if q.get("detect_skipped"):
        text += f"; detection skipped in {q['detect_skipped']} (no lungs in the scan)"
    return text + (f". Flags: {by}." if by else ".")


def _capacity(c: dict[str, Any]) -> str:
    """The capacity model's section: per-stage busy time, the two groups' rates, the assumptions."""
    if c["cases_per_day"] is None:  # nothing completed: no rate, no bottleneck, no table of stages
        return f"<p>{_e(c['text'])}.</p>"
    rows = "".join(
        f"<tr><td>{_e(name)}</td><td>{_e(v['group'])}</td><td>{v['busy_s']:.3f}</td><td>{v['passes']}</td></tr>"
        for name, v in c["stages"].items()
    )
    ref = c["reference_deployment"]
    where = f"{c['cpu_workers_per_node']} CPU worker(s) per node"
    if c.get("gpu_recorded", True):
        figures = (
            f"<p>{c['gpus']} GPU(s) over {c['nodes']} node(s), {where}: "
            f"<b>{_num(c['cases_per_day'], '{:,.0f}')}</b> cases/day, {_num(c['cases_per_gpu_day'], '{:,.0f}')} "
            f"cases/GPU/day; reference deployment {ref['cases_per_day']:,} cases/day on {ref['gpus']} {_e(ref['gpu'])}s = "
            f"{ref['cases_per_gpu_day']:,.0f} cases/GPU/day. Bottleneck: {_e(c['bottleneck'] or 'none')} stages "
            f"(model {c['model_busy_s_per_case']:.2f} s/case per GPU, CPU {c['cpu_busy_s_per_case']:.2f} core-s/case).</p>"
        )
    else:
        figures = (
            f"<p>{c['gpus']} model worker(s) over {c['nodes']} node(s), {where}: "
            f"<b>{_num(c['cases_per_day'], '{:,.0f}')}</b> cases/day. Bottleneck: {_e(c['bottleneck'] or 'none')} stages "
            f"(model {c['model_busy_s_per_case']:.2f} s/case per model worker, CPU {c['cpu_busy_s_per_case']:.2f} "
            "core-s/case). No GPU recorded: the model stages ran on the CPU; no per-GPU figure or comparison with the reference.</p>"
        )
    notes = "".join(f"<li>{_e(a)}</li>" for a in c["assumptions"] if c.get("gpu_recorded", True) or "GPU" not in a)
    if not c["enough_to_project"]:
        notes += "<li>too few to project from (see the cases/day headline): indicative only</li>"
    return (
        f"{figures}<table><tr><th>stage</th><th>group</th><th>busy s/case</th><th>successful attempts</th></tr>{rows}</table>"
        f"<ul>{notes}</ul>"
    )


def _copies_note(copies: list[dict[str, str]]) -> str:
    """The page's note on runs found in several of the report's folders (copies), each counted once."""
    if not copies:
        return ""
    items = "".join(f"<li>run {_e(c['run_id'])} of {_e(c['kept_in'])} is also in {_e(c['run_dir'])}</li>" for c in copies)
    return (
        "<p><b>Copied runs, counted once:</b> these runs appear in more than one of the folders (a run folder copied "
        f"or synced elsewhere); their cases and times are counted in the first folder only.</p><ul>{items}</ul>"
    )


def _left_out_note(left_out: list[dict[str, Any]]) -> str:
    """The page's count of the paths given that were not run folders (a log file, an earlier report), left out, per
    reason (never their names: one may be named after a patient)."""
    if not left_out:
        return ""
    items = "".join(f"<li>{int(e['count'])} path(s): {_e(e['reason'])}</li>" for e in left_out)
    return f"<p><b>Left out, not run folders:</b></p><ul>{items}</ul>"


def _others_note(others: list[dict[str, Any]]) -> str:
    """The page's list of attempts at a series in another folder than the one it is counted in (at most
    :data:`CASES_SHOWN`; ``other_attempts.csv`` has them all)."""
    if not others:
        return ""
    rows = "".join(
        f"<tr><td>{_e(e['case_id'])}</td><td>{_e(e['run_dir'])}</td><td>{_e(e['ended_utc'])}</td><td>{_e(e['status'])}</td>"
        f"<td>{_e(e['error_class'])}</td><td>{_e(e['reason'])}</td><td>{_e(e['counted_in'])}</td><td>{_e(e['counted_status'])}</td></tr>"
        for e in others[:CASES_SHOWN]
    )
    more = len(others) - CASES_SHOWN
    return (
        "<h3>Series tried in several run folders, counted once</h3><p>Each series is one case, counted at its first "
        "completion, else as its latest attempt; these attempts in other folders are not counted (e.g. a quarantine "
        "the night before it was done, or the series processed again).</p><table><tr><th>case</th><th>folder</th><th>ended (UTC)</th><th>status</th>"
        f"<th>error class</th><th>reason</th><th>counted in</th><th>counted as</th></tr>{rows}</table>"
        + (f"<p>and {more} more in other_attempts.csv</p>" if more > 0 else "")
    )


#: Why a plot is missing from the page: nothing was measured that it could show (see ``report_plots.draw_plots``).
NO_PLOT = {
    "throughput": "no case completed",
    "latency": "no stage completed",
    "stages": "no stage completed",
    "gpu": "no GPU samples",
}


#: The run-status banner of the page sits between these markers (:func:`status_banner`), so that a run starting can
#: replace it in the page written before it (:func:`pipeline.runner.report.mark_run_started`).
STATUS_START, STATUS_END = "<!-- run-status -->", "<!-- /run-status -->"


def status_banner(status: dict[str, Any]) -> str:
    """The page's run-status line (``status``: :func:`.report_runs.run_state`'s, possibly with a ``note``),
    between its markers."""
    state = str(status.get("state", "none"))
    text = str(status.get("text", ""))
    if status.get("note"):
        text += f"; {status['note']}"
    style = {"in_progress": "background:#fff3c4", "interrupted": "background:#fde2b8"}.get(state, "")
    if not style and status.get("figures_current") is False:  # an older run's figures, not rebuilt since
        style = "background:#fde2b8"
    return f'{STATUS_START}<p class="run-status {_e(state)}" style="{style}"><b>Run status:</b> {_e(text)}</p>{STATUS_END}'


def _day_rows(per_day: dict[str, int], no_run: list[str], redone: dict[str, int]) -> str:
    """Rows of a daily table: day, new cases, cases done again, the two together (the cases worked on), and "no run"
    on a day no run was active (not "ran, did nothing")."""
    return "".join(
        f"<tr><td>{_e(d)}</td><td>{n}</td><td>{redone.get(d, 0)}</td><td>{n + redone.get(d, 0)}</td>"
        f"<td>{'no run' if d in no_run else 'ran'}</td></tr>"
        for d, n in per_day.items()
    )


#: The daily tables' columns after the day's.
DAY_COLUMNS = "<th>new cases</th><th>done again</th><th>all cases worked</th><th>run</th>"


def render_html(summary: dict[str, Any], plots: dict[str, str], rows: list[dict[str, Any]], skipped: Any) -> str:
    """The report page (see the module docstring)."""
    s = summary
    img = lambda k, alt: (  # noqa: E731
        f'<img alt="{alt}" src="data:image/png;base64,{plots[k]}">' if k in plots else f"<p>no plot: {NO_PLOT[k]}</p>"
    )
    fails = "".join(
        f"<tr><td>{_e(f['case_id'])}</td><td>{_e(f['stage'])}</td><td>{_e(f['error_class'])}</td><td>{_e(f['reason'])}</td></tr>"
        for f in s["failed_cases"][:CASES_SHOWN]
    )
    more = len(s["failed_cases"]) - CASES_SHOWN
    fails_more = f"<p>and {more} more in failures.csv</p>" if more > 0 else ""
    tp = s["throughput"]
    daily = _day_rows(tp["per_day_utc"], tp.get("days_without_run_utc", []), tp.get("redone_per_day_utc", {}))
    local = _day_rows(tp.get("per_day_local", {}), tp.get("days_without_run_local", []), tp.get("redone_per_day_local", {}))
    again_h = tp.get("cases_redone_per_hour", 0.0)
    work = f"{tp['cases_per_hour']:.1f} new cases and {again_h:.1f} done again per active hour, {tp['cases_per_hour'] + again_h:.1f} in all"
    sk = s["skipped"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ctpipe throughput report</title>
<style>body{{font-family:sans-serif;max-width:72em;margin:2em auto;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:right}}th{{background:#f4f4f4}}td:first-child{{text-align:left}}
td.flags,td.links{{text-align:left}}.warning{{background:#fde2b8;padding:0 .3em}}.info{{background:#dde9f7;padding:0 .3em}}
td.unreliable{{color:#a05a00}}.big{{font-size:1.3em}}</style></head><body>
<h1>ctpipe throughput report</h1>
{status_banner(s["status"]) if "status" in s else ""}
<p>Runs: {s["runs"]} in {_e(", ".join(s["run_dirs"]))} &middot; devices: {_e(", ".join(s["devices"]) or "?")}
&middot; generated {_e(s["generated_at"])}</p>
{_left_out_note(s.get("left_out") or [])}
{_copies_note(s.get("copied_runs") or [])}
<p class="big"><b>{_e(s["projection"])}</b></p>
<p>{_e(s["capacity"]["text"])}</p>
<p class="big">{_quality_headline(s["quality"])}</p>
<p>Cases: {s["cases"]["done"]} done, {s["cases"]["failed"]} quarantined (failed: listed with the reason and the fix under Failures), {s["cases"]["unfinished"]} unfinished
({s["cases"].get("interrupted", 0)} interrupted), of {s["cases"]["total"]}. Discovery skipped {sk["files"]} file(s) and {sk["series"]} series (listed below).</p>
<h2>Runs</h2>
<p>Each case is counted once. In one run folder, a completed case in the run that first completed it (as the daily
tables count it, on the day its results were first published), any other case in the run that last worked on it: a
run resumed after a kill does not count again what the killed run finished, and a case done again because its
published folder was removed counts under "done again" in the run that redid it, not as a new case. A series found in several run folders (a nightly run into a
folder of its own meeting a series again) is counted at its first completion: in that run and on the day its results
were first published; a later completion, or a failure before it, is listed under "Series tried in several run
folders" and not counted again (its time still counts as active time). A run killed without an end record is
interrupted once a later run started or its process is gone; so is the case it was working on.</p>
{_runs_table(s["runs_table"], s["cases"])}
<h2>Cases</h2>
<p>Lung volumes marked * are unreliable (a quality flag, e.g. lungs cut by the scan range, makes them meaningless;
hover for the reason). Flags: <span class="warning">warning</span> <span class="info">info</span>; hover for details.</p>
{_case_table(rows, s["cases"]["total"])}
<h2>Capacity model</h2>{_capacity(s["capacity"])}
<h3>How these figures are computed</h3>
<p>{_e(s["throughput"].get("method", ""))}.</p><p>{_e(s["capacity"].get("method", ""))}.</p>
<h2>Throughput</h2>{img("throughput", "throughput over time")}
<p>Work done: {_e(work)} ({tp.get("cases_redone", 0)} case(s) done again in all: their published folder removed, each
counted at its latest completion; no new case, so not in the rates and projections above, which count new cases).
Cases per calendar day, local time ({_e(tp.get("timezone", "?"))}) and UTC: new cases (completed for the first time),
cases done again, and the two together, the cases worked on:</p>
<table style="display:inline-table;margin-right:2em"><tr><th>day ({_e(tp.get("timezone", "?"))})</th>{DAY_COLUMNS}</tr>{local}</table>
<table style="display:inline-table"><tr><th>day (UTC)</th>{DAY_COLUMNS}</tr>{daily}</table>
<h2>Latency (seconds)</h2>{_stat_table(s["latency_s"], "stage")}
<p>n: completed cases for end_to_end, successful runs of the stage for each stage (these include the stages a
quarantined case passed before the one that failed, and those of a series also run in another run folder). mean: the
average; median (p50): half of them took at most this long; p90, p99: 90% and 99% of them did.</p>
<p>Wall time against summed stage time: {_e(s["overlap"]["text"])}. Summed stage time counts {_e(COUNTED_ATTEMPTS)}.</p>{img("latency", "latency histogram")}
<h2>Stage breakdown</h2>{img("stages", "stage breakdown")}
<h3>Queue wait (seconds)</h3>{_stat_table(s["queue_wait_s"], "stage")}
<h2>Failures by reason</h2>{_stat_table({k: {"cases": v} for k, v in s["failures_by_reason"].items()}, "error class")}
{f"<table><tr><th>case</th><th>stage</th><th>error class</th><th>reason</th></tr>{fails}</table>" if fails else ""}{fails_more}
{_others_note(s.get("other_attempts") or [])}
<h2>Skipped by discovery</h2>{_skipped_table(skipped)}
{"<h2>GPU</h2>" + _stat_table(s["gpu"], "gpu") + img("gpu", "GPU utilisation") if s["gpu"] else ""}
</body></html>
"""
