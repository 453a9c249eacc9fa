"""The SR states the one_lung flag as the side with no lung Absent ("Left lung: Absent", standard codes: a finding about
the patient's anatomy, no Quality Finding), from a quality report or its JSON alike, and reads it back as the flag
one_lung; the lungs' totals are stated once, on the remaining lung's side."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest

from pipeline.dicom_out import read_sr_case
from pipeline.phantom import Confounders
from pipeline.reconstruction.measure import lung_measurements
from pipeline.reconstruction.quality import QualityFlag, QualityReport
from tests.test_dicom_out_sources import assert_valid, phantom_case
from tests.test_dicom_out_sr import LUNGS, _content_items, _write


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
    # a finding about the patient's anatomy, in standard codes: "<side> lung: Absent" (CID 240), no Quality Finding
    stated = [
        (item.ConceptNameCodeSequence[0].CodeMeaning, item.ConceptCodeSequence[0].CodeValue)
        for item in _content_items(ds)
        if "ConceptCodeSequence" in item and item.ConceptNameCodeSequence[0].get("CodeMeaning", "").endswith(" lung")
    ]
    assert stated == [(f"{side.capitalize()} lung", "272519000")], stated
    assert not [
        i
        for i in _content_items(ds)
        if "ConceptNameCodeSequence" in i and i.ConceptNameCodeSequence[0].get("CodeValue") == "111052"
    ]
    assert read_sr_case(path)["quality_flags"] == ["one_lung"]
    assert_valid(path)


def _case_lung_items(ds: pydicom.Dataset) -> list[tuple[str, str | None, float]]:
    """(concept, laterality or None, value) of each numeric item of the SR's case measurement group."""
    (case,) = [
        item
        for item in _content_items(ds)
        if item.get("ValueType") == "CONTAINER"
        and any(
            c.get("ValueType") == "TEXT"
            and c.ConceptNameCodeSequence[0].CodeMeaning == "Tracking Identifier"
            and c.TextValue == "Case"
            for c in item.get("ContentSequence", [])
        )
    ]
    out = []
    for item in case.ContentSequence:
        if item.get("ValueType") != "NUM":
            continue
        sides = [
            site.ConceptCodeSequence[0].CodeMeaning
            for site in _content_items(item)
            if site.ConceptNameCodeSequence[0].CodeMeaning == "Laterality"
        ]
        value = float(item.MeasuredValueSequence[0].NumericValue)
        out.append((item.ConceptNameCodeSequence[0].CodeMeaning, sides[0] if sides else None, value))
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_one_lung_sr_states_the_lungs_total_once_on_the_remaining_lungs_side(tmp_path, side):
    """A pneumonectomy patient's SR states the lungs' volume and emphysema index once each, on the remaining lung's
    side (the measurements' lungs_total_covers): the remaining lung's own figures and the lungs' totals, the same
    figures, were both stated with the same concept and the same laterality, a duplicate in a PACS viewer's list."""
    other = "right" if side == "left" else "left"
    case = phantom_case(tmp_path / "case", n_nodules=0, confounders=Confounders(pneumonectomy=side, emphysema=0.2))
    ph = case.phantom
    kept = f"lung_{other}"
    assert not ph.masks[f"lung_{side}"].any() and ph.masks[kept].any()
    lungs = lung_measurements(
        np.asarray(case.volume.array), {kept: ph.masks[kept].astype(bool)}, case.volume.geometry, one_lung=True
    )
    assert lungs["lungs_total_covers"] == other and lungs["emphysema_index_pct"] == lungs[f"{kept}_emphysema_index_pct"]
    path = _write(case, tmp_path / "sr.dcm", findings=[], nodules=[], quality=_one_lung(side), measurements={"lungs": lungs})
    items = _case_lung_items(pydicom.dcmread(path))
    assert len(set((c, lat) for c, lat, _ in items)) == len(items), f"a figure stated twice: {items}"
    (volume,) = [i for i in items if i[0] == "Volume"]
    (index,) = [i for i in items if i[0] != "Volume"]
    assert volume == ("Volume", other.capitalize(), round(lungs["lungs_total_volume_ml"], 1)), volume
    assert index[1:] == (other.capitalize(), round(lungs["emphysema_index_pct"], 1)), index
    read = read_sr_case(path)
    assert read["quality_flags"] == ["one_lung"]
    stated = read["measurements"]
    assert stated["lungs_total_volume_ml"] == stated[f"{kept}_volume_ml"] == volume[2]
    assert stated["emphysema_index_pct"] == stated[f"{kept}_emphysema_index_pct"] == index[2]
    assert f"lung_{side}_volume_ml" not in stated
    assert_valid(path)


