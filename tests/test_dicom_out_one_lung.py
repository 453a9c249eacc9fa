"""The SR's one_lung quality finding names the side with no lung (within the 64 characters of a code meaning), from
a quality report or its JSON alike, and reads back as the flag one_lung; each side has its own code value (one code value, one meaning)."""

from __future__ import annotations

import pydicom
import pytest

from pipeline.dicom_out import read_sr_case
from pipeline.reconstruction.quality import QualityFlag, QualityReport
from tests.test_dicom_out_sources import assert_valid, phantom_case
from tests.test_dicom_out_sr import _content_items, _write


def _one_lung(side: str) -> QualityReport:
    other = "right" if side == "left" else "left"
    message = f"one lung only ({other} lung 2400 mL, no {side} lung: expected after a {side} pneumonectomy)"
    return QualityReport(
        lung_coverage="complete", contrast_phase="non_contrast", flags=(QualityFlag("one_lung", "warning", message, side=side),)
    )


@pytest.mark.parametrize("as_json", [False, True], ids=["report", "json"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_one_lung_finding_names_the_missing_side(tmp_path, side, as_json):
    case = phantom_case(tmp_path / "case")
    other = "right" if side == "left" else "left"
    quality = _one_lung(side)
    path = _write(
        case,
        tmp_path / "sr.dcm",
        quality=quality.to_json() if as_json else quality,
        measurements={"lungs": {f"lung_{other}_volume_ml": 2400.0}},
    )
    ds = pydicom.dcmread(path)
    # one code value, one meaning: each side's statement has its own code value
    (meaning,) = [
        item.ConceptCodeSequence[0].CodeMeaning
        for item in _content_items(ds)
        if "ConceptCodeSequence" in item and item.ConceptCodeSequence[0].CodeValue == f"no_{side}_lung"
    ]
    assert f"no {side} lung" in meaning and other not in meaning, meaning
    assert len(meaning) <= 64
    assert read_sr_case(path)["quality_flags"] == ["one_lung"]
    assert_valid(path)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_one_lung_total_volume_is_the_remaining_lungs_not_both_lungs(tmp_path, side):
    """A pneumonectomy patient's lung volume is stated, on the remaining lung's side: never 'Right and left'."""
    case = phantom_case(tmp_path / "case")
    other = "right" if side == "left" else "left"
    path = _write(
        case,
        tmp_path / "sr.dcm",
        quality=_one_lung(side),
        measurements={"lungs": {f"lung_{other}_volume_ml": 2400.04, "lungs_total_volume_ml": 2400.04}},
    )
    volumes = [
        item
        for item in _content_items(pydicom.dcmread(path))
        if item.get("ValueType") == "NUM"
        and item.ConceptNameCodeSequence[0].CodeMeaning == "Volume"
        and float(item.MeasuredValueSequence[0].NumericValue) == 2400.0  # the lungs', not the nodules' volumes
    ]
    assert len(volumes) == 2  # the remaining lung's and the patient's total
    sides = [
        site.ConceptCodeSequence[0].CodeMeaning
        for v in volumes
        for site in _content_items(v)
        if site.ConceptNameCodeSequence[0].CodeMeaning == "Laterality"
    ]
    assert sides == [other.capitalize(), other.capitalize()], sides
    assert_valid(path)
