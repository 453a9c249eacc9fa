"""Bronchi beside the lung arteries (``Confounders(bronchovascular=True)``): one bronchus per artery branch of a
visible calibre, touching it, continuous through the bifurcations; air lumens in the airway truth, walls in the lung."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.phantom import Confounders, generate_phantom
from pipeline.phantom.bronchi import LUMEN_RATIO, MIN_ARTERY_RADIUS_MM, MIN_WALL_MM, bronchus_tubes
from pipeline.phantom.tubes import Tubes

PROTOCOL = dict(matrix=160, pixel_spacing=1.6, slice_spacing=2.0, n_nodules=0, noise_hu=10.0)


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    t = np.clip((p - a) @ (b - a) / ((b - a) @ (b - a)), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * (b - a))))


def test_each_visible_artery_branch_gets_one_touching_bronchus_continuous_through_its_bifurcation():
    """A parent artery (3 mm radius) splitting into two children, one of them too thin for a visible bronchus."""
    arteries = Tubes()
    root, fork = np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 30.0])
    arteries.add(root, fork, 3.0, 2.8)
    arteries.add(fork, np.array([15.0, 0.0, 50.0]), 2.4, 2.2)
    arteries.add(fork, np.array([-10.0, 5.0, 45.0]), 0.8, 0.7)  # below MIN_ARTERY_RADIUS_MM
    assert 0.8 < MIN_ARTERY_RADIUS_MM <= 2.4
    outer, lumen = bronchus_tubes(arteries, [7, 7, 7], np.random.default_rng(0))
    assert len(outer) == len(lumen) == 2
    # the child's bronchus starts where its parent's ended: one continuous airway through the fork
    np.testing.assert_allclose(lumen.a[1], lumen.b[0])
    for n, (a, b, rb) in enumerate(zip(arteries.a[:2], arteries.b[:2], arteries.rb[:2])):
        # lumen radius within the bronchoarterial ratio, wall at least MIN_WALL_MM
        assert LUMEN_RATIO[0] * rb - 1e-9 <= lumen.rb[n] <= LUMEN_RATIO[1] * rb + 1e-9
        assert outer.rb[n] - lumen.rb[n] >= MIN_WALL_MM - 1e-9
        # the bronchus' outer surface touches the artery at the branch's end (their walls share the adventitia)
        gap = _segment_distance(lumen.b[n], a, b) - rb - outer.rb[n]
        assert gap == pytest.approx(0.0, abs=1e-6)
    # the parent's bronchus runs beside its artery all along: it touches it at the start as well
    assert _segment_distance(lumen.a[0], root, fork) - arteries.ra[0] - outer.ra[0] == pytest.approx(0.0, abs=1e-6)
    # no artery of a visible calibre, no bronchus
    thin = Tubes()
    thin.add(root, fork, 0.9, 0.8)
    assert len(bronchus_tubes(thin, [0], np.random.default_rng(0))[0]) == 0


@pytest.fixture(scope="module")
def pair():
    plain = generate_phantom(23, confounders=Confounders(table="flat"), **PROTOCOL)
    with_bronchi = generate_phantom(23, confounders=Confounders(table="flat", bronchovascular=True), **PROTOCOL)
    return plain, with_bronchi


def test_bronchi_are_air_rings_in_the_lung_beside_its_vessels(pair):
    plain, bv = pair
    assert bv.options["confounders"]["bronchovascular"] is True
    lung0 = plain.masks["lung_left"] | plain.masks["lung_right"]
    lung1 = bv.masks["lung_left"] | bv.masks["lung_right"]
    new_air = bv.masks["airway"] & ~plain.masks["airway"]
    voxel_ml = float(np.prod(bv.volume.spacing)) / 1000.0
    assert new_air.sum() * voxel_ml > 1.0  # several millilitres of bronchial lumen
    # the lumens were lung, are no longer, and are air; the vessels are untouched
    assert (new_air & ~lung0).sum() <= 0.02 * new_air.sum()
    assert not (new_air & lung1).any()
    assert np.array_equal(bv.masks["vessels"] & lung1, plain.masks["vessels"] & lung1)
    assert np.median(bv.volume.array[new_air]) < -500.0
    # every lumen lies beside a vessel (its artery), within a few millimetres
    spacing = np.asarray(bv.volume.spacing)[::-1]
    to_vessel = ndimage.distance_transform_edt(~bv.masks["vessels"], sampling=spacing)
    assert np.percentile(to_vessel[new_air], 90) < 6.0
    # and has a wall: the lung around a lumen is denser than the lung elsewhere
    ring = ndimage.binary_dilation(new_air, iterations=1) & ~bv.masks["airway"] & lung1 & ~bv.masks["vessels"]
    assert np.median(bv.volume.array[ring]) > np.median(bv.volume.array[lung1 & ~bv.masks["vessels"]]) + 200.0


def test_the_option_changes_only_the_bronchi_surroundings(pair):
    """Same seed with and without bronchi: anatomy, noise and everything else are the same draw; only the
    voxels around the new bronchi differ."""
    plain, bv = pair
    changed = np.abs(bv.volume.array.astype(np.float32) - plain.volume.array.astype(np.float32)) > 1.0
    assert changed.any()
    new_air = bv.masks["airway"] & ~plain.masks["airway"]
    spacing = np.asarray(bv.volume.spacing)[::-1]
    to_bronchus = ndimage.distance_transform_edt(~new_air, sampling=spacing)
    # wall, partial volume and the scanner blur: a few voxels (a thin bronchus may show its wall and no air voxel)
    assert np.percentile(to_bronchus[changed], 99.5) < 8.0
    for name in ("body", "bone", "table"):
        np.testing.assert_array_equal(bv.masks[name], plain.masks[name])
