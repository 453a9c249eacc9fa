"""Nodule placement: never (nearly) inside a lung vessel, where the ground truth would list a nodule nobody could see."""

from __future__ import annotations

import numpy as np

from pipeline.phantom.nodules import MAX_VESSEL_SHARE, _crop, _shape_sd, place_nodules
from pipeline.phantom.scanner import CanonicalGrid
from pipeline.phantom.tubes import Tubes


def _lung_with_a_thick_vessel() -> tuple[CanonicalGrid, np.ndarray, np.ndarray]:
    """A 48 mm cube of lung at 1 mm whose middle is a vessel 24 mm across, running head to foot (LPS mm)."""
    xs = np.arange(48) - 23.5
    grid = CanonicalGrid(xs=xs, ys=xs.copy(), zs=xs.copy(), pixel_spacing=1.0, slice_spacing=1.0)
    lung = np.zeros(grid.shape, dtype=bool)
    lung[2:-2, 2:-2, 2:-2] = True
    yy, xx = np.meshgrid(grid.ys, grid.xs, indexing="ij")
    vessel = np.broadcast_to((np.hypot(xx, yy) <= 12.0)[None], grid.shape) & lung
    return grid, lung, vessel


def _vessel_shares(grid: CanonicalGrid, specs, vessel: np.ndarray) -> list[float]:
    out = []
    for spec in specs:
        box = _crop(grid, spec.center, 2 * spec.radius)
        body = _shape_sd(grid, spec, box) < 0
        out.append(float(vessel[box][body].mean()))
    return out


def test_nodules_are_not_placed_inside_a_vessel():
    grid, lung, vessel = _lung_with_a_thick_vessel()
    without, with_mask = [], []
    for seed in range(6):
        for mask, shares in ((None, without), (vessel, with_mask)):
            labels = np.zeros(grid.shape, dtype=np.uint8)
            specs = place_nodules(
                np.random.default_rng(seed), grid, lung, Tubes(), labels, count=3, diameter_mm=(5.0, 7.0), vessel_mask=mask
            )
            assert len(specs) == 3
            shares += _vessel_shares(grid, specs, vessel)
    # the vessel fills a fifth of this lung: left to chance, some nodules land inside it
    assert max(without) > MAX_VESSEL_SHARE
    assert max(with_mask) <= MAX_VESSEL_SHARE
