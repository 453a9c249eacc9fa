"""A NIfTI image file's NaN and infinite voxels reach ctpipe where they are, as an NRRD's or MHA's do.

SimpleITK's NIfTI reader gives every NaN or infinite value of a float NIfTI as 0 (or as the file's ``scl_inter``):
a missing-data region of a ``.nii.gz`` arrived as 0 HU, soft tissue inside the lungs or outside the body, and
``ctpipe detect``, ``reconstruct`` and the case cache, which set a few NaN voxels to air and refuse a volume of many,
saw none of them and recorded none. :func:`~pipeline.ingest.image.read_image` now reads them back with nibabel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest.image import read_image
from pipeline.volume import CTVolume, Geometry
from tests.test_run_detect_parity import _chest

#: The NaN block of :func:`_hu` ([k, j, i]): off every axis and of three different lengths, so that an index taken
#: in nibabel's [i, j, k] order, or a transposed one, lands elsewhere.
NAN_BLOCK = (slice(1, 3), slice(4, 6), slice(5, 8))
PLUS_INF, MINUS_INF = (4, 0, 2), (5, 6, 0)


def _hu() -> np.ndarray:
    """A 6 x 7 x 9 float32 HU volume [k, j, i] of distinct finite values, with a 2 x 2 x 3 NaN block, one +inf voxel
    and one -inf voxel."""
    hu = np.linspace(-1000.0, 400.0, 6 * 7 * 9, dtype=np.float32).reshape(6, 7, 9)
    hu[NAN_BLOCK] = np.nan
    hu[PLUS_INF], hu[MINUS_INF] = np.inf, -np.inf
    return hu


def _write(path: Path, hu: np.ndarray, *, writer: str = "sitk") -> Path:
    """``hu`` ([k, j, i]) as the image file ``path``, written by SimpleITK or by nibabel (from its [i, j, k] array)."""
    if writer == "sitk":
        import SimpleITK as sitk

        sitk.WriteImage(CTVolume(hu, Geometry(hu.shape, (0.8, 0.9, 2.5), (-3.0, 4.0, -50.0))).to_sitk(), str(path))
    else:
        import nibabel as nib

        nib.save(nib.Nifti1Image(np.ascontiguousarray(hu.transpose(2, 1, 0)), np.diag([0.8, 0.9, 2.5, 1.0])), path)
    return path


@pytest.mark.parametrize(
    ("suffix", "writer"),
    [(".nii.gz", "sitk"), (".nii", "sitk"), (".nii.gz", "nibabel"), (".nii", "nibabel"), (".nrrd", "sitk")],
)
def test_nan_and_infinite_voxels_are_read_where_the_file_holds_them(tmp_path, suffix, writer):
    hu = _hu()
    vol = read_image(_write(tmp_path / f"scan{suffix}", hu, writer=writer))
    assert vol.array.dtype == np.float32
    want = np.argwhere(np.isnan(hu))
    assert np.array_equal(np.argwhere(np.isnan(vol.array)), want), np.argwhere(np.isnan(vol.array))
    assert vol.array[PLUS_INF] == np.inf and vol.array[MINUS_INF] == -np.inf
    np.testing.assert_array_equal(vol.array, hu)  # the finite voxels as stored; NaN where NaN


def test_scl_slope_and_scl_inter_apply_around_the_nan_voxels(tmp_path):
    """A float NIfTI with a slope and an intercept: SimpleITK gives its NaN voxels as ``scl_inter`` (-1000 here)."""
    import nibabel as nib

    raw = _hu()
    img = nib.Nifti1Image(np.ascontiguousarray(raw.transpose(2, 1, 0)), np.eye(4))
    img.header.set_slope_inter(2.0, -1000.0)
    nib.save(img, tmp_path / "scaled.nii.gz")
    proxy = nib.load(tmp_path / "scaled.nii.gz").dataobj
    assert (proxy.slope, proxy.inter, proxy.dtype) == (2.0, -1000.0, np.float32)  # the file holds the scaling
    vol = read_image(tmp_path / "scaled.nii.gz")
    assert np.array_equal(np.argwhere(np.isnan(vol.array)), np.argwhere(np.isnan(raw)))
    np.testing.assert_allclose(vol.array, raw.astype(np.float64) * 2.0 - 1000.0, rtol=1e-6)  # NaN and inf where raw's


def test_an_integer_nifti_holds_no_nan_and_reads_as_it_did(tmp_path):
    """NaN HU saved as int16 with a slope cannot stay NaN (nibabel stores them as the value that scales to 0): the
    file holds none, and none is made up."""
    import nibabel as nib

    hu = _hu()
    hu[~np.isfinite(hu)] = np.nan
    img = nib.Nifti1Image(np.ascontiguousarray(hu.transpose(2, 1, 0)), np.eye(4))
    img.set_data_dtype(np.int16)
    nib.save(img, tmp_path / "ints.nii.gz")
    stored = nib.load(tmp_path / "ints.nii.gz")
    assert stored.get_data_dtype() == np.int16 and stored.dataobj.slope != 1.0  # scaled integers
    vol = read_image(tmp_path / "ints.nii.gz")
    assert np.isfinite(vol.array).all()
    np.testing.assert_allclose(vol.array, stored.get_fdata().transpose(2, 1, 0), rtol=1e-5, atol=1e-3)


def _chest_file(path: Path, *, nan_slices: int = 0, n_bad: int = 0) -> Path:
    """The test chest (float32 HU) as the image file ``path``: ``n_bad`` NaN voxels in its right lung, its first
    ``nan_slices`` slices all NaN."""
    vol = _chest()
    arr = vol.array.copy()
    arr[10, 20 : 20 + n_bad, 12] = np.nan
    arr[:nan_slices] = np.nan
    return _write(path, arr)


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii"])
def test_the_case_cache_sets_a_niftis_nan_voxels_to_air_and_records_them(tmp_path, suffix):
    from pipeline.cache import NONFINITE_HU, CaseCache
    from pipeline.ingest import load_series

    cache = CaseCache(tmp_path / "cache")
    entry = cache.write("c1", load_series(_chest_file(tmp_path / f"chest{suffix}", n_bad=10)))
    assert entry.nonfinite == {"voxels": 10, "set_to_air": True}
    stored = cache.read("c1").array
    assert (stored[10, 20:30, 12] == NONFINITE_HU).all()  # air, not 0 HU
    assert np.array_equal(stored, np.where(np.isnan(read_image(tmp_path / f"chest{suffix}").array), NONFINITE_HU, _chest().array))


def test_ctpipe_detect_refuses_a_mostly_nan_nifti(tmp_path, capsys):
    from pipeline.cli import main

    src = _chest_file(tmp_path / "chest.nii.gz", nan_slices=20)
    out = tmp_path / "out"
    argv = ["detect", str(src), "--out", str(out), "--device", "cpu", "--no-png", "--dicom", "none", "--case-id", "c1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "c1: 81920 of 163840 voxels (50.0%) are NaN or infinite" in err, err
    assert not list(tmp_path.rglob("*.findings.json"))


def test_the_stored_values_are_read_chunk_by_chunk_in_file_order(tmp_path, monkeypatch):
    """Chunks of 11 voxels, so that the NaN block and the infinite voxels straddle chunk boundaries."""
    from pipeline.ingest import nifti

    monkeypatch.setattr(nifti, "CHUNK_BYTES", 11 * 4)
    hu = _hu()
    np.testing.assert_array_equal(read_image(_write(tmp_path / "scan.nii.gz", hu)).array, hu)
