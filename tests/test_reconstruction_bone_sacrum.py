"""The fatty interior of a sacrum on 3 mm pixels: bone, without its canal, its foramina or what lies in front of it.

The scene is drawn at 0.5 mm and averaged onto 3 mm pixels (partial volume as a scanner's coarse grid makes it),
then given image noise and, inside the sacrum, the texture of its trabeculae.
"""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction import marrow as marrow_mod
from pipeline.reconstruction import textured_marrow as textured_mod
from tests._support.bone import segment_bone_of

FINE_MM, COARSE_MM = 0.5, 3.0
NJ, NI, NK = 50, 80, 8  # coarse pixels (j: posterior to anterior, i: x) and slices
MID_I = 120.0  # the body's mid-line (mm along i)


def _ellipse(j: np.ndarray, i: np.ndarray, cj: float, ci: float, aj: float, ai: float) -> np.ndarray:
    return ((j - cj) / aj) ** 2 + ((i - ci) / ai) ** 2 < 1.0


def _pelvis(shift_mm: float, angle_deg: float, ni: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One slice: ``(fine HU at 0.5 mm, coarse plane at 3 mm, coarse region masks)``, the skeleton and what lies in
    front of it moved ``shift_mm`` along i from the body's mid-line and turned ``angle_deg`` in-plane about the
    sacrum's centre; the body's outline stays centred on the image (``ni`` coarse pixels wide)."""
    f = int(COARSE_MM / FINE_MM)
    mid = 0.5 * ni * COARSE_MM
    half = 118.0 + 0.5 * (ni - NI) * COARSE_MM

    def scene(j: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Image (j, i) mm to the skeleton's own frame, its mid-line at ``MID_I``."""
        t = np.deg2rad(angle_deg)
        dj, di = j - 45.0, i - (mid + shift_mm)
        return 45.0 + np.cos(t) * dj + np.sin(t) * di, MID_I - np.sin(t) * dj + np.cos(t) * di

    ji = np.meshgrid((np.arange(NJ * f) + 0.5) * FINE_MM, (np.arange(ni * f) + 0.5) * FINE_MM, indexing="ij")
    j, i = scene(*ji)
    fine = np.where(_ellipse(ji[0], ji[1], 75.0, mid, 72.0, half), 40.0, -1000.0)
    for side in (-1.0, 1.0):  # the iliac bones
        fine[_ellipse(j, i, 45.0, MID_I + side * 78.0, 30.0, 16.0)] = 1100.0
        fine[_ellipse(j, i, 45.0, MID_I + side * 78.0, 29.0, 15.0)] = 150.0
    fine[_ellipse(j, i, 45.0, MID_I, 20.0, 55.0)] = 1100.0
    fine[_ellipse(j, i, 45.0, MID_I, 19.0, 54.0)] = 20.0  # the marrow (texture added on the coarse pixels)
    fine[np.hypot(j - 40.0, i - MID_I) < 10.0] = 1100.0
    fine[np.hypot(j - 40.0, i - MID_I) < 9.0] = -70.0  # the canal
    foramina = np.zeros_like(fine, dtype=bool)
    for fj in (28.0, 62.0):  # behind and in front: each runs out through the cortex
        for side in (-1.0, 1.0):
            foramina |= _ellipse(j, i, fj, MID_I + side * 28.0, 9.0, 4.5)
    fine[foramina] = -80.0
    fine[np.hypot(j - 82.0, i - 95.0) < 7.0] = 250.0  # the iliac artery, 12 mm in front of the sacrum
    fine[np.hypot(j - 95.0, i - 140.0) < 16.0] = 20.0  # the rectum (stool's texture and gas added below)
    plane = fine.reshape(NJ, f, ni, f).mean(axis=(1, 3))
    cj, ci = scene(*np.meshgrid((np.arange(NJ) + 0.5) * COARSE_MM, (np.arange(ni) + 0.5) * COARSE_MM, indexing="ij"))
    canal = np.hypot(cj - 40.0, ci - MID_I) < 6.0
    foramen_core = np.zeros_like(canal)
    for fj in (28.0, 62.0):
        for side in (-1.0, 1.0):
            foramen_core |= _ellipse(cj, ci, fj, MID_I + side * 28.0, 5.0, 2.0)
    regions = {
        "alae": _ellipse(cj, ci, 45.0, MID_I, 15.0, 50.0) & (np.abs(ci - MID_I) > 37.0),
        "canal": canal,
        "foramina": foramen_core,
        "artery": np.hypot(cj - 82.0, ci - 95.0) < 4.0,
        "rectum": np.hypot(cj - 95.0, ci - 140.0) < 13.0,
        "inside": _ellipse(cj, ci, 45.0, MID_I, 18.0, 53.0) & (plane < 300.0),
        "stool": np.hypot(cj - 95.0, ci - 140.0) < 15.0,
    }
    return fine, plane, regions


def _sacrum_scene(
    *, shift_mm: float | list[float] = 0.0, angle_deg: float = 0.0, ni: int = NI
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, regions)`` on 3 mm pixels (``[k, j, i]``): a pelvis at the sacrum's level.

    Soft tissue (40 HU, 150x240 mm) holds the sacrum (110 mm wide, 40 mm deep, a 1 mm cortex at 1100 HU around
    fatty marrow: 20 HU, its trabeculae spreading it by 70 HU), the sacral canal on its mid-line (a cortex ring
    around fat, -70 HU, crossed by nerve roots), four foramina of fat (-80 HU) that open through its front and
    back cortex, an iliac bone beside it on either side (cortex around 150 HU cancellous bone), and in front of it
    two confounders: a contrast-filled iliac artery (250 HU) and the rectum, its stool as textured as the marrow
    and holding bubbles of gas. ``regions``: coarse-pixel masks of each, away from their partial-volume edges (of the marrow, the alae's beyond
    the foramina). ``shift_mm`` (one for all slices, or one per slice: a lateral curve), ``angle_deg``: the
    skeleton moved off the body's mid-line and turned in-plane (a patient lying rotated, a scoliosis); ``ni``: the
    image's width in coarse pixels, the body as much wider than 240 mm.
    """
    shifts = [float(shift_mm)] * NK if np.isscalar(shift_mm) else [float(s) for s in shift_mm]  # type: ignore[arg-type]
    slices = [_pelvis(s, angle_deg, ni) for s in shifts]
    plane = np.stack([sl[1] for sl in slices])
    regions = {name: np.stack([sl[2][name] for sl in slices]) for name in slices[0][2]}
    nk = len(shifts)
    rng = np.random.default_rng(23)
    hu = plane + rng.normal(0.0, 12.0, (nk, NJ, ni))
    inside = regions.pop("inside")
    hu[inside] += rng.normal(0.0, 70.0, int(inside.sum()))  # trabeculae (and the nerve roots in the canal's fat)
    rectum = regions.pop("stool")
    hu[rectum] += rng.normal(0.0, 70.0, int(rectum.sum()))
    hu[rectum & (rng.random(hu.shape) < 0.15)] = -850.0  # gas in the stool
    body = plane > -500.0
    return hu.astype(np.float32), body, regions


def test_the_fatty_interior_of_a_sacrum_is_bone_and_its_canal_foramina_and_what_lies_in_front_are_not():
    """On 3 mm pixels the sacrum's 1 mm cortex is a broken ring and its fatty marrow (20 HU, below
    ``FATTY_MARROW_HU``) joins the tissue outside through the gaps and the foramina: it was left out, and the
    sacrum was a hollow shell. Its trabeculae tell it (textured, enclosed by bone); the canal's and the foramina's
    fat, the contrast-filled artery and the rectum's stool with its gas in front of the sacrum stay out."""
    hu, body, regions = _sacrum_scene()
    assert hu[regions["alae"]].mean() < marrow_mod.FATTY_MARROW_HU
    bone = segment_bone_of(hu, body, spacing=(COARSE_MM, COARSE_MM, COARSE_MM))
    inside = float(bone[regions["alae"]].mean())
    assert inside > 0.8, f"only {inside:.0%} of the fatty marrow of the sacral alae is bone (a hollow shell)"
    for name in ("canal", "artery", "rectum"):
        assert not bone[regions[name]].any(), f"{int(bone[regions[name]].sum())} voxels of the {name} are bone"
    at_foramina = float(bone[regions["foramina"]].mean())
    assert at_foramina < 0.1, f"{at_foramina:.0%} of the sacral foramina are bone"


