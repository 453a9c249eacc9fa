"""What dciodvfy says of ctpipe's private codes, and the private codes the SR no longer needs.

dciodvfy (dicom3tools) warns "Unrecognized defined term <99CTPIPE> for value 1 of attribute <Coding Scheme
Designator>" once per code item of ctpipe's private scheme, and once more for the scheme's own declaration in the
Coding Scheme Identification Sequence (0008,0110): it checks a designator against the list of PS3.16 and of the
schemes registered there and does not read the declaration (with a Coding Scheme UID it warns of that UID as well).
Only a standard code in place of a private one makes one warning fewer; the nodules' mean diameter has one: SNOMED
CT "Diameter" (CID 7470 Linear Measurement) with the TID 1419 concept modifier DCM "Derivation" = SNOMED CT "Mean"
(CID 3488), the mean of the diameters measured: the long and short axis."""

from __future__ import annotations

from pathlib import Path

import highdicom as hd
import pydicom
import pytest

from pipeline.dicom_out import read_sr_findings
from tests.test_dicom_out_layout import _sr
from tests.test_dicom_out_sources import dciodvfy, phantom_case

WARNING = "Warning - Unrecognized defined term <99CTPIPE> for value 1 of attribute <Coding Scheme Designator>"


def _private_code_items(dataset: pydicom.Dataset) -> int:
    count = 0
    for item in _walk(dataset):
        count += item.get("CodingSchemeDesignator") == "99CTPIPE"
    return count


def _walk(dataset: pydicom.Dataset):
    for element in dataset:
        if element.VR == "SQ":
            for item in element.value:
                yield item
                yield from _walk(item)


