"""The run store's tables as pandas DataFrames (read-only; what reports and ``open_run`` read).

Times are Unix seconds (UTC), with ``started``/``ended`` columns added as UTC
timestamps; finding centres are DICOM patient coordinates (LPS, mm). A store of
an earlier schema version (before quality flags and skipped files were kept)
reads with those columns empty.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

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
        "origin": None,
        "origin_via": None,
        "origin_study_uid": None,
        "origin_series_uid": None,
    },
    "measurements": {"reliable": 1, "reason": None},
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
    for name, df in (("cases", cases), ("measurements", meas)):
        for col, value in _LATER_COLUMNS[name].items():
            if col not in df:
                df[col] = value
    meas["reliable"] = meas["reliable"].fillna(1).astype(bool)
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
