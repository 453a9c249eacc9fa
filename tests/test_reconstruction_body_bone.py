"""Body (no table, blanket or couch; arms kept; cut by a small field of view) and bone (not contrast blood).

Phantoms with confounders (``generate_phantom(..., confounders=...)``: tables, blankets, arms,
IV contrast phases, small fields of view) against their ground truth, plus unit checks of the
pieces on small synthetic volumes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import CONFOUNDER_SCENARIOS, Confounders, scenarios_at
from pipeline.reconstruction import blood_pools as pools_mod
from pipeline.reconstruction import body as body_mod
from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction import table as table_mod
from pipeline.reconstruction.grid import Grid
from pipeline.reconstruction.organs import SegmentParams
from pipeline.reconstruction.segment import segment_organs
from pipeline.volume import CTVolume, Geometry


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * float((a & b).sum()) / max(1, int(a.sum()) + int(b.sum()))


def _scenario(name: str, matrix: int):
    s = CONFOUNDER_SCENARIOS[name]
    return generate_phantom(s.seed, confounders=s.confounders, patient_position=s.patient_position, matrix=matrix)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["routine_chest", "flat_couch_blanket", "arms_sides_gap", "small_fov_centred", "prone"])
def test_body_leaves_out_the_table_and_keeps_arms(name):
    """Curved table, flat couch with a blanket under the back, arms beside the chest, a small field of view, prone."""
    ph = _scenario(name, 128)
    seg = segment_organs(ph.volume, organs=("body",), device="cpu")
    body, truth, table = seg.masks["body"], ph.masks["body"], ph.masks["table"]
    assert dice(truth, body) >= 0.97, f"{name}: body Dice {dice(truth, body):.3f}"
    # the table (and blanket) never in the body: at most a partial-volume rim, 0.1 % of the body
    assert (body & table).sum() <= 0.001 * truth.sum(), f"{name}: {(body & table).sum()} table voxels in the body"


@pytest.mark.slow
def test_the_table_where_it_leaves_the_field_of_view_beside_a_prone_patient_is_not_a_body_part():
    """Seed 13025 (prone, raised arms, curved table and blanket; a tuning case): the table's shell, cut by the
    image edge beside the patient, is a thin piece of its own; it is not kept as an arm, so the body neither
    holds table voxels nor touches the image edge (no false "field of view cuts the body")."""
    s = scenarios_at(8000)["prone"]
    ph = generate_phantom(s.seed, confounders=s.confounders, patient_position=s.patient_position, matrix=180, pixel_spacing=2.0)
    body = segment_organs(ph.volume, organs=("body",), device="cpu").masks["body"]
    assert (body & ph.masks["table"]).sum() == 0
    assert not body[:, :, [0, -1]].any() and not body[:, [0, -1], :].any()


@pytest.mark.slow
def test_a_mattress_rising_with_a_curved_table_under_arms_at_the_sides_is_not_body():
    """Seed 21002 (arms touching the chest, mattress on a curved table, large field of view; a tuning case):
    beside the patient's back the table and its mattress curve up above the back's lowest row; the mattress
    there is not body (665 mL of it was, when the table's zone was capped at one row for every column)."""
    s = scenarios_at(16000)["arms_touching_blanket"]
    ph = generate_phantom(s.seed, confounders=s.confounders, patient_position=s.patient_position, matrix=180, pixel_spacing=2.0)
    body = segment_organs(ph.volume, organs=("body",), device="cpu").masks["body"]
    voxel_ml = float(np.prod(ph.volume.geometry.spacing)) / 1000.0
    assert float((body & ph.masks["table"]).sum()) * voxel_ml < 10.0
    assert dice(ph.masks["body"], body) >= 0.99


def test_body_keeps_arms_separated_from_the_chest_by_air():
    ph = generate_phantom(11, matrix=128, confounders=Confounders(table="none", arms="sides"))
    seg = segment_organs(ph.volume, organs=("body",), device="cpu")
    body, truth = seg.masks["body"], ph.masks["body"]
    assert dice(truth, body) >= 0.98
    assert (truth & ~body).sum() <= 0.01 * truth.sum()  # both arms are in


@pytest.mark.slow
@pytest.mark.parametrize("name", ["arterial_phase", "pulmonary_phase", "feet_first_venous"])
def test_bone_is_not_contrast_blood(name):
    """Arterial, pulmonary-arterial and venous phases: bone Dice >= 0.90, blood hardly ever bone."""
    ph = _scenario(name, 256)
    seg = segment_organs(ph.volume, organs=("body", "bone"), device="cpu")
    bone, truth, blood = seg.masks["bone"], ph.masks["bone"], ph.masks["contrast_blood"]
    assert blood.any()
    assert dice(truth, bone) >= 0.90, f"{name}: bone Dice {dice(truth, bone):.3f}"
    assert (bone & blood).sum() <= 0.10 * blood.sum(), f"{name}: {(bone & blood).sum()} of {blood.sum()} blood voxels are bone"
    thresholded = ((ph.volume.array > 300) & blood).sum()
    if thresholded > 0.1 * blood.sum():  # arterial phases: a plain HU threshold would take far more of the blood
        assert (bone & blood).sum() < 0.5 * thresholded


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sharp_kernel", "arms_sides_gap", "metal_spine"])
def test_bone_meets_the_target_with_a_sharp_kernel_arms_and_metal(name):
    """Sharp-kernel noise, humeri with fatty marrow beside the chest, spinal hardware: bone Dice >= 0.90, metal not bone."""
    ph = _scenario(name, 256)
    seg = segment_organs(ph.volume, organs=("body", "bone"), device="cpu")
    bone, truth = seg.masks["bone"], ph.masks["bone"]
    assert dice(truth, bone) >= 0.90, f"{name}: bone Dice {dice(truth, bone):.3f}"
    assert (bone & ph.masks["metal"]).sum() <= 0.05 * max(1, int(ph.masks["metal"].sum()))


@pytest.mark.slow
def test_bone_leaves_out_an_aorta_against_the_spine_under_arterial_contrast_sharp_kernel_and_metal():
    """All confounders at once (seed 13031, a tuning case): the enhanced descending aorta touches a
    vertebral body and streaks from spinal hardware cross it; it is a blood pool, not bone."""
    s = scenarios_at(8000)["everything"]
    ph = generate_phantom(
        s.seed,
        confounders=s.confounders,
        patient_position=s.patient_position,
        matrix=180,
        pixel_spacing=2.0,
        slice_spacing=2.5,
        n_nodules=None,
    )
    seg = segment_organs(ph.volume, organs=("body", "bone"), device="cpu")
    bone, truth, blood = seg.masks["bone"], ph.masks["bone"], ph.masks["contrast_blood"]
    assert dice(truth, bone) >= 0.90, f"bone Dice {dice(truth, bone):.3f}"
    assert (bone & blood).sum() <= 0.12 * blood.sum(), f"{(bone & blood).sum()} of {blood.sum()} blood voxels are bone"


def test_bone_without_contrast_still_meets_the_plain_phantom_floor():
    ph = generate_phantom(1, matrix=128)
    seg = segment_organs(ph.volume, organs=("body", "bone"), device="cpu")
    assert dice(ph.masks["bone"], seg.masks["bone"]) >= 0.88


# -- unit checks on synthetic volumes ------------------------------------------------------


def _grid(arr: np.ndarray, spacing=(1.0, 1.0, 1.0)) -> Grid:
    geom = Geometry(shape=arr.shape, spacing=spacing, origin=(0.0, 0.0, 0.0))
    return Grid(CTVolume(arr.astype(np.float32), geom), torch.device("cpu"), (1, 1, 1))


def test_cortex_seeds_ignore_noise_in_bright_blood():
    rng = np.random.default_rng(0)
    arr = rng.normal(450.0, 60.0, (24, 48, 48))  # dense contrast with a sharp kernel's noise
    arr[:, 10:14, 10:30] = 1000.0  # a cortical plate
    seeds = bone_mod.cortex_seeds(torch.from_numpy(arr.astype(np.float32)), (1, 1, 1)).numpy()
    assert seeds[:, 10:14, 10:30].mean() > 0.9
    assert seeds[:, 25:, 25:].sum() == 0


def test_cortex_seeds_at_the_end_of_the_scan_need_the_same_share_of_their_cut_neighbourhood():
    """Three clustered cortex voxels: a seed on the scan's last slice (3 of the 18 voxels of its neighbourhood left
    inside the scan, as 4 of 27 further in), not in the middle of the scan (3 of 27: noise in bright blood)."""
    arr = np.full((7, 9, 9), 40.0, dtype=np.float32)
    for k in (3, 6):
        arr[k, 4, 4] = arr[k, 4, 5] = arr[k, 5, 4] = 900.0
    seeds = bone_mod.cortex_seeds(torch.from_numpy(arr), (1, 1, 1)).numpy()
    assert seeds[6, 4, 4] and seeds[6].sum() == 3
    assert not seeds[3].any()


def test_cortex_seeds_on_a_pooled_grid_keep_the_grid_shape():
    arr = np.zeros((9, 21, 21), np.float32)
    arr[4, 5:15, 5:15] = 900.0
    arr[3, 5:15, 5:15] = 900.0
    seeds = bone_mod.cortex_seeds(torch.from_numpy(arr), (1, 2, 2))
    assert tuple(seeds.shape) == (9, 11, 11)
    assert bool(seeds[3:5, 3:7, 3:7].all())


def _cylinders(rimmed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Soft tissue with a smooth 300 HU cylinder; ``rimmed`` adds a 1 mm cortex (1000 HU) around it."""
    rng = np.random.default_rng(1)
    nk, n = 30, 64
    _, j, i = np.meshgrid(np.arange(nk), np.arange(n), np.arange(n), indexing="ij")
    r = np.hypot(j - 32, i - 32)
    arr = np.full((nk, n, n), 40.0)
    arr[r < 12] = 300.0
    if rimmed:
        arr[(r >= 12) & (r < 13.5)] = 1000.0
    arr += rng.normal(0, 15, arr.shape)
    return arr, r < 12


@pytest.mark.parametrize("rimmed", [False, True])
def test_blood_pools_are_smooth_unrimmed_regions(rimmed):
    arr, inside = _cylinders(rimmed)
    grid = _grid(arr)
    body = torch.ones(arr.shape, dtype=torch.bool)
    cortex = bone_mod.cortex_seeds(grid.hu, (1, 1, 1))
    pool, bone = pools_mod.blood_pools(grid.hu, body, cortex, grid)
    core = inside & (np.hypot(*np.meshgrid(np.arange(64) - 32, np.arange(64) - 32, indexing="ij")) < 9)[None]
    if rimmed:  # a marrow cavity inside cortex: bone, not blood
        assert bone.numpy()[core].mean() > 0.9 and not pool.numpy()[core].any()
    else:  # a vessel: blood
        assert pool.numpy()[core].mean() > 0.9 and not bone.numpy()[core].any()


def test_a_vertebral_body_and_the_aorta_touching_it_through_its_cortex_are_judged_apart():
    """A cortex-rimmed 300 HU body whose cortex is missing where a 300 HU vessel touches it. Judged as one thick
    region, half its ring is cortex and the vessel would be bone with the body; split at the neck, the body is
    rimmed (bone) and the vessel is not (blood)."""
    rng = np.random.default_rng(2)
    nk, n = 20, 72
    _, j, i = np.meshgrid(np.arange(nk), np.arange(n), np.arange(n), indexing="ij")
    r_body, r_vessel = np.hypot(j - 36, i - 28), np.hypot(j - 36, i - 48)  # joined by a 7 mm neck
    arr = np.full((nk, n, n), 40.0)
    arr[(r_body >= 12) & (r_body < 13.5) & (i < 36)] = 1000.0  # the cortex, open on the vessel's side
    arr[r_body < 12] = 300.0
    arr[r_vessel < 9] = 300.0
    arr += rng.normal(0, 15, arr.shape)
    grid = _grid(arr)
    body = torch.ones(arr.shape, dtype=torch.bool)
    cortex = bone_mod.cortex_seeds(grid.hu, (1, 1, 1))
    pool, bone = (m.numpy() for m in pools_mod.blood_pools(grid.hu, body, cortex, grid))
    body_core, vessel_core = r_body < 8, r_vessel < 6
    assert bone[body_core].mean() > 0.9 and not pool[body_core].any()
    assert pool[vessel_core].mean() > 0.9 and not bone[vessel_core].any()


def test_segment_bone_fills_marrow_inside_cortex_but_not_the_spinal_canal():
    """A vertebral body (cortex around 250 HU marrow) and its arch (cortex around the CSF-filled canal)."""
    rng = np.random.default_rng(2)
    _, j, i = np.meshgrid(np.arange(30), np.arange(80), np.arange(64), indexing="ij")
    r_body, r_arch = np.hypot(j - 28, i - 32), np.hypot(j - 52, i - 32)
    arr = np.full((30, 80, 64), 40.0)
    arr[r_body < 13.5] = 1000.0
    arr[r_body < 12] = 250.0
    arr[r_arch < 9.5] = 900.0
    arr[r_arch < 8] = 10.0
    arr += rng.normal(0, 15, arr.shape)
    grid = _grid(arr)
    bone = bone_mod.segment_bone(grid, torch.ones(arr.shape, dtype=torch.bool), grid.hu, SegmentParams())
    assert bone[r_body < 13].mean() > 0.98  # cortex and marrow
    assert not bone[r_arch < 7].any()  # the canal
    assert bone[(r_arch >= 8) & (r_arch < 9.5)].mean() > 0.9


def test_fill_cut_air_fills_lungs_cut_by_the_image_edge_but_not_outside_air():
    mask = np.zeros((3, 40, 40), dtype=bool)
    mask[:, 5:35, :] = True  # a chest wider than the image
    mask[:, 10:30, 0:15] = False  # a lung reaching the left edge
    mask[:, 0:5, :] = False  # outside air above
    out = body_mod.fill_cut_air(mask, slice_axis=0)
    assert out[:, 10:30, 0:15].all()
    assert not out[:, 0:5, :].any() and not out[:, 35:, :].any()


def test_table_zone_finds_a_couch_under_the_patient_and_nothing_without_one():
    nk, n = 20, 80
    _, j, i = np.meshgrid(np.arange(nk), np.arange(n), np.arange(n), indexing="ij")
    arr = np.full((nk, n, n), -1000.0)
    patient = ((i - 40) / 25.0) ** 2 + ((j - 35) / 18.0) ** 2 < 1
    arr[patient] = 40.0
    grid = _grid(arr, spacing=(2.0, 2.0, 3.0))
    assert table_mod.table_zone(torch.from_numpy(arr > -500), grid) is None
    arr[:, 60, 2:78] = 400.0  # a couch: two thin shells around foam, the whole scan long
    arr[:, 61:68, 2:78] = -850.0
    arr[:, 68, 2:78] = 400.0
    grid = _grid(arr, spacing=(2.0, 2.0, 3.0))
    zone = table_mod.table_zone(torch.from_numpy(arr > -500), grid)
    assert zone is not None and zone[60:69, 10:70].all()
    assert not (zone[None] & patient).any()
    body = body_mod.segment_body(grid, SegmentParams())
    assert dice(patient, body) > 0.97 and not body[:, 59:, :].any()


def test_table_zone_finds_the_shell_under_a_mattress_the_field_of_view_cuts():
    """A small field of view: a mattress on the table's bright upper shell from edge to edge, the patient sunk into it.

    No thin tissue persists (the mattress makes the shell part of a thick layer, the lower
    shell is outside the image) and sharp-kernel noise blurs the threshold; the zone still
    starts at the mattress's top, and the body holds neither mattress nor shell.
    """
    rng = np.random.default_rng(5)
    nk, nj, ni = 20, 78, 90
    _, j, i = np.meshgrid(np.arange(nk), np.arange(nj), np.arange(ni), indexing="ij")
    arr = np.full((nk, nj, ni), -1000.0)
    patient = ((i - 45) / 32.0) ** 2 + ((j - 40) / 26.0) ** 2 < 1
    arr[patient] = 40.0
    arr[(j >= 63) & (j < 70) & ~patient] = -40.0  # the mattress, 14 mm, up to the image's edges
    arr[j == 70] = 600.0  # the upper shell
    arr[j > 70] = -850.0  # foam, cut by the image's edge
    arr += rng.normal(0, 60, arr.shape)
    grid = _grid(arr, spacing=(2.0, 2.0, 3.0))
    zone = table_mod.table_zone(torch.from_numpy(arr > -500), grid)
    assert zone is not None and zone[63:, :].all() and not zone[:62].any()
    body = body_mod.segment_body(grid, SegmentParams())
    assert dice(patient, body) > 0.97
    assert not (body & ~patient)[:, 62:, :].any() and not body[:, 67:, :].any()


@pytest.mark.parametrize("fov", [0.8, 1.0])
def test_body_and_bone_leave_out_a_blanket_under_touching_arms_with_a_sharp_kernel(fov):
    """Blanket on a curved table, arms resting against the chest wall, sharp-kernel noise, a small or standard field of view."""
    conf = Confounders(table="curved", blanket=True, arms="sides_touching", kernel="sharp", fov_factor=fov)
    ph = generate_phantom(22, matrix=128, confounders=conf)
    seg = segment_organs(ph.volume, organs=("body", "bone"), device="cpu")
    body, truth, table = seg.masks["body"], ph.masks["body"], ph.masks["table"]
    assert dice(truth, body) >= 0.97, f"body Dice {dice(truth, body):.3f}"
    assert (body & table).sum() <= 0.001 * truth.sum(), f"{(body & table).sum()} table voxels in the body"
    assert dice(ph.masks["bone"], seg.masks["bone"]) >= 0.88, f"bone Dice {dice(ph.masks['bone'], seg.masks['bone']):.3f}"


def test_midline_is_known_when_arms_reach_the_image_edges():
    """Arms at the sides touching both x edges: the trunk in front of and behind them gives the mid-line."""
    _, j, i = np.meshgrid(np.arange(3), np.arange(60), np.arange(100), indexing="ij")
    body = ((i - 56) / 36.0) ** 2 + ((j - 30) / 25.0) ** 2 < 1
    body |= ((j - 30) / 8.0) ** 2 + (np.minimum(i, 99 - i) / 14.0) ** 2 < 1  # the arms, cut by the image edges
    x = i.astype(np.float64)  # 1 mm columns along LPS x
    mid = bone_mod.midline_x(body, x, 0, 0.5)
    assert np.allclose(mid[:, 0], 56.0, atol=1.0) and np.all(mid[:, 1] > 30.0)
    assert np.isnan(bone_mod.midline_x(np.ones_like(body), x, 0, 0.5)).all()  # the body fills the image: unknown


def test_segment_bone_fills_a_long_bone_cavity_of_any_hu_but_not_the_spinal_canal():
    """A humerus beside the chest (cortex around fatty marrow at soft-tissue HU) and a canal (CSF) on the mid-line."""
    rng = np.random.default_rng(3)
    _, j, i = np.meshgrid(np.arange(20), np.arange(96), np.arange(160), indexing="ij")
    arr = np.full((20, 96, 160), -1000.0)
    arr[((i - 80) / 75.0) ** 2 + ((j - 48) / 40.0) ** 2 < 1] = 40.0  # the body, 150 mm wide
    r_canal, r_hum = np.hypot(j - 60, i - 80), np.hypot(j - 48, i - 140)
    arr[r_canal < 10] = 900.0
    arr[r_canal < 7] = 10.0  # the canal, enclosed by the arch
    arr[r_hum < 10] = 950.0
    arr[r_hum < 7] = 20.0  # the humerus's marrow
    arr += rng.normal(0, 15, arr.shape)
    grid = _grid(arr)
    body = torch.from_numpy(body_mod.segment_body(grid, SegmentParams()))
    bone = bone_mod.segment_bone(grid, body, grid.hu, SegmentParams())
    assert bone[r_hum < 9.5].mean() > 0.98  # cortex and marrow
    assert not bone[r_canal < 6].any()
    assert bone[(r_canal >= 7.5) & (r_canal < 9.5)].mean() > 0.9


def test_sharp_kernel_noise_leaves_no_holes_in_bone_and_metal_is_not_bone():
    """Cancellous bone (360 HU) in a cortex under sharp-kernel noise (80 HU) is bone throughout; a rod of metal is not."""
    rng = np.random.default_rng(4)
    _, j, i = np.meshgrid(np.arange(20), np.arange(80), np.arange(80), indexing="ij")
    r = np.hypot(j - 40, i - 40)
    arr = np.full((20, 80, 80), 40.0)
    arr[r < 15] = 950.0
    arr[r < 13.5] = 360.0
    rod = np.hypot(j - 40, i - 62) < 2.5
    arr[rod] = 6000.0
    arr += rng.normal(0, 80, arr.shape)
    grid = _grid(arr)
    bone = bone_mod.segment_bone(grid, torch.ones(arr.shape, dtype=torch.bool), grid.hu, SegmentParams())
    assert bone[r < 14].mean() > 0.99
    assert not bone[rod].any()
