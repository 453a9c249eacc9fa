"""The structured report (TID 1500 Comprehensive 3D SR): content, round trip through read_sr_findings, validators."""

from __future__ import annotations

import logging
import subprocess
import warnings

import numpy as np
import pydicom
import pytest
from pydicom.sr.coding import Code

from pipeline.dicom_out import NoduleDetail, read_source_series, read_sr_case, read_sr_findings, write_sr
from pipeline.dicom_out.sr_read import FINDING_COLUMNS
from pipeline.errors import DicomOutputError
from pipeline.reconstruction.quality import FLAGS, QualityFlag, QualityReport
from tests.test_dicom_out_sources import (
    NO_IDENTITY,
    POSITIONS,
    assert_valid,
    dicom_tool,
    phantom_case,
    strip_attributes,
    without_uids,
)

LUNGS = {
    "lung_left_volume_ml": 1234.5678,
    "lung_right_volume_ml": 1400.25,
    "lungs_total_volume_ml": 2634.8178,
    "lung_left_emphysema_index_pct": 1.234,
    "lung_right_emphysema_index_pct": 0.5,
    "emphysema_index_pct": 0.845,
}
QUALITY = QualityReport(
    lung_coverage="complete",
    contrast_phase="venous",
    flags=(
        QualityFlag("thick_slices", "warning", FLAGS["thick_slices"][1]),
        QualityFlag("contrast_venous", "info", FLAGS["contrast_venous"][1]),
    ),
)


def _write(case, path, **options):
    defaults = dict(
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="demo_phantom_retinanet",
        model_version="7",
        score_threshold=0.5,
        nodules=case.nodules,
        organ_masks=case.organ_masks,
        measurements={"lungs": LUNGS},
        quality=QUALITY,
    )
    defaults.update(options)
    return write_sr(path, **defaults)


@pytest.mark.parametrize(("position", "enhanced"), POSITIONS, ids=["HFS", "FFS", "HFP", "HFS-multiframe"])
def test_findings_round_trip(tmp_path, position, enhanced):
    case = phantom_case(tmp_path / "case", position=position, enhanced=enhanced)
    details = {0: NoduleDetail(composition=case.phantom.nodules[0].kind)}
    path = _write(case, tmp_path / "sr.dcm", details=details)
    table = read_sr_findings(path)
    assert list(table.columns) == FINDING_COLUMNS
    kept = [f for f in case.findings if f.score >= 0.5]  # the 0.2 finding is below the operating point
    assert len(table) == len(kept) == len(case.phantom.nodules)
    g = case.volume.geometry
    for n, (row, f) in enumerate(zip(table.itertuples(), kept)):
        assert row.rank == n + 1 and row.tracking_id == f"Nodule {n + 1}"
        centre = np.array([row.center_x, row.center_y, row.center_z])
        assert np.abs(centre - np.asarray(f.center_lps)).max() < 0.01  # LPS mm
        lo = np.array([row.box_min_x, row.box_min_y, row.box_min_z])
        hi = np.array([row.box_max_x, row.box_max_y, row.box_max_z])
        # the ellipsoid is drawn around the segmented nodule (its voxel cells), centred on the finding
        cells = _cell_extent(case.nodules[n], g)
        np.testing.assert_allclose((lo + hi) / 2, centre, atol=0.01)
        assert np.all(lo <= cells[0] + 0.01) and np.all(hi >= cells[1] - 0.01)
        np.testing.assert_allclose(np.minimum(hi - cells[1], cells[0] - lo), 0.0, atol=0.01)  # and no larger
        assert row.graphic_type == "ELLIPSOID"
        assert row.frame_of_reference_uid == case.source.frame_of_reference_uid
        assert row.score == pytest.approx(f.score, abs=5e-4)  # stated to 0.001
        # the size of the nodule's segmentation (its volume's sphere), not the detector box's estimate
        assert row.diameter_mm == pytest.approx(case.nodules[n].diameter_mm, abs=0.05)  # stated to 0.1 mm
        assert row.volume_mm3 == pytest.approx(case.nodules[n].volume_mm3, abs=0.5)  # and 1 mm³
        assert row.diameter_mm == pytest.approx((6 * row.volume_mm3 / np.pi) ** (1 / 3), rel=0.02)
        assert row.diameter_mm <= row.max_extent_mm < f.diameter_mm * 1.6
        # the long and short axis on the slice where the nodule is largest: within its 3-D extent, and their mean
        assert 0 < row.short_axis_mm <= row.long_axis_mm <= row.max_extent_mm
        assert row.mean_diameter_mm == pytest.approx((row.long_axis_mm + row.short_axis_mm) / 2, abs=0.06)
        assert row.side == case.phantom.nodules[n].lung.removeprefix("lung_")
        k = int(np.rint(g.lps_to_index(f.center_lps)[2]))
        assert row.sop_instance_uid == case.source.sop_instance_uids[k]
        assert row.frame_number == (k + 1 if enhanced else None)
        assert row.series_uid == case.volume.series_uid  # the series of the images the findings are on
    assert table.composition[0] == case.phantom.nodules[0].kind
    assert table.composition[1:].isna().all()


