"""Bone on coarse pixels (3 mm): the cortex fills only part of each pixel it crosses.

A 1 mm cortex seen through 3 mm pixels is a third of each pixel: its ring around a vertebral body
is 200-450 HU with gaps, never the 600 HU of a resolved cortex, and the marrow inside no longer
lies in a closed hole. The scene is drawn at 0.5 mm and averaged onto 3 mm pixels, so partial
volume is what a scanner's coarse grid makes of it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.reconstruction import blood_pools as pools_mod
from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction import marrow as marrow_mod
from pipeline.reconstruction.grid import Grid
from pipeline.reconstruction.organs import SegmentParams
from pipeline.volume import CTVolume, Geometry
from tests._support.bone import segment_bone_of

FINE_MM, COARSE_MM = 0.5, 3.0


def _vertebra_slice(*, body_cortex: bool = True, body_hu: float = 120.0) -> np.ndarray:
    """One 3 mm slice (40x40 pixels, drawn at 0.5 mm and averaged) of the scene of :func:`_vertebra_beside_an_aorta`.

    ``body_cortex``: whether the vertebral body has its 1 mm cortex (a level where it does not is
    the body's cancellous bone alone); ``body_hu``: the HU inside the body (120: cancellous bone;
    80: an intervertebral disc, drawn without cortex)."""
    f = int(COARSE_MM / FINE_MM)
    n = 40 * f
    j, i = np.meshgrid((np.arange(n) + 0.5) * FINE_MM, (np.arange(n) + 0.5) * FINE_MM, indexing="ij")  # mm
    r_body, r_arch, r_aorta = np.hypot(j - 54, i - 60), np.hypot(j - 84, i - 60), np.hypot(j - 20, i - 60)
    fine = np.full((n, n), 40.0)
    if body_cortex:
        fine[r_body < 18.0] = 1100.0
    fine[r_body < 17.0] = body_hu
    fine[r_arch < 10.0] = 1100.0
    fine[r_arch < 9.0] = 15.0
    fine[r_aorta < 12.0] = 350.0
    return fine.reshape(40, f, 40, f).mean(axis=(1, 3))


def _vertebra_beside_an_aorta(slices: list[np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(hu, regions)`` on 3 mm pixels (``[k, j, i]``, 10 slices unless ``slices`` are given): soft tissue
    (40 HU) holding a vertebral body (1 mm cortex at 1100 HU around 120 HU cancellous bone, 36 mm wide), its
    arch (cortex around the 15 HU spinal canal) behind it and an aorta (350 HU: arterial contrast, 24 mm
    wide) 4 mm in front of it. ``regions``: coarse-pixel masks of the body's interior, the canal and
    the aorta, away from their partial-volume edges."""
    planes = slices if slices is not None else [_vertebra_slice()] * 10
    centre = (np.arange(40) + 0.5) * COARSE_MM
    cj, ci = np.meshgrid(centre, centre, indexing="ij")
    regions = {
        "interior": np.hypot(cj - 54, ci - 60) < 14.0,
        "canal": np.hypot(cj - 84, ci - 60) < 6.0,
        "aorta": np.hypot(cj - 20, ci - 60) < 10.0,
    }
    rng = np.random.default_rng(5)
    nk = len(planes)
    hu = np.stack(planes) + rng.normal(0.0, 10.0, (nk, 40, 40))
    return hu.astype(np.float32), {k: np.repeat(v[None], nk, axis=0) for k, v in regions.items()}


def _segment_3mm(hu: np.ndarray) -> np.ndarray:
    return segment_bone_of(hu, spacing=(COARSE_MM, COARSE_MM, COARSE_MM))


