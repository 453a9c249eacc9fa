"""Writing a phantom case again into its folder, as a notebook cell run twice with other options does."""

from __future__ import annotations

import pytest

import pipeline as ctp
from pipeline.errors import DicomWriteError
from pipeline.phantom.model import Phantom


def _phantom(slices: int) -> Phantom:
    return ctp.generate_phantom(5, matrix=64, slices=slices, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=1)


def test_a_case_written_again_holds_only_the_new_series(tmp_path):
    case = tmp_path / "case1"
    ctp.write_phantom_series(_phantom(30), case)
    (case / "dicom" / "notes.txt").write_text("kept: not a slice\n")
    newer = _phantom(12)
    ctp.write_phantom_series(newer, case)
    vol = ctp.load_series(case)  # one series only: no slices of the earlier phantom beside it
    assert vol.series_uid == newer.volume.series_uid and vol.shape == newer.volume.shape
    files = sorted(p.name for p in (case / "dicom").rglob("*") if p.is_file())
    assert len(files) == 13 and "notes.txt" in files  # 12 slices, and the file that is no slice left as it was


def test_writing_the_same_case_again_keeps_it_whole(tmp_path):
    case = tmp_path / "case1"
    phantom = _phantom(12)
    ctp.write_phantom_series(phantom, case)
    ctp.write_phantom_series(phantom, case)
    assert ctp.load_series(case).shape == phantom.volume.shape


def test_a_file_in_place_of_the_case_folder_is_refused(tmp_path):
    target = tmp_path / "case.json"
    target.write_text("{}")
    with pytest.raises(DicomWriteError) as err:
        ctp.write_phantom_series(_phantom(12), target)
    assert str(target) in str(err.value) and "a file" in str(err.value) and err.value.fix
    assert target.read_text() == "{}"


def test_an_unknown_option_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(DicomWriteError) as err:
        ctp.write_phantom_series(_phantom(12), tmp_path / "case1", colour=3)
    assert "colour" in str(err.value) and "transfer_syntax" in (err.value.fix or "")
    assert not (tmp_path / "case1").exists()
