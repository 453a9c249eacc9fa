"""Small-blob candidates and the false-positive reduction stage (LPS mm throughout)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage

from pipeline.detection import candidates as candidates_module
from pipeline.detection import fp_reduction as fp_reduction_module
from pipeline.detection.candidates import blob_candidates
from pipeline.detection.candidates_device import device_maxima
from pipeline.detection.fp_reduction import (
    FLIP_VIEWS,
    FPReducer,
    FPReductionConfig,
    PatchClassifier,
    PatchEnsemble,
    classifier_input,
    combine_scores,
    fold_batch_norm,
    network_support,
    patch_logits,
    suppress_duplicates,
)
from pipeline.detection.lungs import quick_lung_mask
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.detection.patches import HU_WINDOW, DevicePatches, extract_patches, sample_windowed
from pipeline.errors import BundleError
from pipeline.phantom import generate_phantom
from pipeline.volume import CTVolume, Geometry


def _lung_volume(direction: np.ndarray, *, shape=(40, 64, 64), spacing=(1.0, 1.0, 1.5), seed: int = 0) -> CTVolume:
    """Lung-like background (-850 HU with noise) on a grid with ``direction`` (columns: i, j, k axes in LPS)."""
    rng = np.random.default_rng(seed)
    arr = (-850.0 + rng.normal(0, 15, shape)).astype(np.float32)
    return CTVolume(arr, Geometry(shape=shape, spacing=spacing, origin=(10.0, -20.0, 30.0), direction=direction))


def _paint_ball(vol: CTVolume, centre_lps: np.ndarray, radius_mm: float, hu: float) -> None:
    k, j, i = np.indices(vol.shape)
    lps = vol.index_to_lps(np.stack([i.ravel(), j.ravel(), k.ravel()], axis=1)).reshape(*vol.shape, 3)
    vol.array[np.linalg.norm(lps - centre_lps, axis=-1) <= radius_mm] = hu


def _paint_tube(vol: CTVolume, point_lps: np.ndarray, axis_lps: np.ndarray, radius_mm: float, hu: float) -> None:
    k, j, i = np.indices(vol.shape)
    lps = vol.index_to_lps(np.stack([i.ravel(), j.ravel(), k.ravel()], axis=1)).reshape(*vol.shape, 3)
    rel = lps - point_lps
    u = axis_lps / np.linalg.norm(axis_lps)
    dist = np.linalg.norm(rel - (rel @ u)[..., None] * u, axis=-1)
    vol.array[dist <= radius_mm] = hu


@pytest.mark.parametrize("direction", [np.eye(3), np.diag([-1.0, 1.0, -1.0]), np.array([[0.0, 1, 0], [1, 0, 0], [0, 0, -1]])])
def test_blob_candidates_find_a_small_ball_and_rank_it_above_a_vessel(direction: np.ndarray) -> None:
    vol = _lung_volume(direction)
    lo, hi = vol.geometry.bounds_lps()
    mid = (lo + hi) / 2
    ball = mid + np.array([8.0, -6.0, 4.0])
    _paint_ball(vol, ball, 2.0, 40.0)  # a 4 mm solid nodule
    _paint_tube(vol, mid + np.array([-10.0, 8.0, 0.0]), np.array([0.2, 0.3, 1.0]), 2.0, 40.0)  # a vessel as thick
    found = blob_candidates(vol, None, max_candidates=20)
    assert len(found) >= 1
    # strongest candidate on the ball, in LPS, whatever the array's orientation
    assert np.linalg.norm(found.centers_lps[0] - ball) < 1.0
    assert 3.0 <= found.diameters_mm[0] <= 7.0
    on_tube = [n for n in range(len(found)) if np.linalg.norm(found.centers_lps[n] - ball) > 4.0]
    assert all(found.response_hu[n] < 0.5 * found.response_hu[0] for n in on_tube)


def test_blob_candidates_on_a_fine_grid_are_searched_coarser_but_placed_in_lps() -> None:
    vol = _lung_volume(np.diag([-1.0, 1.0, 1.0]), shape=(50, 80, 80), spacing=(0.5, 0.5, 0.5))
    lo, hi = vol.geometry.bounds_lps()
    ball = (lo + hi) / 2 + np.array([3.3, -2.1, 1.7])
    _paint_ball(vol, ball, 2.0, 40.0)
    vol.array.setflags(write=False)  # as a memory-mapped cached case: read, never written
    found = blob_candidates(vol, None, max_candidates=5)
    assert np.linalg.norm(found.centers_lps[0] - ball) < 1.0


def test_blob_candidates_stay_in_the_lungs_and_are_empty_without_blobs() -> None:
    vol = _lung_volume(np.eye(3))
    assert len(blob_candidates(vol, None, min_response_hu=60.0)) == 0  # noise only
    ph = generate_phantom(
        4, matrix=96, pixel_spacing=2.0, slice_spacing=2.5, slices=48, n_nodules=3, nodule_diameter_mm=(4.0, 8.0)
    )
    region = quick_lung_mask(ph.volume)
    found = blob_candidates(ph.volume, region, max_candidates=50)
    ijk = ph.volume.lps_to_index(found.centers_lps)
    assert region.near(ijk, 8.0).all()
    assert np.all(np.diff(found.response_hu) <= 0)  # strongest first


@pytest.mark.parametrize("spacing", [(2.0, 2.0, 1.25), (0.7, 0.7, 2.5)])
def test_blob_filters_on_a_torch_device_give_the_cpu_candidates(spacing, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device filters (:func:`device_maxima`, run here on the CPU through torch) find the CPU filters' maxima,
    with their responses, scales and Hessian ratios, and so the same candidates."""
    ph = generate_phantom(
        4, matrix=96, pixel_spacing=spacing[0], slice_spacing=spacing[2], slices=40, n_nodules=3, nodule_diameter_mm=(4.0, 8.0)
    )
    arr = np.clip(ph.volume.array[:, 10:80, 5:90].astype(np.float32), *candidates_module.HU_CLIP)
    sp = np.asarray(spacing, dtype=np.float64)[::-1]
    radii = (1.5, 2.25, 3.25)
    cpu = candidates_module._cpu_maxima(arr, radii, sp, 40.0)
    dev = device_maxima(arr, radii, sp, min_response_hu=40.0, truncate=candidates_module.GAUSS_TRUNCATE, device="cpu")
    assert len(cpu[0]) > 50
    # a maximum whose response ties a neighbour's to float32 rounding may appear on one side only
    cpu_at = {tuple(p): n for n, p in enumerate(cpu[0])}
    common = [(cpu_at[tuple(p)], n) for n, p in enumerate(dev[0]) if tuple(p) in cpu_at]
    assert len(common) >= 0.99 * max(len(cpu[0]), len(dev[0]))
    c, d = np.asarray(common).T
    assert np.array_equal(cpu[2][c], dev[2][d])
    np.testing.assert_allclose(dev[1][d], cpu[1][c], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dev[3][d], cpu[3][c], rtol=1e-3, atol=1e-4)
    region = quick_lung_mask(ph.volume)
    want = blob_candidates(ph.volume, region, max_candidates=60)
    monkeypatch.setattr(
        candidates_module,
        "_cpu_maxima",
        lambda a, r, s, m: device_maxima(a, r, s, min_response_hu=m, truncate=candidates_module.GAUSS_TRUNCATE, device="cpu"),
    )
    got = blob_candidates(ph.volume, region, max_candidates=60)
    assert np.array_equal(got.centers_lps, want.centers_lps) and np.array_equal(got.diameters_mm, want.diameters_mm)
    np.testing.assert_allclose(got.response_hu, want.response_hu, rtol=1e-3)


