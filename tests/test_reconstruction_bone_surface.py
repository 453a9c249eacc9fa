"""A contrast-filled vessel one voxel wide running along a resolved cortex is not bone; the femur's marrow still is.

On pixels finer than the cortex (1 mm and 0.7 mm here, 3 mm slices) a pixel centred on the bone's outer
surface holds half of the cortex and half of the tissue beside it, so it is at least half-way between the
two. A small vessel (350 HU: contrast-enhanced blood) lying against a femur's cortex (1200 HU) passed the
surface threshold (300 HU on such pixels) and was taken as bone along the whole femur. The scene is a
body with a femur off its mid-line (4 mm cortex around 20 HU fatty marrow, 32 mm wide) and such a vessel
running down the body along its lateral cortex.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests._support.bone import segment_bone_of

NJ, NI, NK = 100, 260, 8


@pytest.mark.parametrize("pixel_mm", [1.0, 0.7])
def test_a_vessel_along_a_resolved_cortex_is_not_bone_and_the_femur_with_its_marrow_is(pixel_mm: float):
    k, j, i = np.meshgrid(np.arange(NK), np.arange(NJ), np.arange(NI), indexing="ij")
    body = ((i - 130) / 125.0) ** 2 + ((j - 50) / 48.0) ** 2 < 1.0
    centre_i = 130 + int(70 / pixel_mm)  # 70 mm to the side of the mid-line
    r_mm = np.hypot(j - 50, i - centre_i) * pixel_mm
    hu = np.where(body, 40.0, -1000.0)
    hu[r_mm < 16.0] = 1200.0
    hu[r_mm < 12.0] = 20.0
    vessel_i = centre_i + int(round(16.0 / pixel_mm))  # the first pixel outside the cortex
    hu[:, 50, vessel_i] = 350.0
    hu = hu + np.random.default_rng(1).normal(0.0, 10.0, hu.shape)
    hu[~body] = -1000.0
    bone = segment_bone_of(hu.astype(np.float32), body, spacing=(pixel_mm, pixel_mm, 3.0))
    vessel = float(bone[:, 50, vessel_i].mean())
    assert vessel == 0.0, f"{vessel:.0%} of the vessel along the cortex is bone"
    cortex = float(bone[(r_mm >= 12.5) & (r_mm < 15.5)].mean())
    assert cortex > 0.99, f"only {cortex:.0%} of the femur's cortex is bone"
    marrow = float(bone[r_mm < 11.0].mean())
    assert marrow > 0.99, f"only {marrow:.0%} of the femur's marrow is bone"
    assert not bone[r_mm >= 17.0].any()