def test_a_two_lung_sr_states_each_lung_and_both(tmp_path):
    """Two lungs: each lung's figures on its side and the lungs' totals as 'Right and left', as before."""
    case = phantom_case(tmp_path / "case")
    lungs = {**LUNGS, "lungs_total_covers": "both"}
    items = _case_lung_items(pydicom.dcmread(_write(case, tmp_path / "sr.dcm", quality=None, measurements={"lungs": lungs})))
    assert sorted((c == "Volume", lat) for c, lat, _ in items) == [
        (False, "Left"),
        (False, "Right"),
        (False, "Right and left"),
        (True, "Left"),
        (True, "Right"),
        (True, "Right and left"),
    ], items


@pytest.mark.parametrize("side", ["left", "right"])
def test_measurements_without_the_totals_cover_take_the_side_from_the_one_lung_flag(tmp_path, side):
    """Measurements written before lungs_total_covers was recorded: the one_lung flag tells the remaining side, and the
    lungs' total volume is stated once there, never as 'Right and left'."""
    case = phantom_case(tmp_path / "case")
    other = "right" if side == "left" else "left"
    lungs = {f"lung_{other}_volume_ml": 2400.04, "lungs_total_volume_ml": 2400.04}
    path = _write(case, tmp_path / "sr.dcm", quality=_one_lung(side), measurements={"lungs": lungs})
    assert _case_lung_items(pydicom.dcmread(path)) == [("Volume", other.capitalize(), 2400.0)]
    assert read_sr_case(path)["measurements"] == {f"lung_{other}_volume_ml": 2400.0, "lungs_total_volume_ml": 2400.0}
    assert_valid(path)


@pytest.mark.parametrize("as_json", [False, True], ids=["report", "json"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_lung_the_field_of_view_cuts_off_is_stated_as_not_covered_not_absent(tmp_path, side, as_json):
    """one_lung where the field of view cuts that side off: the images do not show whether the patient has that lung,
    so the SR states no "<side> lung: Absent" but a Quality Finding, Anatomy coverage incomplete (DCM 130576) at the
    Lung with that side's laterality, and reads it back as the flag one_lung."""
    case = phantom_case(tmp_path / "case")
    other = "right" if side == "left" else "left"
    message = f"one lung in the field of view ({other} lung 2400 mL, no {side} lung in the images)"
    flag = QualityFlag("one_lung", "warning", message, side=side, beyond_view=True)
    quality = QualityReport(lung_coverage="complete", contrast_phase="non_contrast", flags=(flag,))
    path = _write(
        case,
        tmp_path / "sr.dcm",
        quality=quality.to_json() if as_json else quality,
        measurements={"lungs": {f"lung_{other}_volume_ml": 2400.0}},
    )
    ds = pydicom.dcmread(path)
    items = list(_content_items(ds))
    absent = [i for i in items if "ConceptCodeSequence" in i and i.ConceptCodeSequence[0].CodeValue == "272519000"]
    assert not absent, "a lung beyond the field of view is stated Absent"
    (finding,) = [
        i
        for i in items
        if "ConceptNameCodeSequence" in i and i.ConceptNameCodeSequence[0].get("CodeValue") == "111052"  # Quality Finding
    ]
    assert (finding.ConceptCodeSequence[0].CodeValue, finding.ConceptCodeSequence[0].CodingSchemeDesignator) == ("130576", "DCM")
    (site,) = finding.ContentSequence
    assert site.ConceptCodeSequence[0].CodeValue == "39607008"  # SCT Lung
    (laterality,) = site.ContentSequence
    assert laterality.ConceptCodeSequence[0].CodeValue == {"left": "7771000", "right": "24028007"}[side]
    assert read_sr_case(path)["quality_flags"] == ["one_lung"]
    assert_valid(path)
