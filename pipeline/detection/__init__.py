"""Lung-nodule detection with MONAI's RetinaNet (bundle-compatible) and LUNA16-style evaluation.

Public API (positions in DICOM patient coordinates, LPS mm)::

    from pipeline.detection import detect, Detector, load_bundle, Finding, Findings, evaluate_froc
    findings = detect(volume)                       # embedded demo model, lung restriction on
    det = Detector(bundle="path/to/lung_nodule_ct_detection", device="cuda")   # load once
    findings = det.detect(volume, lung_mask=masks)  # per case

Stages: the RetinaNet (:mod:`.infer`), centre refinement on the HU volume (:mod:`.refine`),
and, for models that ship one (the demo model), false-positive reduction: a small 3-D CNN
re-scores the network's findings together with small-blob candidates (:mod:`.candidates`,
:mod:`.fp_reduction`), the classic two-stage lung CAD scheme. A MONAI bundle runs exactly
as MONAI's own pipeline does, then refinement and compact-blob rescoring.
Findings scoring at or above the model's operating point (:mod:`.operating_point`: chosen on
validation data, recorded in the model) are reported; the other candidates are kept beside them
for evaluation (:mod:`.evaluate`, LUNA16's FROC as its evaluation script computes it).

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
    "FrocResult": "pipeline.detection.froc_result",
    "ModelConfig": "pipeline.detection.model_config",
    "OperatingPoint": "pipeline.detection.operating_point",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