def test_the_mean_diameter_is_coded_with_standard_codes(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case")
    path = tmp_path / "sr.dcm"
    _sr(case, path)
    (group, *_rest) = hd.sr.srread(path).content.get_volumetric_roi_measurement_groups()
    by_name = {(str(m.name.scheme_designator), str(m.name.value)): m for m in group.get_measurements()}
    mean = by_name[("SCT", "81827009")]  # Diameter
    assert (mean.derivation.scheme_designator, mean.derivation.value) == ("SCT", "373098007")  # Mean
    long_axis, short_axis = by_name[("SCT", "103339001")], by_name[("SCT", "103340004")]
    assert mean.value == pytest.approx((long_axis.value + short_axis.value) / 2, abs=0.051)
    assert ("99CTPIPE", "mean_diameter") not in by_name
    table = read_sr_findings(path)
    assert table.mean_diameter_mm.tolist() == pytest.approx(((table.long_axis_mm + table.short_axis_mm) / 2).tolist(), abs=0.051)
    assert table.diameter_mm.notna().all()  # the equivalent-sphere diameter is still told apart from the mean


def test_dciodvfy_warns_once_per_private_code_item_and_once_for_the_declaration(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case")
    path = tmp_path / "sr.dcm"
    dataset = _sr(case, path)
    errors, warnings = dciodvfy(path)
    assert errors == []
    private = [w for w in warnings if "99CTPIPE" in w]
    assert set(private) == {WARNING}
    assert len(private) == _private_code_items(dataset)  # the items in the tree and the declaration's own
    declared = dataset.CodingSchemeIdentificationSequence[0]
    assert declared.CodingSchemeDesignator == "99CTPIPE"
    assert declared.CodingSchemeName and declared.CodingSchemeResponsibleOrganization and declared.CodingSchemeVersion


def test_an_earlier_srs_private_mean_diameter_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SRs of layout 2 coded the mean diameter 99CTPIPE mean_diameter, and their equivalent-sphere diameter was never
    a Diameter with a derivation: both read back as they did."""
    import highdicom as hd_module

    from pipeline.dicom_out import codes

    case = phantom_case(tmp_path / "case")
    new = read_sr_findings(_sr(case, tmp_path / "new.dcm").filename)
    real = hd_module.sr.Measurement

    def earlier(*, name, derivation=None, **kwargs):
        if derivation is not None:  # what layout 2 wrote
            return real(name=codes.MEAN_DIAMETER, **kwargs)
        return real(name=name, **kwargs)

    monkeypatch.setattr(hd_module.sr, "Measurement", earlier)
    old_sr = _sr(case, tmp_path / "old.dcm")
    assert any(item.get("CodeValue") == "mean_diameter" for item in _walk(old_sr))
    old = read_sr_findings(old_sr.filename)
    assert old.mean_diameter_mm.tolist() == pytest.approx(new.mean_diameter_mm.tolist())
    assert old.diameter_mm.tolist() == pytest.approx(new.diameter_mm.tolist())


def _values_of(dataset: pydicom.Dataset, concept: str) -> list[tuple[str, str]]:
    """(code value, scheme) of each CODE item named ctpipe's ``concept`` (99CTPIPE)."""
    return [
        (str(item.ConceptCodeSequence[0].CodeValue), str(item.ConceptCodeSequence[0].CodingSchemeDesignator))
        for item in _walk(dataset)
        if "ConceptCodeSequence" in item
        and "ConceptNameCodeSequence" in item
        and (item.ConceptNameCodeSequence[0].CodeValue, item.ConceptNameCodeSequence[0].CodingSchemeDesignator)
        == (concept, "99CTPIPE")
    ]


@pytest.mark.parametrize("composition", ["solid", "ground_glass"])
def test_values_with_a_standard_code_are_coded_so(tmp_path: Path, composition: str) -> None:
    """The lung and airway coverage are SNOMED CT Complete, Partial or Absent, a solid nodule SNOMED CT Solid and a
    ground-glass one DCM Ground glass opacity (CID 6102): one private code item fewer each, one dciodvfy warning fewer;
    a part-solid nodule, which no standard code names, keeps ctpipe's code."""
    from pipeline.dicom_out.model import NoduleDetail

    case = phantom_case(tmp_path / "case")
    details = {0: NoduleDetail(composition=composition), 1: NoduleDetail(composition="part_solid")}
    dataset = _sr(case, tmp_path / "sr.dcm", details=details)
    assert _values_of(dataset, "lung_coverage") == [("255609007", "SCT")]  # Partial
    assert _values_of(dataset, "airway_coverage") == [("272519000", "SCT")]  # Absent
    expected = {"solid": ("35702001", "SCT"), "ground_glass": ("112120", "DCM")}[composition]
    assert sorted(_values_of(dataset, "composition")) == sorted([expected, ("part_solid", "99CTPIPE")])
    table = read_sr_findings(dataset.filename)
    assert sorted(table.composition) == sorted([composition, "part_solid"])
    errors, warnings = dciodvfy(Path(dataset.filename))
    assert errors == []
    assert len([w for w in warnings if "99CTPIPE" in w]) == _private_code_items(dataset)


def test_an_earlier_srs_private_coverage_and_composition_values_still_read(tmp_path: Path) -> None:
    """SRs of layouts 1-6 coded the coverages and the compositions in ctpipe's codes: they read back as they did."""
    from pipeline.dicom_out import read_sr_case
    from pipeline.dicom_out.model import NoduleDetail

    case = phantom_case(tmp_path / "case")
    details = {0: NoduleDetail(composition="ground_glass"), 1: NoduleDetail(composition="solid")}
    dataset = _sr(case, tmp_path / "sr.dcm", details=details)
    new_case, new_table = read_sr_case(dataset.filename), read_sr_findings(dataset.filename)
    earlier = {
        ("255609007", "SCT"): ("partial", "Partial"),
        ("272519000", "SCT"): ("absent", "Absent"),
        ("112120", "DCM"): ("ground_glass", "Ground glass"),
        ("35702001", "SCT"): ("solid", "Solid"),
    }
    for concept in ("lung_coverage", "airway_coverage", "composition"):
        for item in _walk(dataset):
            name = item.get("ConceptNameCodeSequence")
            if not name or "ConceptCodeSequence" not in item or name[0].CodeValue != concept:
                continue
            code = item.ConceptCodeSequence[0]
            value, meaning = earlier[(code.CodeValue, code.CodingSchemeDesignator)]
            code.CodeValue, code.CodingSchemeDesignator, code.CodeMeaning = value, "99CTPIPE", meaning
    old_path = tmp_path / "old.dcm"
    dataset.save_as(old_path)
    assert read_sr_case(old_path) == new_case
    assert read_sr_findings(old_path).composition.tolist() == new_table.composition.tolist()
