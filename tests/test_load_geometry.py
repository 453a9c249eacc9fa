"""InputGeometry: orientation as MONAI/nibabel choose it, index ↔ LPS mappings, planning of shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.load import InputGeometry, PreprocessSpec, plan_input, preprocess_volume, ras_orientation
from pipeline.volume import LPS_TO_RAS, CTVolume, Geometry


def rot(axis: int, deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    a, b = [x for x in range(3) if x != axis]
    m = np.eye(3)
    m[a, a], m[a, b], m[b, a], m[b, b] = c, -s, s, c
    return m


DIRECTIONS = [
    np.eye(3),
    np.diag([-1.0, 1.0, -1.0]),
    np.diag([1.0, -1.0, 1.0]),
    np.array([[0, 0, 1], [1, 0, 0], [0, -1, 0.0]]),  # sagittal
    np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0.0]]),  # coronal
    rot(2, 20.0) @ rot(1, -15.0),
    rot(0, 160.0),
]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_orientation_matches_nibabel(direction):
    nib = pytest.importorskip("nibabel.orientations")
    geom = Geometry(shape=(5, 6, 7), spacing=(0.7, 0.8, 1.5), origin=(1, 2, 3), direction=direction)
    src_axis, flip = ras_orientation(geom)
    ornt = nib.io_orientation(geom.affine_ras)  # row c: (RAS axis of index axis c, ±1)
    for c in range(3):
        a = int(ornt[c, 0])
        assert src_axis[a] == c
        assert flip[a] == (ornt[c, 1] < 0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_mappings_are_consistent(direction):
    geom = Geometry(shape=(20, 31, 27), spacing=(0.8, 0.75, 2.0), origin=(-10, 5, 30), direction=direction)
    spec = PreprocessSpec(spacing=(0.703125, 0.703125, 1.25), size_divisible=(16, 16, 8))
    g = plan_input(geom, spec)
    assert all(s % d == 0 for s, d in zip(g.shape, spec.size_divisible))
    np.testing.assert_allclose(g.affine_lps, LPS_TO_RAS @ g.affine_ras)
    # model axes point to R, A, S (positive diagonal-dominant RAS affine) with the target spacing
    ras = g.affine_ras[:3, :3]
    assert np.all(np.argmax(np.abs(ras), axis=0) == [0, 1, 2]) and np.all(np.diag(ras) > 0)
    np.testing.assert_allclose(np.linalg.norm(ras, axis=0), [0.703125, 0.703125, 1.25])
    rng = np.random.default_rng(0)
    idx = rng.uniform(-3, np.array(g.shape) + 3, size=(40, 3))
    lps = g.input_index_to_lps(idx)
    np.testing.assert_allclose(g.lps_to_input_index(lps), idx, atol=1e-9)
    np.testing.assert_allclose(geom.index_to_lps(g.input_index_to_source_index(idx)), lps, atol=1e-9)
    np.testing.assert_allclose(g.input_index_to_lps(idx[0]), lps[0])
    np.testing.assert_allclose(g.geometry.index_to_lps(idx), lps, atol=1e-9)
    assert InputGeometry.from_json(g.to_json()) == g
    assert hash(InputGeometry.from_json(g.to_json())) == hash(g)


def test_resampled_shape_follows_monai_rule():
    geom = Geometry(shape=(100, 512, 512), spacing=(0.7, 0.7, 2.5), origin=(0, 0, 0))
    g = plan_input(geom, PreprocessSpec(spacing=(0.703125, 0.703125, 1.25), size_divisible=(16, 16, 8)))
    # round((n - 1) * s / t + 1): 511 * 0.7 / 0.703125 + 1 = 509.7 → 510; 99 * 2.5 / 1.25 + 1 = 199
    assert g.resampled_shape == (510, 510, 199)
    assert g.shape == (512, 512, 200)
    assert g.anchor == (-1, -1, 0)  # symmetric: 2 voxels → 1 before; 1 voxel → 0 before, 1 after
    assert g.valid_box == ((1, 1, 0), (511, 511, 199))
    # a source spacing within 1e-3 mm of the target is kept (MONAI's AFFINE_TOL)
    g2 = plan_input(geom.with_(spacing=(0.7035, 0.7035, 1.25)), PreprocessSpec(spacing=(0.703125, 0.703125, 1.25)))
    assert g2.spacing == (0.7035, 0.7035, 1.25) and g2.resampled_shape == (512, 512, 100)


def test_preprocess_volume_in_memory_matches_voxel_values():
    arr = np.full((4, 5, 6), -2000, np.int16)
    arr[1, 2, 3] = 300  # at the top of the window → 1.0
    vol = CTVolume(arr, Geometry(shape=arr.shape, spacing=(1, 1, 1), origin=(10, 20, 30)))
    case = preprocess_volume(vol, PreprocessSpec(spacing=(None, None, None), size_divisible=(1, 1, 1)), device="cpu")
    assert tuple(case.tensor.shape) == (1, 6, 5, 4)
    p = np.array(np.unravel_index(int(torch.argmax(case.tensor)), case.tensor.shape[1:]), dtype=float)
    np.testing.assert_allclose(case.input_index_to_lps(p), vol.index_to_lps([3, 2, 1]))
    assert float(case.tensor.max()) == 1.0 and float(case.tensor.min()) == 0.0
    back = case.to_volume()
    assert back.geometry.same_grid(vol.geometry.with_(origin=vol.index_to_lps([5, 4, 0]), direction=np.diag([-1.0, -1.0, 1.0])))
    np.testing.assert_allclose(back.index_to_lps([0, 0, 0]), vol.index_to_lps([5, 4, 0]))


@pytest.mark.parametrize("direction", DIRECTIONS[:5])
def test_boxes_round_trip_between_input_and_lps(direction):
    geom = Geometry(shape=(20, 31, 27), spacing=(0.8, 0.75, 2.0), origin=(-10, 5, 30), direction=direction)
    g = plan_input(geom, PreprocessSpec(spacing=(0.703125, 0.703125, 1.25), size_divisible=(16, 16, 8)))
    boxes = np.array([[3.0, 4.0, 5.0, 9.5, 12.0, 8.0], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]])
    lps = g.input_boxes_to_lps(boxes)
    assert np.all(lps[:, 3:] >= lps[:, :3])
    # the box centre maps to the LPS box centre; sizes scale with the model spacing
    np.testing.assert_allclose((lps[:, :3] + lps[:, 3:]) / 2, g.input_index_to_lps((boxes[:, :3] + boxes[:, 3:]) / 2), atol=1e-9)
    sizes = np.sort(lps[:, 3:] - lps[:, :3], axis=1)
    want = np.sort((boxes[:, 3:] - boxes[:, :3]) * np.array(g.spacing), axis=1)
    np.testing.assert_allclose(sizes, want, atol=1e-9)
    np.testing.assert_allclose(g.lps_boxes_to_input(lps), boxes, atol=1e-9)
