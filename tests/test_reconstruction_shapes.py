"""The synthetic chest the reconstruction tests rely on is chest-like (lungs left and right of LPS x = 0, airway, bone)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._support.shapes import lps_grids, synthetic_chest


def test_synthetic_chest_is_chest_like():
    vol, masks = synthetic_chest(n=48, slices=24)
    x, _, _ = lps_grids(vol.geometry)
    assert x[masks["lung_left"]].mean() > 0 > x[masks["lung_right"]].mean()
    assert masks["airway"].any() and masks["bone"].any()
    assert float(np.median(vol.array[masks["lung_left"]])) == pytest.approx(-850, abs=5)
