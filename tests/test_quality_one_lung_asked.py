"""A run asked for one lung only (``organs=['lung_left']``) judges that lung alone: the lung not asked for is not
missing (no ``one_lung``), and the lung-volume range, meant for both lungs together, is not applied to one."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.phantom import generate_phantom
from pipeline.reconstruction import reconstruct
from pipeline.reconstruction.quality import assess_quality

GRID = dict(matrix=128, pixel_spacing=2.0, slice_spacing=4.0)


@pytest.fixture(scope="module")
def phantom():
    return generate_phantom(11, n_nodules=0, **GRID)


@pytest.mark.parametrize("organ", ["lung_left", "lung_right"])
def test_one_lung_asked_for_raises_no_one_lung_nor_volume_range(phantom, organ):
    rec = reconstruct(phantom.volume, organs=[organ], mesh_formats=())
    q = rec.quality
    assert q is not None
    assert not q.has("one_lung") and not q.has("lung_volume_out_of_range"), q.codes
    assert not q.has("lung_imbalance") and not q.has("lungs_absent"), q.codes
    assert q.lung_coverage == "complete"


def test_assess_quality_judges_only_the_lungs_looked_for(phantom):
    vol = phantom.volume
    masks = {"lung_left": phantom.masks["lung_left"]}
    q = assess_quality(vol.array, vol.geometry, masks, metadata=vol.metadata, lungs=("lung_left",))
    assert not q.has("one_lung") and not q.has("lung_volume_out_of_range"), q.codes
    assert "lung_balance_ratio" not in q.figures
    # both lungs looked for, one found: still a one-lung case
    both = assess_quality(vol.array, vol.geometry, masks, metadata=vol.metadata)
    assert both.has("one_lung"), both.codes


def test_asked_lung_not_found_is_still_absent(phantom):
    vol = phantom.volume
    empty = np.zeros(vol.geometry.shape, dtype=bool)
    q = assess_quality(vol.array, vol.geometry, {"lung_right": empty}, metadata=vol.metadata, lungs=("lung_right",))
    assert q.has("lungs_absent") and not q.has("one_lung"), q.codes
