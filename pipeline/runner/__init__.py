"""The batch runner: pipelined, crash-safe, resumable runs with per-stage latency and throughput reports.

``ctpipe run SRC... --out RUN_DIR`` (or :func:`run_batch`) discovers CT series
under folders or in a worklist CSV and runs ingest → load (case cache → model
input with the DALI or torch loader) → detect → reconstruct → write for each; ``ctpipe report RUN_DIR...`` (or :func:`build_report`) reports
throughput and latency; :func:`open_run` gives the results as pandas
DataFrames. All positions are DICOM patient coordinates (LPS, mm).

Example (a notebook; ``tests/test_api.py`` runs this same code)::

    import pipeline as ctp
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    # two small synthetic chest CT series, written as DICOM folders
    for seed in (1, 2):
        phantom = generate_phantom(seed, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0)
        write_phantom_case(phantom, f"demo_dicom/case{seed}")

    # options by name, or by section as in configs/default.yaml (renderings off: quicker)
    summary = ctp.run_batch(["demo_dicom"], out="runs/notebook", workers=1, reconstruct={"renderings": False})
    print(summary.done, "cases done; report:", summary.report_html)

    run = ctp.open_run("runs/notebook")
    print(run)                                  # RunResults('runs/notebook'): 2 cases (2 done, ...) ...
    run.cases[["case_id", "status", "latency_s", "n_findings"]]
    run.stage_latency()                         # seconds per stage: count, mean, p50, p90, p99
    run.findings                                # one row per finding; centre_x/y/z in LPS mm
    lungs = run.measurements[run.measurements.name == "lungs.lungs_total_volume_ml"]

    vol = ctp.load_series("demo_dicom/case1")   # CTVolume: HU array [k, j, i] + LPS geometry
    findings = ctp.detect(vol)                  # the same detector, on one volume
    recon = ctp.reconstruct(vol, organs=["lung_left", "lung_right"])
    ax = ctp.show(vol, findings=findings, recon=recon)
"""

from __future__ import annotations

from .batch import RunSummary, run_batch
from .report import Report, build_report
from .results import CaseResult, RunResults, open_run
from .show import show
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
    "show",
]
