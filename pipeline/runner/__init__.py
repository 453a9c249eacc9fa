"""The batch runner: pipelined, crash-safe, resumable runs with per-stage latency and throughput reports.

``ctpipe run SRC... --out RUN_DIR`` (or :func:`run_batch`) discovers CT series
under folders or in a worklist CSV and runs ingest → reconstruct (organs, one
lung mask per case, quality flags) → load (case cache → model input with the
DALI or torch loader) → detect (skipped when the lungs are absent) → nodules →
write for each (see :mod:`.stages`); ``ctpipe report RUN_DIR...`` (or
:func:`build_report`) reports throughput, latency and quality flags;
:func:`open_run` gives the results as pandas DataFrames. All positions are
DICOM patient coordinates (LPS, mm).

The notebook example is in README.md ("Notebook API"); ``tests/test_api.py`` runs it.
"""

from __future__ import annotations

from .batch import RunSummary, run_batch
from .report import Report, build_report
from .results import CaseResult, RunResults, open_run
from .stage import CaseContext, CaseSpec, Stage, WorkerInfo

__all__ = [
    "CaseContext",
    "CaseResult",
    "CaseSpec",
    "Report",
    "RunResults",
    "RunSummary",
    "Stage",
    "WorkerInfo",
    "build_report",
    "open_run",
    "run_batch",
]
