"""Stored pixel formats that change from slice to slice within one series, as archives hold them: each slice's
values read with its own BitsStored / PixelRepresentation, the HU the same as SimpleITK's (pydicom's) reading."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest

from pipeline.errors import DuplicateSliceError
from pipeline.ingest import SelectionRules, load_series, scan_directory
from tests._support.dicom import hu_pattern, write_series

RULES = SelectionRules(min_slices=2)


def _pydicom_hu(paths) -> np.ndarray:
    """HU of each file as pydicom decodes it (its own BitsStored, sign and rescale), in slice order."""
    out = []
    for p in paths:
        ds = pydicom.dcmread(p)
        out.append(ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept))
    return np.stack(out)


def test_bits_stored_varying_per_slice_keeps_metal(tmp_path):
    """A scanner writes BitsStored 12 on ordinary slices and 16 on the one holding metal (3000 HU): the metal slice
    is read with its own 16 bits, not cut to the first slice's 12 (which made 3000 HU into -1096 HU, air)."""
    n, metal_k = 8, 5
    hu = hu_pattern(n, 16, 20)
    hu = np.clip(hu, -1000, 1000)  # stored = HU (intercept 0): fits 12 signed bits, checked below
    hu[metal_k, 4:7, 4:7] = 3000

    def tweak(k: int, ds: pydicom.Dataset) -> None:
        if k != metal_k:
            ds.BitsStored, ds.HighBit = 12, 11

    paths = write_series(tmp_path, n=n, hu=hu, intercept=0.0, tweak=tweak)
    stored = np.stack([pydicom.dcmread(p).pixel_array for p in paths])
    assert stored[np.arange(n) != metal_k].min() >= -2048 and stored[np.arange(n) != metal_k].max() <= 2047
    vol = load_series(tmp_path, rules=RULES, workers=0)
    assert np.array_equal(vol.array, _pydicom_hu(paths))
    assert vol.array[metal_k, 4:7, 4:7].min() == 3000


def test_pixel_representation_varying_per_slice(tmp_path):
    """Half the slices stored unsigned (intercept -1024), half signed (intercept 0), as a series partly re-sent by
    other software holds them: each slice's HU from its own representation, as SimpleITK reads the series (it was
    refused as 'PixelRepresentation differs within the series', with 'remove the odd file(s)' as the fix)."""
    n = 8
    hu = hu_pattern(n, 16, 20)
    hu[2, 3, 3] = -2000  # below what unsigned + (-1024) can hold: that slice must stay signed

    def tweak(k: int, ds: pydicom.Dataset) -> None:
        if k % 2:
            ds.PixelRepresentation = 0
            ds.RescaleIntercept = "-1024"
            ds.PixelData = (hu[k].astype(np.int32) + 1024).astype(np.uint16).tobytes()

    paths = write_series(tmp_path, n=n, hu=hu, intercept=0.0, tweak=tweak)
    assert {pydicom.dcmread(p).PixelRepresentation for p in paths} == {0, 1}
    vol = load_series(tmp_path, rules=RULES, workers=0)
    assert np.array_equal(vol.array, hu) and np.array_equal(vol.array, _pydicom_hu(paths))
    assert vol.array.dtype == np.int16


# --- two files under one SOPInstanceUID ------------------------------------------------------------------


def _resend(tmp_path, change) -> tuple[list, object]:
    """A series in ``a/`` and its copy in ``b/`` (same SOPInstanceUIDs) with ``change(ds)`` made to b's 6th file."""
    paths = write_series(tmp_path / "a", n=12)
    (tmp_path / "b").mkdir()
    for p in paths:
        (tmp_path / "b" / p.name).write_bytes(p.read_bytes())
    other = tmp_path / "b" / paths[5].name
    ds = pydicom.dcmread(other)
    change(ds)
    ds.save_as(other, enforce_file_format=True)
    return paths, other


