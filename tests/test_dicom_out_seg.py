"""The segmentation (binary DICOM SEG): masks back voxel for voxel on the volume's [k, j, i] grid, frame
references and positions, empty segments, validators, and the top-level attributes highdicom writes."""

from __future__ import annotations

import logging
import subprocess

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.sr.codedict import codes

from pipeline.dicom_out import read_source_series, read_sr_findings, write_seg, write_sr
from pipeline.dicom_out.source_headers import limit_to_filing
from pipeline.errors import DicomOutputError
from pipeline.ingest import load_series
from pipeline.volume import LabelMap
from tests._support.dicom import write_series
from tests.test_dicom_out_sources import ORGANS, POSITIONS, assert_valid, dicom_tool, phantom_case
from tests.test_ingest_lossy import near_lossless_without_ratio


def _seg(case, path, **options):
    defaults = dict(
        source=case.source,
        volume=case.volume,
        score_threshold=0.5,
        organ_masks=case.organ_masks,
        findings=case.findings,
        nodules=case.nodules,
    )
    defaults.update(options)
    return write_seg(path, **defaults)


def _by_slice(seg: hd.seg.Segmentation, source) -> np.ndarray:
    """The SEG's segments on the volume's slices [k, j, i, segment], through each slice's source image (or frame)."""
    if source.multiframe:
        return seg.get_pixels_by_source_frame(
            source_sop_instance_uid=source.sop_instance_uids[0], source_frame_numbers=list(source.frame_numbers)
        )
    return seg.get_pixels_by_source_instance(source_sop_instance_uids=list(source.sop_instance_uids))


def _expected(case) -> list[np.ndarray]:
    return [case.phantom.masks[o] for o in ORGANS] + [case.phantom.nodule_labels == n + 1 for n in range(len(case.nodules))]


@pytest.mark.parametrize("omit", [False, True], ids=["all-frames", "omit-empty"])
@pytest.mark.parametrize(("position", "enhanced"), POSITIONS, ids=["HFS", "FFS", "HFP", "HFS-multiframe"])
def test_masks_round_trip_voxel_for_voxel(tmp_path, position, enhanced, omit):
    case = phantom_case(tmp_path / "case", position=position, enhanced=enhanced)
    path = _seg(case, tmp_path / "seg.dcm", omit_empty_frames=omit)
    seg = hd.seg.segread(path)
    expected = _expected(case)
    assert seg.SegmentationType == "BINARY" and len(seg.SegmentSequence) == len(expected)
    labels = [d.SegmentLabel for d in seg.SegmentSequence]
    assert labels == ["Body", "Left lung", "Right lung", "Airway", "Bone", "Nodule 1", "Nodule 2"]
    got = _by_slice(seg, case.source).astype(bool)  # [k, j, i, segment] in the volume's slice order
    for s, mask in enumerate(expected):
        assert np.array_equal(got[..., s], mask), labels[s]
    # the geometry highdicom derives from the frames: get_volume() (slices in its own order) → LPS-ascending view
    g = case.volume.geometry
    for number in (2, 6):
        vol = seg.get_volume(segment_numbers=[number]).to_patient_orientation("HPL")  # axes towards Head, Posterior, Left
        assert np.array_equal(vol.array[..., 0].astype(bool), g.to_lps_view(expected[number - 1])), labels[number - 1]
        np.testing.assert_allclose(vol.position, g.bounds_lps()[0], atol=1e-3)
    n_frames = int(seg.NumberOfFrames)
    if omit:
        assert n_frames == sum(int(m.any(axis=(1, 2)).sum()) for m in expected)
    else:
        assert n_frames == len(expected) * g.shape[0]