def test_an_sr_table_is_checked_against_the_volume_it_is_drawn_or_measured_on(tmp_path, caplog):
    """The table names its findings' series: show() draws it on its own volume without a warning, and show() and
    reconstruct() refuse it on another series' volume."""
    from pipeline.display import show
    from pipeline.errors import GeometryError, ReconstructionError
    from pipeline.reconstruction import reconstruct
    from pipeline.volume import CTVolume

    case = phantom_case(tmp_path / "case")
    table = read_sr_findings(_write(case, tmp_path / "sr.dcm"))
    with caplog.at_level(logging.WARNING):
        show(case.volume, findings=table)
    assert "cannot check" not in caplog.text
    other = CTVolume(case.volume.array, case.volume.geometry, metadata={**case.volume.metadata, "SeriesInstanceUID": "1.2.3.9"})
    with pytest.raises(GeometryError, match=f"the findings are of series {case.volume.series_uid}"):
        show(other, findings=table)
    with pytest.raises(ReconstructionError, match="the volume is series 1.2.3.9"):
        reconstruct(other, organs="lung_left", findings=table, render=False)


def _cell_extent(nodule, geometry):
    """(min, max) LPS mm of the corners of a nodule mask's voxel cells, from the mask's crop geometry."""
    kji = np.argwhere(nodule.mask)
    offsets = np.indices((2, 2, 2)).reshape(3, -1).T - 0.5
    corners = (kji[:, None, ::-1] + offsets[None]).reshape(-1, 3)
    pts = nodule.geometry.index_to_lps(corners)
    return pts.min(axis=0), pts.max(axis=0)


def test_without_a_nodule_segmentation_no_size_is_stated_only_the_detectors_box(tmp_path):
    """A detector box's size read as a measured diameter would be a falsified one (the Fleischner and Lung-RADS
    categories turn on 6 mm): without the nodule's segmentation the SR gives the box as its ellipsoid alone."""
    case = phantom_case(tmp_path / "case")
    table = read_sr_findings(_write(case, tmp_path / "sr.dcm", nodules=None))
    kept = [f for f in case.findings if f.score >= 0.5]
    assert len(table) == len(kept) > 0
    assert table.diameter_mm.isna().all() and table.long_axis_mm.isna().all() and table.volume_mm3.isna().all()
    assert table.max_extent_mm.isna().all() and table.short_axis_mm.isna().all() and table.mean_diameter_mm.isna().all()
    np.testing.assert_allclose(table[["box_min_x", "box_min_y", "box_min_z"]], [f.box_min_lps for f in kept], atol=0.01)
    assert list(table.score) == pytest.approx([f.score for f in kept], abs=5e-4)


def test_case_content_round_trip(tmp_path):
    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm")
    content = read_sr_case(path)
    assert content["measurements"] == pytest.approx(LUNGS, abs=0.05)  # stated to 0.1 mL and 0.1 %
    assert content["nodules_present"] is True
    assert content["lung_coverage"] == "complete" and content["contrast_phase"] == "venous"
    assert content["quality_flags"] == ["thick_slices", "contrast_venous"]
    assert (content["model_name"], content["model_version"], content["score_threshold"]) == ("demo_phantom_retinanet", "7", 0.5)
    assert content["ctpipe_version"]
    ds = pydicom.dcmread(path)
    assert ds.Modality == "SR" and ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.88.34"  # Comprehensive 3D SR
    for kw in ("PatientID", "PatientName", "StudyInstanceUID", "StudyDate", "AccessionNumber"):
        assert ds[kw].value == case.source.datasets[0][kw].value
    assert ds.SeriesInstanceUID != case.source.series_instance_uid
    assert ds.CodingSchemeIdentificationSequence[0].CodingSchemeDesignator == "99CTPIPE"


