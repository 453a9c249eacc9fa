"""Directory scans: discovery, skipped files, selection with reasons, splitting, one bad series among good ones."""

from __future__ import annotations

import warnings

import numpy as np
import pydicom
import pytest

from pipeline.errors import AmbiguousSeriesError, MissingSliceError, NoSeriesFoundError, NotDicomError
from pipeline.ingest import SelectionRules, load_series, scan_directory
from pipeline.ingest.discover import read_header
from pipeline.phantom import generate_phantom
from pipeline.phantom.dicom_writer import write_dicom_series
from tests._support.dicom import write_enhanced, write_series


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    """Two good CT series, one with a missing slice, a localizer, a thick derived series and junk files."""
    root = tmp_path_factory.mktemp("mixed")
    ph = generate_phantom(11, matrix=64, slices=14, n_nodules=0)
    write_dicom_series(ph.volume, root / "study1", seed=2, quirks=["shuffled_names", "localizer", "second_series"])
    good_b = write_series(root / "study2" / "b", n=11, series_uid="1.2.3.4.2", study_uid="1.2.3.9", description="B good")
    bad = write_series(root / "study2" / "c", n=12, series_uid="1.2.3.4.3", study_uid="1.2.3.9", description="C gap")
    bad[4].unlink()
    (root / "README.txt").write_text("exported from PACS\n")
    (root / "study2" / "thumb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(300))
    (root / "study2" / "b" / "cut").write_bytes(good_b[0].read_bytes()[:300])
    return root, ph


def test_scan_reports_every_series_and_file(mixed_folder):
    root, ph = mixed_folder
    scan = scan_directory(root)
    by_key = {s.key: s for s in scan.series}
    main = by_key[ph.volume.series_uid]
    assert main.selected and main.n_slices == 14 and main.reasons == []
    assert by_key["1.2.3.4.2"].selected
    # the bad series is rejected with its error; the others are unaffected
    assert [r.series.key for r in scan.rejected] == ["1.2.3.4.3"]
    err = scan.rejected[0].error
    assert isinstance(err, MissingSliceError) and "1.2.3.4.3" in str(err)
    assert not by_key["1.2.3.4.3"].selected and "MissingSliceError" in by_key["1.2.3.4.3"].why_not
    # localizer and thick derived series: not selected, with reasons
    others = [s for s in scan.series if s.key not in (ph.volume.series_uid, "1.2.3.4.2", "1.2.3.4.3")]
    assert len(others) == 2
    loc = next(s for s in others if s.n_slices == 1)
    thick = next(s for s in others if s.n_slices > 1)
    assert "localizer" in loc.why_not and "not axial" in loc.why_not
    assert "min_slices=10" in thick.why_not
    kinds = {f.path.name: f.kind for f in scan.skipped_files}
    assert kinds == {"README.txt": "not_dicom", "thumb.png": "not_dicom", "cut": "truncated"}
    assert all(f.reason for f in scan.skipped_files)
    assert [s.key for s in scan.selected] == sorted(
        [ph.volume.series_uid, "1.2.3.4.2"], key=lambda k: [x.key for x in scan.series].index(k)
    )
    report = scan.to_json()
    assert report["rejected"][0]["error"] == "MissingSliceError"
    assert {f["kind"] for f in report["skipped_files"]} == {"not_dicom", "truncated"}


def test_a_scan_and_its_series_echo_in_short_lines_not_every_header(mixed_folder):
    root, ph = mixed_folder
    scan = scan_directory(root)
    text = repr(scan)
    assert len(text) < 250 * (len(scan.series) + 1), text  # 6 kB of headers per slice before
    assert "SliceHeader" not in text and "\n" not in text
    assert text.startswith(f"ScanResult([{str(root)!r}]: {scan.n_files} files, 3 skipped (2 not dicom, 1 truncated); ")
    assert f"{len(scan.series)} series, 2 selected, 1 rejected" in text
    main = next(s for s in scan.series if s.key == ph.volume.series_uid)
    assert repr(main) == f"SeriesInfo({main.key!r}, CT, 14 slices, {main.description!r}, selected)"
    gap = next(s for s in scan.series if s.key == "1.2.3.4.3")
    assert repr(gap).startswith("SeriesInfo('1.2.3.4.3', CT, 11 slices, 'C gap', not selected: rejected: MissingSliceError")


def test_good_series_still_load(mixed_folder):
    root, ph = mixed_folder
    with pytest.raises(AmbiguousSeriesError) as err:
        load_series(root)
    text = str(err.value)
    assert "2 CT series qualify" in text and ph.volume.series_uid in text and "1.2.3.4.2" in text and "series_uid=" in text
    vol = load_series(root, series_uid="1.2.3.4.2")
    assert vol.shape == (11, 16, 20) and vol.metadata["SeriesDescription"] == "B good"
    vol = load_series(root / "study1")  # localizer and thick series are not chosen
    assert vol.series_uid == ph.volume.series_uid and vol.shape == ph.volume.shape
    with pytest.raises(MissingSliceError):
        load_series(root, series_uid="1.2.3.4.3")
    with pytest.raises(NoSeriesFoundError, match="no series with SeriesInstanceUID '9.9.9'"):
        load_series(root, series_uid="9.9.9")


def test_dicomdir_skipped(tmp_path):
    from pydicom.fileset import FileSet

    src = write_series(tmp_path / "src", n=10, description="via DICOMDIR")
    fs = FileSet()
    for p in src:
        fs.add(p)
    media = tmp_path / "media"
    fs.write(media)
    scan = scan_directory(media)
    kinds = {f.path.name: f.kind for f in scan.skipped_files}
    assert kinds == {"DICOMDIR": "dicomdir"}
    assert "DICOMDIR" in scan.skipped_files[0].reason
    assert len(scan.selected) == 1 and scan.selected[0].n_slices == 10
    vol = load_series(media)
    assert vol.metadata["SeriesDescription"] == "via DICOMDIR"
    with pytest.raises(NotDicomError) as err:  # the DICOMDIR named itself (as on a CD): the fix names its folder
        load_series(media / "DICOMDIR")
    assert err.value.fix is not None and f"pass the folder holding it ({media})" in err.value.fix


def test_selection_rules(tmp_path):
    write_series(tmp_path / "a", n=6, series_uid="1.1", description="short")
    write_series(tmp_path / "b", n=12, series_uid="1.2", image_type="DERIVED\\SECONDARY\\MPR", description="reformat")
    write_series(tmp_path / "c", n=12, series_uid="1.3", description="Topogram 0.6 T20s")
    write_series(tmp_path / "d", n=12, series_uid="1.4", orientation=(1, 0, 0, 0, 0, -1), description="coronal")
    write_series(tmp_path / "e", n=12, series_uid="1.5", modality="PT", description="pet")
    scan = scan_directory(tmp_path)
    why = {s.key: s.why_not for s in scan.series}
    assert "only 6 slice(s), fewer than min_slices=10" in why["1.1"]
    assert "derived/secondary" in why["1.2"] and "allow_derived=True" in why["1.2"]
    assert "names a scout/localizer" in why["1.3"]
    assert "not axial: slice normal is 90.0 deg" in why["1.4"]
    assert "modality is PT, not CT" in why["1.5"]
    assert not scan.selected
    with pytest.raises(NoSeriesFoundError) as err:
        load_series(tmp_path)
    assert "1.1: only 6 slice(s)" in str(err.value) and "series_uid" in str(err.value)
    loose = SelectionRules(min_slices=5, allow_derived=True, exclude_localizers=False, axial_tolerance_deg=90)
    assert sorted(s.key for s in scan_directory(tmp_path, rules=loose).selected) == ["1.1", "1.2", "1.3", "1.4"]


def test_derived_images_of_another_modality_are_not_offered_allow_derived(tmp_path):
    # was: a SEG's reason said "pass allow_derived=True (--allow-derived) to include it", which still left it out
    write_series(tmp_path / "seg", n=12, series_uid="1.6", modality="SEG", image_type="DERIVED\\PRIMARY")
    write_series(tmp_path / "mpr", n=12, series_uid="1.7", image_type="DERIVED\\SECONDARY\\MPR")
    why = {s.key: s.why_not for s in scan_directory(tmp_path).series}
    assert "modality is SEG, not CT" in why["1.6"] and "derived/secondary" in why["1.6"]
    assert "allow_derived" not in why["1.6"] and "--allow-derived" not in why["1.6"]
    assert "--allow-derived for ctpipe ingest, --set ingest.allow_derived=true for ctpipe run" in why["1.7"]
    loose = SelectionRules(allow_derived=True)
    assert [s.key for s in scan_directory(tmp_path, rules=loose).selected] == ["1.7"]


def test_split_by_orientation_and_acquisition(tmp_path):
    uid = "1.2.840.99.1"
    write_series(tmp_path / "ax", n=12, series_uid=uid)
    write_series(
        tmp_path / "scout", n=1, series_uid=uid, orientation=(1, 0, 0, 0, 0, -1), image_type="ORIGINAL\\PRIMARY\\LOCALIZER"
    )
    scan = scan_directory(tmp_path)
    keys = {s.key: s for s in scan.series}
    assert set(keys) == {f"{uid}#1", f"{uid}#2"}
    assert keys[f"{uid}#1"].selected and keys[f"{uid}#1"].n_slices == 12
    assert "ImageOrientationPatient" in keys[f"{uid}#2"].split_reason
    assert load_series(tmp_path).shape[0] == 12
    assert load_series(tmp_path, series_uid=uid).shape[0] == 12  # the uid picks the selected part

    # two acquisitions over the same positions (e.g. two phases) are split; sequential ones are not
    def acq2(k, ds):
        ds.AcquisitionNumber = 2

    rep = tmp_path / "repeat"
    write_series(rep / "p1", n=10, series_uid="7.7")
    write_series(rep / "p2", n=10, series_uid="7.7", tweak=acq2)
    assert sorted(s.key for s in scan_directory(rep).selected) == ["7.7#1", "7.7#2"]
    seq = tmp_path / "sequential"
    write_series(seq / "a", n=10, series_uid="8.8")
    write_series(seq / "b", n=10, series_uid="8.8", origin=(-10.0, -20.0, 30.0 + 12.5), tweak=acq2)
    (one,) = scan_directory(seq).series
    assert one.key == "8.8" and one.selected and load_series(seq).shape[0] == 20


def test_split_by_matrix(tmp_path):
    write_series(tmp_path / "a", n=10, series_uid="5.5", rows=16, cols=16)
    write_series(tmp_path / "b", n=10, series_uid="5.5", rows=32, cols=32, origin=(0, 0, 0))
    scan = scan_directory(tmp_path)
    assert sorted(s.n_slices for s in scan.selected) == [10, 10]
    assert all("matrix" in s.split_reason for s in scan.series)


def test_raw_header_matches_pydicom(tmp_path):
    """The fast header reader agrees with pydicom on implicit and explicit VR files with sequences."""

    def tweak(k, ds):
        from pydicom.dataset import Dataset
        from pydicom.sequence import Sequence

        item = Dataset()
        item.CodeValue = "123"
        inner = Dataset()
        inner.CodeMeaning = "nested"
        item.ConceptNameCodeSequence = Sequence([inner])
        ds.ProcedureCodeSequence = Sequence([item])
        ds.add_new(0x00091010, "LO", "private value")

    for implicit in (False, True):
        paths = write_series(tmp_path / str(implicit), n=2, implicit=implicit, tweak=tweak)
        # pydicom writes undefined-length sequences when asked; rewrite one file that way
        ds = pydicom.dcmread(paths[1])
        for elem in ds.iterall():
            if elem.VR == "SQ":
                elem.is_undefined_length = True
        ds.save_as(paths[1])
        for p in paths:
            h = read_header(p)
            ds = pydicom.dcmread(p)
            assert h.series_uid == ds.SeriesInstanceUID and h.sop_instance == ds.SOPInstanceUID
            assert h.position == tuple(float(v) for v in ds.ImagePositionPatient)
            assert h.rows == ds.Rows and h.columns == ds.Columns and h.pixel_representation == ds.PixelRepresentation
            assert h.slope == float(ds.RescaleSlope) and h.intercept == float(ds.RescaleIntercept)
            raw = p.read_bytes()
            assert raw[h.pixel_offset : h.pixel_offset + h.pixel_length] == ds.PixelData
            assert np.array_equal(np.frombuffer(ds.PixelData, "<i2"), ds.pixel_array.ravel())


@pytest.mark.parametrize(
    ("charset", "description", "name"),
    [
        ("ISO_IR 192", "Thorax nativ ÄÖÜ 肺", "Müller^Jürgen"),
        ("ISO_IR 100", "Thorax nativ ÄÖÜ", "Müller^Jürgen"),
        ("ISO_IR 144", "Грудная клетка", "Иванов^Иван"),
        ("GB18030", "胸部 CT", "王^小明"),
        ("\\ISO 2022 IR 87", "胸部", "Yamada^Tarou=山田^太郎"),
    ],
)
def test_text_follows_the_specific_character_set(tmp_path, charset, description, name):
    """SeriesDescription and PatientName read as pydicom decodes them, in the file's SpecificCharacterSet."""

    def tweak(k, ds):
        ds.SpecificCharacterSet = charset.split("\\") if "\\" in charset else charset
        ds.SeriesDescription = description
        ds.PatientName = name

    paths = write_series(tmp_path, n=10, tweak=tweak)
    h = read_header(paths[0])
    ds = pydicom.dcmread(paths[0])
    assert h.series_description == ds.SeriesDescription == description
    assert h.extra_value("PatientName") == str(ds.PatientName) == name
    vol = load_series(tmp_path)
    assert vol.metadata["SeriesDescription"] == description


def test_text_the_character_set_cannot_decode_is_kept_byte_for_byte(tmp_path):
    """A Latin-1 byte in a file that declares UTF-8 is kept as Latin-1, not replaced or refused."""

    def tweak(k, ds):
        ds.SpecificCharacterSet = "ISO_IR 192"
        ds.SeriesDescription = "Thorax X"

    paths = write_series(tmp_path, n=2, tweak=tweak)
    for p in paths:
        p.write_bytes(p.read_bytes().replace(b"Thorax X", b"Thorax \xc4"))
    assert read_header(paths[0]).series_description == "Thorax Ä"


@pytest.mark.parametrize(("stored", "read"), [("Größe Thorax".encode(), "Größe Thorax"), (b"Gr\xf6\xdfe", "Größe")])
def test_text_without_a_character_set_is_read_as_utf8_when_it_is_utf8(tmp_path, stored, read):
    """Files without SpecificCharacterSet whose text is UTF-8 (as many exporters write it without saying so) read as
    UTF-8, not as Latin-1 mojibake ('GrÃ¶Ãe'); bytes that are not UTF-8 still read as Latin-1."""
    placeholder = b"X" * len(stored)

    def tweak(k, ds):
        ds.SeriesDescription = placeholder.decode()

    paths = write_series(tmp_path, n=2, tweak=tweak)
    for p in paths:
        p.write_bytes(p.read_bytes().replace(placeholder, stored))
    assert "SpecificCharacterSet" not in pydicom.dcmread(paths[0])
    assert read_header(paths[0]).series_description == read
    ds = pydicom.dcmread(paths[1])  # deflated: its header is read by pydicom, with the same result
    ds.file_meta.TransferSyntaxUID = pydicom.uid.DeflatedExplicitVRLittleEndian
    ds.save_as(paths[1], enforce_file_format=True)
    assert read_header(paths[1]).use_pydicom and read_header(paths[1]).series_description == read


def test_corrupt_headers_never_stop_a_scan(tmp_path):
    """Random byte damage in headers gives a skipped file or a header, never an unexpected exception."""
    from pipeline.errors import CtpipeError

    (good,) = write_series(tmp_path / "src", n=1, implicit=True)
    enhanced, _ = write_enhanced(tmp_path / "src" / "mf", n=3)
    rng = np.random.default_rng(42)
    out = tmp_path / "fuzz"
    out.mkdir()
    for n in range(160):
        buf = bytearray((good if n % 2 else enhanced).read_bytes())
        for pos in rng.integers(0, 1500, size=int(rng.integers(1, 6))):
            buf[pos] = int(rng.integers(0, 256))
        if n % 3 == 0:
            buf = buf[: int(rng.integers(100, len(buf)))]
        (out / f"f{n:03d}").write_bytes(bytes(buf))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns about the damaged values it meets
        scan = scan_directory(out, validate=True)
        assert len(scan.skipped_files) + sum(len(s.headers) for s in scan.series) == 160
        assert all(f.reason for f in scan.skipped_files)
        for f in sorted(out.iterdir())[:60]:
            try:
                load_series(f)
            except CtpipeError as exc:  # the only acceptable failure: a ctpipe error naming the file
                assert f.name in str(exc) or str(out) in str(exc), str(exc)  # the file, or its folder for a series error


def test_files_without_preamble(tmp_path):
    """Bare data sets (no 128-byte preamble, no file meta; implicit VR) are still read."""
    paths = write_series(tmp_path, n=12, implicit=True)
    ref = load_series(tmp_path)
    for p in paths:
        ds = pydicom.dcmread(p)
        ds.preamble = None
        del ds.file_meta
        ds.save_as(p, enforce_file_format=False, implicit_vr=True, little_endian=True)
    assert paths[0].read_bytes()[:4] == b"\x08\x00\x08\x00"
    vol = load_series(tmp_path)
    assert np.array_equal(vol.array, ref.array) and vol.geometry.same_grid(ref.geometry)


def test_header_reads_in_processes_match_threads(tmp_path):
    """The worker-process path (used for large scans on machines with >= 4 CPUs) gives the same headers."""
    from pipeline.ingest import discover_files, read_headers

    write_series(tmp_path / "a", n=140, series_uid="3.1")  # more than one batch of 64 files per process
    (tmp_path / "junk.txt").write_text("not dicom " * 40)
    files = discover_files([tmp_path])
    threads = read_headers(files, workers=4, processes=False)
    procs = read_headers(files, workers=2, processes=True)
    assert procs == threads
    assert len(procs[0]) == 140 and [f.kind for f in procs[1]] == ["not_dicom"]
    # in the files' order, batch after batch
    assert [h.path for h in procs[0]] == [f for f in files if f.suffix != ".txt"]


def test_a_localizer_stored_among_the_axial_slices_is_split_off(tmp_path):
    """A scout image with the axial orientation, stored in the series of the slices (as some scanners do), is set
    apart as a part of its own: the slices still load, and the scout's part says why it is left out."""
    uid = "1.2.840.99.7"
    write_series(tmp_path / "ax", n=12, series_uid=uid)
    write_series(tmp_path / "scout", n=1, series_uid=uid, origin=(-10.0, -20.0, 300.0), image_type="ORIGINAL\\PRIMARY\\LOCALIZER")
    scan = scan_directory(tmp_path)
    keys = {s.key: s for s in scan.series}
    assert set(keys) == {f"{uid}#1", f"{uid}#2"}
    assert keys[f"{uid}#1"].selected and keys[f"{uid}#1"].n_slices == 12
    assert "ImageType LOCALIZER" in keys[f"{uid}#2"].split_reason and "localizer" in keys[f"{uid}#2"].why_not
    assert load_series(tmp_path).shape[0] == 12


def test_overlapping_sources_read_each_file_once(tmp_path):
    """A folder and a folder inside it given together (a worklist naming a study and one of its series): each file
    is read once, not listed as 'another copy' of itself."""
    write_series(tmp_path / "study" / "s1", n=10)
    write_series(tmp_path / "study" / "s2", n=10, seed=3)
    scan = scan_directory([tmp_path / "study", tmp_path / "study" / "s1", str(tmp_path / "study" / "s2") + "/"])
    assert scan.n_files == 20 and not scan.skipped_files, scan.skipped_list()
    assert sorted(len(s.headers) for s in scan.series) == [10, 10]


def test_an_unknown_character_set_is_logged_once_not_warned_per_file(tmp_path, caplog, recwarn):
    """SpecificCharacterSet 'ISO_IR 999' (no such character set): pydicom's UserWarning reached the terminal of
    `ctpipe ingest` once per file; now the scan logs it once and reads the text as Latin-1."""
    import logging

    def tweak(k, ds):
        ds.SpecificCharacterSet = "ISO_IR 999"
        ds.SeriesDescription = "Thorax X"

    paths = write_series(tmp_path, n=10, tweak=tweak)
    for p in paths:
        p.write_bytes(p.read_bytes().replace(b"Thorax X", b"Thorax \xc4"))
    recwarn.clear()  # pydicom's own, writing the files
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.ingest"):
        scan = scan_directory(tmp_path, workers=0)
    assert scan.series[0].description == "Thorax Ä"
    assert not [w for w in recwarn if "encoding" in str(w.message)], [str(w.message) for w in recwarn]
    notes = [r.getMessage() for r in caplog.records if "ISO_IR 999" in r.getMessage()]
    assert len(notes) == 1 and "Latin-1" in notes[0], notes
