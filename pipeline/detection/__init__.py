"""Lung-nodule detection with MONAI's RetinaNet (bundle-compatible) and LUNA16-style evaluation.

Public API (positions in DICOM patient coordinates, LPS mm)::

    from pipeline.detection import detect, Detector, load_bundle, Finding, Findings, evaluate_froc
    findings = detect(volume)                       # embedded demo model, lung restriction on
    det = Detector(bundle="path/to/lung_nodule_ct_detection", device="cuda")   # load once
    findings = det.detect(volume, lung_mask=masks)  # per case

The embedded demo model is trained on synthetic phantoms, for demonstration and
testing only, not for clinical use.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "detect": "pipeline.detection.infer",
    "Detector": "pipeline.detection.infer",
    "load_bundle": "pipeline.detection.bundle",
    "load_model": "pipeline.detection.bundle",
    "LoadedModel": "pipeline.detection.bundle",
    "Finding": "pipeline.detection.findings",
    "Findings": "pipeline.detection.findings",
    "load_findings": "pipeline.detection.findings",
    "evaluate_froc": "pipeline.detection.evaluate",
    "FrocResult": "pipeline.detection.evaluate",
    "ModelConfig": "pipeline.detection.model_config",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

