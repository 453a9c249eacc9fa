"""An anterolateral rib below the lungs, apart from the seeded rest of its rib, is bone; bright things beside it are not.

Below the lungs' domes a 7th to 10th rib runs round the upper abdomen's wall with the liver, not a lung,
between it and the body's centre, and on 3 mm pixels its shaft (150-330 HU, its cortex a third of each
pixel) shows no cortex seed there; it curves round the wall within a few slices, so it is no straight
piece either. The scene (3 mm voxels) is an upper abdomen without lungs: soft tissue holding such a rib
arc 12-20 mm under the skin of the anterolateral wall, descending over five slices and touching no other
bone; a contrast-filled epigastric vessel (its 3 mm pixels at 300 HU) running along the body in the same
wall; a thin contrast-coated bowel wall curving across the body deep in it; and a bright skin marker
wire 3 mm under the skin.
"""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction.rib_pieces import rib_pieces
from tests._support.bone import segment_bone_of

MM = 3.0
NK, NJ, NI = 12, 80, 100
CJ, CI = 40.0, 50.0  # the body's centre (voxels)
AJ, AI = 36.0, 46.0  # its half-axes (voxels)


def _arc(k: np.ndarray, j: np.ndarray, i: np.ndarray, depth_vox: float, deg: tuple[float, float], half: float) -> np.ndarray:
    """Voxels within ``half`` voxels of the body outline drawn ``depth_vox`` in, between angles ``deg`` (degrees)."""
    theta = np.degrees(np.arctan2((j - CJ) / AJ, (i - CI) / AI))
    r = np.hypot((j - CJ) / AJ, (i - CI) / AI)
    shrink = 1.0 - depth_vox / AJ
    return (np.abs(r - shrink) * AJ <= half) & (theta >= deg[0]) & (theta <= deg[1])


def _abdomen() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    k, j, i = np.meshgrid(np.arange(NK), np.arange(NJ), np.arange(NI), indexing="ij")
    body = ((j - CJ) / AJ) ** 2 + ((i - CI) / AI) ** 2 < 1.0
    hu = np.where(body, 40.0, -1000.0)
    parts = {name: np.zeros(hu.shape, dtype=bool) for name in ("rib", "vessel", "bowel", "marker")}
    for n, kk in enumerate(range(3, 8)):  # the rib descends over five slices as it runs forward round the wall
        start = 20.0 + 9.0 * n
        parts["rib"] |= _arc(k, j, i, 5.0, (start, start + 22.0), 0.8) & (k == kk)
    hu[parts["rib"]] = 240.0
    parts["vessel"] = (np.hypot(j - 74.5, i - 36.0) <= 0.6) & body  # anterior wall, along the body
    hu[parts["vessel"]] = 300.0
    for kk in range(4, 7):  # a contrast-coated bowel wall curving across the body, 40 % of the way in or more
        parts["bowel"] |= _arc(k, j, i, 16.0, (40.0, 110.0), 0.8) & (k == kk)
    hu[parts["bowel"]] = 260.0
    parts["marker"] = _arc(k, j, i, 1.0, (60.0, 100.0), 0.5) & (k == 6)  # a wire on the skin, in one slice
    parts["marker"] |= _arc(k, j, i, 1.0, (60.0, 100.0), 0.5) & (k == 7)
    hu[parts["marker"]] = 260.0  # a thin wire, a fraction of each 3 mm pixel
    hu = hu + np.random.default_rng(7).normal(0.0, 10.0, hu.shape)
    hu[~body] = -1000.0
    for name, m in parts.items():
        assert m.any() and body[m].all(), name
    return hu.astype(np.float32), body, parts


def test_a_rib_below_the_lungs_in_the_body_wall_is_bone_and_a_vessel_bowel_or_skin_marker_is_not():
    hu, body, parts = _abdomen()
    seed_3mm = bone_mod.partial_volume_hu(bone_mod.SEED_HU, bone_mod.cortex_share((MM, MM, MM), 0))
    assert hu[parts["rib"]].max() < seed_3mm  # no cortex seed: only its place and shape tell the rib
    bone = segment_bone_of(hu, body, spacing=(MM, MM, MM))
    rib = float(bone[parts["rib"]].mean())
    assert rib > 0.9, f"only {rib:.0%} of the rib below the lungs is bone"
    for name in ("vessel", "bowel", "marker"):
        assert not bone[parts[name]].any(), f"{int(bone[parts[name]].sum())} voxels of the {name} are bone"


def test_a_piece_in_the_body_wall_must_cross_slices_and_be_thin():
    """The rib's arc in one slice (a streak) or as a thick slab (a contrast-filled bowel loop against the wall) is no rib."""
    hu, body, parts = _abdomen()
    k, j, i = np.meshgrid(np.arange(NK), np.arange(NJ), np.arange(NI), indexing="ij")
    found = np.zeros_like(body)
    smooth = np.where(body, 40.0, -1000.0)
    spacing = (MM, MM, MM)

    def kept(piece: np.ndarray) -> bool:
        return bool(rib_pieces(piece, found, body, smooth, spacing=spacing, slice_axis=0)[piece].all())

    assert kept(parts["rib"])
    one_slice = _arc(k, j, i, 5.0, (20.0, 60.0), 0.8) & (k == 5)
    assert not kept(one_slice)
    slab = _arc(k, j, i, 8.0, (20.0, 60.0), 3.5) & (k >= 3) & (k <= 6)  # 21 mm thick
    assert not kept(slab)
