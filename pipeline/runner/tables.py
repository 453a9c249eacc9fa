"""The run store's tables as pandas DataFrames (read-only; what reports and ``open_run`` read).

Times are Unix seconds (UTC), with ``started``/``ended`` columns added as UTC
timestamps; finding centres are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .store import open_readonly

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def read_tables(run_dir: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    """The store's tables as DataFrames: runs, cases, stages (attempts), findings, measurements, gpu."""
    import pandas as pd

    run_dir = Path(run_dir)
    db = open_readonly(run_dir)

    def q(sql: str) -> pd.DataFrame:
        return pd.read_sql_query(sql, db)

    try:
        runs = q("SELECT * FROM runs ORDER BY started_at")
        cases = q("SELECT * FROM cases ORDER BY case_id")
        stages = q("SELECT a.*, c.case_id FROM stage_attempts a JOIN cases c USING (case_key) ORDER BY a.id")
        fnd = q("SELECT f.*, c.case_id FROM findings f JOIN cases c USING (case_key) ORDER BY c.case_id, f.idx")
        meas = q("SELECT m.*, c.case_id FROM measurements m JOIN cases c USING (case_key) ORDER BY c.case_id, m.name")
        gpu = q("SELECT * FROM gpu_samples ORDER BY t")
    finally:
        db.close()
    if len(fnd):
        extra = pd.json_normalize([json.loads(d) for d in fnd.pop("data")])
        extra = extra.drop(columns=[c for c in extra.columns if c in fnd.columns], errors="ignore")
        fnd = pd.concat([fnd.reset_index(drop=True), extra], axis=1)
    else:
        fnd = fnd.drop(columns=["data"])
    for df in (runs, cases, stages, fnd, meas):
        df.insert(0, "run_dir", str(run_dir))
    for col in ("started_at", "ended_at"):
        for df in (runs, cases, stages):
            if col in df:
                df[col.replace("_at", "")] = pd.to_datetime(df[col], unit="s", utc=True)
    cols = ["run_dir", "case_id"] + [c for c in fnd.columns if c not in ("run_dir", "case_id", "case_key")] + ["case_key"]
    fnd = fnd[cols] if len(fnd.columns) else fnd
    return {"runs": runs, "cases": cases, "stages": stages, "findings": fnd, "measurements": meas, "gpu": gpu}