def test_a_different_image_under_the_same_sop_instance_uid_is_not_taken_for_a_copy(tmp_path):
    """A corrected image sent again under its old SOPInstanceUID: which of the two is right cannot be told, so the
    series is refused naming both files (one of them was silently dropped as a 'duplicate copy')."""

    def brighter(ds: pydicom.Dataset) -> None:
        arr = ds.pixel_array.copy()
        arr[4:8, 4:8] += 300
        ds.PixelData = arr.tobytes()

    paths, other = _resend(tmp_path, brighter)
    scan = scan_directory(tmp_path, rules=RULES)
    assert len(scan.rejected) == 1 and not scan.selected, scan.series
    err = scan.rejected[0].error
    assert isinstance(err, DuplicateSliceError)
    text = str(err)
    assert str(paths[5]) in text and str(other) in text and "pixel data" in text and "SOPInstanceUID" in text, text
    assert "Fix:" in text and "remove the other" in text, text
    with pytest.raises(DuplicateSliceError):
        load_series(tmp_path, rules=RULES)
    (skip,) = [f for f in scan.skipped_files if f.path == other]
    assert skip.kind == "conflicting_copy" and "pixel data differ" in skip.reason and str(paths[5]) in skip.reason


def test_a_moved_image_under_the_same_sop_instance_uid_names_the_position(tmp_path):
    def moved(ds: pydicom.Dataset) -> None:
        pos = [float(v) for v in ds.ImagePositionPatient]
        ds.ImagePositionPatient = [pos[0], pos[1], pos[2] + 0.5]

    paths, other = _resend(tmp_path, moved)
    with pytest.raises(DuplicateSliceError, match="ImagePositionPatient") as err:
        load_series(tmp_path, rules=RULES)
    assert str(paths[5]) in str(err.value) and str(other) in str(err.value)


def test_copies_that_differ_only_in_other_header_values_are_still_copies(tmp_path):
    """A patient name corrected in the archive's copy, its position written again with other digits and a longer
    header before the same pixel data: the image is the same, one file is kept, the other skipped."""

    def renamed(ds: pydicom.Dataset) -> None:
        ds.PatientName = "Phantom^Corrected"
        ds.InstitutionName = "Other Hospital, Department of Radiology"
        ds.ImagePositionPatient = [f"{float(v) + 4e-6:.7f}" for v in ds.ImagePositionPatient]

    paths, other = _resend(tmp_path, renamed)
    vol = load_series(tmp_path, rules=RULES)
    assert vol.shape[0] == 12
    scan = scan_directory(tmp_path, rules=RULES)
    assert [f.kind for f in scan.skipped_files if f.path.parent == other.parent] == ["duplicate_copy"] * 12


def test_copies_transcoded_by_the_archive_are_still_copies(tmp_path):
    """The archive's copy of an image is RLE compressed: decoded, it is the same image, so it is a copy."""
    from pydicom.uid import RLELossless

    paths, other = _resend(tmp_path, lambda ds: ds.compress(RLELossless, generate_instance_uid=False))
    assert pydicom.dcmread(other).file_meta.TransferSyntaxUID == RLELossless
    vol = load_series(tmp_path, rules=RULES)
    assert np.array_equal(vol.array, load_series(tmp_path / "a", rules=RULES).array)


# --- data after the compressed pixel data ---------------------------------------------------------------


def _rle_series(folder) -> list:
    from pydicom.uid import RLELossless

    def rle(k: int, ds: pydicom.Dataset) -> None:
        ds.compress(RLELossless, generate_instance_uid=False)

    return write_series(folder, n=12, tweak=rle)


def test_compressed_files_with_data_set_trailing_padding_load(tmp_path):
    """Data Set Trailing Padding (FFFC,FFFC) after compressed pixel data (dcmtk's --padding-create writes it) is valid
    DICOM: the files load as without it (they were refused as cut short: 'no end-of-sequence marker')."""
    ref = load_series(_rle_series(tmp_path / "ref")[0].parent, rules=RULES)
    paths = _rle_series(tmp_path / "padded")
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.add_new(0xFFFCFFFC, "OB", b"\0" * 300)
        ds.save_as(p, enforce_file_format=True)
    assert not paths[0].read_bytes().endswith(b"\xfe\xff\xdd\xe0\x00\x00\x00\x00")
    vol = load_series(tmp_path / "padded", rules=RULES)
    assert np.array_equal(vol.array, ref.array)


