"""Streaks from a hip prosthesis are not bone; the femur around its stem and a bone plate beside it are."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction import metal_streaks as streaks_mod
from tests._support.bone import segment_bone_of


def _stem_in_a_femur(pixel_mm: float, n: int, nk: int = 8) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, regions)`` on ``pixel_mm`` pixels, 2 mm slices (``[k, j, i]``): soft tissue (40 HU) around a
    femur (4 mm cortex at 1500 HU around 20 HU fatty marrow, 32 mm wide) holding a 10 mm metal stem (4000 HU),
    12 thin bright streaks (3 mm wide, up to +1000 HU) radiating from it through the soft tissue between 12 dark
    ones (5 mm wide, down to -700 HU), and an 8 mm bone plate (1200 HU) running out from the femur between two
    streaks (an iliac wing or a trochanter seen from the stem). ``regions``: the cortex ring, the bright streaks
    beyond it up to 8 mm under the skin (air outside the body is no dark band; and not the one alongside the plate:
    bone on its side, it is not told from the plate), the plate."""
    rng = np.random.default_rng(3)
    c = (np.arange(n) + 0.5) * pixel_mm
    j, i = np.meshgrid(c, c, indexing="ij")
    dj, di = j - n * pixel_mm / 2, i - n * pixel_mm / 2
    r = np.hypot(dj, di)
    body = r < 0.45 * n * pixel_mm
    plane = np.where(body, 40.0, -1000.0)
    decay = np.exp(-(r - 5.0) / 60.0)
    bright, dark = np.zeros(r.shape, dtype=bool), np.zeros(r.shape, dtype=bool)
    for m in range(12):
        for angle, half_width, out in ((m * np.pi / 6, 1.5, bright), ((m + 0.5) * np.pi / 6, 2.5, dark)):
            along = dj * np.sin(angle) + di * np.cos(angle)
            out |= (along > 0) & (np.abs(di * np.sin(angle) - dj * np.cos(angle)) < half_width)
    tissue = body & (r >= 16.0)
    plane[tissue & bright] += 1000.0 * decay[tissue & bright]
    plane[tissue & dark] -= 700.0 * decay[tissue & dark]
    plate_angle = 0.25 * np.pi / 6  # between the first bright streak and the first dark one
    along = dj * np.sin(plate_angle) + di * np.cos(plate_angle)
    plate = (along > 10.0) & (along < 50.0) & (np.abs(di * np.sin(plate_angle) - dj * np.cos(plate_angle)) < 4.0)
    plane[plate] = 1200.0
    plane[r < 16.0] = 1500.0
    plane[r < 12.0] = 20.0
    plane[r < 5.0] = 4000.0
    hu = np.repeat(plane[None], nk, axis=0) + rng.normal(0.0, 10.0, (nk, n, n))
    regions = {
        "ring": (r >= 12.5) & (r <= 15.5),
        "streaks": bright
        & (r > 18.0)
        & (r < 0.4 * n * pixel_mm)
        & (np.abs(di * np.sin(plate_angle) - dj * np.cos(plate_angle)) > 12.0),
        "plate": plate & (r > 18.0) & (np.abs(di * np.sin(plate_angle) - dj * np.cos(plate_angle)) < 3.0),
    }
    return (
        hu.astype(np.float32),
        np.repeat(body[None], nk, axis=0),
        {k: np.repeat(v[None], nk, axis=0) for k, v in regions.items()},
    )


@pytest.mark.parametrize("pixel_mm, n", [(1.0, 160), (0.8, 200)])
def test_streaks_from_a_hip_prosthesis_are_not_bone_and_the_femur_around_it_is(pixel_mm: float, n: int):
    """The bright streaks were seeded as cortex: over 90 % of them were bone, a star around the implant in the
    bone rendering. They are narrow across the ray from the metal with a dark band on either side; the femur's
    cortex runs across those rays, and a bone plate along one is too wide to be a streak."""
    hu, body, regions = _stem_in_a_femur(pixel_mm, n)
    assert hu.max() > bone_mod.METAL_HU and (hu[regions["streaks"]] > bone_mod.SEED_HU).mean() > 0.3  # as bright as cortex
    bone = segment_bone_of(hu, body, spacing=(pixel_mm, pixel_mm, 2.0))
    streaks = float(bone[regions["streaks"]].mean())
    assert streaks < 0.02, f"{streaks:.0%} of the bright streaks from the stem are bone"
    ring = float(bone[regions["ring"]].mean())
    assert ring > 0.98, f"only {ring:.0%} of the femur's cortex around the stem is bone"
    plate = float(bone[regions["plate"]].mean())
    assert plate > 0.95, f"only {plate:.0%} of the bone plate running out from the femur is bone"


def test_metal_streaks_is_empty_without_metal():
    hu = np.full((2, 8, 8), 40.0)
    mask = np.ones(hu.shape, dtype=bool)
    assert not streaks_mod.metal_streaks(mask, hu, np.zeros_like(mask), mask, spacing=(2.0, 1.0, 1.0), slice_axis=0).any()
