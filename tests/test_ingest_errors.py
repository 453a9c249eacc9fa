"""Bad input: each case raises its specific error naming the file/series, the problem and the fix."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate

from pipeline.errors import (
    CtpipeError,
    DuplicateSliceError,
    GantryTiltError,
    InconsistentSeriesError,
    MissingPixelDataError,
    MissingSliceError,
    NonUniformSpacingError,
    NotCTError,
    NotDicomError,
    SingleSliceError,
    TruncatedFileError,
    UnsupportedTransferSyntaxError,
)
from pipeline.ingest import SelectionRules, load_series, scan_directory
from tests._support.dicom import hu_pattern, write_series

RULES = SelectionRules(min_slices=2)


def _msg(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert isinstance(err.value, CtpipeError)
    assert "Fix:" in text and err.value.fix, text
    return text


def test_not_dicom_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("patient list\n" * 50)
    with pytest.raises(NotDicomError) as err:
        load_series(f)
    text = _msg(err)
    assert "notes.txt" in text and "not a DICOM file" in text and "pass the folder of a DICOM series" in text


def test_folder_without_dicom(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 300)
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 2)
    with pytest.raises(NotDicomError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "no DICOM image files" in text and "2 not dicom" in text


def test_truncated_header(tmp_path):
    paths = write_series(tmp_path / "s", n=3)
    data = paths[0].read_bytes()
    bad = tmp_path / "cut.dcm"
    bad.write_bytes(data[:400])
    with pytest.raises(TruncatedFileError) as err:
        load_series(bad)
    text = _msg(err)
    assert "cut.dcm" in text and "cut short" in text and "copy the file again" in text


def test_truncated_pixel_data_names_file(tmp_path):
    paths = write_series(tmp_path, n=12)
    data = paths[5].read_bytes()
    paths[5].write_bytes(data[:-100])
    ds = pydicom.dcmread(paths[0])
    needed = int(ds.Rows) * int(ds.Columns) * int(ds.BitsAllocated) // 8
    with pytest.raises(TruncatedFileError) as err:
        load_series(tmp_path)
    text = _msg(err)
    # was: "... but the file has 1568", which read as the file's size; it was the bytes left after the offset
    assert str(paths[5]) in text and "the file is cut short" in text, text
    assert f"its pixel data needs {needed} bytes but only {needed - 100} of them are present" in text, text
    assert f"{len(data) - 100} bytes in all" in text, text


def test_missing_pixel_data(tmp_path):
    paths = write_series(tmp_path, n=12)
    ds = pydicom.dcmread(paths[3])
    del ds.PixelData
    ds.save_as(paths[3])
    with pytest.raises(MissingPixelDataError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert paths[3].name in text and "no PixelData" in text


def test_inconsistent_rows_columns(tmp_path):
    def tweak(k, ds):
        if k == 4:
            ds.Rows, ds.Columns = 8, 10
            ds.PixelData = np.zeros((8, 10), np.int16).tobytes()

    paths = write_series(tmp_path, n=12, rows=16, cols=20, tweak=tweak)
    with pytest.raises(InconsistentSeriesError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert paths[4].name in text and "Rows differs" in text and "has 8" in text and "11 file(s) have 16" in text


def test_mixed_pixel_spacing(tmp_path):
    def tweak(k, ds):
        if k == 7:
            ds.PixelSpacing = ["0.5", "0.5"]

    paths = write_series(tmp_path, n=12, tweak=tweak)
    with pytest.raises(InconsistentSeriesError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert paths[7].name in text and "PixelSpacing" in text and "0.5" in text


def test_a_field_of_view_larger_than_any_scanner_is_refused_before_any_work(tmp_path):
    """40 mm pixels (an edited header): 20 columns cover 800 mm, 30 rows 1200 mm; resampled to 1 mm voxels such a
    series exhausts the memory, so it is refused at ingest, and so by the detector when it comes as an image file."""
    from pipeline.detection.infer_input import check_volume_extent
    from pipeline.errors import SeriesGeometryError
    from pipeline.volume import CTVolume, Geometry

    write_series(tmp_path / "wide", n=4, rows=30, cols=20, pixel_spacing=(40.0, 40.0))
    with pytest.raises(SeriesGeometryError) as err:
        load_series(tmp_path / "wide")
    text = _msg(err)
    assert "800 × 1200 mm in-plane" in text and "30 rows × 40 mm" in text and "PixelSpacing (0028,0030)" in text
    write_series(tmp_path / "long", n=12, step=250.0)  # 2,750 mm along the table
    with pytest.raises(SeriesGeometryError, match="2750 mm along the slices"):
        load_series(tmp_path / "long")
    vol = load_series(write_series(tmp_path / "ok", n=16, rows=32, cols=32)[0].parent)
    g = vol.geometry
    wide = CTVolume(vol.array, Geometry(shape=vol.shape, spacing=(60.0, 60.0, 1.25), origin=g.origin, direction=g.direction))
    with pytest.raises(SeriesGeometryError, match="1920 × 1920 mm in-plane"):
        check_volume_extent(wide, "image wide.nii.gz")
    check_volume_extent(vol, "series ok")  # a real field of view passes


def test_a_series_holding_another_patients_image_is_refused_without_naming_either(tmp_path):
    from pipeline.errors import MixedPatientsError

    def tweak(k, ds):
        ds.PatientID, ds.PatientName = "MRN554433", "ROE^RICHARD"
        if k == 7:  # a misfiled image: the same SeriesInstanceUID, another patient
            ds.PatientID, ds.PatientName = "MRN000111", "WRONG^PATIENT"

    paths = write_series(tmp_path, n=12, tweak=tweak)
    with pytest.raises(MixedPatientsError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "PatientID differs within the series: 11 file(s) have one value, 1 another" in text and paths[7].name in text
    assert not any(v in text for v in ("MRN554433", "ROE", "MRN000111", "WRONG"))  # identifiers stay in the files


def test_missing_slice(tmp_path):
    paths = write_series(tmp_path, n=12, step=2.0)
    paths[6].unlink()
    with pytest.raises(MissingSliceError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "1 slice(s) missing" in text and paths[5].name in text and paths[7].name in text and "4.000 mm" in text


def test_duplicate_position(tmp_path):
    def tweak(k, ds):
        if k == 9:
            ds.ImagePositionPatient = [-10.0, -20.0, 30.0 + 3 * 1.25]

    paths = write_series(tmp_path, n=12, tweak=tweak)
    # slice 9 now sits on slice 3's position; slice 9's own position is empty, so duplicates are reported first
    with pytest.raises(DuplicateSliceError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert paths[3].name in text and paths[9].name in text and "33.750 mm" in text
    assert "hold different images" in text and "wrong ImagePositionPatient" in text and "not delete one" in text


def test_duplicate_copies_under_new_uids(tmp_path):
    """The same image twice under two SOPInstanceUIDs (an archive that sent it again): called copies, one to remove."""
    paths = write_series(tmp_path, n=12)
    ds = pydicom.dcmread(paths[4])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = "1.2.826.0.1.3680043.8.498.77"
    ds.save_as(tmp_path / "zz_again.dcm")
    with pytest.raises(DuplicateSliceError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert paths[4].name in text and "zz_again.dcm" in text and "identical pixel data" in text
    assert "remove one file of each pair (e.g. zz_again.dcm)" in text


def test_non_uniform_spacing(tmp_path):
    z = [0, 1, 2, 3, 4, 5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5]
    write_series(tmp_path, n=12, positions=[(0.0, 0.0, v) for v in z])
    with pytest.raises(NonUniformSpacingError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "1.500 mm" in text and "ctpipe run --set ingest.spacing_tolerance=" in text
    # a looser tolerance accepts the series
    vol = load_series(tmp_path, spacing_tolerance=0.6)
    assert vol.shape[0] == 12


def test_gantry_tilt_rejected_then_resampled(tmp_path):
    tilt = np.radians(10.0)
    col = (0.0, np.cos(tilt), np.sin(tilt))
    step = 2.0
    hu = hu_pattern(12, 16, 20)
    hu[:] = -1000
    hu[:, 6:10, 8:12] = 100  # a bar along z in index space
    positions = [(0.0, 0.0, k * step) for k in range(12)]  # table moves along z, image planes are tilted

    def tweak(k, ds):
        ds.GantryDetectorTilt = "10"

    write_series(tmp_path, n=12, orientation=(1, 0, 0, *col), positions=positions, hu=hu, pixel_spacing=(1.0, 1.0), tweak=tweak)
    with pytest.raises(GantryTiltError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert (
        "gantry tilt of 10.00 deg" in text
        and "GantryDetectorTilt=10" in text
        and "allow_gantry_tilt=True" in text
        and "--set ingest.allow_gantry_tilt=true" in text
    )
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    assert vol.array.dtype == np.float32
    assert vol.metadata["GantryTiltCorrectedDeg"] == pytest.approx(10.0, abs=1e-3)
    # orthogonal grid: the third axis is the plane normal, the slice step is its projection on it
    normal = np.cross((1, 0, 0), col)
    np.testing.assert_allclose(vol.direction[:, 2], normal, atol=1e-6)
    assert vol.spacing[2] == pytest.approx(step * np.cos(tilt), abs=1e-6)
    # the bar is fixed in patient space: on the resampled grid it moves along j by step*sin(tilt) per slice
    k = 10
    row_shift = k * step * np.sin(tilt)
    profile = vol.array[k, :, 10]
    centre = float((np.arange(profile.size) * (profile > -450)).sum() / max(1, (profile > -450).sum()))
    assert centre == pytest.approx(7.5 + row_shift, abs=0.6)


def test_single_slice(tmp_path):
    paths = write_series(tmp_path, n=1)
    with pytest.raises(SingleSliceError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "1 image(s)" in text and "at least 2 slices" in text
    with pytest.raises(SingleSliceError):
        load_series(paths[0])


def test_not_ct(tmp_path):
    write_series(tmp_path, n=12, modality="MR", description="T1 AX")
    with pytest.raises(NotCTError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "Modality MR" in text and "CT" in text
    scan = scan_directory(tmp_path)
    with pytest.raises(NotCTError) as err:
        load_series(tmp_path, series_uid=scan.series[0].uid)
    assert scan.series[0].uid in str(err.value)


def _encapsulated(tmp_path, ts_uid: str):
    paths = write_series(tmp_path, n=12)
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.file_meta.TransferSyntaxUID = ts_uid
        ds.PixelData = encapsulate([b"\x00" * 64])
        ds["PixelData"].VR = "OB"
        ds.save_as(p, enforce_file_format=True)
    return paths


def test_unsupported_transfer_syntax(tmp_path):
    _encapsulated(tmp_path, "1.2.840.10008.1.2.4.100")
    with pytest.raises(UnsupportedTransferSyntaxError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "1.2.840.10008.1.2.4.100" in text and "MPEG2 Main Profile" in text and "gdcmconv --raw" in text


def test_missing_decoder_names_package(tmp_path, monkeypatch):
    import pydicom.pixels

    class NoPlugin:
        is_available = False
        missing_dependencies = ["pylibjpeg - requires pylibjpeg>=2.0 and pylibjpeg-rle>=2.0"]

    _encapsulated(tmp_path, "1.2.840.10008.1.2.5")
    monkeypatch.setattr(pydicom.pixels, "get_decoder", lambda uid: NoPlugin())
    with pytest.raises(UnsupportedTransferSyntaxError) as err:
        load_series(tmp_path)
    text = _msg(err)
    assert "1.2.840.10008.1.2.5 (RLE Lossless)" in text and "pip install pylibjpeg pylibjpeg-rle" in text


def test_rules_validated():
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="min_slices"):
        SelectionRules(min_slices=1)
    with pytest.raises(ConfigError, match="axial_tolerance_deg"):
        SelectionRules(axial_tolerance_deg=120)
    with pytest.raises(ConfigError, match="modalities"):
        SelectionRules(modalities=())
    with pytest.raises(TypeError):
        SelectionRules(5)  # keyword-only


def test_bits_stored_masks_unused_high_bits(tmp_path):
    """12-bit data with junk in the 4 unused bits reads like pydicom's decoder reads it."""
    rng = np.random.default_rng(1)

    def tweak(k, ds):
        ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 12, 11, 0
        ds.RescaleIntercept = "-1024"
        values = rng.integers(0, 4096, size=(16, 20)).astype(np.uint16)
        values |= rng.integers(0, 16, size=values.shape).astype(np.uint16) << 12  # junk above bit 11
        ds.PixelData = values.tobytes()

    paths = write_series(tmp_path, n=12, unsigned=True, tweak=tweak)
    vol = load_series(tmp_path)
    want = np.stack([pydicom.dcmread(p).pixel_array.astype(np.int32) - 1024 for p in paths])
    assert np.array_equal(vol.array, want)
    assert vol.array.min() >= -1024 and vol.array.max() <= 4095 - 1024