def test_a_vertebral_body_on_3mm_pixels_is_bone_inside_and_the_enhanced_aorta_beside_it_is_not():
    hu, regions = _vertebra_beside_an_aorta()
    assert hu[regions["interior"]].mean() < 150.0  # the cancellous bone is below LOW_HU: only the ring tells it
    assert not (hu > bone_mod.SEED_HU).any()  # nor does the cortex reach SEED_HU anywhere
    bone = _segment_3mm(hu)
    inside = float(bone[regions["interior"]].mean())
    assert inside > 0.95, f"only {inside:.0%} of the vertebral body's cancellous interior is bone (hollow body)"
    assert not bone[regions["aorta"]].any(), f"{int(bone[regions['aorta']].sum())} voxels of the enhanced aorta are bone"
    assert not bone[regions["canal"]].any(), f"{int(bone[regions['canal']].sum())} voxels of the spinal canal are bone"


def test_cortex_thresholds_drop_with_partial_volume_only_for_pixels_wider_than_the_cortex():
    """At 1 mm pixels (or finer) the thresholds are the resolved cortex's; at 3 mm a third of the way above LOW_HU."""
    assert bone_mod.cortex_share((0.7, 0.7, 1.25), 0) == 1.0
    assert bone_mod.partial_volume_hu(bone_mod.SEED_HU, bone_mod.cortex_share((0.98, 0.98, 2.0), 0)) == bone_mod.SEED_HU
    share = bone_mod.cortex_share((3.0, 3.0, 3.0), 0)
    assert abs(share - 1.0 / 3.0) < 1e-9
    expected = bone_mod.LOW_HU + (bone_mod.SEED_HU - bone_mod.LOW_HU) / 3.0
    assert abs(bone_mod.partial_volume_hu(bone_mod.SEED_HU, share) - expected) < 1e-6


def test_the_outer_layer_of_bone_on_2mm_pixels_is_trimmed_as_on_fine_pixels():
    """A pixel centred on the bone's outer surface has its inner half on the bone: at 2 mm that half still holds
    a 1 mm cortex whole, so the outer layer is judged against ``bone_hu`` itself. A 2 mm thick cortex plate
    (1000 HU) in soft tissue, with a 260 HU layer of partial-volume blur on each face: the blur stays out."""
    rng = np.random.default_rng(6)
    hu = np.full((10, 40, 40), 40.0)
    hu[:, 10:30, 19:21] = 1000.0  # the plate: two 2 mm pixels thick
    hu[:, 10:30, 18] = hu[:, 10:30, 21] = 260.0
    hu += rng.normal(0.0, 10.0, hu.shape)
    geom = Geometry(shape=hu.shape, spacing=(2.0, 2.0, 2.0), origin=(0.0, 0.0, 0.0))
    grid = Grid(CTVolume(hu.astype(np.float32), geom), torch.device("cpu"), (1, 1, 1))
    bone = bone_mod.segment_bone(grid, torch.ones(hu.shape, dtype=torch.bool), grid.hu, SegmentParams())
    assert bone[:, 12:28, 19:21].all()
    blur = bone[:, 12:28, 18].mean() + bone[:, 12:28, 21].mean()
    assert blur == 0, f"{blur / 2:.0%} of the blurred faces of the plate are bone"


def test_a_vertebral_level_without_cortex_between_bone_is_filled_and_a_disc_is_not():
    """Two 3 mm slices where the vertebral body shows no cortex at all (its 120 HU cancellous bone alone, no
    ring to enclose it) lie between slices of the whole vertebra: bone runs on along the body's axis, so they
    are marrow. Two slices of disc (80 HU, no cortex) between vertebrae further down stay out, as do the
    spinal canal and the enhanced aorta."""
    whole, level, disc = _vertebra_slice(), _vertebra_slice(body_cortex=False), _vertebra_slice(body_cortex=False, body_hu=80.0)
    hu, regions = _vertebra_beside_an_aorta([whole] * 4 + [level] * 2 + [whole] * 3 + [disc] * 2 + [whole] * 3)
    bone = _segment_3mm(hu)
    interior = regions["interior"]
    at_level = float(bone[4:6][interior[4:6]].mean())
    assert at_level > 0.9, f"only {at_level:.0%} of the vertebral level without cortex is bone (hollow level)"
    at_disc = float(bone[9:11][interior[9:11]].mean())
    assert at_disc < 0.1, f"{at_disc:.0%} of the disc between two vertebrae is bone"
    assert not bone[regions["canal"]].any() and not bone[regions["aorta"]].any()


