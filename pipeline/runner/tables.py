"""The run store's tables as pandas DataFrames (read-only; what reports and ``open_run`` read).

Times are Unix seconds (UTC), with ``started``/``ended`` columns added as UTC
timestamps; finding centres are DICOM patient coordinates (LPS, mm). A store of
an earlier schema version (before quality flags and skipped files were kept)
reads with those columns empty.

:func:`run_status`, :func:`case_status` and :func:`finishing_run` read the tables as a report shows them: a run
killed without an end record is ``interrupted`` once a later run of its folder started or its process is gone,
and so is a case it left ``running``; each case belongs to the run of its latest attempt.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .store import open_readonly

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: Columns of later schema versions, with the value older stores read as.
_LATER_COLUMNS: dict[str, dict[str, object]] = {
    "cases": {
        "lung_coverage": None,
        "contrast_phase": None,
        "flags": None,
        "detect_skipped": None,
        "first_done_at": None,
        "found_by": None,
        "origin": None,
        "origin_via": None,
        "origin_study_uid": None,
        "origin_series_uid": None,
    },
    "measurements": {"reliable": 1, "reason": None},
    "runs": {"n_failed_earlier": None, "active_s": None, "active_at": None},
}
_EMPTY = {
    "quality": ["case_key", "code", "severity", "message", "case_id"],
    "skipped": ["run_id", "what", "item", "kind", "reason", "source"],
    "deliveries": ["sop_uid", "destination", "case_id", "sop_class", "state", "attempts", "error", "updated_at"],
}
#: A case's origin (schema version 3: where a PACS delivered it from), joined to its row of ``cases``.
_CASES_WITH_ORIGIN = (
    "SELECT c.*, o.remote AS origin, o.via AS origin_via, o.study_uid AS origin_study_uid,"
    " o.series_uid AS origin_series_uid FROM cases c LEFT JOIN origins o USING (case_key) ORDER BY c.case_id"
)


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def read_tables(run_dir: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    """The store's tables as DataFrames: runs, cases, stages (attempts), findings, measurements, gpu,
    quality (one row per flag of a completed case), skipped (what discovery left out, per run) and
    deliveries (DICOM results sent to a PACS); ``cases`` has the origin of PACS-delivered cases
    (``origin``, ``origin_via``, ``origin_study_uid``, ``origin_series_uid``; empty for folders)."""
    import pandas as pd

    run_dir = Path(run_dir)
    db = open_readonly(run_dir)

    def q(sql: str) -> pd.DataFrame:
        return pd.read_sql_query(sql, db)

    try:
        have = _tables(db)
        runs = q("SELECT * FROM runs ORDER BY started_at")
        cases = q(_CASES_WITH_ORIGIN if "origins" in have else "SELECT * FROM cases ORDER BY case_id")
        stages = q("SELECT a.*, c.case_id FROM stage_attempts a JOIN cases c USING (case_key) ORDER BY a.id")
        fnd = q("SELECT f.*, c.case_id FROM findings f JOIN cases c USING (case_key) ORDER BY c.case_id, f.idx")
        meas = q("SELECT m.*, c.case_id FROM measurements m JOIN cases c USING (case_key) ORDER BY c.case_id, m.name")
        gpu = q("SELECT * FROM gpu_samples ORDER BY t")
        quality = (
            q("SELECT f.*, c.case_id FROM quality_flags f JOIN cases c USING (case_key) ORDER BY c.case_id, f.code")
            if "quality_flags" in have
            else pd.DataFrame(columns=_EMPTY["quality"])
        )
        skipped = (
            q("SELECT s.* FROM skipped s LEFT JOIN runs r USING (run_id) ORDER BY r.started_at, s.what, s.item")
            if "skipped" in have
            else pd.DataFrame(columns=_EMPTY["skipped"])
        )
        deliveries = (
            q("SELECT * FROM deliveries ORDER BY updated_at, sop_uid")
            if "deliveries" in have
            else pd.DataFrame(columns=_EMPTY["deliveries"])
        )
    finally:
        db.close()
    for name, df in (("cases", cases), ("measurements", meas), ("runs", runs)):
        for col, value in _LATER_COLUMNS[name].items():
            if col not in df:
                df[col] = value
    meas["reliable"] = meas["reliable"].fillna(1).astype(bool)
    # a store of a ctpipe before first_done_at: its done cases were first done at their recorded end
    first = pd.to_numeric(cases.first_done_at, errors="coerce").astype(float)
    ended = pd.to_numeric(cases.ended_at, errors="coerce").astype(float)
    cases["first_done_at"] = first.where(cases.status != "done", first.fillna(ended))
    if len(fnd):
        extra = pd.json_normalize([json.loads(d) for d in fnd.pop("data")])
        extra = extra.drop(columns=[c for c in extra.columns if c in fnd.columns], errors="ignore")
        fnd = pd.concat([fnd.reset_index(drop=True), extra], axis=1)
    else:
        fnd = fnd.drop(columns=["data"])
    for df in (runs, cases, stages, fnd, meas, quality, skipped, deliveries):
        df.insert(0, "run_dir", str(run_dir))
    for col in ("started_at", "ended_at"):
        for df in (runs, cases, stages):
            if col in df:
                df[col.replace("_at", "")] = pd.to_datetime(df[col], unit="s", utc=True)
    cols = ["run_dir", "case_id"] + [c for c in fnd.columns if c not in ("run_dir", "case_id", "case_key")] + ["case_key"]
    fnd = fnd[cols] if len(fnd.columns) else fnd
    qcols = ["run_dir", "case_id", "code", "severity", "message", "case_key"]
    quality = quality[qcols]
    return {
        "runs": runs,
        "cases": cases,
        "stages": stages,
        "findings": fnd,
        "measurements": meas,
        "gpu": gpu,
        "quality": quality,
        "skipped": skipped,
        "deliveries": deliveries,
    }


def read_runs(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The store's ``runs`` table alone (read-only), with ``run_dir`` (absolute, as a report names its folders) and
    ``status`` as a report shows it (:func:`run_status`): what the report's run status
    (:func:`.report_runs.run_state`) rests on."""
    import pandas as pd

    db = open_readonly(Path(run_dir))
    try:
        runs = pd.read_sql_query("SELECT * FROM runs ORDER BY started_at", db)
    finally:
        db.close()
    runs.insert(0, "run_dir", str(Path(run_dir).resolve()))
    runs["status"] = run_status(runs)
    return runs