def test_frames_reference_their_source_image_and_its_position(tmp_path):
    case = phantom_case(tmp_path / "case", position="FFS")
    ds = pydicom.dcmread(_seg(case, tmp_path / "seg.dcm", omit_empty_frames=True))
    by_uid = {u: k for k, u in enumerate(case.source.sop_instance_uids)}
    seen = set()
    for item in ds.PerFrameFunctionalGroupsSequence:
        ref = item.DerivationImageSequence[0].SourceImageSequence[0]
        k = by_uid[str(ref.ReferencedSOPInstanceUID)]
        position = [float(v) for v in item.PlanePositionSequence[0].ImagePositionPatient]
        np.testing.assert_allclose(position, case.source.positions[k], atol=1e-6)  # LPS mm
        segment = int(item.SegmentIdentificationSequence[0].ReferencedSegmentNumber)
        assert list(item.FrameContentSequence[0].DimensionIndexValues)[0] == segment
        seen.add((segment, k))
    assert len(seen) == int(ds.NumberOfFrames)
    refs = ds.ReferencedSeriesSequence[0]
    assert refs.SeriesInstanceUID == case.source.series_instance_uid
    assert {str(r.ReferencedSOPInstanceUID) for r in refs.ReferencedInstanceSequence} == set(case.source.sop_instance_uids)
    assert ds.FrameOfReferenceUID == case.source.frame_of_reference_uid
    assert ds.StudyInstanceUID == case.source.study_instance_uid and ds.SeriesInstanceUID != case.source.series_instance_uid
    assert ds.PatientID == case.source.datasets[0].PatientID and ds.PatientName == case.source.datasets[0].PatientName
    shared = ds.SharedFunctionalGroupsSequence[0]
    np.testing.assert_allclose(
        [float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient],
        np.concatenate([case.volume.direction[:, 0], case.volume.direction[:, 1]]),
        atol=1e-6,
    )


def test_nodule_segments_share_tracking_with_the_sr(tmp_path):
    case = phantom_case(tmp_path / "case")
    seg = hd.seg.segread(_seg(case, tmp_path / "seg.dcm"))
    sr = write_sr(
        tmp_path / "sr.dcm",
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="m",
        model_version="1",
        score_threshold=0.5,
        nodules=case.nodules,
        organ_masks=case.organ_masks,
    )
    table = read_sr_findings(sr)
    segments = {d.SegmentLabel: d for d in seg.SegmentSequence}
    for row in table.itertuples():
        d = segments[row.tracking_id]
        assert d.TrackingUID == row.tracking_uid
        assert d.SegmentedPropertyTypeCodeSequence[0].CodeValue == "27925004"  # SCT Nodule
        (region,) = d.AnatomicRegionSequence
        # SCT Lung (CID 4; CID 7151 names no left or right lung) with the side as its modifier (CID 244)
        assert region.CodeValue == "39607008"
        (side,) = region.AnatomicRegionModifierSequence
        assert side.CodeValue == {"left": "7771000", "right": "24028007"}[row.side]


def test_segment_codes(tmp_path):
    case = phantom_case(tmp_path / "case")
    ds = pydicom.dcmread(_seg(case, tmp_path / "seg.dcm"))
    types = {
        d.SegmentLabel: (d.SegmentedPropertyCategoryCodeSequence[0].CodeValue, d.SegmentedPropertyTypeCodeSequence[0].CodeValue)
        for d in ds.SegmentSequence
    }
    assert types == {
        "Body": ("91723000", "38266002"),
        "Left lung": ("91723000", "39607008"),  # SCT Lung: CID 7151 and 7155 name no left or right lung
        "Right lung": ("91723000", "39607008"),
        "Airway": ("91723000", "89187006"),
        "Bone": ("85756007", "3138006"),
        "Nodule 1": ("49755003", "27925004"),
        "Nodule 2": ("49755003", "27925004"),
    }
    modifiers = {
        d.SegmentLabel: [
            m.CodeValue for m in d.SegmentedPropertyTypeCodeSequence[0].get("SegmentedPropertyTypeModifierCodeSequence", [])
        ]
        for d in ds.SegmentSequence
    }
    assert modifiers["Left lung"] == ["7771000"] and modifiers["Right lung"] == ["24028007"]  # the side (CID 244)
    assert all(not m for label, m in modifiers.items() if not label.endswith(" lung"))
    for d in ds.SegmentSequence:
        algo = d.SegmentationAlgorithmIdentificationSequence[0]
        assert algo.AlgorithmName == "ctpipe" and algo.AlgorithmVersion
        assert d.SegmentAlgorithmType == "AUTOMATIC" and "RecommendedDisplayCIELabValue" in d


