"""A fault corpus: each damaged or unusual input is a named skip, a refusal with its true reason, or loaded with a warning.

Discovery never raises for what it meets on the file system; refusals name the file and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import warnings

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset

from pipeline.cli import main
from pipeline.errors import (
    CorruptHeaderError,
    CorruptPixelDataError,
    CtpipeError,
    DuplicateSliceError,
    InconsistentSeriesError,
    MissingPixelDataError,
    NotCTError,
    NotDicomError,
    SeriesGeometryError,
    SingleSliceError,
    TruncatedFileError,
    UnreadableFileError,
)
from pipeline.ingest import find_files, load_series, read_headers, read_volume, scan_directory
from tests._support.dicom import write_enhanced
from tests._support.fault_corpus import (
    MR_IMAGE_STORAGE,
    delete_tags,
    edit,
    fail_reads_of,
    junk_files,
    running_as_root,
    set_text,
    set_values,
    stored_pixels,
    symlink_loop,
    truncated_copy,
    write_phantom,
)


def _fix(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert isinstance(err.value, CtpipeError) and err.value.fix and "Fix:" in text, text
    return text


def _skips(scan) -> dict[str, tuple[str, str]]:
    return {f.path.name: (f.kind, f.reason) for f in scan.skipped_files}


# --- files that are not DICOM images: named skips ---------------------------------------------------


def test_junk_files_are_named_skips(tmp_path):
    paths = write_phantom(tmp_path / "study")
    junk = junk_files(tmp_path / "study")
    truncated_copy(paths[0], tmp_path / "study" / "cut.dcm")
    vol = load_series(tmp_path / "study")  # the series loads; the junk does not stop it
    assert vol.shape == (12, 64, 64)
    scan = scan_directory(tmp_path / "study")
    skips = _skips(scan)
    assert skips.keys() == {"empty.dcm", "noise.bin", "notes.txt", "cut.dcm"}
    assert skips["cut.dcm"][0] == "truncated" and "cut short" in skips["cut.dcm"][1]
    for name in ("empty.dcm", "noise.bin", "notes.txt"):
        assert skips[name][0] == "not_dicom" and "not a DICOM file" in skips[name][1]
    report = scan.to_json()["skipped_files"]
    assert {r["path"] for r in report} == {
        str(junk["empty"]),
        str(junk["random"]),
        str(junk["text"]),
        str(tmp_path / "study" / "cut.dcm"),
    }


def test_folder_of_junk_names_the_files(tmp_path):
    junk = junk_files(tmp_path)
    with pytest.raises(NotDicomError) as err:
        load_series(tmp_path)
    text = _fix(err)
    assert "no DICOM image files found among 3 file(s)" in text
    assert all(str(p) in text for p in junk.values())  # each file named, not only counted
    assert "point ctpipe at the folder holding the DICOM image files" in text


def test_cli_names_skipped_files(tmp_path, capsys):
    write_phantom(tmp_path / "in")
    junk = junk_files(tmp_path / "in")
    rc = main(["ingest", str(tmp_path / "in"), "--out", str(tmp_path / "cache"), "--keep-identifiers"])
    out = capsys.readouterr().out
    assert rc == 0
    for p in junk.values():
        assert f"skipped file {p}: not dicom: " in out
    # without --keep-identifiers each is named by a token of its own (its name may be a patient's), in its folder
    assert main(["ingest", str(tmp_path / "in"), "--out", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    tokens = set(re.findall(rf"skipped file {re.escape(str(tmp_path / 'in'))}/(<file:[0-9a-f]{{6}}>\S*): not dicom: ", out))
    assert len(tokens) == len(junk), out
    assert not [p.name for p in junk.values() if f"/{p.name}" in out]


def test_non_ascii_file_names(tmp_path, capsys):
    paths = write_phantom(tmp_path / "Thorax_ü")
    ref = load_series(tmp_path / "Thorax_ü")
    for k, p in enumerate(paths):
        p.rename(p.with_name(f"胸部_é_{k:02d}.dcm" if k % 2 else f"Schädel–Ü {k:02d}"))
    odd = tmp_path / "Thorax_ü" / "Übersicht_λ.txt"
    odd.write_text("not an image")
    vol = load_series(tmp_path / "Thorax_ü")
    assert np.array_equal(vol.array, ref.array) and vol.geometry.same_grid(ref.geometry)
    assert _skips(scan_directory(tmp_path / "Thorax_ü"))["Übersicht_λ.txt"][0] == "not_dicom"
    assert main(["ingest", str(tmp_path / "Thorax_ü"), "--out", str(tmp_path / "cache"), "--keep-identifiers"]) == 0
    assert f"skipped file {odd}" in capsys.readouterr().out


def test_file_names_with_bytes_invalid_in_utf8(tmp_path, capsys):
    """Files named in Latin-1 on a UTF-8 system (an old archive's export): the error names them with the odd bytes
    escaped, and the command prints its report instead of failing with UnicodeEncodeError."""
    folder = tmp_path / "study"
    paths = write_phantom(folder)
    for k, p in enumerate(paths):
        p.rename(os.fsdecode(os.fsencode(folder) + b"/Sch\xe4del_%02d.dcm" % k))
    os.unlink(os.fsdecode(os.fsencode(folder) + b"/Sch\xe4del_06.dcm"))
    with pytest.raises(CtpipeError) as err:
        load_series(folder)
    assert "Sch\\xe4del_05.dcm" in str(err.value) and "Sch\\xe4del_07.dcm" in str(err.value)
    str(err.value).encode("utf-8")  # writable anywhere: no lone surrogates left
    assert main(["ingest", str(folder), "--out", str(tmp_path / "cache")]) == 1
    out = capsys.readouterr().out
    assert "Sch\\xe4del_05.dcm" in out and "1 rejected" in out


# --- the file system: links, FIFOs, devices, unreadable and vanishing files ------------------------


def test_symlink_loops_and_links(tmp_path):
    write_phantom(tmp_path / "study")
    loop, up = symlink_loop(tmp_path / "study")
    broken = tmp_path / "study" / "gone.dcm"
    os.symlink("nowhere.dcm", broken)
    (tmp_path / "study" / "sub").mkdir()
    os.symlink("../sub", tmp_path / "study" / "sub" / "again")  # a folder loop through a link
    vol = load_series(tmp_path / "study")
    assert vol.shape == (12, 64, 64)
    skips = _skips(scan_directory(tmp_path / "study"))
    assert skips["loop.dcm"][0] == "unreadable" and "symbolic link loop" in skips["loop.dcm"][1]
    assert skips["up"][0] == "not_followed" and "not followed" in skips["up"][1]
    assert skips["again"][0] == "not_followed"
    assert skips["gone.dcm"][0] == "unreadable" and "broken symbolic link" in skips["gone.dcm"][1]
    # the loop named directly: a refusal with the true reason, not an OSError
    assert scan_directory(loop).skipped_files[0].reason.endswith("symbolic link loop (following the link leads back to it)")
    with pytest.raises(UnreadableFileError) as err:
        load_series(loop)
    assert "symbolic link loop" in _fix(err) and str(loop) in str(err.value)


def test_fifo_and_device_files_are_named_skips(tmp_path):
    write_phantom(tmp_path / "study")
    os.mkfifo(tmp_path / "study" / "pipe")
    os.symlink(os.devnull, tmp_path / "study" / "null")  # a character device
    result: dict[str, object] = {}

    def scan() -> None:  # opening the FIFO would block: run where a hang cannot stop the test run
        result["scan"] = scan_directory(tmp_path / "study")

    worker = threading.Thread(target=scan, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the scan blocked on a FIFO or device file"
    skips = _skips(result["scan"])
    assert skips["pipe"] == ("not_regular", "not a regular file (a FIFO / named pipe)")
    assert skips["null"] == ("not_regular", "not a regular file (a character device)")
    assert len(result["scan"].selected) == 1


@pytest.mark.skipif(
    running_as_root(),
    reason="running as root: chmod 000 does not stop root from reading a file "
    "(test_unreadable_file_injected covers the same handling)",
)
def test_unreadable_file_chmod(tmp_path):
    paths = write_phantom(tmp_path / "study")
    paths[6].chmod(0)
    try:
        with pytest.raises(UnreadableFileError) as err:
            load_series(tmp_path / "study")
        text = _fix(err)
        assert str(paths[6]) in text and "permission denied" in text and "gap" in text
        assert _skips(scan_directory(tmp_path / "study"))[paths[6].name] == (
            "unreadable",
            "cannot read the file: permission denied",
        )
    finally:
        paths[6].chmod(0o644)


def test_unreadable_file_injected(tmp_path):
    """A read that fails with 'permission denied' (injected at open, as root reads any file)."""
    paths = write_phantom(tmp_path / "study")
    with fail_reads_of([paths[6]]):
        scan = scan_directory(tmp_path / "study")
        assert _skips(scan)[paths[6].name] == ("unreadable", "cannot read the file: permission denied")
        # a slice in the middle: refused as unreadable, naming the file, not as a missing slice
        with pytest.raises(UnreadableFileError) as err:
            load_series(tmp_path / "study")
        text = _fix(err)
        assert str(paths[6]) in text and "permission denied" in text and "MissingSlice" not in type(err.value).__name__
        assert "check their permissions" in text
    with fail_reads_of([paths[-1]]):  # the last slice: the rest loads, with a warning naming the file
        vol = load_series(tmp_path / "study")
    assert vol.shape[0] == 11
    assert any(str(paths[-1]) in w and "cannot be read" in w for w in vol.metadata["warnings"])
    with fail_reads_of(paths):  # nothing readable
        with pytest.raises(UnreadableFileError) as err:
            load_series(tmp_path / "study")
        assert "none of the 12 entries found can be read" in _fix(err)


def test_a_slice_whose_header_is_cut_short_is_named_as_the_gap(tmp_path):
    """A file of the series cut short inside its header: refused naming that file and the fix (copy it again), not
    as a missing slice; cut short at the end of the stack, the rest loads with a warning naming it."""
    paths = write_phantom(tmp_path / "study")
    middle = paths[6].read_bytes()
    paths[6].write_bytes(middle[:700])
    with pytest.raises(TruncatedFileError) as err:
        load_series(tmp_path / "study")
    text = _fix(err)
    assert str(paths[6]) in text and "cut short" in text and "gap" in text and "copy the files cut short again" in text
    paths[6].write_bytes(middle)
    paths[-1].write_bytes(paths[-1].read_bytes()[:700])
    vol = load_series(tmp_path / "study")
    assert vol.shape[0] == 11
    assert any(str(paths[-1]) in w and "cut short" in w for w in vol.metadata["warnings"])


def test_a_slice_set_apart_by_its_orientation_is_named_as_the_gap(tmp_path):
    """One slice whose ImageOrientationPatient differs slightly is set apart from the stack: the stack's gap is
    refused naming that file and its orientation, not as a slice missing from the archive."""
    paths = write_phantom(tmp_path / "study")
    set_values(paths[6:7], ImageOrientationPatient=[0.9998, 0.02, 0, -0.02, 0.9998, 0])
    with pytest.raises(InconsistentSeriesError) as err:
        load_series(tmp_path / "study")
    text = _fix(err)
    assert paths[6].name in text and "ImageOrientationPatient [0.9998, 0.02, 0.0, -0.02, 0.9998, 0.0]" in text
    assert f"re-export {paths[6].name}" in text
    scan = scan_directory(tmp_path / "study")
    assert [type(r.error) for r in scan.rejected] == [InconsistentSeriesError]


def test_a_folder_deeper_than_the_system_path_limit_is_a_named_skip(tmp_path):
    """A folder whose full path exceeds PATH_MAX cannot be listed: the skip says so, with the fix (a shorter path)."""
    deep = os.open(tmp_path, os.O_RDONLY)
    try:
        for k in range(22):  # 22 × 204 bytes: beyond Linux's 4096-byte PATH_MAX; made relative to each parent
            name = f"d{k:02d}" + "x" * 200
            os.mkdir(name, dir_fd=deep)
            child = os.open(name, os.O_RDONLY, dir_fd=deep)
            os.close(deep)
            deep = child
    finally:
        os.close(deep)
    files, skipped = find_files([tmp_path])
    assert not files and len(skipped) == 1 and skipped[0].kind == "unreadable"
    assert "longer than the system allows" in skipped[0].reason and "shorter path" in skipped[0].reason


def test_files_that_vanish(tmp_path):
    paths = write_phantom(tmp_path / "study")
    files, skipped = find_files([tmp_path / "study"])
    assert len(files) == 12 and not skipped
    paths[3].unlink()  # gone between listing and reading
    headers, skipped = read_headers(files)
    assert len(headers) == 11
    assert [(f.path, f.kind) for f in skipped] == [(paths[3], "unreadable")] and "gone" in skipped[0].reason
    # gone between the scan and the pixel read
    paths = write_phantom(tmp_path / "study2")
    scan = scan_directory(tmp_path / "study2")
    paths[5].unlink()
    with pytest.raises(UnreadableFileError) as err:
        read_volume(scan.plans[scan.selected[0].key])
    assert str(paths[5]) in _fix(err) and "gone" in str(err.value)


def test_unlistable_folder_is_a_named_skip(tmp_path, monkeypatch):
    write_phantom(tmp_path / "a")
    (tmp_path / "b").mkdir()
    real = os.scandir

    def scandir(path):  # injected: root may list any folder, whatever its permissions
        if os.fspath(path) == str(tmp_path / "b"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    scan = scan_directory(tmp_path)
    monkeypatch.undo()
    assert _skips(scan)["b"] == ("unreadable", "cannot list the folder: permission denied")
    assert len(scan.selected) == 1


# --- DICOM that is not a usable CT series: refused with the true reason --------------------------------


def test_missing_pixel_data_names_the_file(tmp_path):
    paths = write_phantom(tmp_path)
    edit(paths[4:5], lambda ds: delattr(ds, "PixelData"))
    with pytest.raises(MissingPixelDataError) as err:
        load_series(tmp_path)
    assert str(paths[4]) in _fix(err) and "no PixelData" in str(err.value)


def test_mr_series_is_refused_as_not_ct(tmp_path):
    paths = write_phantom(tmp_path / "mr")
    set_values(paths, Modality="MR", SOPClassUID=MR_IMAGE_STORAGE)
    with pytest.raises(NotCTError) as err:
        load_series(tmp_path / "mr")
    assert "Modality MR" in _fix(err)
    # no Modality and an MR SOP class: still not CT, and the message says both
    delete_tags(paths, "Modality")
    with pytest.raises(NotCTError) as err:
        load_series(tmp_path / "mr")
    assert "Modality missing (SOP class 1.2.840.10008.5.1.4.1.1.4)" in _fix(err)


def test_enhanced_frame_without_position_is_named_as_the_reason(tmp_path):
    """A multi-frame file whose frame 6 lacks its plane position: the scan leaves it out naming that frame and the
    fix, not for a missing ImageOrientationPatient (which its shared functional groups do hold)."""
    path, _ = write_enhanced(tmp_path / "mf" / "IMG0001", n=12)
    ds = pydicom.dcmread(path)
    del ds.PerFrameFunctionalGroupsSequence[5].PlanePositionSequence
    ds.save_as(path)
    (series,) = scan_directory(tmp_path / "mf").series
    assert not series.selected
    assert "IMG0001: frame 6 has no ImagePositionPatient in its functional groups (fix: re-export" in series.why_not
    assert "no valid ImageOrientationPatient" not in series.why_not
    with pytest.raises(SeriesGeometryError) as err:  # the folder's only series: its own error, not "no series"
        load_series(tmp_path / "mf")
    assert "frame 6 has no ImagePositionPatient" in str(err.value) and "re-export" in _fix(err)


def test_enhanced_frames_at_one_position_name_the_file_to_re_export(tmp_path):
    """Two frames of one multi-frame file at the same position: the fix is to re-export that file, not to remove a
    duplicate file (there is none) or copy missing ones."""
    path, _ = write_enhanced(tmp_path / "mf" / "IMG0001", n=12, shuffle=False)
    ds = pydicom.dcmread(path)
    frames = ds.PerFrameFunctionalGroupsSequence
    frames[6].PlanePositionSequence[0].ImagePositionPatient = list(frames[5].PlanePositionSequence[0].ImagePositionPatient)
    ds.save_as(path)
    with pytest.raises(DuplicateSliceError) as err:
        load_series(tmp_path / "mf")
    text = _fix(err)
    assert "IMG0001 frame 6 and IMG0001 frame 7" in text and "re-export IMG0001 from the scanner/PACS" in text
    assert "remove the duplicate files" not in text


def test_a_report_beside_the_images_is_left_out_as_not_an_image(tmp_path):
    """A structured report (no pixel data) in the series' folder: left out for what it is, without the image rules'
    reasons (no orientation, one slice) that would suggest lowering min_slices."""
    write_phantom(tmp_path / "study")
    sr = Dataset()
    sr.file_meta = pydicom.dataset.FileMetaDataset()
    sr.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    sr.SOPClassUID = sr.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.88.33"
    sr.SOPInstanceUID = sr.file_meta.MediaStorageSOPInstanceUID = "1.2.826.0.1.3680043.8.498.5"
    sr.SeriesInstanceUID, sr.StudyInstanceUID, sr.Modality = "1.2.826.0.1.3680043.8.498.6", "1.2.3", "SR"
    sr.save_as(tmp_path / "study" / "report.dcm", enforce_file_format=True)
    scan = scan_directory(tmp_path / "study")
    (report,) = [s for s in scan.series if s.modality == "SR"]
    assert report.reasons == [
        "modality is SR, not CT",
        "no pixel data (SOP class 1.2.840.10008.5.1.4.1.1.88.33): not an image series",
    ]
    assert len(scan.selected) == 1


def test_damaged_rle_stream_is_refused_naming_the_file_and_the_batch_goes_on(tmp_path):
    """An RLE file whose compressed bytes are damaged makes the Rust RLE decoder panic (PanicException derives from
    BaseException): refused as a file to copy again, and the other series of the batch are still cached."""
    from pipeline.cache import CaseCache
    from pipeline.ingest import ingest_to_cache

    paths = write_phantom(tmp_path / "src" / "rle", transfer_syntax="rle")
    write_phantom(tmp_path / "src" / "plain", seed=2)
    raw = bytearray(paths[5].read_bytes())
    raw[-2000:-1500] = b"\x55" * 500  # in the last segments: literal runs that overflow the decoder's buffer
    paths[5].write_bytes(bytes(raw))
    with pytest.raises(TruncatedFileError) as err:
        load_series(tmp_path / "src" / "rle")
    assert str(paths[5]) in _fix(err) and "cannot be decoded" in str(err.value) and "RLE Lossless" in str(err.value)
    report = ingest_to_cache(tmp_path / "src", CaseCache(tmp_path / "cache"))
    assert len(report.written) == 1 and [type(r.error) for r in report.scan.rejected] == [CorruptPixelDataError]


def test_one_and_two_slice_series(tmp_path):
    write_phantom(tmp_path / "one", keep=1)
    with pytest.raises(SingleSliceError) as err:
        load_series(tmp_path / "one")
    assert "at least 2 slices" in _fix(err)
    write_phantom(tmp_path / "two", keep=2)
    vol = load_series(tmp_path / "two")  # the folder's only CT series: loaded, with a warning
    assert vol.shape == (2, 64, 64)
    assert any("only 2 slices, fewer than min_slices=10" in w for w in vol.metadata["warnings"])


@pytest.mark.parametrize(
    ("tag", "value", "shown"),
    [
        ("RescaleSlope", "NaN", "RescaleSlope (0028,1053) is 'NaN'"),
        ("RescaleSlope", "0", "RescaleSlope (0028,1053) is 0;"),
        ("RescaleSlope", "1e30", "RescaleSlope (0028,1053) is 1e+30"),
        ("RescaleSlope", "-20000", "RescaleSlope (0028,1053) is -20000;"),
        ("RescaleSlope", "abc", "RescaleSlope (0028,1053) is 'abc'"),
        ("RescaleIntercept", "1e6", "RescaleIntercept (0028,1052) is 1e+06"),
        ("RescaleIntercept", "inf", "RescaleIntercept (0028,1052) is inf;"),
    ],
)
def test_absurd_rescale_is_refused(tmp_path, tag, value, shown):
    paths = write_phantom(tmp_path)
    set_text(paths[7:8], 0x00281053 if tag == "RescaleSlope" else 0x00281052, value)
    with pytest.raises(CorruptHeaderError) as err:
        load_series(tmp_path)
    text = _fix(err)
    assert str(paths[7]) in text and shown in text and "re-export the series" in text


def test_enhanced_frame_with_zero_slope_is_refused(tmp_path):
    path, _ = write_enhanced(tmp_path / "mf" / "IMG0001", n=12)

    def zero(ds):
        ds.SharedFunctionalGroupsSequence[0].PixelValueTransformationSequence[0].RescaleSlope = 0

    edit([path], zero)
    with pytest.raises(CorruptHeaderError) as err:
        load_series(path)
    assert f"{path} (frame 1)" in _fix(err) and "RescaleSlope (0028,1053) is 0" in str(err.value)


@pytest.mark.parametrize(("rows", "columns"), [(32, 64), (64, 63), (80, 64), (64, 128)])
def test_matrix_that_disagrees_with_pixel_data(tmp_path, rows, columns):
    paths = write_phantom(tmp_path)
    set_values(paths, Rows=rows, Columns=columns)  # every file: the series is consistent, the pixel data is not
    with pytest.raises(CorruptHeaderError) as err:
        load_series(tmp_path)
    text = _fix(err)
    need = rows * columns * 2
    assert f"Rows × Columns = {rows} × {columns}" in text and f"needs {need} bytes" in text and "holds 8192" in text


def test_hu_far_outside_the_ct_range_is_refused(tmp_path):
    paths = write_phantom(tmp_path)
    set_values(paths[2:3], RescaleSlope="5000")  # within the slope limit, but HU reach millions
    with pytest.raises(CorruptHeaderError) as err:
        load_series(tmp_path)
    text = _fix(err)
    stored = stored_pixels(paths[2]).astype(np.float64)
    assert str(paths[2]) in text and "far outside the CT range -2048..32767" in text
    assert f"{stored.max() * 5000:.6g}" in text


def test_padding_values_of_real_scanners_still_load(tmp_path):
    """-33792 HU (stored -32768, intercept -1024) is outside the plausible range but is how scanners pad."""
    paths = write_phantom(tmp_path)

    def pad(ds):
        arr = ds.pixel_array.copy()
        arr[:4, :] = -32768
        ds.PixelData = arr.tobytes()
        ds.RescaleIntercept = "-1024"

    edit(paths, pad)
    vol = load_series(tmp_path)
    assert vol.array.min() == -32768 - 1024


# --- everything at once: one scan of the whole corpus ------------------------------------------------


def test_a_series_sent_again_after_a_broken_transfer_loads_from_its_whole_copy(tmp_path):
    """The first transfer left one file with half its pixel data; the archive sent the series again: the whole
    copy of that instance is kept (whichever folder sorts first), the truncated one skipped with the reason."""
    first = write_phantom(tmp_path / "a_first_partial")
    shutil.copytree(tmp_path / "a_first_partial", tmp_path / "b_resent")
    cut = first[5]
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    scan = scan_directory(tmp_path)
    skips = {f.path: f for f in scan.skipped_files if f.kind == "duplicate_copy"}
    assert cut in skips and "b_resent" in skips[cut].reason and "not truncated" in skips[cut].reason
    assert len(skips) == len(first) and scan.series[0].selected
    vol = load_series(tmp_path)
    again = load_series(tmp_path / "b_resent")
    assert np.array_equal(vol.array, again.array)


def test_whole_corpus_scan_never_raises(tmp_path):
    root = tmp_path / "archive"
    good = write_phantom(root / "good")
    junk = junk_files(root / "junk")
    truncated_copy(good[0], root / "junk" / "cut.dcm")
    loop, up = symlink_loop(root / "links")
    os.mkfifo(root / "links" / "pipe")
    nouid = write_phantom(root / "anonymised", seed=2, transfer_syntax="jpeg2000", slices=20)
    delete_tags(nouid, "SeriesInstanceUID")
    nomod = write_phantom(root / "no_modality", seed=3, keep=2)
    delete_tags(nomod, "Modality")
    mr = write_phantom(root / "mr", seed=4)
    set_values(mr, Modality="MR", SOPClassUID=MR_IMAGE_STORAGE)
    nanslope = write_phantom(root / "nan_slope", seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns about the invalid DS it is asked to write
        set_values(nanslope[3:4], RescaleSlope="NaN")
    nopix = write_phantom(root / "no_pixels", seed=6)
    edit(nopix[5:6], lambda ds: delattr(ds, "PixelData"))
    shutil.copytree(root / "good", root / "kopie_ä")  # duplicate SOP instances under a non-ASCII folder (sorted after good/)

    scan = scan_directory(root)  # a batch: the short series stays out
    skips = {f.path: f.kind for f in scan.skipped_files}
    assert {junk["empty"], junk["random"], junk["text"]} <= skips.keys()
    assert skips[root / "junk" / "cut.dcm"] == "truncated"
    assert skips[loop] == "unreadable" and skips[up] == "not_followed" and skips[root / "links" / "pipe"] == "not_regular"
    assert sum(k == "duplicate_copy" for k in skips.values()) == 12
    by_folder = {os.path.basename(os.path.commonpath([str(p) for p in s.files])): s for s in scan.series}
    assert by_folder["good"].selected
    anon = by_folder["anonymised"]
    assert anon.selected and anon.key.startswith("2.25.") and "no SeriesInstanceUID" in anon.warnings[0]
    assert not by_folder["no_modality"].selected and "min_slices=10" in by_folder["no_modality"].why_not
    assert "Modality (0008,0060) is missing; taken as CT" in by_folder["no_modality"].warnings[0]
    assert "modality is MR" in by_folder["mr"].why_not
    rejected = {os.path.basename(os.path.commonpath([str(p) for p in r.series.files])): r.error for r in scan.rejected}
    assert isinstance(rejected["nan_slope"], CorruptHeaderError) and str(nanslope[3]) in str(rejected["nan_slope"])
    assert isinstance(rejected["no_pixels"], MissingPixelDataError) and str(nopix[5]) in str(rejected["no_pixels"])
    assert pydicom.dcmread(nouid[0]).get("SeriesInstanceUID") is None