def test_an_sr_without_private_codes_declares_no_private_coding_scheme(tmp_path):
    """ctpipe detect's SR (no reconstruction: no emphysema index, lung coverage, contrast phase or quality flag) uses
    standard codes only: declaring ctpipe's private scheme there gave a validator warning for a code it never uses.
    No nodule segmentation either (detection makes none), so no volume-equivalent diameter."""
    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm", measurements=None, quality=None, nodules=None)
    ds = pydicom.dcmread(path)
    used = {e.value for e in ds.iterall() if e.keyword == "CodingSchemeDesignator"}
    assert "99CTPIPE" not in used and "CodingSchemeIdentificationSequence" not in ds
    assert_valid(path, allowed_warnings=())  # last: it skips the test where dciodvfy is missing


def test_an_sr_written_without_lung_masks_says_why_its_findings_have_no_side(tmp_path, caplog):
    """A notebook that writes the SR of ``detect(vol)``'s findings without a reconstruction gets no side; the log says
    so and names the call that segments the lungs, which then gives each finding its lung."""
    from pipeline.dicom_out import lung_side_masks

    case = phantom_case(tmp_path / "case")
    with caplog.at_level(logging.INFO, logger="pipeline.dicom_out"):
        path = _write(case, tmp_path / "a.dcm", organ_masks=None)
    assert read_sr_findings(path).side.isna().all()
    assert "2 of 2 reported findings state no lung side" in caplog.text
    assert "organ_masks=lung_side_masks(volume)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.dicom_out"):
        path = _write(case, tmp_path / "b.dcm", organ_masks=lung_side_masks(case.volume, device="cpu"))
    assert read_sr_findings(path).side.tolist() == [n.lung.removeprefix("lung_") for n in case.phantom.nodules]
    assert "state no lung side" not in caplog.text
    assert "2 finding(s) at score >= 0.5" in caplog.text and "no statement on nodules" not in caplog.text


def test_unreliable_measurements_are_left_out(tmp_path):
    case = phantom_case(tmp_path / "case")
    quality = QualityReport(
        lung_coverage="partial",
        contrast_phase="non_contrast",
        flags=(QualityFlag("lungs_apex_cut", "warning", "cut"),),
        unreliable=("lungs_total_volume_ml", "emphysema_index_pct"),
    )
    content = read_sr_case(_write(case, tmp_path / "sr.dcm", quality=quality))
    assert "lungs_total_volume_ml" not in content["measurements"] and "emphysema_index_pct" not in content["measurements"]
    assert content["measurements"]["lung_left_volume_ml"] == pytest.approx(LUNGS["lung_left_volume_ml"], abs=0.05)
    assert content["lung_coverage"] == "partial" and content["quality_flags"] == ["lungs_apex_cut"]


def test_no_findings_gives_an_explicit_report(tmp_path):
    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm", findings=[f for f in case.findings if f.score < 0.5])
    assert path.is_file()
    table = read_sr_findings(path)
    assert table.empty and list(table.columns) == FINDING_COLUMNS
    assert read_sr_case(path)["nodules_present"] is False
    assert_valid(path)
    tree = subprocess.run([dicom_tool("dsrdump"), str(path)], capture_output=True, text=True, timeout=60).stdout
    assert 'CODE:(,,"Nodule")=(272519000,SCT,"Absent")' in tree  # CID 240 Present-Absent, beside Present 52101004
    assert "Volume Surface" not in tree


def test_the_detector_score_is_the_findings_certainty(tmp_path, monkeypatch):
    """The detector score is DCM 111012 "Certainty of Finding" (PS3.16: the likelihood that the finding detected is
    in fact the type of finding identified; CID 6048, as CAD reports state it), not DCM 122157 "Probability", a code of
    no context group that names no finding; SRs of layouts 1-3, with "Probability", still read."""
    from pipeline.dicom_out import codes

    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm")
    ds = pydicom.dcmread(path)
    names = {
        (c.CodeValue, c.CodingSchemeDesignator) for i in ds.iterall() if i.keyword == "ConceptNameCodeSequence" for c in i.value
    }
    assert ("111012", "DCM") in names and ("122157", "DCM") not in names
    new = read_sr_findings(path).score.tolist()
    assert new == pytest.approx([f.score for f in case.findings if f.score >= 0.5], abs=0.0005)
    monkeypatch.setattr(codes, "CERTAINTY_OF_FINDING", Code("122157", "DCM", "Probability"))  # what layouts 1-3 wrote
    earlier = _write(case, tmp_path / "earlier.dcm")
    monkeypatch.undo()
    assert read_sr_findings(earlier).score.tolist() == new