def _smooth_cylinder_slices(nk: int, slices: slice, bone_beside: bool) -> np.ndarray:
    """Soft tissue (40 HU, noise 15 HU) on 3 mm voxels holding a smooth 250 HU disc of 12 mm radius in ``slices``;
    ``bone_beside``: the slices just outside ``slices`` (four on each side) hold a bone of the same size, a 300 HU
    inside rimmed by a 1000 HU cortex (a vertebral body above and below its endplate)."""
    rng = np.random.default_rng(7)
    j, i = np.meshgrid(np.arange(30), np.arange(30), indexing="ij")
    r = np.hypot(j - 15, i - 15) * COARSE_MM
    arr = np.full((nk, 30, 30), 40.0)
    if bone_beside:
        for k in (*range(max(0, slices.start - 4), slices.start), *range(slices.stop, min(nk, slices.stop + 4))):
            arr[k][r < 15.0] = 1000.0
            arr[k][r < 12.0] = 300.0
    arr[slices, r < 12.0] = 250.0
    return (arr + rng.normal(0.0, 15.0, arr.shape)).astype(np.float32)


@pytest.mark.parametrize(
    ("slices", "bone_beside", "measured", "is_pool"),
    [
        (slice(9, 11), True, slice(9, 11), False),
        (slice(9, 11), False, slice(9, 11), True),
        (slice(4, 12), False, slice(4, 12), True),
        (slice(0, 20), False, slice(0, 20), True),
        (slice(0, 3), True, slice(0, 2), True),
    ],
    ids=["6mm-endplate", "6mm-vessel-piece", "24mm-vessel", "through-the-scan", "on-bone-cut-by-the-scan"],
)
def test_a_smooth_region_is_blood_unless_it_is_short_and_sits_on_bone(slices, bone_beside, measured, is_pool):
    """A smooth, unrimmed 250 HU region on 3 mm voxels: a region two slices (6 mm) long between slices of a rimmed
    bone is a vertebral endplate (its texture and cortex blurred away), not blood. Blood when it runs at least
    POOL_MIN_LENGTH_MM along the slice axis (a vessel), when it does not sit on bone (a piece of a vessel that goes
    on below the thick-region threshold), or when the scan's first slice cuts it (``measured``: away from the slice
    next to the bone, whose cortex rims it)."""
    arr = _smooth_cylinder_slices(20, slices, bone_beside)
    geom = Geometry(shape=arr.shape, spacing=(COARSE_MM, COARSE_MM, COARSE_MM), origin=(0.0, 0.0, 0.0))
    grid = Grid(CTVolume(arr, geom), torch.device("cpu"), (1, 1, 1))
    cortex = bone_mod.cortex_seeds(grid.hu, (1, 1, 1))
    pool, _ = pools_mod.blood_pools(grid.hu, torch.ones(arr.shape, dtype=torch.bool), cortex, grid)
    centre = np.zeros(arr.shape, dtype=bool)
    centre[measured, 13:18, 13:18] = True
    share = float(pool.numpy()[centre].mean())
    assert (share > 0.9) if is_pool else (share == 0.0), f"{share:.0%} of the smooth region is blood"


