"""A reconstruction's quality report is the scan's, whichever organs were asked for."""

from __future__ import annotations

import numpy as np

import pipeline as ctp


def test_contrast_phase_does_not_depend_on_the_organs_asked_for():
    # a non-contrast chest (as data_samples/phantom_00003): with the lungs alone, its bone read as 16 mL of arterial blood
    phantom = ctp.generate_phantom(3, matrix=128, slices=64, pixel_spacing=1.0, slice_spacing=2.0, n_nodules=0)
    volume = phantom.volume
    lungs = ctp.reconstruct(volume, organs=["lung_left", "lung_right"], render=False)
    every = ctp.reconstruct(volume, render=False)
    assert every.quality is not None and lungs.quality is not None
    assert every.quality.contrast_phase == "non_contrast"
    assert lungs.quality.contrast_phase == every.quality.contrast_phase
    assert lungs.quality.codes == every.quality.codes
    # the organs given are those asked for, as before; the lungs themselves are the same
    assert sorted(lungs.masks) == ["lung_left", "lung_right"] and sorted(lungs.meshes) == ["lung_left", "lung_right"]
    assert set(lungs.measurements["organs"]) == {"lung_left", "lung_right"} and not lungs.errors
    for side in ("lung_left", "lung_right"):
        assert np.array_equal(lungs.masks[side].array, every.masks[side].array)