@pytest.mark.parametrize("omit", [False, True], ids=["all-frames", "omit-empty"])
def test_empty_segment_keeps_frames(tmp_path, caplog, omit):
    case = phantom_case(tmp_path / "case")
    masks = dict(case.organ_masks, airway=np.zeros(case.volume.shape, dtype=bool))
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        seg = hd.seg.segread(_seg(case, tmp_path / "seg.dcm", organ_masks=masks, omit_empty_frames=omit))
    assert "segment 'Airway' is empty" in caplog.text
    frames = [int(i.SegmentIdentificationSequence[0].ReferencedSegmentNumber) for i in seg.PerFrameFunctionalGroupsSequence]
    assert frames.count(4) == (1 if omit else case.volume.shape[0])
    got = _by_slice(seg, case.source).astype(bool)
    assert not got[..., 3].any()
    assert np.array_equal(got[..., 1], case.phantom.masks["lung_left"])


def test_label_maps_and_extra_codes(tmp_path, caplog):
    case = phantom_case(tmp_path / "case")
    g = case.volume.geometry
    masks = {
        "lung_left": LabelMap(case.phantom.masks["lung_left"], g, labels={1: "lung_left"}),
        "vessels": case.phantom.masks["vessels"],
        "heart": np.zeros(g.shape, dtype=bool),
    }
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        path = _seg(
            case,
            tmp_path / "seg.dcm",
            organ_masks=masks,
            nodules=None,
            segment_codes={"vessels": (codes.SCT.AnatomicalStructure, codes.SCT.BloodVessel)},
        )
    assert "no codes for mask(s) ['heart']" in caplog.text
    seg = hd.seg.segread(path)
    assert [d.SegmentLabel for d in seg.SegmentSequence] == ["Left lung", "vessels"]
    got = _by_slice(seg, case.source).astype(bool)
    assert np.array_equal(got[..., 1], case.phantom.masks["vessels"])


def test_unaligned_frames_and_oblique_source(tmp_path):
    """Frames of 9 × 7 pixels end mid-byte (bits run on from frame to frame); a double-oblique source."""
    a, b = np.radians(25), np.radians(10)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    r = rz @ rx
    write_series(tmp_path / "dicom", n=6, rows=7, cols=9, orientation=(*r[:, 0], *r[:, 1]), step=1.5)
    vol = load_series(tmp_path / "dicom")
    rng = np.random.default_rng(0)
    masks = {"lung_left": rng.random(vol.shape) > 0.5, "lung_right": rng.random(vol.shape) > 0.7}
    masks["lung_right"][2] = False
    written = []
    for omit in (False, True):
        path = write_seg(
            tmp_path / f"seg{omit}.dcm",
            source=tmp_path / "dicom",
            volume=vol,
            score_threshold=0.5,
            organ_masks=masks,
            omit_empty_frames=omit,
        )
        source = read_source_series(tmp_path / "dicom", vol)
        got = _by_slice(hd.seg.segread(path), source).astype(bool)
        assert np.array_equal(got[..., 0], masks["lung_left"]) and np.array_equal(got[..., 1], masks["lung_right"])
        written.append(path)
    for path in written:  # last: it skips the test where dciodvfy is missing
        assert_valid(path)


