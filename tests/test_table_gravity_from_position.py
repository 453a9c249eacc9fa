"""The table is looked for on the floor side of the patient, which the DICOM PatientPosition and the image orientation
(LPS) tell: not the shell's shape. A small field of view centred on the left lung with a blanket draped down the
patient's left side (phantom seed 44, supine) showed the blanket's arc as a longer 'shell' than the cut table: gravity
was taken to run along the image's columns, and the 'table' zone cut 0.18 of the patient away at the default grid."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.geometry import Geometry
from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import realistic_confounders
from pipeline.reconstruction.segment import segment_organs
from pipeline.reconstruction.table import floor_lps, gravity_axis

L, P, S = np.eye(3)


def _geom(i_dir: np.ndarray, j_dir: np.ndarray) -> Geometry:
    return Geometry(shape=(4, 8, 8), spacing=(1.0, 1.0, 2.0), origin=(0.0, 0.0, 0.0), direction=np.stack([i_dir, j_dir, S], 1))


@pytest.mark.parametrize(
    ("position", "floor"),
    [("HFS", P), ("FFS", P), ("HFP", -P), ("ffp", -P), ("HFDR", -L), ("FFDL", L), (None, None), ("", None), ("XYZ", None)],
)
def test_the_floor_follows_the_patient_position(position, floor):
    got = floor_lps(position)
    assert (got is None) if floor is None else np.array_equal(got, floor)


@pytest.mark.parametrize(
    ("i_dir", "j_dir", "position", "expected"),
    [
        (L, P, "HFS", (0, 1)),  # supine, rows run posteriorly: the table at the image's bottom
        (-L, -P, "HFP", (0, 1)),  # prone, the image turned so rows run anteriorly: the table at the bottom again
        (L, P, "HFP", (0, -1)),  # prone shown as supine: the table at the image's top
        (P, L, "HFS", (1, 1)),  # rows and columns swapped: gravity along the columns
        (L, P, "HFDR", (1, -1)),  # decubitus right: the floor on the patient's right, the image's left
        (L, P, None, None),  # no position: unknown
    ],
)
def test_gravity_axis_from_position_and_orientation(i_dir, j_dir, position, expected):
    assert gravity_axis(_geom(i_dir, j_dir), position) == expected


@pytest.mark.slow
def test_a_blanket_at_the_side_of_a_small_field_does_not_turn_the_table_search():
    c = realistic_confounders(44)
    assert c.blanket and c.fov_factor < 1.0 and c.fov_centre == "left_lung"
    ph = generate_phantom(
        44, confounders=c, patient_position="HFS", matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    seg = segment_organs(ph.volume, organs=("body",), device="cpu")
    assert not seg.errors, seg.errors
    skin = ph.masks["body"].astype(bool)
    body = seg.masks["body"]
    assert 0.98 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"
    table = body & ph.masks["table"].astype(bool)
    assert table.sum() <= 0.001 * skin.sum(), f"{int(table.sum())} voxels of table in the body"