def test_enclosure_counts_the_directions_that_meet_bone_within_reach():
    """A voxel inside a ring of bone meets it in all 8 in-plane directions; beside a bar of bone, in the 3 that face it."""
    ring = np.zeros((1, 21, 21), dtype=bool)
    jj, ii = np.mgrid[0:21, 0:21]
    r = np.hypot(jj - 10, ii - 10)
    ring[0] = (r >= 6) & (r < 7.5)
    assert textured_mod.enclosed_directions(ring, 0, (8, 8))[0, 10, 10] == 8
    assert textured_mod.enclosed_directions(ring, 0, (3, 3))[0, 10, 10] == 0  # beyond reach
    bar = np.zeros((1, 21, 21), dtype=bool)
    bar[0, 5, :] = True
    assert textured_mod.enclosed_directions(bar, 0, (8, 8))[0, 10, 10] == 3


def test_nothing_is_added_on_the_spinal_canal_not_even_a_one_pixel_hole():
    """On 4 mm pixels the spinal canal can be a hole of one pixel in the bone: it stays a hole (the outer-layer
    trim then keeps the canal's rim out), while the same hole 40 mm beside the mid-line is filled as marrow."""
    mask = np.zeros((1, 15, 31), dtype=bool)
    hole = np.zeros_like(mask)
    for ci in (15, 25):  # on the mid-line (x 15 pixels = 60 mm) and 40 mm beside it
        mask[0, 6:9, ci - 1 : ci + 2] = True
        mask[0, 7, ci] = False
        hole[0, 7, ci] = True
    x = np.broadcast_to(((np.arange(31) + 0.5) * 4.0)[None, None, :], mask.shape)
    midline = np.array([[62.0, 60.0]])
    hu = np.full(mask.shape, 30.0, dtype=np.float32)
    out = textured_mod.fill_textured_marrow(mask, hu, np.ones_like(mask), 0, (4.0, 4.0), noise_hu=10.0, midline=midline, x=x)
    assert not out[0, 7, 15], "the one-pixel canal on the mid-line was filled"
    assert out[0, 7, 25], "a one-pixel hole beside the mid-line was not filled"