def test_the_outer_layer_of_bone_on_3mm_pixels_wholly_on_bone_is_kept_below_the_surface_threshold():
    """A 30 mm bone on 3 mm pixels whose surface lies on pixel borders: 140 HU cancellous bone inside a ring of
    pixels wholly on bone holding a faint cortex (220 HU, below the 250 HU surface threshold of 3 mm pixels),
    with brighter patches (450 HU) at its corners as its seeds. Each ring pixel is the bone itself, far more than
    half-way from the tissue beside it (40 HU) to the bone inside it: it is kept, and nothing outside is bone."""
    rng = np.random.default_rng(8)
    hu = np.full((16, 30, 30), 40.0)
    hu[:, 10:20, 10:20] = 220.0
    hu[:, 11:19, 11:19] = 140.0
    for j0, i0 in ((10, 10), (10, 18), (18, 10), (18, 18)):
        hu[:, j0 : j0 + 2, i0 : i0 + 2] = 450.0
    hu = (hu + rng.normal(0.0, 10.0, hu.shape)).astype(np.float32)
    surface = bone_mod.partial_volume_hu(300.0, min(1.0, 2.0 * bone_mod.cortex_share((3.0, 3.0, 3.0), 0)))
    assert surface > 220.0 + 2 * 10.0  # the ring is well below the surface threshold
    bone = _segment_3mm(hu)
    block = np.zeros(hu.shape, dtype=bool)
    block[:, 10:20, 10:20] = True
    kept = float(bone[block].mean())
    assert kept > 0.99, f"only {kept:.0%} of the bone is bone: its outer ring of pixels wholly on bone was trimmed"
    assert not bone[~block].any(), f"{int(bone[~block].sum())} voxels of the tissue around the bone are bone"


def test_half_way_hu_lies_between_the_bone_and_the_tissue_beside_a_voxel():
    hu = torch.full((1, 5, 5), 40.0)
    hu[0, :, :2] = 200.0  # bone in the two left columns, tissue on the right
    bone = hu > 100.0
    outer = torch.zeros_like(bone)
    outer[0, :, 1] = True  # the bone's outer layer
    level = bone_mod.half_way_hu(hu, bone, outer, torch.ones_like(bone), 0)
    assert torch.allclose(level[0, 1:4, 1], torch.tensor(120.0))  # (200 + 40) / 2
    assert torch.isinf(level[0, 2, 0])  # no tissue beside it


def test_a_disc_rimmed_by_endplates_is_not_marrow_and_fatty_textured_marrow_is(monkeypatch: pytest.MonkeyPatch):
    """An intervertebral disc (smooth 85 HU fibrocartilage) in 3 mm slices whose partial-volume ring of endplate
    cortex nearly encloses it is not marrow; the fatty marrow of an elderly vertebra (90 HU on average, below
    ``MARROW_HU``, its trabeculae spreading it by 25 HU, twice the noise) behind the same broken ring is."""
    disc = _vertebra_slice(body_hu=85.0)
    fatty = _vertebra_slice(body_hu=90.0)
    hu, regions = _vertebra_beside_an_aorta([_vertebra_slice()] * 3 + [disc] * 2 + [fatty] * 4 + [_vertebra_slice()] * 3)
    interior = regions["interior"]
    rng = np.random.default_rng(11)
    trabeculae = rng.normal(0.0, 25.0, hu.shape).astype(np.float32)
    hu[5:9][interior[5:9]] += trabeculae[5:9][interior[5:9]]
    assert hu[3:5][interior[3:5]].mean() < 100.0 and hu[5:9][interior[5:9]].mean() < 100.0  # both below MARROW_HU
    bone = _segment_3mm(hu)
    at_disc = float(bone[3:5][interior[3:5]].mean())
    assert at_disc < 0.1, f"{at_disc:.0%} of the disc between the endplates' rings is bone"
    at_fatty = float(bone[5:9][interior[5:9]].mean())
    monkeypatch.setattr(marrow_mod, "DISC_SPREAD", 0.0)  # no region is smooth enough to be a disc
    unchecked = float(_segment_3mm(hu)[5:9][interior[5:9]].mean())
    assert at_fatty > 0.85 and at_fatty >= unchecked, f"only {at_fatty:.0%} of the fatty marrow is bone ({unchecked:.0%})"
    assert not bone[regions["canal"]].any() and not bone[regions["aorta"]].any()


