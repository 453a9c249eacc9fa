"""Explicit VR Big Endian files without preamble and file meta information (no 'DICM', no TransferSyntaxUID), as
old archives hold them: read as DICOM, pixel values in their own byte order, and a header cut short said so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileMetaDataset

from pipeline import load_series
from pipeline.errors import CorruptPixelDataError, TruncatedFileError
from pipeline.ingest.discover import read_header
from pipeline.ingest.rawheader import EXPLICIT_BE, dicom_data_start
from tests._support.dicom import write_series


def _bare_big_endian(paths: list[Path], folder: Path) -> list[Path]:
    """Each file of ``paths`` written again into ``folder`` as a bare Explicit VR Big Endian data set."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in paths:
        ds = pydicom.dcmread(path)
        stored = ds.pixel_array
        ds.file_meta = FileMetaDataset()
        ds.preamble = None
        ds.PixelData = stored.astype(stored.dtype.newbyteorder(">")).tobytes()
        ds["PixelData"].VR = "OW"
        target = folder / path.name
        pydicom.dcmwrite(target, ds, implicit_vr=False, little_endian=False, force_encoding=True, enforce_file_format=False)
        out.append(target)
    return out


@pytest.fixture
def series(tmp_path) -> tuple[list[Path], np.ndarray]:
    hu = np.arange(4 * 16 * 20, dtype=np.int16).reshape(4, 16, 20) * 3 - 1000  # values whose two bytes differ
    le = write_series(tmp_path / "le", n=4, hu=hu.astype(float))
    return _bare_big_endian(le, tmp_path / "be"), hu


def test_a_bare_big_endian_series_loads_with_its_values_and_geometry(series, tmp_path):
    paths, hu = series
    head = paths[0].read_bytes()[:132]
    assert head[128:132] != b"DICM" and head[:2] == b"\x00\x08"  # was: "not a DICOM file: no 'DICM' marker ..."
    assert dicom_data_start(head) == 0
    h = read_header(paths[0])
    assert h.transfer_syntax == EXPLICIT_BE and h.modality == "CT" and (h.rows, h.columns) == (16, 20)
    vol = load_series(paths[0].parent)
    reference = load_series(tmp_path / "le")
    assert vol.shape == (4, 16, 20)
    np.testing.assert_array_equal(vol.array, reference.array)
    np.testing.assert_allclose(vol.geometry.origin, reference.geometry.origin)
    np.testing.assert_allclose(vol.geometry.spacing, reference.geometry.spacing)


def test_a_bare_big_endian_header_cut_short_is_truncated_not_other_values(series):
    paths, _ = series
    cut = paths[1]
    cut.write_bytes(cut.read_bytes()[:100])  # inside the first UIDs
    with pytest.raises(TruncatedFileError) as err:
        read_header(cut)
    assert str(cut) in str(err.value) and "cut short" in str(err.value) and "Big Endian" in str(err.value)


def test_bare_big_endian_pixel_data_cut_short_names_the_file(series):
    paths, _ = series
    cut = paths[2]
    cut.write_bytes(cut.read_bytes()[:-100])
    with pytest.raises(CorruptPixelDataError) as err:
        load_series(cut.parent)
    assert str(cut) in str(err.value) and "Big Endian" in str(err.value)


def test_the_dicom_results_find_the_bare_big_endian_source_images(series):
    """Was: "no DICOM files among the source files": the SR and SEG of such a series were not written."""
    from pipeline.dicom_out.sources import read_source_series

    paths, _ = series
    vol = load_series(paths[0].parent)
    source = read_source_series(paths[0].parent, vol)
    uids = [pydicom.dcmread(p, force=True).SOPInstanceUID for p in paths]
    assert list(source.sop_instance_uids) == uids
    np.testing.assert_allclose(source.positions[:, 2], [vol.index_to_lps([0, 0, k])[2] for k in range(4)])