def _assert_alae_filled_and_canal_left_out(bone: np.ndarray, regions: dict[str, np.ndarray]) -> None:
    """Both alae mostly bone (a band about the body's mid-line left the nearer one out: 0-51% of it, 35-68% of
    both; the scene on the mid-line, as wide, 80-84% of both), and nothing on the canal, artery or rectum."""
    inside = float(bone[regions["alae"]].mean())
    assert inside > 0.7, f"only {inside:.0%} of the fatty marrow of the sacral alae is bone"
    i_mid = np.nonzero(regions["canal"].any(axis=(0, 1)))[0].mean()
    cols = np.arange(bone.shape[2])
    for side in (-1, 1):  # each ala, not one for both
        ala = regions["alae"] & ((cols - i_mid) * side > 0)[None, None, :]
        share = float(bone[ala].mean())
        assert share > 0.65, f"only {share:.0%} of the {'left' if side > 0 else 'right'} ala is bone"
    for name in ("canal", "artery", "rectum"):
        assert not bone[regions[name]].any(), f"{int(bone[regions[name]].sum())} voxels of the {name} are bone"
    at_foramina = float(bone[regions["foramina"]].mean())
    assert at_foramina < 0.1, f"{at_foramina:.0%} of the sacral foramina are bone"


def test_a_sacrum_off_the_body_s_mid_line_and_rotated_keeps_its_canal_out_and_its_alae_in():
    """A patient lying rotated, or with the spine off the body's centre: the sacrum lies 40 mm beside the body's
    mid-line, turned 15 degrees. Its canal is found where it lies, enclosed by the sacrum, and kept out; a band
    about the body's mid-line would have left an ala's marrow out and let the canal in."""
    hu, body, regions = _sacrum_scene(shift_mm=40.0, angle_deg=15.0, ni=110)
    bone = segment_bone_of(hu, body, spacing=(COARSE_MM, COARSE_MM, COARSE_MM))
    _assert_alae_filled_and_canal_left_out(bone, regions)


def test_a_scoliotic_sacrum_keeps_its_canal_out_and_its_alae_in_on_every_slice():
    """A lateral curve: slice by slice the sacrum lies 10 to 40 mm beside the body's mid-line (2 mm a slice)."""
    hu, body, regions = _sacrum_scene(shift_mm=list(np.linspace(10.0, 40.0, 16)), angle_deg=-10.0, ni=110)
    bone = segment_bone_of(hu, body, spacing=(COARSE_MM, COARSE_MM, COARSE_MM))
    _assert_alae_filled_and_canal_left_out(bone, regions)


