"""The SR's quality assessment: DCM 111052 "Quality Finding" (PS3.16: a quality related deficiency detected within an
image) names deficiencies only; the informational flags are stated once each under a concept that fits (the contrast
phase item, "Left/Right lung: Absent", "Airway coverage: Absent"); a lung end cut by the scan range is DCM 130576
"Anatomy coverage incomplete" at the lung's apex or base. read_sr_case gives the same flags back, as it does for SRs of
earlier layouts, which wrote every flag as a Quality Finding in ctpipe's private codes."""

from __future__ import annotations

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from pipeline.dicom_out import read_sr_case
from pipeline.reconstruction.quality import FLAGS, QualityFlag, QualityReport
from tests.test_dicom_out_sources import assert_valid, phantom_case
from tests.test_dicom_out_sr import _content_items, _write


def _flag(code: str, side: str | None = None) -> QualityFlag:
    return QualityFlag(code, FLAGS[code][0], FLAGS[code][1], side=side)


def _evaluations(ds: pydicom.Dataset) -> list[Dataset]:
    """The CODE items of the SR's case group (Quality Findings, the contrast phase, ...)."""
    return [
        item
        for item in _content_items(ds)
        if item.get("ValueType") == "CODE" and item.get("RelationshipType") == "CONTAINS" and "ConceptCodeSequence" in item
    ]


def _named(ds: pydicom.Dataset, value: str, scheme: str) -> list[Dataset]:
    return [item for item in _evaluations(ds) if _named_as(item, (value, scheme))]


def _code(item: Dataset) -> tuple[str, str]:
    code = item.ConceptCodeSequence[0]
    return (str(code.get("CodeValue", code.get("LongCodeValue"))), str(code.CodingSchemeDesignator))


def _modifiers(item: Dataset) -> list[tuple[str, tuple[str, str]]]:
    """(concept meaning, (code value, scheme)) of the item's concept modifiers, nested ones included."""
    return [
        (str(m.ConceptNameCodeSequence[0].CodeMeaning), _code(m))
        for m in _content_items(item)
        if m.get("RelationshipType") == "HAS CONCEPT MOD" and "ConceptCodeSequence" in m
    ]


