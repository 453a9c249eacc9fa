"""The phantom DICOM writer: valid CT series, SimpleITK round trips, quirks, enhanced CT, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from scipy.ndimage import map_coordinates

from pipeline.errors import CtpipeError, DicomWriteError
from pipeline.phantom.dicom_writer import (
    CT_IMAGE_STORAGE,
    ENHANCED_CT_IMAGE_STORAGE,
    GANTRY_TILT_DEG,
    write_dicom_series,
)
from pipeline.volume import CTVolume, Geometry

SPACING = (0.7, 0.8, 1.25)
ORIGIN = (-10.5, 20.25, -30.0)


def _rotation(ax: float, ay: float, az: float) -> np.ndarray:
    cx, sx, cy, sy, cz, sz = np.cos(ax), np.sin(ax), np.cos(ay), np.sin(ay), np.cos(az), np.sin(az)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx


def _volume(shape=(8, 32, 40), *, direction=None, seed=0, low=-1100, high=2000, metadata=None) -> CTVolume:
    rng = np.random.default_rng(seed)
    arr = rng.integers(low, high, size=shape).astype(np.int16)
    geom = Geometry(shape=shape, spacing=SPACING, origin=ORIGIN, direction=np.eye(3) if direction is None else direction)
    return CTVolume(arr, geom, metadata=metadata)


def _smooth_volume(shape=(10, 33, 24)) -> CTVolume:
    k, j, i = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")
    arr = 200.0 * np.sin(k / 3.0) + 10.0 * j - 5.0 * i
    return CTVolume(arr.astype(np.float32), Geometry(shape=shape, spacing=SPACING, origin=ORIGIN))


def _sitk_read(folder: Path, series_uid: str | None = None) -> sitk.Image:
    reader = sitk.ImageSeriesReader()
    if series_uid is None:
        ids = reader.GetGDCMSeriesIDs(str(folder))
        assert len(ids) == 1, ids
        series_uid = ids[0]
    names = reader.GetGDCMSeriesFileNames(str(folder), series_uid, False, True)
    reader.SetFileNames(names)
    return reader.Execute()


def _assert_same(img: sitk.Image, expected_hu: np.ndarray, geom: Geometry) -> None:
    np.testing.assert_array_equal(sitk.GetArrayFromImage(img).astype(np.int32), expected_hu.astype(np.int32))
    np.testing.assert_allclose(img.GetOrigin(), geom.origin, atol=1e-4)
    np.testing.assert_allclose(img.GetSpacing(), geom.spacing, atol=1e-4)
    np.testing.assert_allclose(np.asarray(img.GetDirection()).reshape(3, 3), geom.direction, atol=1e-4)


def _headers(paths):
    return [pydicom.dcmread(p, stop_before_pixels=True) for p in paths]


@pytest.mark.parametrize("transfer_syntax", ["explicit_le", "rle", "jpeg2000"])
@pytest.mark.parametrize("unsigned", [False, True])
def test_round_trip_through_simpleitk(tmp_path, transfer_syntax, unsigned):
    vol = _volume()
    paths = write_dicom_series(vol, tmp_path, transfer_syntax=transfer_syntax, unsigned=unsigned)
    assert len(paths) == vol.shape[0]
    ds = pydicom.dcmread(paths[3])
    expected_ts = {
        "explicit_le": pydicom.uid.ExplicitVRLittleEndian,
        "rle": pydicom.uid.RLELossless,
        "jpeg2000": pydicom.uid.JPEG2000Lossless,
    }[transfer_syntax]
    assert ds.file_meta.TransferSyntaxUID == expected_ts
    assert ds.SOPClassUID == CT_IMAGE_STORAGE == ds.file_meta.MediaStorageSOPClassUID
    assert ds.SOPInstanceUID == ds.file_meta.MediaStorageSOPInstanceUID
    assert ds.Modality == "CT" and list(ds.ImageType) == ["ORIGINAL", "PRIMARY", "AXIAL"]
    assert ds.PixelRepresentation == (0 if unsigned else 1) and ds.BitsAllocated == 16
    assert float(ds.RescaleIntercept) == (-1024 if unsigned else 0) and float(ds.RescaleSlope) == 1
    assert ds.RescaleType == "HU" and ds.InstanceNumber == 4
    # PixelSpacing is [row spacing, column spacing] = [sj, si]
    assert [float(v) for v in ds.PixelSpacing] == [SPACING[1], SPACING[0]]
    assert float(ds.SpacingBetweenSlices) == SPACING[2] and float(ds.SliceThickness) == SPACING[2]
    np.testing.assert_allclose([float(v) for v in ds.ImagePositionPatient], [ORIGIN[0], ORIGIN[1], ORIGIN[2] + 3 * SPACING[2]])
    # pydicom decodes the stored values (HU - intercept), unsigned storage clips below -1024 HU
    expected = np.maximum(vol.array, -1024) if unsigned else vol.array
    np.testing.assert_array_equal(ds.pixel_array.astype(np.int32), expected[3].astype(np.int32) - int(ds.RescaleIntercept))
    _assert_same(_sitk_read(tmp_path), expected, vol.geometry)


def test_oblique_geometry_round_trip(tmp_path):
    direction = _rotation(0.2, -0.15, 0.4)
    vol = _volume(direction=direction, seed=3)
    write_dicom_series(vol, tmp_path)
    _assert_same(_sitk_read(tmp_path), vol.array, vol.geometry)


def test_slice_axis_against_the_normal_reads_back_reversed(tmp_path):
    # direction[:, 2] = -(row x column): positions descend with k, so a reader sorting by position reverses k
    direction = np.diag([1.0, 1.0, -1.0])
    vol = _volume(direction=direction)
    write_dicom_series(vol, tmp_path)
    img = _sitk_read(tmp_path)
    flipped = Geometry(shape=vol.shape, spacing=SPACING, origin=vol.index_to_lps([0, 0, vol.shape[0] - 1]))
    _assert_same(img, vol.array[::-1], flipped)


def test_float_hu_are_rounded_and_clipped(tmp_path):
    values = np.array([10.4, 10.6, -3.6, -0.4, 2.5, 40000.0, -40000.0, 1500.49], dtype=np.float32)
    arr = np.tile(values, (3, 2, 1))
    vol = CTVolume(arr, Geometry(shape=arr.shape, spacing=SPACING, origin=ORIGIN))
    write_dicom_series(vol, tmp_path)
    got = sitk.GetArrayFromImage(_sitk_read(tmp_path))[0, 0]
    np.testing.assert_array_equal(got, [10, 11, -4, 0, 2, 32767, -32768, 1500])


def test_shuffled_names_in_nested_folders(tmp_path):
    vol = _volume()
    paths = write_dicom_series(vol, tmp_path, quirks=["shuffled_names"], seed=5)
    assert len(paths) == vol.shape[0]
    assert all(p.suffix == "" and len(p.name) == 16 and int(p.name, 16) >= 0 for p in paths)
    assert any(p.parent != tmp_path for p in paths)
    assert not list(tmp_path.rglob("*.tmp"))
    reader = sitk.ImageSeriesReader()
    top_level = reader.GetGDCMSeriesFileNames(str(tmp_path), "", False, False)
    assert len(top_level) < len(paths)
    names = reader.GetGDCMSeriesFileNames(str(tmp_path), "", False, True)  # recursive, sorted by position
    assert sorted(names) == sorted(str(p) for p in paths)
    reader.SetFileNames(names)
    _assert_same(reader.Execute(), vol.array, vol.geometry)


def test_reversed_order_runs_instance_numbers_against_position(tmp_path):
    vol = _volume()
    paths = write_dicom_series(vol, tmp_path, quirks="reversed_order")  # a single quirk may be a string
    hdr = _headers(paths)
    z = [float(h.ImagePositionPatient[2]) for h in hdr]
    inst = [int(h.InstanceNumber) for h in hdr]
    assert z == sorted(z) and inst == list(range(vol.shape[0], 0, -1))
    _assert_same(_sitk_read(tmp_path), vol.array, vol.geometry)


def test_missing_and_duplicate_slice(tmp_path):
    vol = _volume()
    nk = vol.shape[0]
    miss = _headers(write_dicom_series(vol, tmp_path / "miss", quirks=["missing_slice"]))
    z = [float(h.ImagePositionPatient[2]) for h in miss]
    assert len(miss) == nk - 1
    assert ORIGIN[2] + (nk // 2) * SPACING[2] not in z
    gaps = np.diff(sorted(z))
    assert np.isclose(gaps.max(), 2 * SPACING[2]) and np.isclose(gaps.min(), SPACING[2])

    dup = _headers(write_dicom_series(vol, tmp_path / "dup", quirks=["duplicate_slice"]))
    assert len(dup) == nk + 1
    positions = [tuple(float(v) for v in h.ImagePositionPatient) for h in dup]
    assert len(set(positions)) == nk
    assert positions[-1] == positions[nk // 2]
    assert len({h.SOPInstanceUID for h in dup}) == nk + 1
    assert len({int(h.InstanceNumber) for h in dup}) == nk + 1


def test_gantry_tilt_shears_positions_and_resamples(tmp_path):
    vol = _smooth_volume()
    paths = write_dicom_series(vol, tmp_path, quirks=["gantry_tilt"])
    t = np.deg2rad(GANTRY_TILT_DEG)
    si, sj, sk = vol.spacing
    for k, path in enumerate(paths):
        ds = pydicom.dcmread(path)
        assert float(ds.GantryDetectorTilt) == GANTRY_TILT_DEG
        iop = np.array([float(v) for v in ds.ImageOrientationPatient])
        np.testing.assert_allclose(iop, [1, 0, 0, 0, np.cos(t), np.sin(t)], atol=1e-6)
        ipp = np.array([float(v) for v in ds.ImagePositionPatient])
        # every pixel's LPS point, mapped back into the original grid, holds the original value
        jj, ii = np.mgrid[: ds.Rows, : ds.Columns]
        lps = ipp + ii[..., None] * si * iop[:3] + jj[..., None] * sj * iop[3:]
        ijk = vol.lps_to_index(lps.reshape(-1, 3))
        inside = (ijk[:, 2] >= -1e-3) & (ijk[:, 2] <= vol.shape[0] - 1 + 1e-3)
        outside = (ijk[:, 2] < -1e-3) | (ijk[:, 2] > vol.shape[0] - 1 + 1e-3)
        expect = map_coordinates(vol.array.astype(np.float64), ijk[:, ::-1].T, order=1, mode="nearest")
        got = ds.pixel_array.reshape(-1).astype(np.float64)
        assert inside.sum() >= 0.4 * got.size  # the edge slices reach half beyond the scanned slab
        if k == len(paths) // 2:
            assert inside.all()
        np.testing.assert_allclose(got[inside], expect[inside], atol=0.51)
        # past the slab, a row holds the nearest slab slice's anatomy (a tilted scanner images every row): not air
        np.testing.assert_allclose(got[outside], expect[outside], atol=0.51)
    hdr = _headers(paths)
    ipps = np.array([[float(v) for v in h.ImagePositionPatient] for h in hdr])
    step = np.diff(ipps, axis=0)
    normal = np.cross(iop[:3], iop[3:])
    # the table moves along z (sk per slice): the step is not along the slice normal (sheared along y)
    np.testing.assert_allclose(step, np.tile([0, 0, sk], (len(step), 1)), atol=1e-6)
    along_col = step @ iop[3:]
    np.testing.assert_allclose(along_col, sk * np.sin(t), atol=1e-6)
    np.testing.assert_allclose(step @ normal, sk * np.cos(t), atol=1e-6)


def test_localizer_and_second_series(tmp_path):
    vol = _volume(shape=(8, 20, 24))
    paths = write_dicom_series(vol, tmp_path, quirks=["localizer", "second_series"])
    hdr = _headers(paths)
    by_series: dict[str, list] = {}
    for h in hdr:
        by_series.setdefault(h.SeriesInstanceUID, []).append(h)
    assert len(by_series) == 3
    main_uid = hdr[0].SeriesInstanceUID
    assert len(by_series[main_uid]) == 8
    loc = [h for h in hdr if list(h.ImageType)[2] == "LOCALIZER"]
    assert len(loc) == 1 and loc[0].SeriesInstanceUID != main_uid
    assert list(loc[0].ImageType) == ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    np.testing.assert_allclose([float(v) for v in loc[0].ImageOrientationPatient], [1, 0, 0, 0, 0, -1])
    assert (loc[0].Rows, loc[0].Columns) == (8, 24)
    thick = [h for h in hdr if h.SeriesInstanceUID not in (main_uid, loc[0].SeriesInstanceUID)]
    assert len(thick) == 2 and all(float(h.SliceThickness) == 5.0 for h in thick)
    assert all(list(h.ImageType) == ["ORIGINAL", "PRIMARY", "AXIAL"] for h in thick)
    assert len({h.StudyInstanceUID for h in hdr}) == 1 and len({h.FrameOfReferenceUID for h in hdr}) == 1
    thick_img = _sitk_read(tmp_path, thick[0].SeriesInstanceUID)
    expected = np.rint(vol.array.astype(np.float64).reshape(2, 4, 20, 24).mean(axis=1))
    np.testing.assert_array_equal(sitk.GetArrayFromImage(thick_img), expected)
    np.testing.assert_allclose(thick_img.GetOrigin()[2], ORIGIN[2] + 1.5 * SPACING[2], atol=1e-4)
    # the main series still reads back as the volume
    _assert_same(_sitk_read(tmp_path, main_uid), vol.array, vol.geometry)


def test_all_quirks_combine(tmp_path):
    vol = _volume()
    quirks = ["shuffled_names", "reversed_order", "gantry_tilt", "missing_slice", "duplicate_slice", "localizer", "second_series"]
    paths = write_dicom_series(vol, tmp_path, quirks=quirks, transfer_syntax="rle")
    assert len(paths) == 8 - 1 + 1 + 2 + 1
    assert all(p.suffix == "" for p in paths)
    assert {str(p) for p in tmp_path.rglob("*") if p.is_file()} == {str(p) for p in paths}


@pytest.mark.parametrize("transfer_syntax", ["explicit_le", "rle"])
def test_enhanced_multiframe(tmp_path, transfer_syntax):
    vol = _volume(direction=_rotation(0.0, 0.0, 0.3))
    paths = write_dicom_series(vol, tmp_path, enhanced=True, transfer_syntax=transfer_syntax, unsigned=True)
    assert len(paths) == 1
    ds = pydicom.dcmread(paths[0])
    assert ds.SOPClassUID == ENHANCED_CT_IMAGE_STORAGE
    assert ds.NumberOfFrames == vol.shape[0]
    shared = ds.SharedFunctionalGroupsSequence[0]
    assert [float(v) for v in shared.PixelMeasuresSequence[0].PixelSpacing] == [SPACING[1], SPACING[0]]
    iop = [float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient]
    np.testing.assert_allclose(iop, np.concatenate([vol.direction[:, 0], vol.direction[:, 1]]), atol=1e-9)
    pvt = shared.PixelValueTransformationSequence[0]
    assert float(pvt.RescaleIntercept) == -1024 and pvt.RescaleType == "HU"
    frames = ds.PerFrameFunctionalGroupsSequence
    assert len(frames) == vol.shape[0]
    for k, frame in enumerate(frames):
        ipp = [float(v) for v in frame.PlanePositionSequence[0].ImagePositionPatient]
        np.testing.assert_allclose(ipp, vol.index_to_lps([0, 0, k]), atol=1e-6)
        assert frame.FrameContentSequence[0].InStackPositionNumber == k + 1
    hu = ds.pixel_array.astype(np.int32) + int(pvt.RescaleIntercept)
    np.testing.assert_array_equal(hu, np.maximum(vol.array, -1024))
    # GDCM reads the multi-frame geometry from the functional groups
    _assert_same(sitk.ReadImage(str(paths[0])), np.maximum(vol.array, -1024), vol.geometry)


def test_uids_are_deterministic(tmp_path):
    vol = _volume()
    a = _headers(write_dicom_series(vol, tmp_path / "a", seed=7))
    b = _headers(write_dicom_series(vol, tmp_path / "b", seed=7, transfer_syntax="rle"))
    c = _headers(write_dicom_series(vol, tmp_path / "c", seed=8))
    for key in ("SOPInstanceUID", "SeriesInstanceUID", "StudyInstanceUID", "FrameOfReferenceUID"):
        assert [h[key].value for h in a] == [h[key].value for h in b]
        assert a[0][key].value != c[0][key].value
        assert pydicom.uid.UID(a[0][key].value).is_valid
    assert len({h.SOPInstanceUID for h in a}) == len(a)
    s1 = write_dicom_series(vol, tmp_path / "s1", seed=3, quirks=["shuffled_names"])
    s2 = write_dicom_series(vol, tmp_path / "s2", seed=3, quirks=["shuffled_names"])
    assert [p.relative_to(tmp_path / "s1") for p in s1] == [p.relative_to(tmp_path / "s2") for p in s2]


def test_volume_metadata_is_kept(tmp_path):
    meta = {
        "PatientID": "P123",
        "StudyInstanceUID": "1.2.3.4",
        "SeriesInstanceUID": "1.2.3.4.5",
        "KVP": 100,
        "ConvolutionKernel": "B30f",
        "PatientPosition": "FFS",
        "SliceThickness": 2.0,
    }
    vol = _volume(metadata=meta)
    ds = _headers(write_dicom_series(vol, tmp_path))[0]
    assert ds.PatientID == "P123" and ds.StudyInstanceUID == "1.2.3.4" and ds.SeriesInstanceUID == "1.2.3.4.5"
    assert float(ds.KVP) == 100 and ds.ConvolutionKernel == "B30f" and ds.PatientPosition == "FFS"
    assert float(ds.SliceThickness) == 2.0 and float(ds.SpacingBetweenSlices) == SPACING[2]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"quirks": ["upside_down"]}, ["upside_down", "shuffled_names"]),
        ({"transfer_syntax": "jpegls"}, ["jpegls", "rle"]),
        ({"enhanced": True, "quirks": ["gantry_tilt"]}, ["gantry_tilt", "enhanced"]),
    ],
)
def test_bad_options_raise_with_fix(tmp_path, kwargs, words):
    with pytest.raises(DicomWriteError) as info:
        write_dicom_series(_volume(), tmp_path / "x", **kwargs)
    assert isinstance(info.value, CtpipeError) and info.value.fix
    assert str(tmp_path / "x") in str(info.value)
    for word in words:
        assert word in str(info.value)
    assert not (tmp_path / "x").exists()


def test_jpeg2000_small_images(tmp_path):
    with pytest.raises(DicomWriteError, match="at least 32"):
        write_dicom_series(_volume(shape=(4, 16, 40)), tmp_path / "small", transfer_syntax="jpeg2000")
    paths = write_dicom_series(_volume(), tmp_path / "loc", transfer_syntax="jpeg2000", quirks=["localizer"])
    syntaxes = [pydicom.dcmread(p, stop_before_pixels=True).file_meta.TransferSyntaxUID for p in paths]
    assert syntaxes == [pydicom.uid.JPEG2000Lossless] * 8 + [pydicom.uid.ExplicitVRLittleEndian]


def test_too_few_slices_for_missing_slice(tmp_path):
    with pytest.raises(DicomWriteError, match="at least 3 slices"):
        write_dicom_series(_volume(shape=(2, 8, 8)), tmp_path, quirks=["missing_slice"])


def test_cli_choices_match_the_writer():
    from pipeline.phantom import cli
    from pipeline.phantom.dicom_writer import QUIRKS, TRANSFER_SYNTAXES

    assert set(cli._QUIRKS) == set(QUIRKS)
    assert set(cli._TRANSFER_SYNTAXES) == set(TRANSFER_SYNTAXES)


_SMALL = {
    "matrix": 64,
    "pixel_spacing": 2.0,
    "slice_spacing": 4.0,
    "slices": 16,
    "n_nodules": 1,
    "nodule_diameter_mm": (6.0, 10.0),
}


@pytest.mark.parametrize("position", ["HFS", "FFP"])
def test_write_phantom_case_matches_volume_and_ground_truth(tmp_path, position):
    from pipeline.phantom import generate_phantom, load_ground_truth, load_masks, write_phantom_series
    from pipeline.phantom.dicom_writer import write_phantom_case

    assert write_phantom_series is write_phantom_case
    phantom = generate_phantom(4, patient_position=position, **_SMALL)
    case = write_phantom_case(phantom, tmp_path / "case", transfer_syntax="jpeg2000")
    assert case == tmp_path / "case"
    img = _sitk_read(case / "dicom")
    _assert_same(img, np.rint(phantom.volume.array), phantom.volume.geometry)
    gt = load_ground_truth(case)
    ds = pydicom.dcmread(next((case / "dicom").iterdir()), stop_before_pixels=True)
    assert ds.SeriesInstanceUID == gt["series_uid"] == phantom.volume.series_uid
    assert ds.PatientID == phantom.volume.metadata["PatientID"] and ds.PatientPosition == position
    masks = load_masks(case)
    assert masks["lung_left"].shape == tuple(reversed(img.GetSize()))
    # the nodule's LPS centre lands inside its label in the written series' own geometry
    for n, nodule in enumerate(gt["nodules"], start=1):
        i, j, k = img.TransformPhysicalPointToIndex([float(v) for v in nodule["center_lps"]])
        assert masks["nodule_labels"][k, j, i] == n


def test_cli_writes_cases(tmp_path, capsys):
    from pipeline.cli import main

    argv = [
        "phantom",
        str(tmp_path),
        "--seed",
        "4",
        "--count",
        "2",
        "--matrix",
        "64",
        "--pixel-spacing",
        "2",
        "--slice-spacing",
        "4",
        "--slices",
        "16",
        "--nodules",
        "1",
        "--nodule-diameter",
        "6",
        "10",
        "--transfer-syntax",
        "rle",
        "--quirk",
        "shuffled_names",
        "--quirk",
        "localizer",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for seed in (4, 5):
        case = tmp_path / f"phantom_{seed:05d}"
        assert str(case) in out
        files = [p for p in (case / "dicom").rglob("*") if p.is_file()]
        assert len(files) == 16 + 1 and all(p.suffix == "" for p in files)
        ds = pydicom.dcmread(files[0], stop_before_pixels=True)
        assert ds.file_meta.TransferSyntaxUID == pydicom.uid.RLELossless
        assert (case / "ground_truth.json").is_file() and (case / "masks.npz").is_file()


def test_cli_reports_failing_cases(tmp_path, capsys):
    from pipeline.cli import main

    argv = [
        "phantom",
        str(tmp_path),
        "--seed",
        "4",
        "--matrix",
        "64",
        "--pixel-spacing",
        "2",
        "--slices",
        "16",
        "--nodules",
        "2",
        "--nodule-diameter",
        "50",
        "60",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "seed 4" in err and "nodule" in err
    with pytest.raises(SystemExit) as exc:  # argparse refuses it, with the range
        main(["phantom", str(tmp_path), "--seed", "1", "--count", "0"])
    assert exc.value.code == 2 and "argument --count: 0 is out of range (>= 1)" in capsys.readouterr().err