def test_a_canal_beside_the_mid_line_stays_a_hole_and_a_hole_in_marrow_on_the_mid_line_is_filled():
    """The canal is found where it lies: a smooth hole (CSF, cord) that runs on through the slices 30 mm beside the
    body's mid-line is the canal and stays a hole, while a one-pixel hole in textured marrow on the mid-line is
    filled (a band about the mid-line left it out)."""
    mask = np.zeros((3, 15, 41), dtype=bool)
    hu = np.full(mask.shape, 30.0, dtype=np.float32)
    jj, ii = np.mgrid[0:15, 0:41]
    hu[:, :, :26] += np.where((jj + ii) % 2 == 0, 70.0, -70.0)[None, :, :26]  # trabeculae about the mid-line's vertebra
    mask[:, 6:9, 19:22] = True
    mask[:, 7, 20] = False  # a one-pixel hole in the marrow on the mid-line (x 20.5 pixels = 61.5 mm)
    mask[:, 5:10, 28:33] = True
    mask[:, 6:9, 29:32] = False  # the canal, 30 mm beside it
    x = np.broadcast_to(((np.arange(41) + 0.5) * 3.0)[None, None, :], mask.shape)
    midline = np.array([[61.5, 100.0]] * 3)
    canal = textured_mod.canal_hole(mask, np.abs(hu - 30.0) < 1.0, 0, (3.0, 3.0), midline=midline, x=x)
    expected = np.zeros_like(mask)
    expected[:, 6:9, 29:32] = True
    assert np.array_equal(canal, expected), f"the canal was not found: {np.argwhere(canal).tolist()}"
    out = textured_mod.fill_textured_marrow(mask, hu, np.ones_like(mask), 0, (3.0, 3.0), noise_hu=10.0, midline=midline, x=x)
    assert not out[:, 6:9, 29:32].any(), "the canal beside the mid-line was filled"
    assert out[:, 7, 20].all(), "a one-pixel hole in the marrow on the mid-line was not filled"
    lone = textured_mod.canal_hole(mask[:1], np.abs(hu[:1] - 30.0) < 1.0, 0, (3.0, 3.0), midline=midline[:1], x=x[:1])
    assert not lone.any(), "a hole in one slice alone, not running on along the spine, was taken for the canal"


def _spine_beside_a_hip_cavity() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(mask, hu, x, midline, canal)`` on 3 mm pixels, 7 slices: a vertebra on the body's mid-line (x 61.5 mm)
    enclosing its canal (smooth cord and CSF, 30 HU) on slices 2-6; on slices 0-1 its arch is open behind (a gap
    of 5 pixels) and the canal holds textured nerve roots (30 +- 70 HU), while a hip bone 30-48 mm beside it holds
    a fatty cavity (-80 HU, 225 mm²) there. ``canal``: the canal's voxels on every slice."""
    mask = np.zeros((7, 17, 41), dtype=bool)
    hu = np.full(mask.shape, 30.0, dtype=np.float32)
    jj, ii = np.mgrid[0:17, 0:41]
    mask[:, 3:10, 16:25] = True
    mask[:, 4:9, 17:24] = False  # the canal
    mask[:, 10:15, 15:26] = True  # the vertebral body
    mask[:, 1, 19:22] = True  # the spinous process behind the arch
    mask[:2, 3, 18:23] = False  # the arch open behind: the canal is no hole of the bone there
    canal = np.zeros_like(mask)
    canal[:, 4:9, 17:24] = True
    hu[:2] += np.where(canal[0] & ((jj + ii) % 2 == 0), 70.0, 0.0) - np.where(canal[0] & ((jj + ii) % 2 == 1), 70.0, 0.0)  # roots
    mask[:, 4:13, 4:11] = True  # the hip bone beside the spine
    mask[:2, 6:11, 5:10] = False
    hu[:2, 6:11, 5:10] = -80.0  # its fatty cavity, on two slices
    x = np.broadcast_to(((np.arange(41) + 0.5) * 3.0)[None, None, :], mask.shape)
    midline = np.array([[61.5, 150.0]] * 7)
    return mask, hu, x, midline, canal


def test_a_fatty_cavity_of_a_hip_bone_beside_the_spine_is_not_taken_for_the_canal():
    """Where the arch is open behind, the spinal canal is no hole of the bone, and a hip bone's fatty cavity 40 mm
    beside the mid-line was the only hole there: it was taken for the canal, so the canal lost its protection (its
    textured nerve roots were filled as marrow) and the mid-line's band was not used. The canal is followed through
    the slices from where the arch encloses it: the cavity is not continuous with it and is no canal, and the slices
    without the canal fall back to the band about the mid-line."""
    mask, hu, x, midline, canal = _spine_beside_a_hip_cavity()
    not_marrow = (hu < 0.0) | (np.abs(hu - 30.0) < 1.0)
    found = textured_mod.canal_hole(mask, not_marrow, 0, (3.0, 3.0), midline=midline, x=x)
    assert not found[:2].any(), f"the hip bone's cavity was taken for the canal: {np.argwhere(found[:2]).tolist()}"
    assert np.array_equal(found[2:], canal[2:]), "the canal enclosed by its arch was not found"
    out = textured_mod.fill_textured_marrow(mask, hu, np.ones_like(mask), 0, (3.0, 3.0), noise_hu=10.0, midline=midline, x=x)
    filled = out & canal & ~mask
    assert not filled.any(), f"{int(filled.sum())} voxels of the spinal canal were filled as marrow"
