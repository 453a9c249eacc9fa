"""The SR's lung sides of a tilt-corrected series with fine pixels: both lungs are found.

``lung_side_masks`` (the lungs that give each finding its side in an SR written without a reconstruction, as
``ctpipe detect`` writes it) segments blocks of about 2 mm. Its block volume had no mask of the voxels the tilted
images measured, so the -1024 HU wedge read as air joined the lungs that the field of view cuts at the tilted
images' edge to the air around the patient: no lung was found, and no finding was given a side.
"""

from __future__ import annotations

import numpy as np

from pipeline.dicom_out.case import lung_side_masks
from pipeline.ingest import load_series
from pipeline.ingest.measured import measured_mask
from tests.test_gantry_tilt_detector_lungs import _write


def test_both_lungs_of_a_finely_sampled_tilted_series_give_the_findings_their_side(tmp_path):
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0)).resample((1.0, 1.0, 2.0), device="cpu")
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    tilted = tilted.resample((1.0, 1.0, 2.0), device="cpu")  # 1 mm pixels: the 2 mm blocks hold 2 x 2 of them
    measured = measured_mask(tilted.geometry, tilted.metadata)
    assert measured is not None
    want = lung_side_masks(straight, device="cpu")
    got = lung_side_masks(tilted, device="cpu")
    assert set(want) == set(got) == {"lung_left", "lung_right"}, sorted(got)
    for organ in want:
        assert got[organ].sum() > 0.8 * want[organ].sum()
        assert not np.any(got[organ] & ~measured)
