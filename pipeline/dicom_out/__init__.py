"""DICOM results for PACS viewers: a structured report (TID 1500) and a segmentation (SEG) per case.

Public API (positions in DICOM patient coordinates, LPS mm; masks ``[k, j, i]`` on the volume's grid)::

    from pipeline.dicom_out import read_source_series, write_dicom_outputs, read_sr_findings
    source = read_source_series("dicom/series1", volume)     # headers matched to the volume's slices
    paths = write_dicom_outputs("out/", source=source, volume=volume, findings=findings,
                                reconstruction=recon, nodules=nodule_results, quality=quality,
                                model_name="demo_phantom", model_version="1", score_threshold=0.5)
    table = read_sr_findings(paths["sr"])                     # the findings back, LPS mm

:func:`write_sr` and :func:`write_seg` write one object each; :func:`lung_side_masks` segments the lungs
that give each finding its side when there is no reconstruction (``ctpipe detect``). :func:`write_case_dicom`
writes them from a ``Findings`` (its operating point and model) as ``ctpipe detect``, ``reconstruct`` and
``run`` do, from the DICOM source :func:`dicom_source_of` finds; :data:`OUTPUTS` names the objects (``sr``,
``seg``), :func:`parse_outputs` reads a user's choice (``"sr,seg"``, ``"none"``). The SR and the SEG share the
nodules' tracking UIDs; the codes they use are listed in :mod:`pipeline.dicom_out.codes`.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {
    "SourceSeries": "pipeline.dicom_out.sources",
    "read_source_series": "pipeline.dicom_out.sources",
    "NoduleDetail": "pipeline.dicom_out.model",
    "ReportedFinding": "pipeline.dicom_out.model",
    "reported_findings": "pipeline.dicom_out.model",
    "write_sr": "pipeline.dicom_out.api",
    "write_seg": "pipeline.dicom_out.api",
    "write_dicom_outputs": "pipeline.dicom_out.api",
    "OUTPUTS": "pipeline.dicom_out.kinds",
    "parse_outputs": "pipeline.dicom_out.kinds",
    "write_case_dicom": "pipeline.dicom_out.case",
    "dicom_source_of": "pipeline.dicom_out.case",
    "lung_side_masks": "pipeline.dicom_out.case",
    "read_sr_findings": "pipeline.dicom_out.sr_read",
    "read_sr_case": "pipeline.dicom_out.sr_read",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