def test_a_device_out_of_memory_searches_and_cuts_on_the_cpu_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the GPU runs out of memory for the blob search's filters or for the voxels the cubes are cut from, the
    same work is done on the CPU, with a warning: the same candidates and probabilities, not a failed case."""
    ph = generate_phantom(
        4, matrix=96, pixel_spacing=2.0, slice_spacing=2.5, slices=40, n_nodules=3, nodule_diameter_mm=(4.0, 8.0)
    )
    region = quick_lung_mask(ph.volume)
    want = blob_candidates(ph.volume, region, max_candidates=40)

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(candidates_module, "device_maxima", out_of_memory)
    with caplog.at_level("WARNING"):
        got = blob_candidates(ph.volume, region, max_candidates=40, device="cuda")
    assert np.array_equal(got.centers_lps, want.centers_lps) and np.array_equal(got.response_hu, want.response_hu)
    assert "ran out of memory filtering" in caplog.text and "searched on the CPU instead" in caplog.text
    torch.save(PatchClassifier(16, (4, 8, 16), 8).state_dict(), tmp_path / "w.pt")
    reducer = FPReducer(
        FPReductionConfig.from_json({"weights": "w.pt", "patch": 16, "channels": [4, 8, 16], "hidden": 8}, weights_dir=tmp_path)
    )
    probs = reducer.probabilities(ph.volume, want.centers_lps)
    monkeypatch.setattr(fp_reduction_module, "DevicePatches", out_of_memory)
    caplog.clear()
    with caplog.at_level("WARNING"):
        again = reducer.probabilities(ph.volume, want.centers_lps, cut_on_device=True)
    np.testing.assert_array_equal(again, probs)
    assert "ran out of memory for the voxels around 40 candidates" in caplog.text


@pytest.mark.parametrize("slabs", [2, 5])
def test_blob_search_in_slabs_side_by_side_equals_one_pass(slabs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ph = generate_phantom(
        4, matrix=96, pixel_spacing=2.0, slice_spacing=1.25, slices=48, n_nodules=3, nodule_diameter_mm=(4.0, 8.0)
    )
    region = quick_lung_mask(ph.volume)
    monkeypatch.setattr(candidates_module, "cpu_workers", lambda: 1)
    one = blob_candidates(ph.volume, region, max_candidates=60)
    monkeypatch.setattr(candidates_module, "cpu_workers", lambda: slabs)
    split = blob_candidates(ph.volume, region, max_candidates=60)
    assert len(one) == 60
    for field in ("centers_lps", "diameters_mm", "response_hu"):  # the same values, not close ones
        assert np.array_equal(getattr(one, field), getattr(split, field)), field


def test_laplacian_of_a_few_rows_equals_those_rows_of_the_whole() -> None:
    smoothed = np.random.default_rng(4).normal(0.0, 100.0, size=(11, 8, 9)).astype(np.float32)
    spacing_kji = np.array([2.5, 0.7, 0.8])
    whole = candidates_module._laplacian_mm(smoothed, spacing_kji)
    assert not whole[0].any() and not whole[-1].any() and whole[1:-1, 1:-1, 1:-1].all()
    pieces = [candidates_module._laplacian_mm(smoothed, spacing_kji, rows) for rows in ((0, 1), (1, 4), (4, 5), (5, 11))]
    assert np.array_equal(np.concatenate(pieces), whole)  # the same values, not close ones


def test_local_maxima_are_those_of_scipys_maximum_filter() -> None:
    values = np.random.default_rng(3).integers(0, 4, size=(7, 9, 11)).astype(np.float32)  # many ties, edges
    expected = ndimage.maximum_filter(values, size=3, mode="nearest") == values
    assert np.array_equal(candidates_module._local_maxima(values), expected)


@pytest.mark.parametrize("direction", [np.eye(3), np.diag([-1.0, -1.0, -1.0]), np.array([[0.0, 1, 0], [1, 0, 0], [0, 0, 1]])])
def test_patches_are_cut_along_l_p_s_whatever_the_array_orientation(direction: np.ndarray) -> None:
    vol = _lung_volume(direction, spacing=(1.0, 1.0, 1.0))
    lo, hi = vol.geometry.bounds_lps()
    centre = np.round((lo + hi) / 2)
    marker = centre + np.array([5.0, -3.0, 2.0])  # 5 mm to the patient's left, 3 mm anterior, 2 mm superior
    _paint_ball(vol, marker, 0.6, 400.0)
    patch = extract_patches(vol, centre[None], patch=16, spacing_mm=1.0)[0]  # [S, P, L]
    s_, p_, l_ = np.unravel_index(int(np.argmax(patch)), patch.shape)
    mid = 7.5
    assert (l_ - mid, p_ - mid, s_ - mid) == pytest.approx((5.0, -3.0, 2.0), abs=0.6)
    assert patch.min() >= 0.0 and patch.max() <= 1.0


@pytest.mark.parametrize(
    "direction", [np.eye(3), np.array([[np.cos(0.3), -np.sin(0.3), 0.0], [np.sin(0.3), np.cos(0.3), 0.0], [0.0, 0.0, 1.0]])]
)
def test_no_positions_give_no_patches(direction: np.ndarray) -> None:
    # a phantom or series with no candidate (or no anatomy negative) anywhere: an empty stack, not an error
    vol = _lung_volume(direction, spacing=(1.0, 1.0, 1.0))
    assert extract_patches(vol, np.zeros((0, 3)), patch=8, spacing_mm=2.5).shape == (0, 8, 8, 8)


_C, _S = np.cos(0.3), np.sin(0.3)


@pytest.mark.parametrize(
    "direction",
    [
        np.eye(3),
        np.diag([-1.0, 1.0, -1.0]),
        np.array([[0.0, 0, 1], [-1, 0, 0], [0, 1, 0]]),  # i along S, j along -L, k along P (a sagittal stack)
        np.array([[_C, -_S, 0.0], [_S, _C, 0], [0, 0, 1]]),  # oblique: sampled point by point
    ],
)
def test_patches_are_trilinear_samples_with_the_edge_repeated(direction: np.ndarray) -> None:
    """Cubes (and :func:`sample_windowed`) hold the trilinear samples of the whole array at ``centre + offset``
    (LPS mm mapped to indices by the inverse of the series' affine, HU windowed to 0..1), at centres inside, at the
    edge and outside the series, on 1-mm and 2.5-mm grids, axis-aligned or oblique."""
    vol = _lung_volume(direction, shape=(30, 41, 37), spacing=(0.7, 0.9, 1.6), seed=3)
    vol.array[:] += np.linspace(-100.0, 1200.0, vol.array.size).reshape(vol.shape)  # a ramp: every axis matters
    lps_to_ijk = np.linalg.inv(np.asarray(vol.direction) * np.asarray(vol.spacing)[None, :])
    lo, hi = vol.geometry.bounds_lps()
    rng = np.random.default_rng(5)
    centres = np.concatenate([rng.uniform(lo - 12.0, hi + 12.0, size=(12, 3)), [lo, hi, (lo + hi) / 2]])
    for spacing_mm, patch in ((1.0, 16), (2.5, 8)):
        cubes = extract_patches(vol, centres, patch=patch, spacing_mm=spacing_mm)
        ax = (np.arange(patch) - (patch - 1) / 2.0) * spacing_mm
        zz, yy, xx = np.meshgrid(ax, ax, ax, indexing="ij")
        offsets = np.stack([xx.ravel(), yy.ravel(), zz.ravel()], axis=1)  # L, P, S: cubes are [S, P, L]
        for cube, centre in zip(cubes, centres):
            ijk = (centre + offsets - np.asarray(vol.origin)) @ lps_to_ijk.T
            hu = ndimage.map_coordinates(np.asarray(vol.array, np.float64), ijk[:, ::-1].T, order=1, mode="nearest")
            expected = ((np.clip(hu, *HU_WINDOW) - HU_WINDOW[0]) / (HU_WINDOW[1] - HU_WINDOW[0])).reshape(cube.shape)
            np.testing.assert_allclose(cube, expected, atol=1e-5)
            np.testing.assert_allclose(sample_windowed(vol, centre, offsets).reshape(cube.shape), expected, atol=1e-5)
        assert cubes.min() >= 0.0 and cubes.max() <= 1.0 and cubes.std() > 0.05


def test_context_channel_sees_the_surroundings_on_the_same_centre(tmp_path: Path) -> None:
    vol = _lung_volume(np.diag([-1.0, 1.0, -1.0]), spacing=(1.0, 1.0, 1.0))
    lo, hi = vol.geometry.bounds_lps()
    centre = np.round((lo + hi) / 2)
    near, far = centre + np.array([0.0, 0.0, 4.0]), centre + np.array([16.0, 0.0, 0.0])  # 16 mm: outside a 16 mm cube
    _paint_ball(vol, near, 1.0, 400.0)
    _paint_ball(vol, far, 1.5, 400.0)
    cfg = FPReductionConfig.from_json({"weights": "w.pt", "patch": 16, "context_spacing_mm": 2.5}, weights_dir=tmp_path)
    assert cfg.spacings_mm == (1.0, 2.5) and cfg.to_json()["context_spacing_mm"] == 2.5
    x = classifier_input(vol, centre[None], cfg)
    assert x.shape == (1, 2, 16, 16, 16)
    fine, wide = x[0]
    mid = 7.5
    assert np.unravel_index(int(np.argmax(fine)), fine.shape)[0] - mid == pytest.approx(4.0, abs=0.6)  # S
    assert fine[:, :, -1].max() < 0.5  # the far ball is out of the fine cube ...
    s_, p_, l_ = np.unravel_index(int(np.argmax(np.where(np.abs(np.arange(16) - mid)[None, None, :] > 4, wide, 0))), wide.shape)
    assert ((l_ - mid) * 2.5, s_ - mid) == pytest.approx((16.0, 0.0), abs=1.5)  # ... and in the wide one, to the left
    torch.save(PatchClassifier(16, (4, 8, 16), 8, in_channels=2).state_dict(), tmp_path / "w.pt")
    cfg = FPReductionConfig.from_json(
        {"weights": "w.pt", "patch": 16, "channels": [4, 8, 16], "hidden": 8, "context_spacing_mm": 2.5}, weights_dir=tmp_path
    )
    reducer = FPReducer(cfg)
    probs = reducer.probabilities(vol, np.stack([centre, far]))
    assert probs.shape == (2,) and np.all((probs > 0) & (probs < 1))
    # the cubes cut as on a GPU (DevicePatches) give the same probabilities, in one batch or several
    for batch in (1, 2):
        same = reducer.probabilities(vol, np.stack([centre, far]), batch=batch, cut_on_device=True)
        np.testing.assert_allclose(same, probs, atol=1e-5)
    with pytest.raises(BundleError, match="fp_reduction.context_spacing_mm: -1 is not a positive number of mm"):
        FPReductionConfig.from_json({"weights": "w.pt", "context_spacing_mm": -1}, weights_dir=tmp_path)


def test_duplicates_and_score_combination() -> None:
    centers = np.array([[0.0, 0, 0], [1.0, 0, 0], [0.0, 0, 6], [30.0, 0, 0]])
    diam = np.array([20.0, 4.0, 4.0, 4.0])
    keep = suppress_duplicates(centers, diam, np.array([0.9, 0.95, 0.5, 0.1]))
    # the 4 mm candidate at 1 mm wins; the 20 mm one is then dropped as its duplicate; 6 mm away survives
    assert keep.tolist() == [1, 2, 3]
    # a larger radius factor also merges the candidate 6 mm away from the 4 mm one (1.5 x 2 mm < 6 < 4 x 2 mm)
    assert suppress_duplicates(centers, diam, np.array([0.9, 0.95, 0.5, 0.1]), radius_factor=4.0).tolist() == [1, 3]
    p = np.array([0.9, 0.9, 0.2])
    s = np.array([0.1, -1.0, 0.8])
    out = combine_scores(p, s, 0.5)
    assert out[1] == pytest.approx(0.9)  # blob candidate: the classifier alone
    assert out[0] == pytest.approx(np.sqrt(0.09)) and out[2] == pytest.approx(0.4)
    assert np.all((out >= 0) & (out <= 1))


def test_network_support_of_blob_candidates() -> None:
    """A blob inside network boxes takes the best of them; a blob outside every box the lowest score the network
    reported (its belief there is no higher); network candidates keep their own scores (LPS mm)."""
    centers = np.array([[0.0, 0, 0], [0.0, 0, 0.5], [40.0, 0, 0], [2.0, 0, 0], [0.5, 0, 0]])
    det = np.array([0.6, 0.9, 0.05, -1.0, -1.0])
    extents = np.array([[10.0, 10, 10], [2.0, 2, 2], [6.0, 6, 6], [3.0, 3, 3], [3.0, 3, 3]])
    s = network_support(centers, det, extents)
    assert s[:3].tolist() == det[:3].tolist()
    assert s[3] == 0.6  # (2, 0, 0) lies in the 10 mm box only (the 2 mm box ends at x = 1)
    assert s[4] == 0.9  # (0.5, 0, 0) lies in both boxes
    far = network_support(np.array([[0.0, 0, 0], [90.0, 0, 0]]), np.array([0.3, -1.0]), np.full((2, 3), 4.0))
    assert far[1] == 0.3  # outside every box: the network's lowest score
    alone = network_support(np.zeros((2, 3)), np.array([-1.0, -1.0]), np.ones((2, 3)))
    assert alone.tolist() == [-1.0, -1.0]  # no network candidates: the classifier alone, as before
    # combined, a blob the network does not support scores far below the classifier's own probability
    out = combine_scores(np.array([0.8, 0.8]), np.array([far[1], -1.0]), 0.5)
    assert out[0] == pytest.approx(np.sqrt(0.8 * 0.3)) and out[1] == pytest.approx(0.8)


def test_candidates_sharing_one_box_are_one_finding_with_box_merging() -> None:
    # a 26 mm nodule (box centred at 0) with three 6 mm candidates on its rim, scoring above it; a separate
    # 6 mm candidate outside its box; and a large, low-scoring box that reaches none of the kept centres
    centers = np.array([[9.0, 9.0, 0.0], [-9.0, 8.0, 2.0], [2.0, -10.0, -5.0], [0.0, 0.0, 0.0], [25.0, 0.0, 0.0]])
    diam = np.array([6.0, 6.0, 6.0, 26.0, 6.0])
    extents = np.repeat(diam[:, None], 3, axis=1)
    scores = np.array([0.97, 0.95, 0.94, 0.90, 0.80])
    # by distance alone, every rim candidate and the box itself survive (each 12-13 mm from the others)
    assert suppress_duplicates(centers, diam, scores, radius_factor=1.5).tolist() == [0, 1, 2, 3, 4]
    # the 26 mm box holds the best rim candidate and the other two: one finding; the one outside stays
    assert suppress_duplicates(centers, diam, scores, radius_factor=1.5, extents_mm=extents).tolist() == [0, 4]
    # a box is only a link where it holds both centres: the rim candidates alone (no wide box) stay apart
    alone = suppress_duplicates(centers[[0, 1, 2, 4]], diam[[0, 1, 2, 4]], scores[[0, 1, 2, 4]], extents_mm=extents[[0, 1, 2, 4]])
    assert alone.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="one box size per centre"):
        suppress_duplicates(centers, diam, scores, extents_mm=extents[:2])


def _greedy_one_by_one(centers, diam, scores, min_distance_mm, radius_factor, extents):
    """Duplicate suppression candidate by candidate, each against every kept one (LPS mm)."""
    kept: list[int] = []
    for n in np.argsort(-scores, kind="stable"):
        near = [k for k in kept if np.linalg.norm(centers[k] - centers[n]) < max(min_distance_mm, radius_factor * diam[k] / 2)]
        boxed = extents is not None and any(
            np.all(np.abs(centers[[k, n]] - centers[b]) <= extents[b] / 2) for k in kept for b in range(len(centers))
        )
        if not near and not boxed:
            kept.append(int(n))
    return kept


@pytest.mark.parametrize("box_merge", [False, True])
def test_duplicate_suppression_keeps_what_one_by_one_greedy_keeps(box_merge: bool) -> None:
    """Clusters of candidates (several on one nodule, boxes of all sizes, tied scores): the kept indices, in order,
    are those of the greedy pass that checks each candidate against every kept one in turn."""
    rng = np.random.default_rng(11)
    hubs = rng.uniform(-60.0, 60.0, size=(12, 3))
    centers = hubs[rng.integers(0, len(hubs), 90)] + rng.normal(0.0, 3.0, size=(90, 3))
    diam = rng.choice([3.0, 4.5, 6.5, 12.0, 25.0], size=90)
    extents = diam[:, None] * rng.uniform(0.6, 1.4, size=(90, 3))
    scores = np.round(rng.uniform(0.0, 1.0, 90), 1)  # ties: the earlier candidate goes first
    for min_distance_mm, radius_factor in ((3.0, 1.0), (3.0, 2.0), (8.0, 0.5)):
        got = suppress_duplicates(
            centers,
            diam,
            scores,
            min_distance_mm=min_distance_mm,
            radius_factor=radius_factor,
            extents_mm=extents if box_merge else None,
        )
        want = _greedy_one_by_one(centers, diam, scores, min_distance_mm, radius_factor, extents if box_merge else None)
        assert 12 <= len(want) < 80
        assert got.tolist() == want


class _Lopsided(torch.nn.Module):
    """Logit = sum of the patch's first half along L minus its second half: not mirror-invariant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x[..., :half].sum(dim=(1, 2, 3, 4)) - x[..., half:].sum(dim=(1, 2, 3, 4))


def test_flip_views_average_mirrored_copies_of_candidates_not_clearly_rejected() -> None:
    x = torch.zeros(3, 1, 8, 8, 8)
    x[0, :, :, :, :4] = 0.01  # bright on the left: logit +2.56
    x[1, :, :, :, 4:] = 0.01  # bright on the right: logit -2.56, probability 0.07
    x[2, :, :, :, 4:] = 0.1  # clearly rejected: logit -25.6
    net = _Lopsided()
    one = patch_logits(net, x)
    assert one.dtype == torch.float32 and one.tolist() == pytest.approx([2.56, -2.56, -25.6], rel=1e-4)
    # 4 views: the patch, then S, P and L mirrored; only the L flip changes this network's logit
    four = patch_logits(net, x, views=4, min_probability=0.02)
    assert four.tolist() == pytest.approx([2.56 / 2, -2.56 / 2, -25.6], rel=1e-4)
    # 8 views: half of them mirror L; a threshold of 0 re-scores every candidate
    eight = patch_logits(net, x, views=8, min_probability=0.0)
    assert eight.tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-4)
    assert all(len(set(v)) == len(v) == n for n, v in FLIP_VIEWS.items())


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 64])
def test_flip_views_in_batches_give_the_logits_of_all_at_once(batch: int) -> None:
    """The network seeing ``batch`` patches at a time, the flipped copies of several patches in one batch, gives
    each patch its own views' mean: the logits of one call per view on all patches, to float32 rounding."""
    entry = json.loads(DEMO_MODEL_JSON.read_text())["fp_reduction"]
    net = FPReducer(FPReductionConfig.from_json(entry, weights_dir=DEMO_MODEL_JSON.parent))._scoring  # the demo's
    torch.manual_seed(4)
    x = torch.rand(11, 2, 24, 24, 24) * torch.linspace(0.05, 1.0, 11)[:, None, None, None, None]
    x[::2, :, 9:15, 9:15, 9:15] = 0.8  # a bright cube in the middle of every other patch
    with torch.no_grad():
        p = torch.sigmoid(net(x))
        ranked = p.sort().values  # about half the patches are re-scored on their flipped copies; none sits at the cut
        cut = float(ranked[5] + ranked[6]) / 2.0
        assert 0 < int((p >= cut).sum()) < len(x) and float(p.max() - p.min()) > 0.05
        for views in (4, 8):
            whole = patch_logits(net, x, views=views, min_probability=cut)
            np.testing.assert_allclose(
                patch_logits(net, x, views=views, min_probability=cut, batch=batch).numpy(), whole.numpy(), rtol=1e-6, atol=1e-6
            )
    lopsided = torch.zeros(5, 1, 8, 8, 8)
    lopsided[:, :, :, :, :4] = torch.linspace(0.001, 0.02, 5)[:, None, None, None, None]  # each its own logit
    expected = patch_logits(_Lopsided(), lopsided, views=4, min_probability=0.0)
    assert patch_logits(_Lopsided(), lopsided, views=4, min_probability=0.0, batch=batch).tolist() == pytest.approx(
        expected.tolist(), rel=1e-5
    )
    with pytest.raises(ValueError, match="batch 0"):
        patch_logits(net, x, batch=0)