# -- the tables as a report shows them -------------------------------------------------------------------------------
def _process_start(pid: int) -> float | None:
    """When process ``pid`` of this host started (Unix s), or None where that cannot be read (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _process_state(pid: object, host: object, since: float) -> str:
    """``alive``, ``gone`` or ``unknown``: the process ``pid`` of ``host`` that started a run at ``since`` (Unix s).
    Only this host's processes can be checked (another host's: unknown); a process of that id that started after
    the run did is another one (the id was reused: gone)."""
    try:
        n = int(pid)  # type: ignore[call-overload]  # a number from the runs table, or None / NaN
    except (TypeError, ValueError):  # none recorded
        return "unknown"
    if host != socket.gethostname() or n <= 0:
        return "unknown"
    try:
        os.kill(n, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:  # it exists, as another user's process
        pass
    except OSError:
        return "unknown"
    started = _process_start(n)
    return "gone" if started is not None and started > since + 1.0 else "alive"


def process_gone(pid: object, host: object, *, since: float) -> bool:
    """Whether the process ``pid`` of ``host`` that started a run at ``since`` (Unix s) has certainly ended (see
    :func:`_process_state`)."""
    return _process_state(pid, host, since) == "gone"


def process_alive(pid: object, host: object, *, since: float) -> bool:
    """Whether the process ``pid`` of ``host`` that started a run at ``since`` (Unix s) certainly still runs (see
    :func:`_process_state`)."""
    return _process_state(pid, host, since) == "alive"


def run_status(runs: pd.DataFrame) -> pd.Series:
    """Each run's status (index of ``runs``): as recorded, except that a run without an end record that a later
    run of its folder followed, or whose process is gone, is ``interrupted`` (it was killed)."""
    out = runs.status.copy()
    for i, r in runs.iterrows():
        if r["status"] != "running" or _finite(r["ended_at"]):
            continue
        later = (runs.run_dir == r["run_dir"]) & (runs.started_at > r["started_at"])
        if later.any() or process_gone(r.get("pid"), r.get("host"), since=float(r["started_at"])):
            out.at[i] = "interrupted"
    return out


def case_status(cases: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """Each case's status (index of ``cases``): as recorded, except that a case left ``running`` by a run that is
    no longer running (``runs.status`` as :func:`run_status` gives it) is ``interrupted``."""
    import pandas as pd

    status = dict(zip(zip(runs.run_dir, runs.run_id), runs.status))
    stopped = [
        s == "running" and status.get((d, r), "running") != "running"
        for d, r, s in zip(cases.run_dir, cases.run_id, cases.status)
    ]
    return cases.status.mask(pd.Series(stopped, index=cases.index, dtype=bool), "interrupted")


def unfinished_reasons(
    cases: pd.DataFrame, runs: pd.DataFrame, stages: pd.DataFrame, *, left: Mapping[tuple[str, str], str] | None = None
) -> pd.Series:
    """Each case's ``reason`` (index of ``cases``), with the unfinished cases that have none named: a case
    ``interrupted`` (:func:`case_status`) by the stage its run stopped at, a case ``pending`` that no run started by the
    latest run of its folder, a case ``running`` by its stage in the run in progress; each with what to do. A
    recorded reason (a quarantine, a release) is kept. ``runs.status`` and ``cases.status`` as the report shows them.
    ``left``: (run folder, case id) → the command that adopts the case's folder, of the folders a run killed as it
    recorded their case left in place (:func:`pipeline.runner.left_unsent.left_cases`): such a case is named with it
    (a later run whose sources did not hold its series left it as it is)."""
    import pandas as pd

    recorded = cases.reason if "reason" in cases else pd.Series(None, index=cases.index, dtype=object)
    has_reason = recorded.map(lambda r: isinstance(r, str) and r != "")
    need = cases[cases.status.isin(("interrupted", "pending", "running")) & ~has_reason]
    out = recorded.astype(object).copy()
    if not len(need):
        return out
    # (folder, case key, attempt) -> its stage still at work or stopped, and the last stage it finished (recorded at
    # a stage's end: a stage stopped in a worker process may have no row)
    at: dict[tuple[str, str, int], str] = {}
    last_ok: dict[tuple[str, str, int], str] = {}
    mine = stages[stages.case_key.isin(set(need.case_key))].sort_values("id")
    for d, k, n, stage, st in mine[["run_dir", "case_key", "attempt", "stage", "status"]].itertuples(index=False):
        key = (str(d), str(k), int(n))
        if st in ("running", "interrupted"):
            at[key] = str(stage)
        elif st == "ok":
            last_ok[key] = str(stage)
    latest = {
        str(d): (str(r), str(st))
        for d, r, st in runs.sort_values("started_at")[["run_dir", "run_id", "status"]].itertuples(index=False)
    }
    fin = finishing_run(need, mine)
    again = "not quarantined: the same ctpipe run command analyses it (no --retry-failed needed)"
    rows = zip(need.index, need.run_dir, need.case_key, need.case_id, need.attempts, need.status, fin)
    for i, d, k, cid, n, status, run_id in rows:
        key = (str(d), str(k), int(n) if pd.notna(n) else 0)
        stage, done_stage = at.get(key), last_ok.get(key)
        where = (
            f" at stage {stage}"
            if stage
            else f" at work (its last finished stage: {done_stage})"
            if done_stage
            else " at work (before its first stage finished)"
        )
        last_id, last_status = latest.get(str(d), ("?", "?"))
        adopt = (left or {}).get((str(d), str(cid)))
        if adopt is not None and status != "running":
            out[i] = _left_reason(str(cid), run_id, last_id, adopt)
        elif status == "interrupted":
            out[i] = f"run {run_id} stopped while the case was{where}; {again}"
        elif status == "running":
            out[i] = f"at work{where} in run {run_id}, in progress"
        elif last_status == "running":
            out[i] = f"waiting: run {last_id} is in progress"
        elif last_status == "interrupted":
            out[i] = f"not started: run {last_id} stopped before it reached the case; {again}"
        else:  # the latest run completed without it: its series was not among that run's sources
            out[i] = (
                f"not analysed: the latest run, {last_id}, completed without it (its series was not found in that run's "
                "sources: moved or removed); ctpipe run with the folder that holds it analyses it"
            )
    return out


def _left_reason(case_id: str, run_id: str, last_id: str, adopt: str) -> str:
    """Why a case whose folder a run killed as it recorded the case left in place is unfinished, and the command
    ``adopt`` that adopts the folder (a later run leaves it when its sources do not hold the case's series)."""
    later = (
        f"; the latest run, {last_id}, left it as it is: its series was not among that run's sources"
        if last_id not in (run_id, "?")
        else ""
    )
    return (
        f"not quarantined: run {run_id} was stopped as it recorded the case, its results in place in cases/{case_id} "
        f"but not recorded{later}; {adopt} checks its series in the source and adopts them (no --retry-failed needed)"
    )


def finishing_run(cases: pd.DataFrame, stages: pd.DataFrame) -> pd.Series:
    """The run id of each case's latest attempt (index of ``cases``): the run whose stage attempts carry the case's
    attempt number (``cases.attempts``), else the case's own ``run_id`` (that attempt recorded no stage yet)."""
    import pandas as pd

    latest: dict[tuple[str, str], tuple[int, str]] = {}
    for d, k, n, r in stages.sort_values(["attempt", "id"])[["run_dir", "case_key", "attempt", "run_id"]].itertuples(index=False):
        latest[(d, k)] = (int(n), r)
    runs = []
    for d, k, n, r in zip(cases.run_dir, cases.case_key, cases.attempts, cases.run_id):
        seen = latest.get((d, k))
        runs.append(seen[1] if seen is not None and seen[0] >= n else r)
    return pd.Series(runs, index=cases.index, dtype=object)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


def utc_text(seconds: pd.Series) -> pd.Series:
    """Unix seconds as ISO 8601 UTC text (``2026-12-04T10:15:03Z``, whole seconds); missing times as None."""
    import pandas as pd

    stamps = pd.to_datetime(pd.to_numeric(seconds, errors="coerce"), unit="s", utc=True)
    return stamps.dt.strftime("%Y-%m-%dT%H:%M:%SZ").astype(object).where(stamps.notna(), None)


def drop_copies(t: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[dict[str, str]]]:
    """The combined tables of several run folders (``t``: :func:`read_tables` of each, concatenated in the order the
    folders were given) with what a copied run folder repeats counted once.

    A run id names one run: a run found in several folders (a folder copied, backed up or synced elsewhere and named
    beside the original) is kept in the first folder that holds it, and its rows elsewhere (the run, its stage
    attempts, skipped files and GPU samples) are dropped. A case row whose latest attempt is such a dropped run is
    dropped too, and so is a case row that another folder sharing that run carries on with a later attempt (the copy
    was resumed): each case of a shared history counts once, with its latest outcome. Runs and cases of a folder's
    own are kept. Returns the tables and one entry per dropped run (``run_id``, ``run_dir``: the copy, ``kept_in``).
    """
    runs, cases, stages = t["runs"], t["cases"], t["stages"]
    first: dict[str, str] = {}
    for d, r in zip(runs.run_dir, runs.run_id):
        first.setdefault(str(r), str(d))
    dropped = {(str(d), str(r)) for d, r in zip(runs.run_dir, runs.run_id) if first[str(r)] != str(d)}
    if not dropped:
        return t, []
    folder_runs: dict[str, set[str]] = {}
    for d, r in zip(runs.run_dir, runs.run_id):
        folder_runs.setdefault(str(d), set()).add(str(r))
    fin = finishing_run(cases, stages)
    attempts: dict[str, list[tuple[str, int]]] = {}  # case key -> (folder, attempt) of each folder holding it
    for d, k, n in zip(cases.run_dir, cases.case_key, cases.attempts):
        attempts.setdefault(str(k), []).append((str(d), int(n)))
    keep_case = []
    for d, k, n, f in zip(cases.run_dir, cases.case_key, cases.attempts, fin):
        d, f = str(d), str(f)
        resumed_elsewhere = any(od != d and on > int(n) and f in folder_runs[od] for od, on in attempts[str(k)])
        keep_case.append((d, f) not in dropped and not resumed_elsewhere)
    kept_cases = _rows(cases, keep_case)
    kept_pairs = set(zip(kept_cases.run_dir.astype(str), kept_cases.case_key.astype(str)))

    def own_run(df: pd.DataFrame) -> pd.DataFrame:
        return _rows(df, [(str(d), str(r)) not in dropped for d, r in zip(df.run_dir, df.run_id)])

    def kept_case(df: pd.DataFrame) -> pd.DataFrame:
        return _rows(df, [(str(d), str(k)) in kept_pairs for d, k in zip(df.run_dir, df.case_key)])

    out = {
        **t,
        "runs": own_run(runs),
        "cases": kept_cases,
        "stages": own_run(stages),
        "findings": kept_case(t["findings"]),
        "measurements": kept_case(t["measurements"]),
        "quality": kept_case(t["quality"]),
        "skipped": own_run(t["skipped"]),
        "gpu": t["gpu"].drop_duplicates(subset=["run_id", "t", "gpu"]),
    }
    copies = [{"run_id": r, "run_dir": d, "kept_in": first[r]} for d, r in sorted(dropped)]
    return out, copies


def _rows(df: pd.DataFrame, keep: list[bool]) -> pd.DataFrame:
    """The rows of ``df`` where ``keep`` is true (an empty ``df`` stays itself, columns and all)."""
    import pandas as pd

    return df[pd.Series(keep, index=df.index, dtype=bool)]


def series_identity(cases: pd.DataFrame) -> pd.Series:
    """Each case's series (index of ``cases``): its SeriesInstanceUID (with the part of a split series), else, for a
    case without one (a worklist row whose files were missing), its ``case_key``."""
    import pandas as pd

    ids = [u if isinstance(u, str) and u else str(k) for u, k in zip(cases.series_uid, cases.case_key)]
    return pd.Series(ids, index=cases.index, dtype=object)


def drop_other_attempts(t: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[dict[str, Any]]]:
    """The combined tables of several run folders (after :func:`drop_copies`) with each series counted once.

    Nightly runs into a new folder each (``ctpipe run SOURCE --out RUNS/<date>``) meet the same series again: one
    quarantined one night is retried and completed the next, in another folder; one still in the source is processed
    again. Of the case rows of one series (:func:`series_identity`) in several folders, the report counts one: its
    first completion (by end time), else its latest attempt (by end, else start time), so that cases are distinct
    series and each is counted on the day it was first done. The rows of that series in the other folders are
    dropped, with their findings, measurements and quality flags; their runs and stage attempts stay (the time was
    spent). Returns the tables and one entry per dropped row (``case_id``, ``series_uid``, ``run_dir``, ``run_id``,
    ``status``, ``error_class``, ``reason``, ``ended_utc``: ISO 8601 UTC, and ``counted_in`` / ``counted_status``: the
    folder and outcome of the row counted), oldest first.
    """
    cases = t["cases"]
    if not len(cases) or cases.run_dir.nunique() < 2:
        return t, []
    ident = series_identity(cases)
    done = (cases.status == "done").to_numpy()
    ended_at = cases.first_done_at.where(done, cases.ended_at)  # a completion counts at the first one
    when = ended_at.fillna(cases.started_at).fillna(cases.discovered_at).fillna(0.0)
    # the first completion first, else the latest attempt: sorted on (done, -end) for completions, (not done, end)
    rank = cases.assign(_id=ident, _done=done.astype(int), _order=[-w if d else w for w, d in zip(when.astype(float), done)])
    best = rank.sort_values(["_done", "_order"], kind="stable").groupby("_id").tail(1)
    counted = {i: (str(d), str(s)) for i, d, s in zip(best._id, best.run_dir, best.status)}
    keep = [counted[i][0] == str(d) for i, d in zip(ident, cases.run_dir)]
    if all(keep):
        return t, []
    ended = utc_text(cases.ended_at.fillna(cases.started_at))
    dropped = [
        (
            (float(w), str(r.case_id)),
            {
                "case_id": str(r.case_id),
                "series_uid": r.series_uid if isinstance(r.series_uid, str) else None,
                "run_dir": str(r.run_dir),
                "run_id": r.run_id if isinstance(r.run_id, str) else None,
                "status": str(r.status),
                "error_class": r.error_class if isinstance(r.error_class, str) else None,
                "reason": r.reason if isinstance(r.reason, str) else None,
                "ended_utc": ended[r.Index],
                "counted_in": counted[i][0],
                "counted_status": counted[i][1],
            },
        )
        for r, i, k, w in zip(cases.itertuples(), ident, keep, when)
        if not k
    ]
    earlier = [e for _, e in sorted(dropped, key=lambda x: x[0])]
    kept_cases = _rows(cases, keep)
    kept_pairs = set(zip(kept_cases.run_dir.astype(str), kept_cases.case_key.astype(str)))

    def kept_case(df: pd.DataFrame) -> pd.DataFrame:
        return _rows(df, [(str(d), str(k)) in kept_pairs for d, k in zip(df.run_dir, df.case_key)])

    out = {**t, "cases": kept_cases}
    for name in ("findings", "measurements", "quality"):
        out[name] = kept_case(t[name])
    return out, earlier
