"""Results of runs as pandas DataFrames: ``open_run(run_dir) -> RunResults``.

All positions are DICOM patient coordinates (LPS, mm); times are Unix seconds
(UTC) or seconds of duration. The store is opened read-only, so a run in
progress can be inspected.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RunStoreError, require_path
from .dicom_stage import FILES as DICOM_FILES
from .report import build_report
from .run_summary import RunSummary
from .tables import read_tables

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


@dataclass
class CaseResult:
    """One case of a run: status, output folder, findings (LPS mm) and measurements."""

    case_id: str
    status: str
    reason: str | None
    folder: Path | None
    findings: pd.DataFrame
    measurements: pd.DataFrame

    @property
    def files(self) -> list[Path]:
        """Output files of the case (empty unless it is done)."""
        if self.folder is None or not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.rglob("*") if p.is_file())

    def __repr__(self) -> str:
        if self.status != "done":
            return f"CaseResult({self.case_id!r}, status={self.status!r}, reason={self.reason!r})"
        return (
            f"CaseResult({self.case_id!r}, status='done', findings={len(self.findings)}, "
            f"measurements={len(self.measurements)}, files={len(self.files)}, folder='{self.folder}')"
        )


class RunResults:
    """A run folder's results.

    Attributes (pandas DataFrames)
    ------------------------------
    cases: one row per case (status, reason, latency_s, n_findings, output_dir, ...), with its quality:
        ``lung_coverage`` (complete, partial, absent), ``contrast_phase`` (non_contrast, arterial, venous),
        ``flags`` (the flag codes, comma-separated; empty when none; read it as ``cases["flags"]``, since
        ``cases.flags`` is a pandas attribute) and ``detect_skipped`` (why detection did not run, e.g. no
        lungs in the scan).
    quality: one row per quality flag of a completed case: case_id, code, severity (warning, info), message
        (see :mod:`pipeline.reconstruction.quality` for the codes).
    stages: one row per stage attempt (stage, status, wall_s, queue_wait_s, peak_rss_mb, peak_cuda_mb in MiB, ...).
    findings: one row per finding of a completed case: ``case_id`` and ``series_uid`` (the SeriesInstanceUID of
        the case's series, None where it has none) then center_x/y/z in LPS mm, diameter_mm, score, ...; filter it by
        series before drawing a volume's findings (``run.findings[run.findings.series_uid == vol.series_uid]``).
    measurements: one row per (case, measurement): name, value, unit, ``reliable`` (False for a figure a quality
        flag makes meaningless, e.g. the volume of lungs cut by the scan range) and the ``reason``.
    skipped: what discovery left out, per run: ``what`` (file or series), ``item`` (path or series key),
        ``kind`` and ``reason``.
    runs: one row per invocation of ``ctpipe run`` on this folder (config, versions, device, start/end).
    deliveries: one row per DICOM result (SR, SEG) and PACS destination: ``state`` (sent, pending: a retry is due,
        failed; unconfirmed: stored on the archive's success answer, the query confirming it refused), ``attempts``, the last ``error``. A case a PACS delivered has its origin in ``cases``: ``origin``
        (the archive's address without credentials, or the sending AE title), ``origin_via`` (wado-rs, c-move, c-get,
        c-store), ``origin_study_uid`` and ``origin_series_uid``.
    dicom_outputs: one row per completed case: ``case_id``, ``sr`` and ``seg`` (paths of ``<case>/dicom/sr.dcm`` and
        ``seg.dcm``, None where the case has none); :func:`pipeline.dicom_out.read_sr_findings` reads an SR back.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | RunSummary):
        if isinstance(run_dir, RunSummary):  # what run_batch returned: its run folder
            run_dir = run_dir.run_dir
        given = require_path(
            run_dir, where="run_dir", error=RunStoreError, what="a folder", fix="give a folder written by `ctpipe run --out`"
        )
        t = read_tables(given)  # as given: its errors tell a path written with '~' from a missing one
        self.run_dir = given.absolute()  # its paths (cases' folders, dicom_outputs) stay right when the notebook moves
        self.runs: pd.DataFrame = t["runs"]
        self.cases: pd.DataFrame = t["cases"]
        self.stages: pd.DataFrame = t["stages"]
        self.findings: pd.DataFrame = _with_series(t["findings"], self.cases)
        self.measurements: pd.DataFrame = t["measurements"]
        self.gpu: pd.DataFrame = t["gpu"]
        self.quality: pd.DataFrame = t["quality"]
        self.skipped: pd.DataFrame = t["skipped"]
        self.deliveries: pd.DataFrame = t["deliveries"]

    @property
    def config(self) -> dict[str, Any]:
        """The effective configuration of the latest run (as saved with it)."""
        if not len(self.runs):
            return {}
        return json.loads(self.runs.iloc[-1]["config"] or "{}")

    @property
    def dicom_outputs(self) -> pd.DataFrame:
        """The DICOM results of the completed cases (see the class docstring)."""
        import pandas as pd

        rows = []
        done = self.cases[self.cases.status == "done"]
        for case_id, output_dir in zip(done.case_id, done.output_dir):
            folder = self.run_dir / output_dir if isinstance(output_dir, str) else None
            row: dict[str, Any] = {"case_id": case_id}
            for kind, rel in DICOM_FILES.items():
                path = folder / rel if folder is not None else None
                row[kind] = path if path is not None and path.is_file() else None
            rows.append(row)
        return pd.DataFrame(rows, columns=["case_id", *DICOM_FILES])

    @property
    def failures(self) -> pd.DataFrame:
        """Quarantined cases with their stage, error class and reason."""
        f = self.cases[self.cases.status == "failed"]
        return f[["case_id", "failed_stage", "error_class", "reason", "source"]].reset_index(drop=True)

    def case(self, case_id: str) -> CaseResult:
        """One case (``case_id``: a value of ``cases.case_id``, not a row number): its status, output folder, findings
        (LPS mm) and measurements; :class:`~pipeline.errors.RunStoreError` listing the run's case ids when there is no
        such case."""
        rows = self.cases[self.cases.case_id == case_id]
        if not len(rows):
            raise RunStoreError(
                f"no case {case_id!r} in this run; cases are {', '.join(self.cases.case_id[:10])}",
                where=self.run_dir,
                fix="pick an id from RunResults.cases.case_id",
            )
        row = rows.iloc[0]
        folder = self.run_dir / row["output_dir"] if isinstance(row["output_dir"], str) else None
        return CaseResult(
            case_id,
            row["status"],
            row["reason"] if isinstance(row["reason"], str) else None,
            folder,
            self.findings[self.findings.case_id == case_id].reset_index(drop=True),
            self.measurements[self.measurements.case_id == case_id].reset_index(drop=True),
        )

    def stage_latency(self) -> pd.DataFrame:
        """Per-stage wall time (s) of successful attempts, one row per stage: columns ``count``, ``mean``, ``p50``,
        ``p90`` and ``p99`` (as ``report/latency.csv``'s ``p50_s``, ...)."""
        ok = self.stages[self.stages.status == "ok"]
        g = ok.groupby("stage", sort=False)["wall_s"]
        table = g.describe(percentiles=[0.5, 0.9, 0.99])[["count", "mean", "50%", "90%", "99%"]]
        return table.rename(columns={"50%": "p50", "90%": "p90", "99%": "p99"})

    def report(self, *, out: str | os.PathLike[str] | None = None) -> Path:
        """Write the HTML/CSV/JSON report (default ``RUN_DIR/report``); returns the HTML path."""
        return build_report([self.run_dir], Path(out) if out else self.run_dir / "report").html

    def __repr__(self) -> str:
        counts = self.cases.status.value_counts().to_dict()
        return (
            f"RunResults('{self.run_dir}'): {len(self.cases)} cases ({counts.get('done', 0)} done, "
            f"{counts.get('failed', 0)} failed, {counts.get('running', 0) + counts.get('pending', 0)} unfinished), "
            f"{len(self.findings)} findings, {len(self.runs)} run(s)"
        )

    def _repr_html_(self) -> str:
        head = f"<p><b>{html.escape(self.__repr__())}</b></p>"
        cols = [c for c in ("case_id", "status", "latency_s", "n_findings", "flags", "reason") if c in self.cases]
        return head + self.cases[cols].head(20).to_html(index=False)


def _with_series(findings: pd.DataFrame, cases: pd.DataFrame) -> pd.DataFrame:
    """``findings`` with the ``series_uid`` of each finding's case (from ``cases``, by ``case_key``) after ``case_id``."""
    if "series_uid" in findings.columns or "case_key" not in findings.columns:
        return findings
    uids = dict(zip(cases.case_key, cases.series_uid)) if "series_uid" in cases.columns else {}
    out = findings.copy()
    out.insert(list(out.columns).index("case_id") + 1 if "case_id" in out.columns else 0, "series_uid", None)
    out["series_uid"] = [uids.get(key) for key in out.case_key]
    return out


def open_run(run_dir: str | os.PathLike[str] | RunSummary) -> RunResults:
    """Open a run folder written by ``ctpipe run`` / :func:`pipeline.run_batch` (read-only): its path, or the
    :class:`~pipeline.runner.run_summary.RunSummary` ``run_batch`` returned.

    Returns a :class:`RunResults`: its cases, findings (``center_x/y/z`` in DICOM patient coordinates, LPS, mm),
    measurements, quality flags and stage times as pandas DataFrames. Raises
    :class:`~pipeline.errors.RunStoreError` for a path that is not a run folder (no ``runs.sqlite``)."""
    return RunResults(run_dir)