def test_fp_reduction_config_and_weights_errors(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="fp_reduction.weights: the entry names no weights file"):
        FPReductionConfig.from_json({"patch": 24}, weights_dir=tmp_path)  # no weights entry
    with pytest.raises(BundleError, match="fp_reduction.patch: 20 is not a positive multiple of 8"):
        FPReductionConfig.from_json({"weights": "w.pt", "patch": 20}, weights_dir=tmp_path)
    with pytest.raises(BundleError, match="fp_reduction.flip_views: 3 is not one of 1, 4, 8"):
        FPReductionConfig.from_json({"weights": "w.pt", "flip_views": 3}, weights_dir=tmp_path)
    four = FPReductionConfig.from_json({"weights": "w.pt", "flip_views": 4, "flip_min_probability": 0.05}, weights_dir=tmp_path)
    assert (four.flip_views, four.flip_min_probability) == (4, 0.05)
    assert FPReductionConfig.from_json(four.to_json(), weights_dir=tmp_path) == four
    merged = FPReductionConfig.from_json({"weights": "w.pt", "box_merge": True}, weights_dir=tmp_path)
    assert merged.box_merge and not four.box_merge
    assert FPReductionConfig.from_json(merged.to_json(), weights_dir=tmp_path) == merged
    with pytest.raises(BundleError, match="fp_reduction.box_merge: 'yes' is not true or false"):
        FPReductionConfig.from_json({"weights": "w.pt", "box_merge": "yes"}, weights_dir=tmp_path)
    supported = FPReductionConfig.from_json({"weights": "w.pt", "blob_support": True}, weights_dir=tmp_path)
    assert supported.blob_support and not merged.blob_support
    assert FPReductionConfig.from_json(supported.to_json(), weights_dir=tmp_path) == supported
    with pytest.raises(BundleError, match="fp_reduction.blob_support: 1 is not true or false"):
        FPReductionConfig.from_json({"weights": "w.pt", "blob_support": 1}, weights_dir=tmp_path)
    cfg = FPReductionConfig.from_json({"weights": "w.pt"}, weights_dir=tmp_path)
    with pytest.raises(BundleError, match="missing") as exc:
        FPReducer(cfg)
    assert "w.pt" in str(exc.value)
    torch.save(PatchClassifier(24, (4, 8, 16)).state_dict(), tmp_path / "w.pt")  # another shape
    with pytest.raises(BundleError, match="do not load"):
        FPReducer(cfg)