@pytest.mark.parametrize("enhanced", [False, True], ids=["classic", "multiframe"])
def test_valid_for_dciodvfy(tmp_path, enhanced):
    case = phantom_case(tmp_path / "case", enhanced=enhanced)
    path = _seg(case, tmp_path / "seg.dcm")
    assert_valid(path, allowed_warnings=())
    dump = subprocess.run([dicom_tool("dcmdump"), "+P", "0062,0005", str(path)], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0 and dump.stdout.count("SegmentLabel") == 7


def test_same_top_level_attributes_as_highdicom(tmp_path):
    """Every top-level attribute highdicom's own SEG carries is in ours (highdicom's contributing-equipment entry
    names itself as the writing software and is left out), but for what the results never repeat of their source
    (:func:`limit_to_filing`: highdicom copies the whole patient and study modules)."""
    case = phantom_case(tmp_path / "case")
    ours = pydicom.dcmread(_seg(case, tmp_path / "seg.dcm"))
    stacked = np.stack(_expected(case), axis=-1)
    algo = hd.AlgorithmIdentificationSequence(name="ctpipe", family=codes.DCM.MorphologicalOperations, version="1")
    descriptions = [
        hd.seg.SegmentDescription(
            segment_number=n + 1,
            segment_label=f"s{n}",
            segmented_property_category=codes.SCT.AnatomicalStructure,
            segmented_property_type=codes.SCT.Lung,
            algorithm_type="AUTOMATIC",
            algorithm_identification=algo,
        )
        for n in range(stacked.shape[-1])
    ]
    peer = hd.seg.Segmentation(
        source_images=list(case.source.datasets),
        pixel_array=stacked,
        segmentation_type="BINARY",
        segment_descriptions=descriptions,
        series_instance_uid=pydicom.uid.generate_uid(),
        series_number=2,
        sop_instance_uid=pydicom.uid.generate_uid(),
        instance_number=1,
        manufacturer="x",
        manufacturer_model_name="x",
        software_versions="1",
        device_serial_number="1",
    )
    limit_to_filing(peer)
    missing = {e.keyword for e in peer} - {e.keyword for e in ours} - {"ContributingEquipmentSequence"}
    assert missing == set()
    for kw in ("SOPClassUID", "SegmentationType", "BitsAllocated", "Rows", "Columns", "FrameOfReferenceUID", "StudyInstanceUID"):
        assert ours[kw].value == peer[kw].value, kw


def test_bad_masks_are_refused(tmp_path):
    case = phantom_case(tmp_path / "case")
    with pytest.raises(DicomOutputError, match=r"the lung_left mask has shape \(20, 64, 63\)"):
        _seg(case, tmp_path / "a.dcm", organ_masks={"lung_left": np.zeros((20, 64, 63), dtype=bool)})
    with pytest.raises(DicomOutputError, match="nothing to segment"):
        _seg(case, tmp_path / "b.dcm", organ_masks={}, nodules=None)
    assert not list(tmp_path.glob("*.dcm")) and not list(tmp_path.glob(".*.tmp"))


def _lossy_source(_k: int, ds: pydicom.Dataset) -> None:
    ds.LossyImageCompression = "01"
    ds.LossyImageCompressionRatio = "8.5"
    ds.LossyImageCompressionMethod = "ISO_15444_1"


def _lung_masks(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"lung_left": rng.random(shape) > 0.5, "lung_right": rng.random(shape) > 0.6}


def test_seg_of_a_lossy_source_says_lossy(tmp_path):
    """PS3.3 C.7.6.1.1.5: derived from lossy compressed images, the SEG states LossyImageCompression 01 with the
    source's ratio and method (type 1C in the Segmentation Image module)."""
    write_series(tmp_path / "dicom", n=6, rows=8, cols=10, tweak=_lossy_source)
    vol = load_series(tmp_path / "dicom")
    path = write_seg(
        tmp_path / "seg.dcm", source=tmp_path / "dicom", volume=vol, score_threshold=0.5, organ_masks=_lung_masks(vol.shape)
    )
    ds = pydicom.dcmread(path)
    assert ds.LossyImageCompression == "01"
    assert float(ds.LossyImageCompressionRatio) == 8.5 and ds.LossyImageCompressionMethod == "ISO_15444_1"
    assert_valid(path)


def test_seg_of_a_lossy_transfer_syntax_source_says_lossy(tmp_path):
    """A source file in a lossy transfer syntax makes the SEG lossy even when the volume's metadata does not say so;
    the method is the syntax's."""
    paths = write_series(tmp_path / "dicom", n=6, rows=8, cols=10, unsigned=True)
    ds = pydicom.dcmread(paths[2])
    ds.compress(pydicom.uid.JPEGLSNearLossless, jls_error=2)
    ds.save_as(paths[2])
    vol = load_series(tmp_path / "dicom")
    plain = vol.__class__(vol.array, vol.geometry, metadata={k: v for k, v in vol.metadata.items() if "Lossy" not in k})
    for volume in (vol, plain):
        path = write_seg(
            tmp_path / "seg.dcm",
            source=tmp_path / "dicom",
            volume=volume,
            score_threshold=0.5,
            organ_masks=_lung_masks(vol.shape),
        )
        seg = pydicom.dcmread(path)
        assert seg.LossyImageCompression == "01" and seg.LossyImageCompressionMethod == "ISO_14495_1"


def test_seg_of_a_lossy_source_stating_no_ratio_carries_the_estimated_ratio(tmp_path, caplog):
    """LossyImageCompressionRatio and Method are type 1C in the Segmentation Image module (required when
    LossyImageCompression is 01): when the lossy compressed source files state no ratio, the SEG carries the ratio
    ingest estimated from them."""
    paths = write_series(tmp_path / "dicom", n=6, rows=32, cols=32, unsigned=True)
    near_lossless_without_ratio(paths)
    vol = load_series(tmp_path / "dicom")
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        path = write_seg(
            tmp_path / "seg.dcm",
            source=tmp_path / "dicom",
            volume=vol,
            score_threshold=0.5,
            organ_masks=_lung_masks(vol.shape),
        )
    ds = pydicom.dcmread(path)
    assert ds.LossyImageCompression == "01" and ds.LossyImageCompressionMethod == "ISO_14495_1"
    assert float(ds.LossyImageCompressionRatio) == vol.metadata["LossyImageCompressionRatio"][0] > 1
    assert "none written" not in caplog.text  # the SEG warns when it has no ratio to write
    assert_valid(path)


def test_seg_of_an_uncompressed_source_is_not_lossy(tmp_path):
    write_series(tmp_path / "dicom", n=6, rows=8, cols=10)
    vol = load_series(tmp_path / "dicom")
    path = write_seg(
        tmp_path / "seg.dcm", source=tmp_path / "dicom", volume=vol, score_threshold=0.5, organ_masks=_lung_masks(vol.shape)
    )
    ds = pydicom.dcmread(path)
    assert ds.LossyImageCompression == "00" and "LossyImageCompressionRatio" not in ds


def test_segments_are_coloured_as_the_pngs_colour_the_organs(tmp_path):
    """A PACS showed the left lung green and the right lung blue, the other way round from the PNGs' outlines, legends
    and 3-D preview (left blue, right green): the SEG's recommended display colours are now the PNG outlines' colours.
    The nodules' segments were red (230, 30, 30), where the renderings outline the same segmented nodules magenta and a
    bundle's vessels red (224, 68, 62): a PACS showed nodules and vessels alike. They are the renderings' magenta."""
    from pipeline.reconstruction.organs import OUTLINE_COLORS

    case = phantom_case(tmp_path / "case")
    ds = pydicom.dcmread(_seg(case, tmp_path / "seg.dcm"))
    names = {"Body": "body", "Left lung": "lung_left", "Right lung": "lung_right", "Airway": "airway", "Bone": "bone"}
    for d in ds.SegmentSequence:
        shown = hd.color.CIELabColor.from_dicom_value(tuple(d.RecommendedDisplayCIELabValue)).to_rgb()
        if d.SegmentLabel in names:
            hex_rgb = OUTLINE_COLORS[names[d.SegmentLabel]]
            expected = tuple(int(hex_rgb[i : i + 2], 16) for i in (1, 3, 5))
        else:
            hex_rgb = OUTLINE_COLORS["nodules"]
            expected = tuple(int(hex_rgb[i : i + 2], 16) for i in (1, 3, 5))
            vessels = tuple(int(OUTLINE_COLORS["vessels"][i : i + 2], 16) for i in (1, 3, 5))
            assert np.abs(np.subtract(shown, vessels)).max() > 60, (d.SegmentLabel, shown)  # told from vessels
        assert np.abs(np.subtract(shown, expected)).max() <= 2, (d.SegmentLabel, shown, expected)


def test_other_organs_are_coloured_as_the_pngs_outline_them(tmp_path):
    # was: every organ beyond the five ctpipe segments itself (vessels, a bundle's liver) the same grey (200, 200, 200)
    from pipeline.reconstruction.organs import organ_colours

    case = phantom_case(tmp_path / "case")
    g = case.volume.geometry
    liver = np.zeros(g.shape, dtype=bool)
    liver[2:6, 10:20, 10:20] = True
    masks = {"lung_left": case.phantom.masks["lung_left"], "vessels": case.phantom.masks["vessels"], "liver": liver}
    path = _seg(
        case,
        tmp_path / "seg.dcm",
        organ_masks=masks,
        nodules=None,
        segment_codes={
            "vessels": (codes.SCT.AnatomicalStructure, codes.SCT.BloodVessel),
            "liver": (codes.SCT.AnatomicalStructure, codes.SCT.Liver),
        },
    )
    colours = organ_colours(masks, outline=True)  # the MPR PNGs' and show()'s outlines
    seg = pydicom.dcmread(path)
    shown = {
        d.SegmentLabel: hd.color.CIELabColor.from_dicom_value(tuple(d.RecommendedDisplayCIELabValue)).to_rgb()
        for d in seg.SegmentSequence
    }
    for label, organ in (("Left lung", "lung_left"), ("vessels", "vessels"), ("liver", "liver")):
        expected = tuple(int(colours[organ][i : i + 2], 16) for i in (1, 3, 5))
        assert np.abs(np.subtract(shown[label], expected)).max() <= 2, (label, shown[label], expected)
    assert len(set(shown.values())) == 3


def test_the_seg_leaves_out_empty_frames_by_default(tmp_path):
    """A viewer pages through a segment's frames: by default the SEG holds, per segment, only the slices it touches
    (as highdicom, dcmqi and OHIF write them), each frame naming its source image and that image's position (LPS mm);
    ``omit_empty_frames=False`` keeps one frame per slice per segment."""
    case = phantom_case(tmp_path / "case")
    path = write_seg(
        tmp_path / "seg.dcm",
        source=case.source,
        volume=case.volume,
        score_threshold=0.5,
        organ_masks=case.organ_masks,
        findings=case.findings,
        nodules=case.nodules,
    )
    ds = pydicom.dcmread(path)
    expected = _expected(case)
    touched = [np.flatnonzero(m.any(axis=(1, 2))).tolist() for m in expected]
    assert int(ds.NumberOfFrames) == sum(len(ks) for ks in touched) < len(expected) * case.volume.shape[0]
    by_uid = {u: k for k, u in enumerate(case.source.sop_instance_uids)}
    frames: dict[int, list[int]] = {}
    for item in ds.PerFrameFunctionalGroupsSequence:
        k = by_uid[str(item.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID)]
        position = [float(v) for v in item.PlanePositionSequence[0].ImagePositionPatient]
        np.testing.assert_allclose(position, case.source.positions[k], atol=1e-6)  # LPS mm
        frames.setdefault(int(item.SegmentIdentificationSequence[0].ReferencedSegmentNumber), []).append(k)
    assert [frames[s + 1] for s in range(len(expected))] == touched
    got = _by_slice(hd.seg.segread(path), case.source).astype(bool)
    for s, mask in enumerate(expected):
        assert np.array_equal(got[..., s], mask), s
    every = pydicom.dcmread(_seg(case, tmp_path / "every.dcm", omit_empty_frames=False), stop_before_pixels=True)
    assert int(every.NumberOfFrames) == len(expected) * case.volume.shape[0]


def test_ctpipe_run_leaves_out_empty_frames_by_default():
    from pipeline.config import load_config

    assert load_config(environ={}).outputs.seg_omit_empty_frames is True


@pytest.mark.parametrize(
    ("side", "lobe", "region", "laterality"),
    [
        ("left", "upper", "45653009", "7771000"),
        ("left", "lower", "90572001", "7771000"),
        ("right", "upper", "45653009", "24028007"),
        ("right", "middle", "72481006", None),
        ("right", "lower", "90572001", "24028007"),
        ("left", None, "39607008", "7771000"),
        (None, None, "39607008", None),
    ],
)
def test_a_nodule_segments_region_is_a_lobe_or_lung_of_cid_4_with_its_side(side, lobe, region, laterality):
    """The nodule segment's anatomic region as CID 4 and CID 7151 name it: the Upper or Lower lobe of lung (no "upper
    lobe of left lung" there), the Middle lobe of right lung, or the Lung, with the side as its modifier (CID 244)."""
    from types import SimpleNamespace

    from pipeline.dicom_out import seg as seg_module

    regions = seg_module._nodule_region(SimpleNamespace(side=side, lobe=lobe))
    d = seg_module._description(
        1, "Nodule 1", *seg_module.C.ORGAN_SEGMENTS["body"], ("1", "DCM", "x"), (255, 0, 255), regions=regions
    )
    (item,) = d.AnatomicRegionSequence
    assert (item.CodeValue, item.CodingSchemeDesignator) == (region, "SCT")
    assert [m.CodeValue for m in item.get("AnatomicRegionModifierSequence", [])] == ([laterality] if laterality else [])
