"""Ingest against SimpleITK's ImageSeriesReader on phantom series, and LPS geometry against the phantom's own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import SelectionRules, load_series
from pipeline.phantom import generate_phantom
from pipeline.phantom.dicom_writer import write_dicom_series
from pipeline.volume import Geometry
from tests._support.dicom import read_sitk, write_series


@pytest.fixture(scope="module")
def phantom():
    return generate_phantom(7, matrix=64, slices=16, n_nodules=1)


def _compare(vol, folder, uid=None):
    arr, origin, spacing, direction = read_sitk(folder, uid)
    assert vol.array.shape == arr.shape
    assert np.array_equal(vol.array, arr), np.abs(vol.array.astype(np.float64) - arr).max()
    np.testing.assert_allclose(vol.origin, origin, atol=1e-4)
    np.testing.assert_allclose(vol.spacing, spacing, atol=1e-4)
    np.testing.assert_allclose(vol.direction, direction, atol=1e-4)


@pytest.mark.parametrize(
    ("options",),
    [
        ({},),
        ({"quirks": ["shuffled_names"]},),
        ({"quirks": ["reversed_order"]},),
        ({"transfer_syntax": "rle"},),
        ({"transfer_syntax": "jpeg2000"},),
        ({"unsigned": True},),
        ({"unsigned": True, "transfer_syntax": "rle", "quirks": ["shuffled_names", "reversed_order"]},),
    ],
    ids=["plain", "shuffled", "reversed", "rle", "jpeg2000", "unsigned", "unsigned-rle-shuffled-reversed"],
)
def test_matches_simpleitk(tmp_path, phantom, options):
    write_dicom_series(phantom.volume, tmp_path, seed=3, **options)
    vol = load_series(tmp_path)
    _compare(vol, tmp_path)
    assert vol.array.dtype == np.int16  # integral rescale that fits
    md = vol.metadata
    src = phantom.volume.metadata
    for key in (
        "StudyInstanceUID",
        "SeriesInstanceUID",
        "ConvolutionKernel",
        "Manufacturer",
        "PatientPosition",
    ):
        assert md[key] == src[key], key
    # the phantom's description ("Chest phantom") holds no part of its patient's name (PHANTOM000003): shown as it is
    assert md["SeriesDescription"] == src["SeriesDescription"] == "Chest phantom"
    assert load_series(tmp_path, keep_identifiers=True).metadata["SeriesDescription"] == src["SeriesDescription"]
    assert "PatientID" not in md  # patient identifiers only with keep_identifiers=True
    assert md["SliceThickness"] == pytest.approx(1.25)
    assert md["KVP"] == pytest.approx(120.0)
    assert md["SourceFileCount"] == 16
    assert md["StudyDate"]


@pytest.mark.parametrize("position", ["HFS", "FFS", "HFP"])
def test_lps_geometry_matches_phantom(tmp_path, position):
    """Every voxel lands at the LPS point where the phantom put it (any patient position)."""
    ph = generate_phantom(3, matrix=64, slices=12, n_nodules=0, patient_position=position)
    write_dicom_series(ph.volume, tmp_path, seed=1, quirks=["shuffled_names"])
    vol = load_series(tmp_path)
    _compare(vol, tmp_path)
    rng = np.random.default_rng(0)
    ijk = np.stack([rng.integers(0, n, 400) for n in vol.geometry.size_ijk], axis=1)
    lps = vol.index_to_lps(ijk)
    src_ijk = np.rint(ph.volume.lps_to_index(lps)).astype(int)
    np.testing.assert_allclose(ph.volume.index_to_lps(src_ijk), lps, atol=1e-3)
    got = vol.array[ijk[:, 2], ijk[:, 1], ijk[:, 0]].astype(np.float64)
    want = ph.volume.array[src_ijk[:, 2], src_ijk[:, 1], src_ijk[:, 0]].astype(np.float64)
    assert np.abs(got - want).max() <= 0.5 + 1e-3  # stored values are the HU rounded to integers
    # the patient's left lung is at +x in LPS whatever the patient position
    left = ph.masks["lung_left"]
    right = ph.masks["lung_right"]
    kk, jj, ii = np.nonzero(left)
    xl = ph.volume.index_to_lps(np.stack([ii, jj, kk], 1))[:, 0].mean()
    kk, jj, ii = np.nonzero(right)
    xr = ph.volume.index_to_lps(np.stack([ii, jj, kk], 1))[:, 0].mean()
    assert xl > xr


@pytest.mark.parametrize(
    "orientation",
    [(1, 0, 0, 0, 1, 0), (-1, 0, 0, 0, 1, 0), (1, 0, 0, 0, -1, 0), (0.8, 0.6, 0, -0.6, 0.8, 0), (0, 1, 0, 0, 0, -1)],
    ids=["axial", "flipped-x", "flipped-y", "rotated", "sagittal"],
)
@pytest.mark.parametrize("step", [1.25, -2.0])
def test_orientations_match_simpleitk(tmp_path, orientation, step):
    write_series(tmp_path, n=12, orientation=orientation, step=step, implicit=step < 0, names=lambda k: f"{(k * 7919) % 101:03d}")
    vol = load_series(tmp_path, rules=SelectionRules(axial_tolerance_deg=90))
    _compare(vol, tmp_path)


def test_float_rescale_matches_simpleitk(tmp_path):
    write_series(tmp_path, n=12, slope=0.5, intercept=-1024.25)
    vol = load_series(tmp_path)
    assert vol.array.dtype == np.float32
    arr, *_ = read_sitk(tmp_path)
    np.testing.assert_allclose(vol.array, arr, rtol=0, atol=1e-3)


def test_gantry_tilt_from_phantom_writer_lands_in_lps(tmp_path):
    """A 15 deg tilted acquisition, resampled onto an orthogonal grid, shows the phantom where it is in LPS."""
    from pipeline.errors import GantryTiltError

    ph = generate_phantom(4, matrix=64, slices=24, n_nodules=1, noise_hu=0)
    write_dicom_series(ph.volume, tmp_path, quirks=["gantry_tilt"])
    with pytest.raises(GantryTiltError, match="gantry tilt of 15.00 deg"):
        load_series(tmp_path)
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    assert vol.metadata["GantryTiltCorrectedDeg"] == pytest.approx(15.0, abs=0.01)
    rng = np.random.default_rng(0)
    ijk = np.stack([rng.integers(6, n - 6, 2000) for n in vol.geometry.size_ijk], axis=1)
    src = np.rint(ph.volume.lps_to_index(vol.index_to_lps(ijk))).astype(int)
    inside = np.all((src >= 0) & (src < np.array(ph.volume.geometry.size_ijk)), axis=1)
    got = vol.array[ijk[inside, 2], ijk[inside, 1], ijk[inside, 0]]
    want = ph.volume.array[src[inside, 2], src[inside, 1], src[inside, 0]]
    assert inside.sum() > 1000
    assert np.corrcoef(got, want)[0, 1] > 0.97
    assert np.median(np.abs(got - want)) < 15.0


SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"  # committed (see data_samples/README.md)


@pytest.mark.parametrize("name", ["phantom_00001", "phantom_00002", "phantom_00003"])
def test_data_samples_match_simpleitk(name):
    case = SAMPLES / name / "dicom"
    vol = load_series(case)
    _compare(vol, case)
    gt = json.loads((case.parent / "ground_truth.json").read_text())
    assert vol.series_uid == gt["series_uid"]
    lo, hi = Geometry.from_json(gt["geometry"]).bounds_lps()  # the phantom's own LPS extent
    vlo, vhi = vol.geometry.bounds_lps()
    np.testing.assert_allclose(vlo, lo, atol=1e-3)
    np.testing.assert_allclose(vhi, hi, atol=1e-3)
