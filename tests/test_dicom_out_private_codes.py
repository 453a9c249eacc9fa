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