def test_demo_model_ships_a_trained_fp_reduction_stage() -> None:
    entry = json.loads(DEMO_MODEL_JSON.read_text())["fp_reduction"]
    cfg = FPReductionConfig.from_json(entry, weights_dir=DEMO_MODEL_JSON.parent)
    assert cfg.weights.is_file() and cfg.weights.stat().st_size < 2_000_000
    first, last = entry["training"]["train_seeds"]  # the range of training seeds, both ends included
    assert first <= last and set(range(first, last + 1)).isdisjoint(range(1, 1000))
    reducer = FPReducer(cfg)
    ph = generate_phantom(
        5, matrix=128, pixel_spacing=1.5, slice_spacing=2.0, slices=80, n_nodules=4, nodule_diameter_mm=(6.0, 12.0)
    )
    nodules = np.array([n.center_lps for n in ph.nodules])
    rng = np.random.default_rng(0)
    lungs = np.argwhere(ph.masks["lung_left"] | ph.masks["lung_right"])
    far = [ph.volume.index_to_lps(lungs[n][::-1].astype(float)) for n in rng.choice(len(lungs), 200)]
    far = np.array([c for c in far if np.min(np.linalg.norm(nodules - c, axis=1)) > 15.0][:40])
    p_nod = reducer.probabilities(ph.volume, nodules)
    p_far = reducer.probabilities(ph.volume, far)
    # trained weights separate nodule centres from random lung positions
    assert np.median(p_nod) > 0.5 > np.median(p_far)
    assert np.mean(p_nod[:, None] > p_far[None, :]) > 0.9


