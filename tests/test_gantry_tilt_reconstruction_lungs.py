"""The reconstruction's lungs on a tilt-corrected grid whose images cut the lungs at their sheared edge.

Read as air, the grown grid's -1024 HU wedge joined lungs that a small field of view cuts at the tilted images' edge to
the air around the patient, and the full-resolution segmentation dropped them as outside air. It now reads the wedge as
each image continued past its edge (as the detector's lung search does) and keeps its masks to what was measured; the
lungs' cut ends are measured where the lungs meet the last measured voxel of each column.
"""

from __future__ import annotations

import numpy as np

from pipeline.ingest import load_series
from pipeline.ingest.measured import measured_mask
from pipeline.reconstruction.segment import segment_organs
from tests.test_gantry_tilt_detector_lungs import _lung_points, _write


def _lungs(vol) -> np.ndarray:
    seg = segment_organs(vol, organs=("lung_left", "lung_right"), device="cpu")
    return np.logical_or.reduce([seg.masks.get(o, np.zeros(vol.shape, bool)) for o in ("lung_left", "lung_right")])


def test_lungs_cut_at_a_tilted_images_edge_are_kept_by_the_reconstruction(tmp_path):
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    measured = measured_mask(tilted.geometry, tilted.metadata)
    assert measured is not None and not measured.all()
    for vol in (straight, tilted):
        lungs = _lungs(vol)
        i, j, k = _lung_points(vol).astype(int).T
        assert lungs[k, j, i].mean() > 0.9
    assert not (_lungs(tilted) & ~measured).any()  # the wedge is never lung
