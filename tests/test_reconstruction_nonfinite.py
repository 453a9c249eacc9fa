"""``ctpipe reconstruct`` and ``reconstruct()`` on an image file (NRRD, MHA, NIfTI) whose voxels hold NaN.

An image file is read as it is: an NRRD with a few NaN voxels in the lung reached the segmentation and the
measurements unchanged (10 NaN voxels in one lung of the test chest took 39 mL off each lung's 179 mL, and a file half
NaN was measured as "lungs complete" at half the volume, without a word), where ``ctpipe detect`` on the same file sets them
to -1024 HU (air) with a warning, and refuses a file with more than
:data:`~pipeline.cache.MAX_NONFINITE_FRACTION` of them by name. The reconstruction now does the same: the
measurements keep the count (``nonfinite_voxels_set_to_air``) and a mostly-NaN file is refused before any work.
A NIfTI file's NaN voxels, which SimpleITK reads as 0 HU, are read back (:mod:`pipeline.ingest.nifti`) and go the same way.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InvalidVolumeError
from pipeline.ingest.image import read_image
from pipeline.volume import CTVolume
from tests.test_run_detect_parity import _chest

LUNGS = "lung_left,lung_right"


def _image_file(tmp_path: Path, *, nan_slices: int = 0, n_bad: int = 0, suffix: str = ".nrrd") -> Path:
    """The test chest (float32 HU, LPS) as ``chest`` + ``suffix``, with ``n_bad`` NaN voxels in its right lung and its
    first ``nan_slices`` slices all NaN."""
    import SimpleITK as sitk

    vol = _chest()
    arr = vol.array.copy()
    arr[10, 20 : 20 + n_bad, 12] = np.nan
    arr[:nan_slices] = np.nan
    path = tmp_path / f"chest{suffix}"
    sitk.WriteImage(CTVolume(arr, vol.geometry).to_sitk(), str(path))
    return path


def _lung_figures_finite(measurements: dict) -> bool:
    """Whether every lung figure is a finite number (one a quality flag marks unreliable: its value)."""
    values = [v["value"] if isinstance(v, dict) else v for v in measurements["lungs"].values()]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return len(numbers) > 4 and all(math.isfinite(v) for v in numbers)


@pytest.mark.parametrize("suffix", [".nrrd", ".nii.gz"])
@pytest.mark.parametrize("n_bad", [0, 10])
def test_the_reconstruction_sets_a_files_few_nan_voxels_to_air_and_says_so(tmp_path, caplog, n_bad, suffix):
    from pipeline.reconstruction import reconstruct

    volume = read_image(_image_file(tmp_path, n_bad=n_bad, suffix=suffix))
    assert int(np.isnan(volume.array).sum()) == n_bad  # the file is read as it is
    with caplog.at_level(logging.WARNING):
        rec = reconstruct(volume, organs=LUNGS, device="cpu", render=False)
    assert rec.measurements["nonfinite_voxels_set_to_air"] == n_bad
    assert _lung_figures_finite(rec.measurements), rec.measurements["lungs"]
    clean = reconstruct(read_image(_image_file(tmp_path)), organs=LUNGS, device="cpu", render=False)
    volume_ml = rec.measurements["lungs"]["lungs_total_volume_ml"]
    assert volume_ml == pytest.approx(clean.measurements["lungs"]["lungs_total_volume_ml"], abs=1.0)  # 10 voxels: 0.1 mL
    if n_bad:
        assert "chest: 10 NaN/infinite voxels set to -1024 HU (air)" in caplog.text
    else:
        assert "NaN" not in caplog.text
    assert int(np.isnan(volume.array).sum()) == n_bad  # the caller's volume is left as it was


@pytest.mark.parametrize("suffix", [".nrrd", ".nii.gz"])
def test_the_reconstruction_refuses_a_file_mostly_nan_by_name(tmp_path, suffix):
    from pipeline.reconstruction import reconstruct

    volume = read_image(_image_file(tmp_path, nan_slices=20, suffix=suffix))  # half the voxels
    with pytest.raises(InvalidVolumeError) as info:
        reconstruct(volume, organs=LUNGS, device="cpu", render=False, out_dir=tmp_path / "out")
    text = str(info.value)
    assert "chest" in text and "(50.0%) are NaN or infinite" in text and "1%" in text, text
    assert "fix:" in text.lower() or info.value.fix, text
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("suffix", [".nrrd", ".nii.gz", ".nii"])
def test_ctpipe_reconstruct_on_an_image_file_with_nan_voxels_warns_and_records_the_count(tmp_path, capsys, suffix):
    from pipeline.cli import main

    src = _image_file(tmp_path, n_bad=10, suffix=suffix)
    out = tmp_path / "out"
    argv = ["reconstruct", str(src), "--out", str(out), "--organs", LUNGS, "--device", "cpu", "--case-id", "c1"]
    assert main([*argv, "--no-render", "--dicom", "none"]) == 0
    err = capsys.readouterr().err
    assert "c1: 10 NaN/infinite voxels set to -1024 HU (air)" in err, err
    doc = json.loads((out / "c1_measurements.json").read_text())
    assert doc["nonfinite_voxels_set_to_air"] == 10
    assert _lung_figures_finite(doc), doc["lungs"]


@pytest.mark.parametrize("suffix", [".nrrd", ".nii.gz"])
def test_ctpipe_reconstruct_refuses_a_mostly_nan_image_file_by_name(tmp_path, capsys, suffix):
    from pipeline.cli import main

    src = _image_file(tmp_path, nan_slices=20, suffix=suffix)
    out = tmp_path / "out"
    argv = ["reconstruct", str(src), "--out", str(out), "--organs", LUNGS, "--device", "cpu", "--case-id", "c1"]
    assert main([*argv, "--no-render", "--dicom", "none"]) == 1
    err = capsys.readouterr().err
    assert "c1" in err and "(50.0%) are NaN or infinite" in err, err
    assert not any(out.glob("*_measurements.json"))
