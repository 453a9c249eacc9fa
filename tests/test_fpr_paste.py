"""``scripts/fpr_paste.py``: nodules drawn into negative patches sit where they are drawn (patch axes ``[S, P, L]``,
offsets in mm), at the phantoms' HU, with the same size on both channels' grids, and are refused where they would not
be seen."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch

from pipeline.detection.patches import HU_WINDOW
from pipeline.phantom.nodules import random_nodule_spec
from tests._support.scripts import import_script

LUNG_HU = -850.0


@pytest.fixture(scope="module")
def paste_mod() -> ModuleType:
    return import_script("fpr_paste")


@pytest.fixture(scope="module")
def bank(paste_mod: ModuleType):  # -> fpr_paste.NoduleBank
    return paste_mod.NoduleBank(size=24, patch=24, spacings_mm=(1.0, 2.5), seed=3, diameters_mm=(4.0, 9.0))


def _patches(hu: float, n: int) -> torch.Tensor:
    lo, hi = HU_WINDOW
    return torch.full((n, 2, 24, 24, 24), (hu - lo) / (hi - lo))


def _hu(x: torch.Tensor) -> np.ndarray:
    lo, hi = HU_WINDOW
    return (x.numpy() * (hi - lo) + lo).astype(np.float64)


def test_nodule_size_is_the_same_on_both_grids(bank) -> None:
    for n in range(len(bank)):
        fine, coarse = bank.alpha[n, 0] / 255.0, bank.alpha[n, 1] / 255.0
        volume_fine = fine.sum() * 1.0**3  # mm^3: each voxel's share of the nodule times the voxel's volume
        volume_coarse = coarse.sum() * 2.5**3
        sphere = np.pi / 6.0 * bank.diameter[n] ** 3
        assert volume_fine == pytest.approx(sphere, rel=0.3), (n, bank.diameter[n])
        assert volume_coarse == pytest.approx(volume_fine, rel=0.3), (n, bank.diameter[n])


@pytest.mark.parametrize("offset_lps", [(4.0, 0.0, 0.0), (0.0, -3.0, 0.0), (0.0, 0.0, 5.0)])
def test_a_nodule_drawn_off_centre_lies_where_it_was_drawn(paste_mod: ModuleType, offset_lps) -> None:
    spec = random_nodule_spec(np.random.default_rng(0), np.array(offset_lps), 3.0, "solid", None)
    for spacing in (1.0, 2.5):
        a = paste_mod._drawn(spec, 1.0, (0.8, 0.5, 0.5), 24, spacing).astype(np.float64)
        # centroid per array axis [S, P, L], in mm from the cube's centre
        centroid = [(a.sum(axis=tuple(i for i in range(3) if i != ax)) * np.arange(24)).sum() / a.sum() for ax in range(3)]
        centroid_mm = (np.array(centroid) - 11.5) * spacing
        expected = np.array(offset_lps)[[2, 1, 0]]
        assert np.allclose(centroid_mm, expected, atol=0.25 * spacing), (spacing, centroid_mm, expected)


def test_solid_nodule_in_lung_reaches_its_hu_and_is_visible(paste_mod: ModuleType, bank) -> None:
    solid = np.flatnonzero(bank.kind == paste_mod.KIND_CODE["solid"])
    assert len(solid) >= 3
    out, visible = paste_mod.paste(_patches(LUNG_HU, len(solid)), bank, solid, torch.Generator().manual_seed(0))
    hu = _hu(out)
    assert visible.all()
    for row, n in enumerate(solid):
        a = bank.alpha[n, 0] / 255.0
        assert a.max() > 0.8, (n, bank.diameter[n])
        # on uniform lung the nodule replaces the lung's HU by its own in proportion to its share of each voxel
        assert np.allclose(hu[row, 0], LUNG_HU + a * (bank.value[n] - LUNG_HU), atol=1.0)


def test_ground_glass_raises_lung_but_never_lowers_tissue(paste_mod: ModuleType, bank) -> None:
    glass = np.flatnonzero(bank.kind == paste_mod.KIND_CODE["ground_glass"])
    assert len(glass)
    gen = torch.Generator().manual_seed(1)
    out, _ = paste_mod.paste(_patches(LUNG_HU, len(glass)), bank, glass, gen)
    hu = _hu(out)
    for row, n in enumerate(glass):
        a = bank.alpha[n, 0] / 255.0
        body = a >= 0.9 * a.max()
        expected = LUNG_HU + a[body] * (bank.value[n] - LUNG_HU)
        assert np.median(hu[row, 0][body] - expected) == pytest.approx(0.0, abs=40.0)
        assert (hu[row, 0] >= LUNG_HU - 0.5).all()
    dense, _ = paste_mod.paste(_patches(40.0, len(glass)), bank, glass, gen)
    assert _hu(dense).min() >= 40.0 - 0.5


def test_nodule_inside_soft_tissue_is_refused(paste_mod: ModuleType, bank) -> None:
    picks = np.arange(len(bank))
    _, in_lung = paste_mod.paste(_patches(LUNG_HU, len(bank)), bank, picks, torch.Generator().manual_seed(2))
    _, in_wall = paste_mod.paste(_patches(40.0, len(bank)), bank, picks, torch.Generator().manual_seed(2))
    assert in_lung.all() and not in_wall.any()