def test_the_contrast_phase_is_stated_once_and_is_no_quality_finding(tmp_path):
    case = phantom_case(tmp_path / "case")
    quality = QualityReport(
        lung_coverage="complete", contrast_phase="arterial", flags=(_flag("thick_slices"), _flag("contrast_arterial"))
    )
    path = _write(case, tmp_path / "sr.dcm", quality=quality)
    ds = pydicom.dcmread(path)
    assert [_code(i) for i in _named(ds, "111052", "DCM")] == [("thick_slices", "99CTPIPE")]
    assert [_code(i) for i in _named(ds, "contrast_phase", "99CTPIPE")] == [("arterial", "99CTPIPE")]
    content = read_sr_case(path)
    assert content["contrast_phase"] == "arterial"
    assert content["quality_flags"] == ["thick_slices", "contrast_arterial"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_one_lung_is_stated_as_the_missing_lung_absent(tmp_path, side):
    case = phantom_case(tmp_path / "case")
    other = "right" if side == "left" else "left"
    quality = QualityReport(lung_coverage="complete", contrast_phase="non_contrast", flags=(_flag("one_lung", side),))
    path = _write(case, tmp_path / "sr.dcm", quality=quality, measurements={"lungs": {f"lung_{other}_volume_ml": 2400.0}})
    ds = pydicom.dcmread(path)
    assert not _named(ds, "111052", "DCM")
    lung = {"left": "44029006", "right": "3341006"}[side]
    assert [_code(i) for i in _named(ds, lung, "SCT")] == [("272519000", "SCT")]  # CID 240 Absent
    assert read_sr_case(path)["quality_flags"] == ["one_lung"]


def test_airway_not_in_scan_is_stated_as_airway_coverage_absent(tmp_path):
    case = phantom_case(tmp_path / "case")
    flags = (_flag("metal_streaks"), _flag("contrast_venous"), _flag("airway_not_in_scan"))
    quality = QualityReport(lung_coverage="complete", contrast_phase="venous", flags=flags)
    path = _write(case, tmp_path / "sr.dcm", quality=quality)
    ds = pydicom.dcmread(path)
    assert [_code(i) for i in _named(ds, "111052", "DCM")] == [("metal_streaks", "99CTPIPE")]
    assert [_code(i) for i in _named(ds, "airway_coverage", "99CTPIPE")] == [("272519000", "SCT")]  # Absent, CID 240
    assert read_sr_case(path)["quality_flags"] == ["metal_streaks", "contrast_venous", "airway_not_in_scan"]


@pytest.mark.parametrize(("code", "end"), [("lungs_apex_cut", "43674008"), ("lungs_base_cut", "57195005")])
def test_a_cut_lung_end_is_anatomy_coverage_incomplete_at_that_end(tmp_path, code, end):
    """DCM 130576 "Anatomy coverage incomplete" (CID 6315) with the finding site Lung and the topographical modifier
    Apical or Basal (CID 2): standard codes alone, no private one."""
    case = phantom_case(tmp_path / "case")
    quality = QualityReport(lung_coverage="partial", contrast_phase="non_contrast", flags=(_flag(code),))
    path = _write(case, tmp_path / "sr.dcm", quality=quality)
    ds = pydicom.dcmread(path)
    (finding,) = _named(ds, "111052", "DCM")
    assert _code(finding) == ("130576", "DCM")
    assert _modifiers(finding) == [("Finding Site", ("39607008", "SCT")), ("Topographical modifier", (end, "SCT"))]
    assert read_sr_case(path)["quality_flags"] == [code]
    assert_valid(path)  # last: it skips where dciodvfy is missing


def test_srs_of_earlier_layouts_still_read(tmp_path):
    """Layouts 1-4 wrote every flag as a Quality Finding coded 99CTPIPE <flag> (one_lung as no_<side>_lung)."""
    case = phantom_case(tmp_path / "case")
    flags = (_flag("lungs_apex_cut"), _flag("one_lung", "left"), _flag("contrast_venous"), _flag("airway_not_in_scan"))
    quality = QualityReport(lung_coverage="partial", contrast_phase="venous", flags=flags)
    path = _write(case, tmp_path / "sr.dcm", quality=quality, measurements={"lungs": {"lung_right_volume_ml": 2400.0}})
    ds = pydicom.dcmread(path)
    old = {"lungs_apex_cut": "lungs_apex_cut", "one_lung": "no_left_lung", "contrast_venous": "contrast_venous"}
    old["airway_not_in_scan"] = "airway_not_in_scan"
    for parent in _content_items(ds):
        items = list(parent.get("ContentSequence", []))
        if not any(_named_as(i, ("111052", "DCM")) or _named_as(i, ("44029006", "SCT")) for i in items):
            continue
        kept = [
            i
            for i in items
            if not (
                _named_as(i, ("111052", "DCM"))
                or _named_as(i, ("44029006", "SCT"))
                or _named_as(i, ("airway_coverage", "99CTPIPE"))
            )
        ]
        parent.ContentSequence = Sequence(kept + [_old_quality_finding(v) for v in old.values()])
        break
    old_path = tmp_path / "old.dcm"
    ds.save_as(old_path)
    content = read_sr_case(old_path)
    assert content["quality_flags"] == list(old)  # the contrast flag once, as that SR stated it
    assert content["contrast_phase"] == "venous"


def _named_as(item: Dataset, code: tuple[str, str]) -> bool:
    name = item.get("ConceptNameCodeSequence")
    return bool(name) and (str(name[0].get("CodeValue")), str(name[0].get("CodingSchemeDesignator"))) == code


def _old_quality_finding(value: str) -> Dataset:
    item = Dataset()
    item.RelationshipType = "CONTAINS"
    item.ValueType = "CODE"
    name, concept = Dataset(), Dataset()
    name.CodeValue, name.CodingSchemeDesignator, name.CodeMeaning = "111052", "DCM", "Quality Finding"
    concept.CodingSchemeDesignator, concept.CodeMeaning = "99CTPIPE", value
    if len(value) > 16:  # as highdicom writes a code value longer than CodeValue holds
        concept.LongCodeValue = value
    else:
        concept.CodeValue = value
    item.ConceptNameCodeSequence = Sequence([name])
    item.ConceptCodeSequence = Sequence([concept])
    return item


def test_a_field_of_view_cutting_the_body_off_is_poor_fov_selection(tmp_path):
    """fov_cuts_body is DCM 130577 "Poor FOV selection" (CID 6315), a standard code: no private code item, no dciodvfy
    warning for it; it reads back as fov_cuts_body, and SRs of layouts 1-7, which coded it 99CTPIPE fov_cuts_body, still
    read."""
    case = phantom_case(tmp_path / "case")
    quality = QualityReport(lung_coverage="complete", contrast_phase="non_contrast", flags=(_flag("fov_cuts_body"),))
    path = _write(case, tmp_path / "sr.dcm", quality=quality)
    ds = pydicom.dcmread(path)
    (finding,) = _named(ds, "111052", "DCM")
    assert _code(finding) == ("130577", "DCM") and not _modifiers(finding)
    assert read_sr_case(path)["quality_flags"] == ["fov_cuts_body"]
    assert not [i for i in _evaluations(ds) if _code(i)[0] == "fov_cuts_body"]  # no private code for it
    code = finding.ConceptCodeSequence[0]
    code.CodeValue, code.CodingSchemeDesignator, code.CodeMeaning = "fov_cuts_body", "99CTPIPE", FLAGS["fov_cuts_body"][1]
    old_path = tmp_path / "old.dcm"
    ds.save_as(old_path)
    assert read_sr_case(old_path)["quality_flags"] == ["fov_cuts_body"]
    assert_valid(path)  # last: it skips where dciodvfy is missing
