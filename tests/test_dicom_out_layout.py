"""The SR's and SEG's layout versions (SR_LAYOUT, SEG_LAYOUT, in their instance UIDs) move with their layout.

A document built now is fingerprinted (:mod:`pipeline.dicom_out.layout`: the SR's content tree, the SEG's attributes
and segments; not their values) and compared with the fingerprint recorded beside its layout version: changing the
content tree without raising the version, which would write another document under an instance UID already used,
fails here and says what to do."""

from __future__ import annotations

from pathlib import Path

import pydicom
import pytest

from pipeline.dicom_out import NoduleDetail, write_seg, write_sr
from pipeline.dicom_out import seg as seg_module
from pipeline.dicom_out import sr as sr_module
from pipeline.dicom_out.layout import seg_layout_fingerprint, sr_layout_fingerprint, sr_layout_text
from pipeline.reconstruction.quality import FLAGS, QualityFlag, QualityReport
from tests.test_dicom_out_sources import phantom_case
from tests.test_dicom_out_sr import LUNGS

MODEL = dict(model_name="demo_phantom_retinanet", model_version="7", score_threshold=0.5)
#: a quality report with a flag of each way the SR states one (a Quality Finding in ctpipe's code and as Anatomy
#: coverage incomplete at a lung end, a lung Absent, Airway coverage, the contrast phase), so that the fingerprint
#: covers each
LAYOUT_QUALITY = QualityReport(
    lung_coverage="partial",
    contrast_phase="venous",
    flags=tuple(
        QualityFlag(code, FLAGS[code][0], FLAGS[code][1], side="left" if code == "one_lung" else None)
        for code in ("lungs_apex_cut", "one_lung", "thick_slices", "contrast_venous", "airway_not_in_scan")
    ),
)


def _sr(case, path: Path, **options) -> pydicom.Dataset:
    details = {i: NoduleDetail(composition=n.kind) for i, n in enumerate(case.phantom.nodules)}
    options = {
        "findings": case.findings,
        "nodules": case.nodules,
        "measurements": {"lungs": LUNGS},
        "quality": LAYOUT_QUALITY,
        "details": details,
        **options,
    }
    written = write_sr(path, source=case.source, volume=case.volume, organ_masks=case.organ_masks, **MODEL, **options)
    return pydicom.dcmread(written)


def _seg(case, path: Path, **options) -> pydicom.Dataset:
    options = {"findings": case.findings, "nodules": case.nodules, **options}
    written = write_seg(
        path, source=case.source, volume=case.volume, organ_masks=case.organ_masks, score_threshold=0.5, **options
    )
    return pydicom.dcmread(written)


def test_the_sr_layout_is_the_one_recorded_for_its_version(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case")
    now = sr_layout_fingerprint(_sr(case, tmp_path / "sr.dcm"))
    assert now == sr_module.SR_LAYOUT_FINGERPRINT, (
        f"the SR's content tree is laid out otherwise than SR_LAYOUT {sr_module.SR_LAYOUT} records (fingerprint {now}, "
        f"recorded {sr_module.SR_LAYOUT_FINGERPRINT}): raise SR_LAYOUT in pipeline/dicom_out/sr.py and record "
        f'SR_LAYOUT_FINGERPRINT = "{now}" beside it'
    )


def test_the_seg_layout_is_the_one_recorded_for_its_version(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case")
    now = seg_layout_fingerprint(_seg(case, tmp_path / "seg.dcm"))
    assert now == seg_module.SEG_LAYOUT_FINGERPRINT, (
        f"the SEG is laid out otherwise than SEG_LAYOUT {seg_module.SEG_LAYOUT} records (fingerprint {now}, recorded "
        f"{seg_module.SEG_LAYOUT_FINGERPRINT}): raise SEG_LAYOUT in pipeline/dicom_out/seg.py and record "
        f'SEG_LAYOUT_FINGERPRINT = "{now}" beside it'
    )


def test_the_fingerprint_follows_the_tree_not_its_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other values (one nodule fewer, other lung volumes) leave the fingerprint as it is; a nodule group
    without its axis lines (the content tree of SR_LAYOUT 1) changes it, and the texts show where."""
    case = phantom_case(tmp_path / "case")
    base = _sr(case, tmp_path / "a.dcm")
    lungs = {k: v * 1.1 for k, v in LUNGS.items()}
    fewer = _sr(case, tmp_path / "b.dcm", findings=case.findings[1:], measurements={"lungs": lungs})
    assert len(fewer.ContentSequence) == len(base.ContentSequence)
    assert sr_layout_fingerprint(fewer) == sr_layout_fingerprint(base)
    monkeypatch.setattr(sr_module, "_axis_lines", lambda *args, **kwargs: [])
    without_lines = _sr(case, tmp_path / "c.dcm")
    assert sr_layout_fingerprint(without_lines) != sr_layout_fingerprint(base)
    assert "SCOORD" in sr_layout_text(base) and "POLYLINE" in sr_layout_text(base)
    assert "POLYLINE" not in sr_layout_text(without_lines)


def test_the_seg_fingerprint_follows_its_segments_not_how_many_nodules(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case")
    base = seg_layout_fingerprint(_seg(case, tmp_path / "a.dcm"))
    assert seg_layout_fingerprint(_seg(case, tmp_path / "b.dcm", findings=case.findings[1:])) == base
    assert seg_layout_fingerprint(_seg(case, tmp_path / "c.dcm", findings=[], nodules=None)) != base
