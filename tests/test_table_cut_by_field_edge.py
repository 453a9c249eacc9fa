"""A small field of view that cuts the table under the patient's centre: the table's curved shell leaves the image at
its lower edge there, and the table was found only at the patient's sides. On a 6 or 8 mm working grid the shell's
piece left at the image edge joined the patient's back, and the body took in that piece and the air between it and the
back (phantom seed 6, supine, 6 mm: about 3,000 voxels of air and 2,500 of table)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import realistic_confounders
from pipeline.reconstruction.organs import SegmentParams
from pipeline.reconstruction.segment import segment_organs


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFS", "HFP"])
@pytest.mark.parametrize("work_mm", [2.0, 4.0, 6.0, 8.0])
def test_a_table_cut_by_the_image_edge_under_the_patient_stays_out_of_the_body(position, work_mm):
    c = realistic_confounders(6)
    assert c.fov_factor < 1.0 and c.table == "curved"  # a small field of view that cuts the curved table
    ph = generate_phantom(
        6, confounders=c, patient_position=position, matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    table = ph.masks["table"].astype(bool)
    assert ph.volume.geometry.array_axis(2) == 0
    assert table[:, 0].any() or table[:, -1].any(), "the table leaves the image at its upper or lower edge"
    params = SegmentParams(work_voxel_mm=work_mm, work_min_voxels=1)
    seg = segment_organs(ph.volume, organs=("body",), device="cpu", params=params)
    assert not seg.errors, seg.errors
    hu = np.asarray(ph.volume.array)
    skin = ph.masks["body"].astype(bool)
    body = seg.masks["body"]
    air_outside = body & ~skin & (hu < -500.0)
    assert not air_outside.any(), f"{int(air_outside.sum())} voxels of air outside the skin inside the body"
    assert not (body & table).any(), f"{int((body & table).sum())} voxels of table in the body"
    assert 0.99 * skin.sum() <= body.sum() <= 1.001 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"