def test_an_earlier_srs_absent_still_reads(tmp_path, monkeypatch):
    """SRs of layouts 1-3 stated "Nodule: Absent" with SCT 2667000, a code no PS3.16 context group holds (CID 240
    Present-Absent has SCT 272519000): they still read as no nodules present."""
    from pipeline.dicom_out import codes

    case = phantom_case(tmp_path / "case")
    monkeypatch.setattr(codes, "ABSENT", Code("2667000", "SCT", "Absent"))  # what layouts 1-3 wrote
    path = _write(case, tmp_path / "sr.dcm", findings=[f for f in case.findings if f.score < 0.5])
    monkeypatch.undo()
    assert "2667000" in {str(e.value) for e in pydicom.dcmread(path).iterall() if e.keyword == "CodeValue"}
    assert read_sr_case(path)["nodules_present"] is False


def test_lobe_and_side_from_details(tmp_path):
    case = phantom_case(tmp_path / "case")
    details = {
        0: NoduleDetail(side="right", lobe="middle", composition="ground_glass"),
        1: NoduleDetail(side="left", lobe="upper", composition="solid"),
    }
    table = read_sr_findings(_write(case, tmp_path / "sr.dcm", details=details))
    assert list(zip(table.side, table.lobe, table.composition)) == [
        ("right", "middle", "ground_glass"),
        ("left", "upper", "solid"),
    ]
    ds = pydicom.dcmread(tmp_path / "sr.dcm")
    assert {"72481006", "44714003"} <= {str(e.value) for e in ds.iterall() if e.keyword == "CodeValue"}  # SCT lobes