@pytest.mark.slow
def test_detector_runs_the_fp_reduction_stage_unless_postprocessing_is_off() -> None:
    from pipeline.detection.infer import Detector

    ph = generate_phantom(6, matrix=160, pixel_spacing=1.6, slice_spacing=2.0, n_nodules=3, nodule_diameter_mm=(6.0, 14.0))
    full = Detector(device="cpu")
    raw = Detector(device="cpu", postprocess=False)
    assert full.fp_reduction and not raw.fp_reduction
    a = full.detect(ph.volume, lung_mask=ph.masks)
    b = raw.detect(ph.volume, lung_mask=ph.masks)
    assert "fp_reduction" in a.timings_ms and "fp_reduction" not in b.timings_ms
    # the total is the whole detection, the false-positive reduction included (the CLI prints it as the case's time)
    t = a.timings_ms
    assert t["total"] >= t["lung_mask"] + t["preprocess"] + t["model"] + t["fp_reduction"]
    scores = [f.score for f in a]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    # every nodule has a finding within its radius (LPS), and the top findings are nodules
    for nod in ph.nodules:
        d = [np.linalg.norm(np.subtract(f.center_lps, nod.center_lps)) for f in a]
        assert min(d) <= nod.diameter_mm / 2, nod
    top = a.findings[: len(ph.nodules)]
    hits = [any(np.linalg.norm(np.subtract(f.center_lps, n.center_lps)) <= n.diameter_mm / 2 for n in ph.nodules) for f in top]
    assert sum(hits) >= len(ph.nodules) - 1


