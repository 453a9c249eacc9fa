"""A flat table below a small field of view with a blanket on it (phantom seed 48, field 0.63 of nominal): no shell is
in the image, only the blanket, cut by the image's lower edge, under the patient's back and beside it with air between.
No table was found, and the body took in the blanket and the air between it and the patient's flanks (body 1.05 of the
skin, 14,000 to 18,000 voxels of air and as many of blanket)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import realistic_confounders
from pipeline.reconstruction.organs import SegmentParams
from pipeline.reconstruction.segment import segment_organs


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFS", "HFP"])
@pytest.mark.parametrize("work_mm", [None, 2.0])
def test_a_blanket_cut_by_the_image_edge_under_the_patient_stays_out_of_the_body(position, work_mm):
    c = realistic_confounders(48)
    assert c.table == "flat" and c.blanket and c.fov_factor < 1.0
    ph = generate_phantom(
        48, confounders=c, patient_position=position, matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    params = SegmentParams() if work_mm is None else SegmentParams(work_voxel_mm=work_mm, work_min_voxels=1)
    seg = segment_organs(ph.volume, organs=("body",), device="cpu", params=params)
    assert not seg.errors, seg.errors
    hu = np.asarray(ph.volume.array)
    skin = ph.masks["body"].astype(bool)
    body = seg.masks["body"]
    air = int((body & ~skin & (hu < -500.0)).sum())
    table = int((body & ph.masks["table"].astype(bool)).sum())
    assert air <= 0.005 * skin.sum(), f"{air} voxels of air outside the skin inside the body"
    assert table <= 0.005 * skin.sum(), f"{table} voxels of table and blanket in the body"
    assert 0.97 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"
