"""ctpipe: chest CT DICOM → lung-nodule findings, 3D organ reconstructions and throughput reports.

The public API for notebooks (all coordinates are DICOM patient coordinates,
LPS, in mm)::

    import pipeline as ctp
    vol = ctp.load_series("path/to/dicom/folder")      # CTVolume (HU + LPS geometry)
    findings = ctp.detect(vol)                           # lung-nodule findings (Findings)
    recon = ctp.reconstruct(vol)                         # organ masks, meshes, measurements
    summary = ctp.run_batch(["dicom/"], out="runs/r1")   # the batch runner
    run = ctp.open_run("runs/r1")                        # results as DataFrames
    ctp.show(vol, findings=findings, recon=recon)        # a slice with findings and outlines
    ctp.read_sr_findings(run.dicom_outputs.sr[0])        # a case's DICOM SR back as a findings table

Names are imported lazily, so ``import pipeline`` stays fast.
"""

from __future__ import annotations

from ._lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "CTVolume": "pipeline.volume",
    "Geometry": "pipeline.geometry",
    "LabelMap": "pipeline.volume",
    "Finding": "pipeline.detection.findings",
    "Findings": "pipeline.detection.findings",
    "CaseCache": "pipeline.cache",
    "CtpipeError": "pipeline.errors",
    "generate_phantom": "pipeline.phantom",
    "write_phantom_series": "pipeline.phantom",
    "load_series": "pipeline.ingest",
    "scan_directory": "pipeline.ingest",
    "detect": "pipeline.detection",
    "reconstruct": "pipeline.reconstruction",
    "run_batch": "pipeline.runner",
    "open_run": "pipeline.runner",
    "read_sr_findings": "pipeline.dicom_out",
    "show": "pipeline.display",
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