def test_a_kept_blob_inside_a_merged_network_box_is_reported_as_that_box():
    from pipeline.detection.findings import Finding
    from pipeline.detection.fp_reduction import _sized

    def finding(c, d, k):
        c = np.asarray(c, dtype=float)
        return Finding(tuple(c), tuple(c - d / 2), tuple(c + d / 2), d, 0.0, (0, 0, k), k + 1)

    # a large nodule: the network's 18 mm box, a 6.5 mm spot on its rim found as a blob 7 mm off centre (another
    # slice), and a far 5 mm blob that no box covers
    items = [finding((10, 20, 30), 18.0, 6), finding((17, 20, 30), 6.5, 8), finding((60, 20, 30), 5.0, 2)]
    det = np.array([0.9, -1.0, -1.0])
    scores = np.array([0.97, 0.99, 0.4])
    out = _sized(items, det, scores, np.array([1, 2]))  # the spot outscored the box, which was merged into it
    assert [f.score for f in out] == [0.99, 0.4]
    # the whole nodule, where the network saw it: its centre, box, size and slice, with the spot's score
    assert out[0].center_lps == (10.0, 20.0, 30.0) and out[0].diameter_mm == 18.0
    assert out[0].box_min_lps == (1.0, 11.0, 21.0) and out[0].box_max_lps == (19.0, 29.0, 39.0)
    assert out[0].voxel_ijk == (0, 0, 6) and out[0].slice_number == 7
    assert out[1].diameter_mm == 5.0 and out[1].center_lps == (60.0, 20.0, 30.0)  # no box around it: the blob itself
    # a network box that was kept itself stands for nothing else
    assert _sized(items, det, scores, np.array([0, 1]))[1].diameter_mm == 6.5
    # a box the network hardly believes (its score under half the blob's) is a poor guess beside the nodule the
    # blob found: the blob is reported as it is
    weak = _sized(items, np.array([0.2, -1.0, -1.0]), np.array([0.3, 0.99, 0.4]), np.array([1, 2]))
    assert weak[0].center_lps == (17.0, 20.0, 30.0) and weak[0].diameter_mm == 6.5 and weak[0].score == 0.99


