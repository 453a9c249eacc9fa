"""Sub-voxel peripheral lung vessels (``Confounders(fine_vessels=True)``): partial volume, lungs only, and the
faint local maxima a real chest CT's lungs hold."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.detection.lungs import quick_lung_mask
from pipeline.phantom import Confounders, generate_phantom
from pipeline.phantom.fine_vessels import blood_fraction
from pipeline.phantom.scanner import CanonicalGrid
from pipeline.volume import CTVolume

PROTOCOL = dict(matrix=160, pixel_spacing=1.6, slice_spacing=2.0, n_nodules=0, noise_hu=10.0)
BANDS = (-600.0, -450.0, -300.0, -150.0)  # HU bands of faint local maxima


def _grid(shape=(20, 40, 40), pixel=1.4, slice_=2.0) -> CanonicalGrid:
    nz, ny, nx = shape
    return CanonicalGrid(
        xs=np.arange(nx) * pixel, ys=np.arange(ny) * pixel, zs=np.arange(nz) * slice_, pixel_spacing=pixel, slice_spacing=slice_
    )


def faint_peaks_per_litre(volume: CTVolume, lung: np.ndarray) -> np.ndarray:
    """Local maxima (3x3x3) inside ``lung`` (eroded by 3 voxels) per litre, in each HU band of :data:`BANDS`."""
    hu = volume.array.astype(np.float32)
    core = ndimage.binary_erosion(lung, iterations=3)
    peaks = (hu == ndimage.maximum_filter(hu, size=3)) & core
    litres = core.sum() * float(np.prod(volume.spacing)) / 1e6
    return np.histogram(hu[peaks], bins=BANDS)[0] / litres


def test_blood_fraction_is_the_vessel_volume_spread_over_voxels():
    """A 0.5 mm radius vessel 30 mm long: its voxels hold its volume (pi r^2 L) and none is more than half blood."""
    g = _grid()
    a, b = np.array([[10.0, 20.0, 15.0]]), np.array([[40.0, 30.0, 21.0]])
    r = 0.5
    frac = blood_fraction(g, a, b, np.array([r]))
    length = float(np.linalg.norm(b - a))
    voxel = 1.4 * 1.4 * 2.0
    assert frac.sum() * voxel == pytest.approx(np.pi * r * r * length, rel=0.02)
    assert 0.05 < frac.max() < 0.5
    # twice the radius: four times the blood on the axis, never more than a full voxel
    thick = blood_fraction(g, a, b, np.array([2 * r]))
    assert thick.sum() == pytest.approx(4 * frac.sum(), rel=0.02) and thick.max() <= 1.0
    # a segment leaving the grid loses only its outside part
    out = blood_fraction(g, np.array([[30.0, 20.0, 15.0]]), np.array([[80.0, 20.0, 15.0]]), np.array([r]))
    inside_mm = 40 * 1.4 - 0.7 - 30.0  # up to the last voxel centre plus half a voxel
    assert out.sum() * voxel == pytest.approx(np.pi * r * r * inside_mm, rel=0.1)


@pytest.fixture(scope="module")
def pair():
    plain = generate_phantom(21, confounders=Confounders(table="flat"), **PROTOCOL)
    fine = generate_phantom(21, confounders=Confounders(table="flat", fine_vessels=True), **PROTOCOL)
    return plain, fine


def test_fine_vessels_are_faint_lung_structures_only(pair):
    plain, fine = pair
    assert fine.options["confounders"]["fine_vessels"] is True
    for name in ("lung_left", "lung_right", "vessels", "body", "bone"):
        assert np.array_equal(plain.masks[name], fine.masks[name]), name
    lung = plain.masks["lung_left"] | plain.masks["lung_right"]
    changed = np.abs(fine.volume.array - plain.volume.array) > 1.0
    # only the lungs and the voxels the scanner's blur reaches from them
    assert changed.any() and not (changed & ~ndimage.binary_dilation(lung, iterations=3)).any()
    before, after = faint_peaks_per_litre(plain.volume, lung), faint_peaks_per_litre(fine.volume, lung)
    assert after.sum() > 3 * before.sum(), (before, after)
    # faint: the lung's median HU hardly moves
    assert abs(np.median(fine.volume.array[lung]) - np.median(plain.volume.array[lung])) < 15


def test_fine_vessel_phantom_lungs_look_like_a_real_chest_ct(pair):
    """Faint local maxima per litre of lung (-600 to -150 HU, three bands) within a factor of 2.5 of the real
    RT-planning chest CT's in every band; without the fine vessels at least one band is off by more."""
    from tests._support.real_ct import rt_planning_chest

    case = rt_planning_chest()  # skips with a reason when ../shared/real_ct is absent
    region = quick_lung_mask(case.volume)
    coarse = region.mask
    for axis, stride in enumerate(region.stride):
        coarse = np.repeat(coarse, stride, axis=axis)
    lung = np.zeros(case.volume.array.shape, bool)
    box = tuple(slice(0, min(x, y)) for x, y in zip(lung.shape, coarse.shape))
    lung[box] = coarse[box]
    lung = ndimage.binary_erosion(lung, iterations=2)
    real = faint_peaks_per_litre(case.volume, lung)
    plain, fine = pair
    lungs = plain.masks["lung_left"] | plain.masks["lung_right"]
    ratio_fine = faint_peaks_per_litre(fine.volume, lungs) / real
    ratio_plain = faint_peaks_per_litre(plain.volume, lungs) / real
    assert np.all((ratio_fine > 1 / 2.5) & (ratio_fine < 2.5)), (real, ratio_fine)
    assert np.any((ratio_plain < 1 / 2.5) | (ratio_plain > 2.5)), (real, ratio_plain)


def test_canonical_grid_index_and_lps_are_inverse() -> None:
    """``index_of`` and ``lps_of`` map LPS mm to continuous (z, y, x) indices and back, for any batch shape."""
    grid = CanonicalGrid(
        xs=-50.0 + 0.8 * np.arange(20),
        ys=-30.0 + 0.8 * np.arange(16),
        zs=10.0 + 2.0 * np.arange(8),
        pixel_spacing=0.8,
        slice_spacing=2.0,
    )
    points = np.random.default_rng(0).uniform(-40.0, 20.0, (4, 5, 3))
    idx = grid.index_of(points)
    assert idx.shape == (4, 5, 3)
    assert np.allclose(grid.lps_of(idx), points)
    assert np.allclose(grid.lps_of([0.0, 0.0, 0.0]), [-50.0, -30.0, 10.0])  # the first voxel centre, (x, y, z)
    assert np.allclose(grid.lps_of([1.0, 2.0, 3.0]), [-50.0 + 2.4, -30.0 + 1.6, 12.0])
