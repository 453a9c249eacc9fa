"""The in-plane HU statistics shared by the bone and blood-pool segmentation, against direct per-voxel loops."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.reconstruction.grid import Grid
from pipeline.reconstruction.local_hu import image_noise, in_plane_spread, masked_in_plane_mean
from pipeline.volume import CTVolume, Geometry


def _in_plane_window(shape: tuple[int, int, int], k: int, j: int, i: int) -> list[tuple[int, int, int]]:
    """The in-plane 3x3 neighbours of voxel (k, j, i) inside the image (slices across axis 0)."""
    return [(k, j + a, i + b) for a in (-1, 0, 1) for b in (-1, 0, 1) if 0 <= j + a < shape[1] and 0 <= i + b < shape[2]]


def test_masked_in_plane_mean_counts_only_the_mask_within_the_slice() -> None:
    rng = np.random.default_rng(3)
    hu = rng.normal(40.0, 30.0, (3, 6, 7))
    mask = rng.random(hu.shape) < 0.5
    mean, count = masked_in_plane_mean(torch.from_numpy(hu), torch.from_numpy(mask), 0)
    for k, j, i in np.ndindex(hu.shape):
        inside = [v for v in _in_plane_window(hu.shape, k, j, i) if mask[v]]
        assert count[k, j, i].item() == len(inside), (k, j, i)
        expected = float(np.mean([hu[v] for v in inside])) if inside else 0.0
        assert abs(mean[k, j, i].item() - expected) < 1e-9, (k, j, i)


def test_image_noise_is_the_lower_quartile_of_the_soft_tissue_spread() -> None:
    """Soft tissue (40 HU, noise 12 HU) beside fat (-100 HU and below) and bone: only soft tissue's 3x3 spread counts."""
    rng = np.random.default_rng(4)
    hu = np.full((4, 20, 20), 40.0) + rng.normal(0.0, 12.0, (4, 20, 20))
    hu[:, :, :6] = -300.0 + rng.normal(0.0, 60.0, (4, 20, 6))  # noisy fat: its spread must not count
    hu[:, :, 16:] = 700.0  # flat bone
    t = torch.from_numpy(hu)
    body = torch.ones(hu.shape, dtype=torch.bool)
    mean, spread = in_plane_spread(t, 0)
    soft = (mean > -100) & (mean < 100)
    assert soft.any() and not soft[:, :, :4].any()
    assert abs(image_noise(t, body, 0) - float(torch.quantile(spread[soft], 0.25))) < 1e-9
    assert 6.0 < image_noise(t, body, 0) < 14.0  # about the noise itself, not the fat's or the edges' spread


def test_in_plane_radius_is_zero_across_the_slices_and_at_least_one_voxel_in_plane() -> None:
    geom = Geometry(shape=(10, 20, 30), spacing=(0.7, 3.0, 5.0), origin=(0.0, 0.0, 0.0))
    grid = Grid(CTVolume(np.zeros((10, 20, 30), np.float32), geom), torch.device("cpu"), (1, 1, 1))
    assert grid.in_plane_radius(1.0) == (0, 1, 1)  # 1 mm is a third of a 3 mm pixel: still one voxel
    assert grid.in_plane_radius(4.2) == (0, 1, 6)  # (k, j, i): rows 3 mm, columns 0.7 mm
