"""A lower rib's shaft beyond the reach of growth is bone; thin bright things touching bone that are no rib are not.

On 3 mm pixels a lower rib's cortex fills a third of each pixel: the rib shows a seeded cortex near the
spine and runs on as a 150-300 HU shaft, below the lungs (no lung lies beside it, so it is no rib piece
told by the lung). Bone grows only ``GROW_MM`` from a seed, so the shaft beyond that was lost. The scene
(3 mm voxels, LPS: +x the patient's left, +y posterior) is an upper abdomen: soft tissue holding a
vertebral body with a resolved ring above its disc, a rib whose first 9 mm are seeded and whose 220 HU shaft (in a 160 HU
partial-volume rim) runs on around the body wall, descending across slices; beside the vertebra a thin contrast-filled vessel running
on down the body past the disc (the azygos vein) and, in one slice, a streak (from metal) touching the vertebra.
"""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction.rib_pieces import rib_continuations
from tests._support.bone import segment_bone_of

MM = 3.0
NK, NJ, NI = 16, 70, 90


def _near_segment(
    k: np.ndarray, j: np.ndarray, i: np.ndarray, a: tuple[float, ...], b: tuple[float, ...], r: float
) -> np.ndarray:
    """Voxels within ``r`` voxels of the segment from ``a`` to ``b`` (``(k, j, i)`` in voxels, isotropic)."""
    p, q = np.array(a), np.array(b)
    d = q - p
    t = np.clip(((k - p[0]) * d[0] + (j - p[1]) * d[1] + (i - p[2]) * d[2]) / float(d @ d), 0.0, 1.0)
    return (k - p[0] - t * d[0]) ** 2 + (j - p[1] - t * d[1]) ** 2 + (i - p[2] - t * d[2]) ** 2 <= r * r


def _abdomen() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, parts)`` of the module docstring's scene, ``[k, j, i]`` on 3 mm voxels."""
    k, j, i = np.meshgrid(np.arange(NK), np.arange(NJ), np.arange(NI), indexing="ij")
    body = ((i - 45) / 42.0) ** 2 + ((j - 35) / 30.0) ** 2 < 1.0
    r_vert = np.hypot(j - 53, i - 45)
    hu = np.where(body, 40.0, -1000.0)
    vert = (r_vert < 6.0) & (k >= 9)  # a vertebral body in the upper slices, its disc (80 HU) below
    hu[(r_vert < 6.0) & (k < 9)] = 80.0
    parts: dict[str, np.ndarray] = {}
    head = _near_segment(k, j, i, (11.0, 53.0, 51.0), (11.0, 52.0, 54.0), 1.0)  # the rib's seeded head beside the vertebra
    shaft = _near_segment(k, j, i, (11.0, 52.0, 54.0), (7.0, 38.0, 79.0), 1.0) & ~head  # 90 mm, 12 mm down
    rim = _near_segment(k, j, i, (11.0, 52.0, 54.0), (7.0, 38.0, 79.0), 1.5) & ~shaft & ~head
    hu[rim] = 160.0  # pixels a third on the shaft: its partial-volume rim
    hu[shaft] = 220.0
    hu[head] = 700.0
    far = np.hypot(j - 52, i - 54) * MM > 15.0  # beyond the reach of growth from the head
    parts["shaft_far"], parts["rim_far"] = shaft & far, rim & far
    vessel = np.hypot(j - 53, i - 38.5) <= 0.5  # beside the vertebra and on down the body: 250 HU on these pixels
    hu[vessel] = 250.0
    parts["vessel_far"] = vessel & (k <= 4)  # more than 12 mm below the vertebra
    # a contrast-filled vein running across the body from the vertebra's front towards a kidney (a retroaortic
    # left renal vein), 6 mm wide, deep in the body
    renal = _near_segment(k, j, i, (12.0, 48.0, 45.0), (12.5, 45.0, 22.0), 1.0) & ~(r_vert < 6.0)
    hu[renal] = 250.0
    parts["renal_far"] = renal & (r_vert * MM > 36.0)
    streak = _near_segment(k, j, i, (13.0, 47.0, 45.0), (13.0, 30.0, 40.0), 0.5) & (r_vert >= 6.0)
    hu[streak] = 260.0
    parts["streak_far"] = streak & (r_vert * MM > 30.0)  # beyond the reach of growth from the vertebra
    hu[vert] = np.where(r_vert[vert] < 5.0, 200.0, 700.0)  # cortex (a third of each pixel it crosses, and more), marrow
    hu = hu + np.random.default_rng(11).normal(0.0, 10.0, hu.shape)
    hu[~body] = -1000.0
    for name, m in parts.items():
        assert m.any() and body[m].all(), name
    return hu.astype(np.float32), body, parts


def _segment(hu: np.ndarray, body: np.ndarray) -> np.ndarray:
    return segment_bone_of(hu, body, spacing=(MM, MM, MM))


