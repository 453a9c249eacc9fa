"""A tilt-corrected volume keeps which voxels its images measured through every spatial operation.

``CTVolume.resample`` and ``CTVolume.crop`` kept the ingest's per-slice shifts, which describe the source grid only:
on the new grid every voxel counted as measured (the wedge of -1024 HU fill was taken for air downstream), or, for a
crop that kept the slices, a mask of the wrong voxels. The mask now travels with the volume: a resampled voxel counts
as measured only where every source voxel it is made of was (unmeasured wins at the boundary), a cropped one as it
was, and the case cache keeps it.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.ingest import load_series
from pipeline.ingest.measured import continued_past_edge, measured_mask
from pipeline.volume import CTVolume
from tests.test_gantry_tilt_detector_lungs import _write


@pytest.fixture(scope="module")
def tilted(tmp_path_factory) -> CTVolume:
    folder = tmp_path_factory.mktemp("tilt") / "tilted"
    vol = load_series(_write(folder, tilt_deg=15.0), allow_gantry_tilt=True)
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None and not measured.all()
    return vol


def _mask(vol: CTVolume) -> np.ndarray:
    m = measured_mask(vol.geometry, vol.metadata)
    return np.ones(vol.shape, bool) if m is None else m


@pytest.mark.parametrize(
    "lo, hi",
    [
        ((0, 5, 0), (1000, 60, 1000)),  # rows only: the slices and their shifts are kept
        ((0, 5, 8), (1000, 60, 30)),  # rows and slices
        ((3, 2, 1), (40, 70, 33)),  # every axis
    ],
)
def test_a_crop_keeps_which_of_its_voxels_were_measured(tilted, lo, hi):
    crop = tilted.crop(lo, hi)
    full = _mask(tilted)
    k0, j0, i0 = lo[2], lo[1], lo[0]
    want = full[k0 : k0 + crop.shape[0], j0 : j0 + crop.shape[1], i0 : i0 + crop.shape[2]]
    assert not want.all()
    np.testing.assert_array_equal(_mask(crop), want)


def test_a_crop_inside_what_was_measured_has_no_mask(tilted):
    full = _mask(tilted)
    k = tilted.shape[0] // 2
    rows = np.flatnonzero(full[k].any(axis=1))
    crop = tilted.crop((0, int(rows[0]) + 2, k), (1000, int(rows[-1]) - 1, k + 1))
    assert measured_mask(crop.geometry, crop.metadata) is None


@pytest.mark.parametrize("order", ["linear", "nearest"])
@pytest.mark.parametrize("ratio", [1.4, 0.6])
def test_a_resampled_voxel_is_measured_only_where_no_fill_entered_it(tilted, order, ratio):
    """Resampling the volume as it is and with its wedge continued past the images' edge (the fill replaced by
    tissue or air values) differs exactly at the voxels the resampled mask calls unmeasured (ratios without
    half-way ties)."""
    spacing = tuple(s * ratio for s in tilted.spacing)
    res = tilted.resample(spacing, order=order, device="cpu")
    filled = tilted.with_array(continued_past_edge(np.asarray(tilted.array), _mask(tilted)))
    res_filled = filled.resample(spacing, order=order, device="cpu")
    measured = measured_mask(res.geometry, res.metadata)
    assert measured is not None
    fill_entered = np.abs(np.asarray(res.array, np.float64) - np.asarray(res_filled.array, np.float64)) > 1e-3
    assert fill_entered.any()
    np.testing.assert_array_equal(~measured, fill_entered)


def test_unmeasured_wins_at_a_half_way_nearest_neighbour_tie(tilted):
    """Halving the rows puts every new row half-way between two; nearest-neighbour picks one, and a new voxel counts
    as measured only when both were."""
    full = _mask(tilted)
    spacing = (tilted.spacing[0], tilted.spacing[1] * 0.5, tilted.spacing[2])
    res = tilted.resample(spacing, order="nearest", device="cpu")
    got = _mask(res)
    # new row 2r + 1 lies half-way between source rows r and r + 1
    between = full[:, :-1, :] & full[:, 1:, :]
    np.testing.assert_array_equal(got[:, 1 : 2 * full.shape[1] - 1 : 2, :], between)
    np.testing.assert_array_equal(got[:, 0::2, :], full)


def test_the_case_cache_keeps_the_mask_of_a_resampled_or_cropped_volume(tilted, tmp_path):
    cache = CaseCache(tmp_path / "cache")
    for name, vol in (
        ("res", tilted.resample(tuple(s * 1.4 for s in tilted.spacing), device="cpu")),
        ("crop", tilted.crop((10, 0, 0), (50, 1000, 1000))),
    ):
        cache.write(name, vol)
        back = cache.read(name)
        want = measured_mask(vol.geometry, vol.metadata)
        assert want is not None and not want.all()
        np.testing.assert_array_equal(measured_mask(back.geometry, back.metadata), want)


def test_the_model_input_as_a_volume_knows_which_of_its_voxels_were_measured(tilted):
    """``LoadedCase.to_volume()`` (the model input, resampled, flipped to RAS and padded) calls a voxel measured only
    where no unmeasured source voxel entered it: exactly where preprocessing the array as it is and with its wedge
    continued past the images' edge agree (the padding is no image's either)."""
    from pipeline.detection import Detector
    from pipeline.load import preprocess_array, preprocess_volume

    spec = Detector(device="cpu").spec
    case = preprocess_volume(tilted, spec, device="cpu")
    assert case.geometry is not None
    vol = case.to_volume()
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None
    bare = preprocess_array(np.asarray(tilted.array), case.geometry, spec, device="cpu")[0].numpy()
    filled = case.unwrap()[0].numpy()
    (x0, y0, z0), (x1, y1, z1) = case.geometry.valid_box
    fill_entered = (bare != filled).transpose(2, 1, 0)  # [z, y, x], as the volume's [k, j, i]
    valid = np.zeros_like(measured)
    valid[z0:z1, y0:y1, x0:x1] = True
    assert fill_entered.any()
    np.testing.assert_array_equal(measured, valid & ~fill_entered)
