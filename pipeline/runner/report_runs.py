"""Runs as a throughput report shows them (:mod:`.report_summary`): whether its figures are current
(:func:`run_state`: each folder's latest run in progress, interrupted or ended) and the rows of ``runs.csv``
(:func:`runs_table`: per run its status, times (ISO 8601 UTC), active seconds, counts and where
``n_failed_earlier`` comes from)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .tables import utc_text


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


def runs_table(runs: Any, cases: Any, finished_in: Any, durations: dict[str, float]) -> list[dict[str, Any]]:
    """One row per run: status as the report shows it, start and end (ISO 8601 UTC; no end record: None), active
    time (s) and its cases by outcome, each case counted in one run only: a done case in the run that first completed
    it (:func:`first_completion_run`), as the day tables count it on the day it was first done, others in the run of
    their latest attempt (``finished_in``: :func:`.tables.finishing_run`); ``n_redone``: done cases this run did again
    (their published folder was removed), counted as done in the run that first completed them, not here; ``n_failed_earlier``: the cases quarantined by earlier runs that it
    left as they were (not retried), and where that figure comes from (:func:`_failed_earlier`). A case that no run
    started is unfinished in the latest run of its folder, the run that left it."""
    latest = runs.sort_values("started_at").groupby("run_dir").run_id.last()
    finished_in = finished_in.where(finished_in.notna(), cases.run_dir.map(latest))
    first_in = first_completion_run(cases, runs).fillna(finished_in)
    done = cases.status == "done"
    credited = finished_in.where(~done, first_in)  # a done case counts in the run that first completed it
    outcome = cases.status.map({"done": "n_done", "failed": "n_failed"}).fillna("n_unfinished")
    counts = outcome.groupby([cases.run_dir, credited]).value_counts().to_dict() if len(cases) else {}
    redone = done & (finished_in != first_in)  # done again by its latest run: a redo in that run, not a new case
    if redone.any():
        counts.update({(d, r, "n_redone"): n for (d, r), n in cases[redone].groupby([cases.run_dir, finished_in]).size().items()})
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
                **{
                    k: int(counts.get((r["run_dir"], r["run_id"], k), 0))
                    for k in ("n_done", "n_failed", "n_unfinished", "n_redone")
                },
                **_failed_earlier(r, cases, latest),
            }
        )
    return rows


def first_completion_run(cases: Any, runs: Any) -> Any:
    """The run that first completed each done case (index of ``cases``; None for a case not done, or done before any
    run of its folder started): the latest run of the case's folder started at or before the case's
    ``first_done_at`` (Unix s). The runs of one folder follow each other (the folder's lock), so it is the run at
    work when the case was first published, also when a later run did it again after its published folder was
    removed, or when a run recovered it from the folder a killed run published."""
    import pandas as pd

    out = pd.Series([None] * len(cases), index=cases.index, dtype=object)
    first = pd.to_numeric(cases.first_done_at, errors="coerce")
    for run_dir, group in runs.sort_values("started_at").groupby("run_dir", sort=False):
        mine = (cases.run_dir == run_dir) & (cases.status == "done") & first.notna()
        if not mine.any():
            continue
        starts = group.started_at.to_numpy(dtype=float)
        i = np.searchsorted(starts, first[mine].to_numpy(dtype=float), side="right") - 1
        ids = group.run_id.to_numpy(dtype=object)
        out[mine] = [ids[j] if j >= 0 else None for j in i]
    return out


def _failed_earlier(run: Any, cases: Any, latest: Any) -> dict[str, Any]:
    """``n_failed_earlier`` of ``run`` (a row of ``runs``): the cases quarantined by earlier runs of its folder that
    it left as they were, and ``n_failed_earlier_from``, where that figure comes from: ``end record`` (as the run
    recorded it at its end), ``run store`` (a run without an end record, killed or under way, that is the latest of
    its folder: the store is as it left it, so the figure is counted as its end would have counted it: the quarantined
    cases its discovery found (``cases.found_by``) whose latest attempt is not this run's; a folder into which runs of
    other sources write holds quarantined cases this run never looked at, which its end would not have counted), or
    ``unknown`` (None: a later run of the folder has retried or quarantined cases since, and the store keeps no earlier
    state; or a store of an earlier version). A store written before ``cases.found_by`` (schema version 8) counts
    every quarantined case of the folder."""
    if _finite_time(run["ended_at"]):
        n = _count(run.get("n_failed_earlier"))
        return {"n_failed_earlier": n, "n_failed_earlier_from": "end record" if n is not None else "unknown"}
    if latest.get(run["run_dir"]) != run["run_id"]:
        return {"n_failed_earlier": None, "n_failed_earlier_from": "unknown"}
    folder = cases[cases.run_dir == run["run_dir"]]
    mine = folder[folder.status == "failed"]
    if folder.found_by.notna().any():  # the store records what each run found
        mine = mine[mine.found_by == run["run_id"]]
    return {"n_failed_earlier": int((mine.run_id != run["run_id"]).sum()), "n_failed_earlier_from": "run store"}
