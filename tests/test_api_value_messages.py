"""Values of the wrong kind given to the notebook API: each message names the value, where, and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline as ctp
from pipeline.detection.lungs import region_from_mask
from pipeline.errors import CtpipeError, GeometryError
from tests._support.shapes import synthetic_chest

GEOMETRY = ctp.Geometry((4, 8, 8), (2.0, 2.0, 2.5), (0.0, 0.0, 0.0))


def test_a_float_label_array_names_the_fix():
    with pytest.raises(GeometryError) as err:
        ctp.LabelMap(np.zeros(GEOMETRY.shape), GEOMETRY)
    assert "got dtype float64" in str(err.value) and "astype" in (err.value.fix or "")


def test_a_bool_hu_array_names_the_fix():
    with pytest.raises(GeometryError) as err:
        ctp.CTVolume(np.zeros(GEOMETRY.shape, bool), GEOMETRY)
    assert "got dtype bool" in str(err.value) and "LabelMap" in (err.value.fix or "")


def test_a_reconstruction_without_lungs_as_lung_mask_says_to_reconstruct_the_lungs():
    volume, _ = synthetic_chest(n=48, spacing=3.0, slices=24, slice_spacing=5.0)
    body_only = ctp.reconstruct(volume, organs=["body"], render=False)
    with pytest.raises(CtpipeError) as err:
        region_from_mask(body_only, volume)
    text, fix = str(err.value), err.value.fix or ""
    assert "the Reconstruction given as lung mask holds no lung mask (its masks: ['body'])" in text
    assert "organs=['lung_left', 'lung_right'" in fix and "lung_mask" in fix


def test_a_probability_map_as_lung_mask_is_refused_and_a_float_0_1_mask_is_taken():
    volume, truth = synthetic_chest(n=48, spacing=3.0, slices=24, slice_spacing=5.0)
    lungs = truth["lung_left"] | truth["lung_right"]
    probabilities = np.where(lungs, 0.9, 0.01)  # a model's output: above 0 everywhere
    with pytest.raises(GeometryError) as err:
        region_from_mask(probabilities, volume)
    assert "holds fractional values (float64, 0.01..0.9)" in str(err.value)
    assert "probabilities > 0.5" in (err.value.fix or "")
    as_floats = region_from_mask(lungs.astype(np.float64), volume)  # a 0/1 mask read as floats (nibabel's get_fdata)
    assert np.array_equal(as_floats.mask, region_from_mask(lungs, volume).mask)