@pytest.mark.parametrize("members", [1, 2])
def test_folded_batch_norm_gives_the_trained_networks_logits(members: int) -> None:
    """The scoring copy (batch norms folded into the convolutions) gives the loaded network's logits, with batch-norm
    statistics and affine terms far from their defaults; the loaded network keeps its layers and weights."""
    torch.manual_seed(3)
    nets = [PatchClassifier(8, (3, 4, 5), 6, in_channels=2) for _ in range(members)]
    for net in nets:
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm3d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.2, 3.0)
                m.weight.data.uniform_(0.5, 2.0)
                m.bias.data.uniform_(-0.3, 0.3)
    net = (nets[0] if members == 1 else PatchEnsemble(nets)).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    folded = fold_batch_norm(net)
    assert not any(isinstance(m, torch.nn.BatchNorm3d) for m in folded.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm3d) for m in net.modules()) == 5 * members
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    x = torch.rand(7, 2, 8, 8, 8)
    with torch.no_grad():
        np.testing.assert_allclose(folded(x).numpy(), net(x).numpy(), atol=1e-5)
        np.testing.assert_allclose(
            patch_logits(folded, x, views=4, min_probability=0.0).numpy(),
            patch_logits(net, x, views=4, min_probability=0.0).numpy(),
            atol=1e-5,
        )
    with pytest.raises(ValueError, match="eval mode"):
        fold_batch_norm(net.train())


def test_an_ensemble_scores_the_mean_logit_of_its_members(tmp_path: Path) -> None:
    torch.manual_seed(0)
    members = [PatchClassifier(8, (2, 2, 2), 4, in_channels=2).eval() for _ in range(2)]
    torch.save(PatchEnsemble(members).state_dict(), tmp_path / "pair.pt")
    cfg = FPReductionConfig.from_json(
        {"weights": "pair.pt", "patch": 8, "channels": [2, 2, 2], "hidden": 4, "context_spacing_mm": 2.5, "members": 2},
        weights_dir=tmp_path,
    )
    assert cfg.members == 2 and FPReductionConfig.from_json(cfg.to_json(), weights_dir=tmp_path) == cfg
    reducer = FPReducer(cfg)
    assert isinstance(reducer.network, PatchEnsemble) and len(reducer.network.members) == 2
    vol = _lung_volume(np.eye(3))
    centres = np.array([[42.0, 12.0, 60.0], [30.0, 25.0, 45.0]])  # LPS mm, inside the volume
    _paint_ball(vol, centres[0], 3.0, 40.0)
    x = torch.from_numpy(classifier_input(vol, centres, cfg))
    with torch.no_grad():
        mean_logit = (members[0](x) + members[1](x)) / 2
    assert reducer.probabilities(vol, centres) == pytest.approx(torch.sigmoid(mean_logit).numpy(), rel=1e-5)
    # a one-classifier weights file named as an ensemble, and an ensemble of none, are refused with the fix
    torch.save(members[0].state_dict(), tmp_path / "one.pt")
    with pytest.raises(BundleError, match="do not load"):
        FPReducer(replace(cfg, weights=tmp_path / "one.pt"))
    with pytest.raises(BundleError, match="fp_reduction.members: 0 is not a positive integer"):
        FPReductionConfig.from_json({**cfg.to_json(), "members": 0}, weights_dir=tmp_path)