def _ala_beside_the_canal() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, regions)`` on 3 mm pixels (``[k, j, i]``, 8 slices of 40x60 pixels, x along i): a body (40 HU
    soft tissue, 170 mm wide, air around it) holding, 30 mm to the side of its mid-line, a sacral ala's 1 mm cortex
    (1100 HU) around fatty marrow (45 HU, its trabeculae spreading it by 40 HU), and on the mid-line a spinal canal
    rimmed by its arch's cortex, as dense and as spread (the cord, nerve roots and CSF). ``regions``: coarse-pixel
    masks of the ala's marrow and of the canal, away from their partial-volume edges."""
    f = int(COARSE_MM / FINE_MM)
    nj, ni, nk = 40, 60, 8
    j, i = np.meshgrid((np.arange(nj * f) + 0.5) * FINE_MM, (np.arange(ni * f) + 0.5) * FINE_MM, indexing="ij")  # mm
    fine = np.where(((j - 60.0) / 55.0) ** 2 + ((i - 90.0) / 85.0) ** 2 < 1.0, 40.0, -1000.0)
    r_ala = np.hypot((j - 60.0) / 15.0, (i - 120.0) / 12.0)  # 30 mm to the side of the mid-line (x 90 mm)
    r_canal = np.hypot(j - 60.0, i - 90.0)
    fine[r_ala < 1.0] = 1100.0
    fine[np.hypot((j - 60.0) / 14.0, (i - 120.0) / 11.0) < 1.0] = 45.0
    fine[r_canal < 10.0] = 1100.0
    fine[r_canal < 9.0] = 45.0
    plane = fine.reshape(nj, f, ni, f).mean(axis=(1, 3))
    cj, ci = np.meshgrid((np.arange(nj) + 0.5) * COARSE_MM, (np.arange(ni) + 0.5) * COARSE_MM, indexing="ij")
    regions = {
        "marrow": np.hypot((cj - 60.0) / 11.0, (ci - 120.0) / 8.0) < 1.0,
        "canal": np.hypot(cj - 60.0, ci - 90.0) < 6.0,
    }
    regions = {k: np.repeat(v[None], nk, axis=0) for k, v in regions.items()}
    rng = np.random.default_rng(17)
    hu = np.repeat(plane[None], nk, axis=0) + rng.normal(0.0, 10.0, (nk, nj, ni))
    textured = regions["marrow"] | regions["canal"]
    hu[textured] += rng.normal(0.0, 40.0, int(textured.sum()))
    body = np.repeat((plane > -500.0)[None], nk, axis=0)
    return hu.astype(np.float32), body, regions


def test_fatty_marrow_of_a_sacral_ala_behind_a_broken_cortex_is_bone_and_the_spinal_canal_is_not():
    """On 3 mm pixels a sacral ala's cortex is a broken ring around fatty marrow (45 HU: below soft tissue's
    ``MARROW_LOW_HU`` and ``MARROW_HU``) that joins the tissue outside through the gaps: it was left out, and the
    ala was a hollow shell. Marrow as textured and as dense on the mid-line is the spinal canal and stays out."""
    hu, body, regions = _ala_beside_the_canal()
    assert hu[regions["marrow"]].mean() < marrow_mod.MARROW_LOW_HU
    bone = segment_bone_of(hu, body, spacing=(COARSE_MM, COARSE_MM, COARSE_MM))
    inside = float(bone[regions["marrow"]].mean())
    assert inside > 0.9, f"only {inside:.0%} of the sacral ala's fatty marrow is bone (a hollow shell)"
    assert not bone[regions["canal"]].any(), f"{int(bone[regions['canal']].sum())} voxels of the spinal canal are bone"