def test_compressed_file_with_bytes_appended_loads_like_an_uncompressed_one(tmp_path):
    """Bytes appended after the data set (a copy tool's junk) are ignored, as they are after uncompressed pixel data."""
    ref = load_series(_rle_series(tmp_path / "ref")[0].parent, rules=RULES)
    paths = _rle_series(tmp_path / "junk")
    with open(paths[4], "ab") as fh:
        fh.write(np.random.default_rng(3).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    vol = load_series(tmp_path / "junk", rules=RULES)
    assert np.array_equal(vol.array, ref.array)


def test_compressed_file_cut_inside_its_fragments_is_still_cut_short(tmp_path):
    from pipeline.errors import TruncatedFileError

    paths = _rle_series(tmp_path)
    data = paths[4].read_bytes()
    paths[4].write_bytes(data[: len(data) - 40])
    with pytest.raises(TruncatedFileError, match="cut short|end-of-sequence") as err:
        load_series(tmp_path, rules=RULES)
    assert str(paths[4]) in str(err.value)


def test_a_series_exported_twice_under_new_sop_uids_names_the_two_folders(tmp_path):
    """The same series exported twice (the second export gave every image a new SOPInstanceUID): every slice has a
    copy, so the fix is to remove one of the two folders, not 'remove one file of each pair (e.g. slice_0000.dcm)',
    which named a file both folders hold."""
    paths = write_series(tmp_path / "export1", n=12)
    (tmp_path / "export2").mkdir()
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
        ds.save_as(tmp_path / "export2" / p.name, enforce_file_format=True)
    with pytest.raises(DuplicateSliceError) as err:
        load_series(tmp_path, rules=RULES)
    fix = err.value.fix
    assert "twice" in fix and str(tmp_path / "export1") in fix and str(tmp_path / "export2") in fix, fix
    assert "remove one of the two folders" in fix, fix


def test_a_few_copied_slices_name_the_files_with_their_folders(tmp_path):
    paths = write_series(tmp_path / "a", n=12)
    (tmp_path / "b").mkdir()
    ds = pydicom.dcmread(paths[3])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    ds.save_as(tmp_path / "b" / paths[3].name, enforce_file_format=True)
    with pytest.raises(DuplicateSliceError) as err:
        load_series(tmp_path, rules=RULES)
    assert "remove one file of each pair (e.g. b/slice_0003.dcm)" in err.value.fix, err.value.fix


def test_deflated_copies_that_differ_in_other_header_values_are_still_copies(tmp_path):
    """A deflated file is compressed as a whole: a header value changed in the archive's copy changes every byte
    after it, so such copies are told apart by their decoded pixel values."""
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    def deflate(ds: pydicom.Dataset) -> None:
        ds.file_meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian

    paths = write_series(tmp_path / "a", n=12)
    for p in paths:
        ds = pydicom.dcmread(p)
        deflate(ds)
        ds.save_as(p, enforce_file_format=True)
    (tmp_path / "b").mkdir()
    for p in paths:
        (tmp_path / "b" / p.name).write_bytes(p.read_bytes())
    ds = pydicom.dcmread(tmp_path / "b" / paths[5].name)
    ds.PatientName = "Phantom^Corrected"
    ds.save_as(tmp_path / "b" / paths[5].name, enforce_file_format=True)
    assert pydicom.dcmread(tmp_path / "b" / paths[5].name).file_meta.TransferSyntaxUID == DeflatedExplicitVRLittleEndian
    vol = load_series(tmp_path, rules=RULES)
    assert vol.shape[0] == 12


def test_two_series_that_reuse_sop_instance_uids_for_different_images_both_load(tmp_path):
    """Software that made a second series from the first (other SeriesInstanceUID, other images) but kept the
    SOPInstanceUIDs: the files are not copies and belong to different series, so each series keeps its files."""
    paths = write_series(tmp_path / "a", n=12)
    (tmp_path / "b").mkdir()
    uid = pydicom.uid.generate_uid()
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.SeriesInstanceUID = uid
        ds.SeriesNumber = 3
        ds.PixelData = (ds.pixel_array + 7).astype(np.int16).tobytes()
        ds.save_as(tmp_path / "b" / p.name, enforce_file_format=True)
    scan = scan_directory(tmp_path, rules=RULES)
    assert not scan.rejected and not scan.skipped_files, (scan.rejected, scan.skipped_list())
    assert sorted(len(s.headers) for s in scan.series) == [12, 12] and len(scan.selected) == 2
    a = load_series(tmp_path / "a", rules=RULES)
    b = load_series(tmp_path, series_uid=uid, rules=RULES)
    assert np.array_equal(b.array, a.array + 7)