def test_deflated_file_falls_back_to_pydicom(tmp_path):
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    paths = write_series(tmp_path, n=12)
    direct = load_series(tmp_path)
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
        ds.save_as(p, enforce_file_format=True)
    vol = load_series(tmp_path)
    assert np.array_equal(vol.array, direct.array) and vol.geometry.same_grid(direct.geometry)
    assert vol.metadata["TransferSyntaxUID"] == DeflatedExplicitVRLittleEndian


def test_missing_path(tmp_path):
    with pytest.raises(NotDicomError) as err:
        load_series(tmp_path / "nowhere")
    assert "nowhere" in str(err.value) and "no such file or folder" in _msg(err)
    with pytest.raises(NotDicomError):
        scan_directory([tmp_path / "nowhere"])


def test_a_position_written_with_decimal_commas_shows_the_value(tmp_path):
    """An exporter that wrote ImagePositionPatient with decimal commas: the error shows what the file holds, not
    'the file lacks geometry'."""
    paths = write_series(tmp_path, n=12)
    data = paths[4].read_bytes()
    ds = pydicom.dcmread(paths[4])
    text = "\\".join(str(v) for v in ds["ImagePositionPatient"].value).encode()
    assert data.count(text) == 1 and b"." in text
    paths[4].write_bytes(data.replace(text, text.replace(b".", b",")))
    with pytest.raises(CtpipeError) as err:
        load_series(tmp_path, rules=RULES)
    msg = _msg(err)
    assert str(paths[4]) in msg and text.replace(b".", b",").decode() in msg and "decimal comma" in msg, msg
    assert "lacks geometry" not in msg, msg