@pytest.mark.parametrize(
    "direction",
    [
        np.diag([-1.0, 1.0, -1.0]),
        np.array([[0.0, 0, 1], [-1, 0, 0], [0, 1, 0]]),  # a sagittal stack
        np.array([[_C, -_S, 0.0], [_S, _C, 0], [0, 0, 1]]),  # oblique
    ],
)
def test_device_patches_equal_the_cpu_cubes(direction: np.ndarray) -> None:
    """:class:`DevicePatches` (torch ``grid_sample``, run here on the CPU) cuts the cubes of :func:`extract_patches`:
    centres inside, on the edge and outside the series, both channels, any batch split."""
    vol = _lung_volume(direction, shape=(30, 41, 37), spacing=(0.7, 0.9, 1.6), seed=3)
    vol.array[:] += np.linspace(-100.0, 1200.0, vol.array.size).reshape(vol.shape)
    lo, hi = vol.geometry.bounds_lps()
    rng = np.random.default_rng(8)
    centres = np.concatenate([rng.uniform(lo - 12.0, hi + 12.0, size=(9, 3)), [lo, hi, (lo + hi) / 2]])
    cut = DevicePatches(vol, centres, patch=8, spacings_mm=(1.0, 2.5), device="cpu")
    assert len(cut) == len(centres)
    got = torch.cat([cut.cubes(0, 5), cut.cubes(5)]).numpy()
    assert got.shape == (len(centres), 2, 8, 8, 8)
    for c, spacing in enumerate((1.0, 2.5)):
        np.testing.assert_allclose(got[:, c], extract_patches(vol, centres, patch=8, spacing_mm=spacing), atol=2e-5)
    inner = DevicePatches(vol, centres[-1:], patch=8, spacings_mm=(1.0,), device="cpu")  # a copy of a few voxels only
    assert inner._voxels.numel() < vol.array.size / 4
    np.testing.assert_allclose(inner.cubes()[:, 0].numpy(), extract_patches(vol, centres[-1:], patch=8), atol=2e-5)
    assert DevicePatches(vol, np.zeros((0, 3)), patch=8, spacings_mm=(1.0,), device="cpu").cubes().shape == (0, 1, 8, 8, 8)


@pytest.mark.gpu
def test_cuda_demo_pipeline_cuts_its_cubes_and_searches_its_blobs_on_the_gpu_as_on_the_cpu() -> None:
    """On a CUDA device the classifier's cubes are cut there (:class:`DevicePatches`) and the blob search's filters
    run there (:func:`device_maxima`): the same cubes and blobs as the CPU's, and the demo pipeline (float32 on both
    sides) reports the same findings."""
    from pipeline.detection.infer import Detector

    vol = _lung_volume(np.diag([-1.0, 1.0, -1.0]), shape=(30, 41, 37), spacing=(0.7, 0.9, 1.6), seed=3)
    vol.array[:] += np.linspace(-100.0, 1200.0, vol.array.size).reshape(vol.shape)
    lo, hi = vol.geometry.bounds_lps()
    centres = np.random.default_rng(8).uniform(lo - 12.0, hi + 12.0, size=(40, 3))
    cut = DevicePatches(vol, centres, patch=8, spacings_mm=(1.0, 2.5), device="cuda").cubes()
    assert cut.is_cuda
    np.testing.assert_allclose(cut[:, 1].cpu().numpy(), extract_patches(vol, centres, patch=8, spacing_mm=2.5), atol=2e-5)
    ph = generate_phantom(4, matrix=160, pixel_spacing=1.2, slice_spacing=2.0)
    region = quick_lung_mask(ph.volume)
    blobs_cpu = blob_candidates(ph.volume, region, max_candidates=200)
    blobs_gpu = blob_candidates(ph.volume, region, max_candidates=200, device="cuda")
    same = (np.linalg.norm(blobs_cpu.centers_lps[:, None] - blobs_gpu.centers_lps[None], axis=2) < 1e-6).any(axis=1)
    assert len(blobs_gpu) == len(blobs_cpu) == 200 and same.mean() >= 0.98
    cpu = Detector(device="cpu", amp=False).detect(ph.volume)
    gpu = Detector(device="cuda", amp=False).detect(ph.volume)
    assert {"fpr_blobs", "fpr_refine", "fpr_classifier"} <= set(gpu.timings_ms)
    top = [f for f in cpu.candidates if f.score > 0.1]
    assert len(top) >= 3
    for f in top:  # each has a twin on the GPU (its convolutions differ in the last bits)
        d = [np.linalg.norm(np.subtract(f.center_lps, g.center_lps)) for g in gpu.candidates]
        n = int(np.argmin(d))
        assert d[n] < 1.0 and abs(gpu.candidates[n].score - f.score) < 0.03


def test_no_candidates_at_all_still_report_the_blob_search_and_refinement_times() -> None:
    """Lung without a blob and a detector without a box: nothing to score, yet the blob search and the centre
    refinement ran, and the result's timings (ms) say how long they took, as for a case with candidates."""
    from pipeline.detection.findings import Findings
    from pipeline.detection.fp_reduction import reduce_false_positives

    entry = json.loads(DEMO_MODEL_JSON.read_text())["fp_reduction"]
    reducer = FPReducer(FPReductionConfig.from_json(entry, weights_dir=DEMO_MODEL_JSON.parent))
    vol = _lung_volume(np.eye(3))  # noise only: the blob search finds nothing
    out = reduce_false_positives(vol, Findings([], case_id="c", timings_ms={"model": 5.0}), reducer, None)
    assert len(out.candidates) == 0
    assert {"model", "fpr_blobs", "fpr_refine"} <= set(out.timings_ms), out.timings_ms
    assert out.timings_ms["fpr_blobs"] > 0.0 and out.timings_ms["fpr_refine"] >= 0.0