def test_a_rib_shaft_beyond_the_reach_of_growth_is_bone_and_a_vessel_or_streak_touching_bone_is_not():
    hu, body, parts = _abdomen()
    seed_3mm = bone_mod.partial_volume_hu(bone_mod.SEED_HU, bone_mod.cortex_share((MM, MM, MM), 0))
    assert hu[parts["shaft_far"]].max() < seed_3mm  # no cortex seed along the shaft: only the bone it continues tells it
    bone = _segment(hu, body)
    shaft = float(bone[parts["shaft_far"]].mean())
    assert shaft > 0.9, f"only {shaft:.0%} of the rib's shaft beyond the reach of growth is bone"
    rim = float(bone[parts["rim_far"]].mean())  # marrow filling beside the shaft still takes some of it
    assert rim < 0.5, f"{rim:.0%} of the shaft's partial-volume rim is bone (pixels a third on it)"
    for name in ("vessel_far", "renal_far", "streak_far"):
        assert not bone[parts[name]].any(), f"{int(bone[parts[name]].sum())} voxels of the {name.split('_')[0]} are bone"
    assert bone[9:, 53, 45].all()  # the vertebra stays bone


def test_a_rib_continuation_touches_bone_crosses_slices_and_the_body_axis_and_is_thin_and_small():
    """Each rule on its own: a thin bar across the body touching bone over three slices in the body wall is kept;
    the same bar apart from bone, in one slice, along the body or deep in the body is not, nor a thick block (a
    contrast-filled bowel loop or a kidney against a rib) or a wide thin sheet (contrast layered in the rectum
    against the sacrum)."""
    spacing = (MM, MM, MM)
    bone = np.zeros((NK, NJ, NI), dtype=bool)
    bone[:, 30:36, 10:16] = True
    body = np.zeros_like(bone)
    body[:, :40, :] = True  # the bone and the pieces beside it lie 12-30 mm in from the body's surface (j = 40)

    def kept(piece: np.ndarray) -> bool:
        return bool(rib_continuations(piece, bone, body, spacing=spacing, slice_axis=0)[piece].all())

    bar = np.zeros_like(bone)
    for n, k in enumerate((6, 7, 8)):
        bar[k, 32:34, 16 + 6 * n : 24 + 6 * n] = True  # 2 voxels (6 mm) thick, running laterally and down
    assert kept(bar)
    apart = np.roll(bar, 3, axis=2)  # 9 mm away from the bone
    assert not kept(apart)
    one_slice = np.zeros_like(bone)
    one_slice[7, 32:34, 16:40] = True
    assert not kept(one_slice)
    along = np.zeros_like(bone)
    along[2:14, 32:34, 16:18] = True  # 36 mm down the body, beside the bone
    assert not kept(along)
    block = np.zeros_like(bone)
    block[6:10, 28:38, 16:26] = True  # 30 mm across, 12 mm high: no rib is that thick
    assert not kept(block)
    deep = np.zeros_like(bone)
    for n, k in enumerate((6, 7, 8)):
        deep[k, 18:20, 16 + 6 * n : 24 + 6 * n] = True  # the bar half-way in or more: a vein towards a kidney
    deep[:, 18:30, 10:16] = bone[:, 18:30, 10:16] = True  # with the bone reaching it
    assert not kept(deep & ~bone)
    sheet = np.zeros_like(bone)
    sheet[4:12, 30:32, 16:60] = True  # 12 mm thin but 130 x 24 mm: 38 mL
    sheet[4:12, 32:34, 16:60] = True
    assert not kept(sheet)


def test_a_short_rib_tip_running_down_from_bone_in_the_body_wall_is_kept_and_a_longer_piece_along_the_body_is_not():
    """A lower rib ends in a tip that turns down the body: on 3 mm voxels, a piece of three slices (its centres
    6 mm apart, 6 mm across) beside the rib's grown end, just under the body's surface. Its principal axis runs
    along the body, which for anything longer is a vessel running on down past the bone (the azygos vein); a
    piece in the outer body wall shorter than ``RIB_MIN_MM`` is a rib's tip, and was lost. A bar of the same
    width 24 mm down the body stays out, as does the short tip deeper in (a vessel beside a vertebra)."""
    spacing = (MM, MM, MM)
    body = np.zeros((NK, NJ, NI), dtype=bool)
    body[:, :40, :] = True  # the body's surface at j = 40, its deepest point 40 voxels in

    def kept(piece: np.ndarray, bone: np.ndarray) -> bool:
        return bool(rib_continuations(piece, bone, body, spacing=spacing, slice_axis=0)[piece].all())

    def rib_end(j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bone = np.zeros((NK, NJ, NI), dtype=bool)
        bone[8:11, j : j + 2, 10:20] = True  # the rib's end, grown from its seeded cortex
        tip = np.zeros_like(bone)
        tip[5:8, j : j + 2, 18:20] = True  # on down the body from it, three slices
        along = np.zeros_like(bone)
        along[0:8, j : j + 2, 18:20] = True  # eight slices
        return bone, tip, along

    bone, tip, along = rib_end(35)  # 12-15 mm under the surface
    assert kept(tip, bone)
    assert not kept(along, bone)
    bone, tip, _ = rib_end(25)  # 42-45 mm in: deeper than the outer body wall
    assert not kept(tip, bone)