def test_a_pixel_spacing_with_one_value_shows_it(tmp_path):
    def one(k, ds):
        if k == 0:
            ds["PixelSpacing"] = pydicom.DataElement(0x00280030, "DS", "0.7")

    paths = write_series(tmp_path, n=12, tweak=one)
    with pytest.raises(CtpipeError) as err:
        load_series(tmp_path, rules=RULES)
    msg = _msg(err)
    assert str(paths[0]) in msg and "PixelSpacing (0028,0030) is '0.7'" in msg and "2 numbers" in msg, msg


def test_a_tilt_correction_warns_how_far_it_shifted_the_slices(tmp_path):
    """With allow_gantry_tilt, slices are shifted in-plane onto a grid grown to hold them whole: the volume's
    warnings say so, with the largest shift in mm (10 deg over 11 steps of 2 mm along z: 22 mm × sin 10° = 3.8 mm,
    5.4 rows of 0.7 mm: 6 rows more)."""
    tilt = np.radians(10.0)
    positions = [(0.0, 0.0, k * 2.0) for k in range(12)]
    write_series(tmp_path, n=12, orientation=(1, 0, 0, 0.0, np.cos(tilt), np.sin(tilt)), positions=positions)
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    (warning,) = [w for w in vol.metadata["warnings"] if "gantry tilt" in w]
    assert "10.00 deg" in warning and "up to 3.8 mm" in warning and "cut" not in warning, warning
    assert "grown by 0 column(s) and 6 row(s)" in warning and "nothing was measured" in warning, warning
    assert "-1024 HU there" in warning and "outside the scan" in warning, warning
    assert vol.shape == (12, 16 + 6, 20) and vol.metadata["GantryTiltGrownColumnsRows"] == [0, 6]


def test_a_few_excess_bytes_after_the_pixel_data_are_padding(tmp_path):
    """Pixel data a few bytes longer than Rows × Columns need (padding some writers add; pydicom and SimpleITK read
    such files) load as without them; a whole row more is still refused (the header does not describe the image)."""
    paths = write_series(tmp_path / "s", n=12)
    ref = load_series(tmp_path / "s")

    def pad(extra: bytes):
        ds = pydicom.dcmread(paths[4])
        ds.PixelData = ds.PixelData + extra
        ds.save_as(paths[4], enforce_file_format=True)

    pad(b"\0" * 6)  # 16 x 20 pixels of 2 bytes: 640 bytes needed, 646 held
    vol = load_series(tmp_path / "s")
    assert np.array_equal(vol.array, ref.array)
    pad(b"\0" * 34)  # 680 held: one row (20 columns x 2 bytes) more
    with pytest.raises(CtpipeError, match="needs 640 bytes of pixel data but PixelData"):
        load_series(tmp_path / "s")
