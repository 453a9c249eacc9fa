"""Loading a label map (a segmentation file) instead of a CT warns at load time, naming the file and the fix; the
other image files beside it (names that may be a patient's) are named only when identifiers are kept."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from pipeline.ingest import load_series
from tests._support.real_ct import require_real_ct

SUFFIXES = (".nii", ".nii.gz", ".nrrd", ".mha", ".mhd")


def _write(path: Path, array: np.ndarray) -> Path:
    img = sitk.GetImageFromArray(array)
    img.SetSpacing((1.5, 1.5, 3.0))
    sitk.WriteImage(img, str(path))
    return path


def _label_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "label map" in r.getMessage()]


def test_label_map_file_warns_with_the_file_values_and_fix(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    labels = np.zeros((8, 16, 16), np.uint8)
    labels[2:5, 4:9, 4:9] = 10
    labels[5:7, 8:12, 3:6] = 13
    seg = _write(tmp_path / "case_seg.nii.gz", labels)
    _write(tmp_path / "case_ct.nii.gz", np.full((8, 16, 16), -1000, np.int16) + np.arange(16, dtype=np.int16) * 90)
    with caplog.at_level(logging.WARNING):
        vol = load_series(seg, keep_identifiers=True)
    [message] = _label_warnings(caplog)
    assert str(seg) in message
    assert "3 distinct integer values, 0..13" in message
    assert "case_ct.nii.gz" in message and "LabelMap(vol.array, vol.geometry)" in message
    assert vol.metadata["warnings"] == [message]


def test_the_warning_names_no_other_image_file_unless_identifiers_are_kept(tmp_path, caplog):
    # was: "load the CT image instead (beside it: DOE_JANE_ct.nii.gz, MRN12345.nrrd)" on the console and in metadata
    from pipeline.ingest.source import read_source

    mask = np.zeros((6, 10, 10), np.uint8)
    mask[2:4, 3:7, 3:7] = 1
    seg = _write(tmp_path / "seg.nii.gz", mask)
    for name in ("DOE_JANE_ct.nii.gz", "MRN12345.nrrd"):
        _write(tmp_path / name, np.full((6, 10, 10), -1000, np.int16))
    with caplog.at_level(logging.WARNING):
        warned = [load_series(seg).metadata["warnings"], read_source(seg)[0].metadata["warnings"]]
    texts = _label_warnings(caplog) + [w for ws in warned for w in ws]
    assert len(texts) == 4 and all("2 other image files beside it" in t and "keep" in t for t in texts), texts
    assert not [t for t in texts if "DOE" in t or "MRN12345" in t], texts
    kept = read_source(seg, keep_identifiers=True)[0].metadata["warnings"]
    assert "beside it: DOE_JANE_ct.nii.gz, MRN12345.nrrd" in kept[0], kept


def test_binary_mask_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mask = np.zeros((6, 10, 10), np.int16)
    mask[2:4, 3:7, 3:7] = 1
    with caplog.at_level(logging.WARNING):
        load_series(_write(tmp_path / "lungs.nrrd", mask))
    [message] = _label_warnings(caplog)
    assert "2 distinct integer values, 0..1" in message


def test_real_label_files_warn_and_real_ct_never_does(caplog: pytest.LogCaptureFixture) -> None:
    root = require_real_ct()  # skips with a reason when ../shared/real_ct is absent
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    labels = {"example_seg.nii.gz", "example_seg_fast_force_split.nii.gz", "lm-64.nrrd", "wholeLung-64.nrrd"}
    assert labels <= {p.name for p in files}
    for path in files:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            vol = load_series(path)
        warned = _label_warnings(caplog)
        assert bool(warned) == (path.name in labels), (path, warned)
        assert ("warnings" in vol.metadata) == (path.name in labels)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the DICOM series of the folder: real HU, no warning
        load_series(root / "chest_ct_rt_planning_dicom")
        load_series(root / "cip_copdgene_chest_64" / "ct-64Dicom")
    assert not _label_warnings(caplog)
    seg = root / "totalseg_abdomen_lung_bases" / "example_seg.nii.gz"
    assert "example_ct.nii.gz" in " ".join(load_series(seg, keep_identifiers=True).metadata["warnings"])
