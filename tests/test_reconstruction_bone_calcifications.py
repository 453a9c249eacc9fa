"""Calcifications and dense contrast deep in the body are not bone; bone apart from the skeleton in the body wall is.

A kidney stone, excreted contrast in a renal pelvis, a calcified plaque on the aorta or a tablet in the
bowel is brighter than cortical bone and clusters as a cortex does, so it was seeded and kept as bone (the
3-D bone rendering showed specks in the kidneys and the aorta). The scene (3 mm voxels, LPS: +x the
patient's left, +y posterior) is an upper abdomen below the lungs: soft tissue holding a vertebra with a
resolved ring, a rib's piece with its own cortex in the left flank, two stones side by side and excreted
contrast filling a calyx in the kidneys, a calcified plate on the aorta's anterior wall and a tablet in a
bowel loop in front. A second scene (a chest with the arms at the sides) holds a rib's piece in the chest
wall beyond a lung, deep below the arm's skin, and a calcified hilar node between the lungs.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.reconstruction.calcifications import deep_calcifications
from tests._support.bone import segment_bone_of

MM = 3.0
NK, NJ, NI = 12, 70, 90


def _abdomen() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, parts)`` of the module docstring's first scene, ``[k, j, i]`` on 3 mm voxels (j runs posteriorly)."""
    k, j, i = np.meshgrid(np.arange(NK), np.arange(NJ), np.arange(NI), indexing="ij")
    body = ((i - 45) / 42.0) ** 2 + ((j - 35) / 30.0) ** 2 < 1.0
    hu = np.where(body, 40.0, -1000.0)
    r_vert = np.hypot(j - 53, i - 45)
    hu[r_vert < 6.0] = 700.0  # cortex (a third of each pixel it crosses, and more)
    hu[r_vert < 5.0] = 200.0
    parts = {
        # a rib's piece in the left flank (+x: larger i on this grid), 6 mm thick, 27 mm long, with its own cortex
        "rib": (np.abs(i - 84) <= 0) & (j >= 30) & (j < 39) & (k >= 4) & (k < 7),
        # in the kidneys, either side of the vertebra: two 6 mm stones 9 mm apart, and a calyx of excreted contrast
        "stones": ((np.hypot(j - 43, i - 30) <= 1.0) | (np.hypot(j - 43, i - 33) <= 1.0)) & (k >= 5) & (k < 7),
        "calyx": (np.abs(j - 43) <= 1) & (np.abs(i - 60) <= 1) & (k >= 4) & (k < 7),
        # the aorta's anterior wall, 15 mm in front of the vertebra: a 12 mm calcified plate
        "plaque": (j == 40) & (np.abs(i - 45) <= 2) & (k >= 5) & (k < 7),
        # a tablet in a bowel loop in front
        "tablet": (np.hypot(j - 24, i - 55) <= 1.0) & (k >= 5) & (k < 7),
    }
    hu[parts["rib"]] = 700.0
    hu[parts["stones"]] = 1100.0
    hu[parts["calyx"]] = 1200.0
    hu[parts["plaque"]] = 900.0
    hu[parts["tablet"]] = 1500.0
    hu = hu + np.random.default_rng(12).normal(0.0, 10.0, hu.shape)
    hu[~body] = -1000.0
    for name, m in parts.items():
        assert m.any() and body[m].all(), name
    return hu.astype(np.float32), body, parts


def _segment(hu: np.ndarray, body: np.ndarray) -> np.ndarray:
    return segment_bone_of(hu, body, spacing=(MM, MM, MM))


def test_stones_contrast_plaque_and_a_tablet_deep_in_the_abdomen_are_not_bone_and_a_rib_piece_in_the_wall_is():
    """(Excreted contrast filling a whole renal pelvis, more than ``CALCIFICATION_MAX_ML``, is still taken for bone.)"""
    hu, body, parts = _abdomen()
    bone = _segment(hu, body)
    for name in ("stones", "calyx", "plaque", "tablet"):
        assert not bone[parts[name]].any(), f"{int(bone[parts[name]].sum())} voxels of the {name} are bone"
    rib = float(bone[parts["rib"]].mean())
    assert rib > 0.9, f"only {rib:.0%} of the rib's piece in the flank is bone"
    assert bone[:, 53, 45].all()  # the vertebra stays bone


def test_a_rib_piece_beyond_a_lung_deep_below_an_arm_is_bone_and_a_hilar_calcification_is_not():
    """1 mm pixels, 2 mm slices: a chest 240 mm wide with the arms at its sides (the body 400 mm wide), two lungs;
    a small rib piece just outside the left lung (more than half-way in from the arm's skin) and a 6 mm
    calcified node beside the mediastinum, each apart from any other bone."""
    n_k, n_j, n_i = 6, 200, 400
    k, j, i = np.meshgrid(np.arange(n_k), np.arange(n_j) + 0.5, np.arange(n_i) + 0.5, indexing="ij")
    trunk = ((i - 200) / 120) ** 2 + ((j - 100) / 90) ** 2 < 1.0
    arms = (np.hypot(j - 100, i - 45) < 40) | (np.hypot(j - 100, i - 355) < 40)
    body = trunk | arms | ((np.abs(j - 100) < 25) & (i > 30) & (i < 370))  # the arms joined to the trunk
    hu = np.where(body, 40.0, -1000.0)
    lung_l = ((i - 250) / 40) ** 2 + ((j - 95) / 60) ** 2 < 1.0
    lung_r = ((i - 150) / 40) ** 2 + ((j - 95) / 60) ** 2 < 1.0
    hu[lung_l | lung_r] = -850.0
    rib = (np.abs(i - 295) < 2.0) & (np.abs(j - 95) < 6.0) & (k >= 2) & (k < 4)
    node = (np.hypot(j - 95, i - 212) <= 3.0) & (k >= 2) & (k < 4)
    hu[rib | node] = 900.0
    bone = rib | node
    spacing = (2.0, 1.0, 1.0)
    smooth = torch.nn.functional.avg_pool2d(torch.from_numpy(hu).float()[:, None], 3, 1, 1, count_include_pad=False)[:, 0].numpy()
    out = deep_calcifications(bone, body, smooth, spacing=spacing, slice_axis=0)
    assert out[node].all(), "the calcified hilar node is kept as bone"
    assert not out[rib].any(), "the rib piece beyond the lung is taken for a calcification"
