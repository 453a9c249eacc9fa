"""``scripts/fpr_anatomy.py``: the classifier's anatomy negatives lie on the phantom's own anatomy, in LPS mm, and
keep clear of its nodules."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from pipeline.phantom import generate_phantom
from tests._support.scripts import import_script


@pytest.fixture(scope="module")
def anatomy() -> ModuleType:
    return import_script("fpr_anatomy")


@pytest.fixture(scope="module")
def phantom():  # -> pipeline.phantom.Phantom
    # HFP: voxel order and direction differ from LPS, so an index/LPS mix-up puts the points outside the lungs
    return generate_phantom(7, matrix=128, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=3, patient_position="HFP")


def test_negatives_lie_in_the_lungs_on_every_kind_and_away_from_nodules(anatomy: ModuleType, phantom) -> None:
    centres, kinds = anatomy.anatomy_negatives(phantom, np.random.default_rng(0), 60, clearance_mm=6.0)
    assert centres.shape == (len(kinds), 3) and 30 <= len(kinds) <= 60
    found = {anatomy.ANATOMY_KINDS[k] for k in kinds}
    assert {"bifurcation", "cross_section", "hilum"} <= found, found
    lung = phantom.masks["lung_left"] | phantom.masks["lung_right"]
    body = lung | phantom.masks["vessels"] | phantom.masks["airway"]
    ijk = np.rint(phantom.volume.lps_to_index(centres)).astype(int)
    ijk = np.clip(ijk, 0, np.array(lung.shape[::-1]) - 1)
    inside = body[ijk[:, 2], ijk[:, 1], ijk[:, 0]]
    assert inside.mean() >= 0.9, f"{int((~inside).sum())} of {len(inside)} anatomy negatives outside the lungs"


@pytest.mark.parametrize("clearance_mm", [6.0, 30.0])
def test_negatives_keep_clear_of_the_nodules(anatomy: ModuleType, phantom, clearance_mm: float) -> None:
    centres, _ = anatomy.anatomy_negatives(phantom, np.random.default_rng(1), 300, clearance_mm=clearance_mm)
    assert len(centres)
    for nod in phantom.nodules:
        gap = np.linalg.norm(centres - np.asarray(nod.center_lps), axis=1) - nod.diameter_mm / 2.0
        assert gap.min() > clearance_mm, f"an anatomy negative {gap.min():.1f} mm from the surface of {nod}"


def test_a_count_of_zero_gives_none(anatomy: ModuleType, phantom) -> None:
    centres, kinds = anatomy.anatomy_negatives(phantom, np.random.default_rng(0), 0)
    assert centres.shape == (0, 3) and kinds.shape == (0,)