@pytest.mark.parametrize("enhanced", [False, True], ids=["classic", "multiframe"])
def test_valid_for_dciodvfy_and_printed_by_dsrdump(tmp_path, enhanced):
    case = phantom_case(tmp_path / "case", enhanced=enhanced)
    path = _write(case, tmp_path / "sr.dcm", details={0: NoduleDetail(composition="part_solid")})
    assert_valid(path)
    result = subprocess.run([dicom_tool("dsrdump"), str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    tree = result.stdout
    for text in (
        "Imaging Measurement Report",
        '"Device Observer Name")="ctpipe',
        '(27925004,SCT,"Nodule")',
        "SCOORD3D",
        "ELLIPSOID",
        'NUM:(,,"Certainty of Finding")="0.9" (1,UCUM,"no units")',
        '(24627-2,LN,"CT Chest")',
        '"Algorithm Parameters")="score_threshold=0.5"',
        "Part-solid",
    ):
        assert text in tree, text


def test_image_library_option(tmp_path):
    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm", image_library=True)
    assert len(read_sr_findings(path)) == 2
    assert_valid(path)  # the tools last: they skip the test where they are missing
    tree = subprocess.run([dicom_tool("dsrdump"), str(path)], capture_output=True, text=True, timeout=60).stdout
    assert "Image Library" in tree


def test_source_without_frame_of_reference_or_patient_gives_a_valid_sr(tmp_path, caplog):
    case = phantom_case(tmp_path / "case")
    strip_attributes(case.dicom, NO_IDENTITY)
    volume = without_uids(case.volume)
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        path = _write(case, tmp_path / "sr.dcm", source=case.dicom, volume=volume)
    assert "has no FrameOfReferenceUID" in caplog.text
    table = read_sr_findings(path)
    source = read_source_series(case.dicom, volume)
    assert (table.frame_of_reference_uid == source.frame_of_reference_uid).all()
    ds = pydicom.dcmread(path)
    assert ds.PatientID == "" and ds.StudyInstanceUID == source.study_instance_uid
    # last: it skips the test where dciodvfy is missing; empty patient/study identifiers
    assert_valid(path, allowed_warnings=("<99CTPIPE>", "needed to build DICOMDIR"))


def test_one_component_names_are_copied_without_a_warning_that_quotes_them(tmp_path):
    """highdicom warns about a person name of one component and quotes it; the SR copies the source's names as they
    are, and no warning carries a patient's name to the console or the logs."""
    case = phantom_case(tmp_path / "case")
    for path in sorted(case.dicom.rglob("*.dcm")):
        ds = pydicom.dcmread(path)
        ds.PatientName, ds.ReferringPhysicianName = "Quillfeather", "Zenobia"
        ds.save_as(path, enforce_file_format=True)
    source = read_source_series(case.dicom, case.volume)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = _write(case, tmp_path / "sr.dcm", source=source)
    assert not [str(w.message) for w in caught if "Quillfeather" in str(w.message) or "Zenobia" in str(w.message)]
    ds = pydicom.dcmread(path)
    assert (str(ds.PatientName), str(ds.ReferringPhysicianName)) == ("Quillfeather", "Zenobia")


def test_bad_options_are_refused(tmp_path):
    case = phantom_case(tmp_path / "case")
    with pytest.raises(DicomOutputError, match="unknown quality flag 'blurry'"):
        _write(
            case,
            tmp_path / "a.dcm",
            quality={"lung_coverage": "complete", "contrast_phase": "non_contrast", "flags": [{"code": "blurry"}]},
        )
    with pytest.raises(DicomOutputError, match="model name '' and version"):
        _write(case, tmp_path / "b.dcm", model_name="")
    with pytest.raises(DicomOutputError, match="lobe 'middle' with side 'left'"):
        NoduleDetail(side="left", lobe="middle")
    assert not (tmp_path / "a.dcm").exists() and not list(tmp_path.glob(".*.tmp"))


def test_lossy_compressed_flag_is_a_quality_statement_and_the_sr_has_no_lossy_attribute(tmp_path):
    """The SR states the lossy_compressed flag like the thick-slice flag; LossyImageCompression belongs to image IODs
    (General Image, Segmentation Image modules), not to the Comprehensive 3D SR IOD: the SR does not carry it."""
    case = phantom_case(tmp_path / "case")
    lossy = QualityFlag("lossy_compressed", "warning", f"{FLAGS['lossy_compressed'][1]} (ratio 10:1 by ISO_10918_1)")
    quality = QualityReport(lung_coverage="complete", contrast_phase="non_contrast", flags=(lossy,))
    path = _write(case, tmp_path / "sr.dcm", quality=quality)
    assert read_sr_case(path)["quality_flags"] == ["lossy_compressed"]
    ds = pydicom.dcmread(path)
    assert "LossyImageCompression" not in ds
    meanings = {item.ConceptCodeSequence[0].CodeMeaning for item in _content_items(ds) if "ConceptCodeSequence" in item}
    assert FLAGS["lossy_compressed"][1] in meanings  # the flag's sentence, within the 64 characters of a code meaning
    assert len(FLAGS["lossy_compressed"][1]) <= 64
    assert_valid(path)


def _content_items(ds):
    for item in ds.get("ContentSequence", []):
        yield item
        yield from _content_items(item)


def test_the_sr_names_the_contrast_phase_with_ctpipes_code_not_a_catheterization_phase(tmp_path, monkeypatch):
    """PS3.16 defines DCM 109058 "Contrast Phase" as the subpart of a cardiac catheterization procedure in which contrast
    is injected, and no DCM code, SNOMED CT code or context group of PS3.16 names the contrast phase of a CT acquisition
    (CID 3250 lists catheterization phases, CID 10014 the procedures "CT with/without contrast"): the SR names it with
    ctpipe's private code 99CTPIPE contrast_phase, declared with the scheme's name, version and responsible
    organisation. SRs of layout 3, which wrote DCM 109058, and of earlier layouts, with the private code, still read."""
    from pipeline.dicom_out import codes, sr_read

    case = phantom_case(tmp_path / "case")
    path = _write(case, tmp_path / "sr.dcm")
    ds = pydicom.dcmread(path)
    names = [item.value[0] for item in ds.iterall() if getattr(item, "keyword", "") == "ConceptNameCodeSequence"]
    phase = [code for code in names if code.CodeMeaning.lower() == "contrast phase"]
    assert phase and all((c.CodeValue, c.CodingSchemeDesignator) == ("contrast_phase", "99CTPIPE") for c in phase)
    assert "109058" not in {str(e.value) for e in ds.iterall() if e.keyword == "CodeValue"}
    (scheme,) = ds.CodingSchemeIdentificationSequence
    assert scheme.CodingSchemeDesignator == "99CTPIPE"
    assert scheme.CodingSchemeName and scheme.CodingSchemeVersion and scheme.CodingSchemeResponsibleOrganization
    assert read_sr_case(path)["contrast_phase"] == "venous"
    monkeypatch.setattr(codes, "CONTRAST_PHASE", Code("109058", "DCM", "Contrast Phase"))  # what layout 3 wrote
    layout_3 = _write(case, tmp_path / "layout3.dcm")
    monkeypatch.undo()
    assert "109058" in {str(e.value) for e in pydicom.dcmread(layout_3).iterall() if e.keyword == "CodeValue"}
    assert sr_read.read_sr_case(layout_3)["contrast_phase"] == "venous"
    assert_valid(path)  # its only warnings: the private codes themselves (last: it skips where dciodvfy is missing)
