"""Classical segmentation against phantom ground truth (Dice), left/right from LPS geometry, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.phantom import generate_phantom
from pipeline.reconstruction.organs import SegmentParams
from pipeline.reconstruction.segment import segment_organs
from pipeline.volume import CTVolume, Geometry
from tests._support.shapes import dice, synthetic_chest

MIN_DICE = {"body": 0.97, "lung_left": 0.97, "lung_right": 0.97, "airway": 0.85, "bone": 0.85}


@pytest.fixture(scope="module", params=["HFS", "FFS", "HFDR"])
def phantom_and_seg(request):
    """A matrix-128 phantom in three patient positions (FFS flips x and z; HFDR permutes rows/columns)."""
    ph = generate_phantom(1, matrix=128, patient_position=request.param)
    return ph, segment_organs(ph.volume, device="cpu")


def test_dice_against_phantom_truth(phantom_and_seg):
    ph, seg = phantom_and_seg
    assert not seg.errors
    for organ, floor in MIN_DICE.items():
        d = dice(ph.masks[organ], seg.masks[organ])
        assert d >= floor, f"{organ}: Dice {d:.3f} < {floor}"


def test_left_lung_is_at_larger_lps_x(phantom_and_seg):
    ph, seg = phantom_and_seg
    g = ph.volume.geometry
    x_left = g.centroid_lps(seg.masks["lung_left"])[0]
    x_right = g.centroid_lps(seg.masks["lung_right"])[0]
    assert x_left > 0 > x_right  # the phantom's body axis is x = 0
    # and the masks overlap their own truth, not the other side's
    assert dice(ph.masks["lung_left"], seg.masks["lung_left"]) > 0.9
    assert dice(ph.masks["lung_right"], seg.masks["lung_left"]) < 0.05


def test_same_anatomy_in_every_patient_position():
    """The same phantom stored in HFS and FFP order gives the same lung volumes (mL), sides unswapped."""
    vols = {}
    for pos in ("HFS", "FFP"):
        ph = generate_phantom(2, matrix=96, patient_position=pos)
        seg = segment_organs(ph.volume, organs=("lung_left", "lung_right"), device="cpu")
        vols[pos] = {k: int(seg.masks[k].sum()) for k in ("lung_left", "lung_right")}
        assert dice(ph.masks["lung_left"], seg.masks["lung_left"]) >= 0.95
    assert vols["HFS"] == vols["FFP"]


@pytest.mark.parametrize("direction", [np.eye(3), np.diag([-1.0, 1.0, 1.0]), np.diag([-1.0, -1.0, 1.0])])
def test_synthetic_direction_flip_keeps_sides(direction):
    vol, truth = synthetic_chest(n=64, slices=40, direction=direction)
    seg = segment_organs(vol, device="cpu")
    for organ in ("lung_left", "lung_right", "body"):
        assert dice(truth[organ], seg.masks[organ]) > 0.97, organ


def test_merged_lungs_are_split_at_the_junction():
    vol, truth = synthetic_chest(n=64, slices=40, merged=True, with_airway=False)
    seg = segment_organs(vol, organs=("lung_left", "lung_right", "airway"), device="cpu")
    # no trachea in this chest: flagged (no mask, no error), lungs still separated
    assert seg.info["airway"] == "not_in_scan" and "airway" not in seg.masks and "airway" not in seg.errors
    assert dice(truth["lung_left"], seg.masks["lung_left"]) > 0.9
    assert dice(truth["lung_right"], seg.masks["lung_right"]) > 0.9
    assert not (seg.masks["lung_left"] & seg.masks["lung_right"]).any()


def test_coarse_working_grid_with_boundary_refinement():
    """Forcing the coarse path (as used for 512² scans) still meets the Dice floors at full resolution."""
    ph = generate_phantom(3, matrix=128)
    params = SegmentParams(work_min_voxels=0, work_voxel_mm=1.4)
    seg = segment_organs(ph.volume, device="cpu", params=params)
    assert seg.info["work_factors_kji"] == "(1, 2, 2)"
    for organ in ("body", "lung_left", "lung_right"):
        assert dice(ph.masks[organ], seg.masks[organ]) >= 0.97, organ
    assert dice(ph.masks["bone"], seg.masks["bone"]) >= 0.85


def test_volume_without_lungs_reports_lungs_and_keeps_body_and_bone():
    vol, truth = synthetic_chest(n=48, slices=24)
    arr = vol.array.copy()
    arr[(arr < -500) & truth["body"]] = 40.0  # fill lungs and airways with soft tissue
    seg = segment_organs(vol.with_array(arr), device="cpu")
    for organ in ("lung_left", "lung_right"):
        assert "no lungs found" in str(seg.errors[organ])
        assert "1.2.3.synthetic" in str(seg.errors[organ])  # names the series
    assert seg.info["lungs"] == "absent" and seg.info["airway"] == "not_in_scan"
    assert "airway" not in seg.masks and "airway" not in seg.errors
    assert dice(truth["body"], seg.masks["body"]) > 0.97
    assert "bone" in seg.masks


def test_one_slice_volume_gives_a_clear_error():
    geom = Geometry(shape=(1, 32, 32), spacing=(1.0, 1.0, 1.0), origin=(0, 0, 0))
    seg = segment_organs(CTVolume(np.zeros((1, 32, 32), np.float32), geom), device="cpu")
    assert not seg.masks
    assert "too thin" in str(seg.errors["body"]) and "one-slice" in str(seg.errors["body"])


def test_no_body_gives_a_clear_error():
    geom = Geometry(shape=(8, 16, 16), spacing=(1.0, 1.0, 1.0), origin=(0, 0, 0))
    seg = segment_organs(CTVolume(np.full((8, 16, 16), -1000.0, np.float32), geom), device="cpu")
    assert "no body found" in str(seg.errors["lung_left"])


@pytest.mark.gpu
def test_cuda_segmentation_matches_cpu():
    ph = generate_phantom(1, matrix=128)
    cpu = segment_organs(ph.volume, device="cpu")
    gpu = segment_organs(ph.volume, device="cuda")
    for organ in MIN_DICE:
        assert dice(cpu.masks[organ], gpu.masks[organ]) > 0.999, organ
