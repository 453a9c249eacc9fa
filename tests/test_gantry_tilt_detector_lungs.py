"""The detector's lung search on a tilt-corrected grid whose images cut the lungs at their sheared edge.

The grown grid's unmeasured wedge holds -1024 HU: read as air, it joins the lungs that a small field of view cuts at
the tilted images' edge to the air around the patient, and the whole is then taken for outside air: the lungs were
lost to the detector's search and to the limit of its findings. The wedge is now left out of both, and the lungs
they hold are those of the same series scanned untilted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

from pipeline.detection.lungs import quick_lung_mask, segmented_lung_region
from pipeline.ingest import load_series
from pipeline.ingest.measured import measured_mask
from tests._support.dicom import write_series

ROWS, COLS, N, STEP, PIXEL = 64, 64, 40, 2.0, 2.0
LUNG_HU = -850.0


def _write(folder: Path, *, tilt_deg: float) -> Path:
    """A chest slab (40 HU) cut by the field of view front and back, air beside it, and two lungs (-850 HU with noise)
    that reach the posterior edge of the images; the column cosine leans towards S by ``tilt_deg`` (shear along j)."""
    t = np.radians(tilt_deg)
    row, col = np.array([1.0, 0.0, 0.0]), np.array([0.0, np.cos(t), np.sin(t)])
    start = np.array([-64.0, -64.0, -40.0])
    positions = [(start + k * np.array([0.0, 0.0, STEP])).tolist() for k in range(N)]
    hu = np.full((N, ROWS, COLS), -1000.0)
    hu[:, :, 6:58] = 40.0
    rng = np.random.default_rng(0)
    for c0, c1 in ((12, 28), (36, 52)):
        hu[5:35, 30:, c0:c1] = LUNG_HU + rng.normal(0.0, 30.0, (30, ROWS - 30, c1 - c0))
    write_series(
        folder,
        n=N,
        rows=ROWS,
        cols=COLS,
        pixel_spacing=(PIXEL, PIXEL),
        orientation=(*row, *col),
        positions=positions,
        hu=hu.astype(np.int16),
        tweak=lambda k, ds: setattr(ds, "GantryDetectorTilt", f"{tilt_deg:g}"),
    )
    return folder


def _lung_points(vol) -> np.ndarray:
    """(i, j, k) of voxels at lung HU (every fifth), a voxel or more inside what the images measured (the edge voxels
    blend the slab with the -1024 HU fill)."""
    arr = np.asarray(vol.array)
    lung = (arr > -950.0) & (arr < -700.0)
    measured = measured_mask(vol.geometry, vol.metadata)
    if measured is not None:
        lung &= ndimage.binary_erosion(measured, structure=np.ones((1, 3, 3), bool))
    return np.argwhere(lung)[::5, ::-1].astype(np.float64)


def test_lungs_cut_at_a_tilted_images_edge_stay_in_the_detectors_lung_search(tmp_path):
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    measured = measured_mask(tilted.geometry, tilted.metadata)
    assert measured is not None and not measured.all()
    # the wedge beyond the coarse grid's rounding (the search samples every 2nd voxel: 4 mm)
    wedge = ndimage.binary_erosion(~measured, structure=np.ones((1, 5, 5), bool), border_value=1)
    unmeasured_ijk = np.argwhere(wedge)[:, ::-1]
    assert len(unmeasured_ijk) > 0.5 * np.count_nonzero(~measured)
    for find in (quick_lung_mask, lambda v: segmented_lung_region(v, device="cpu")):
        before = find(straight).near(_lung_points(straight), 2.0).mean()
        region = find(tilted)
        assert before > 0.85
        assert region.near(_lung_points(tilted), 2.0).mean() > before - 0.05
        assert not region.near(unmeasured_ijk, 0.0).any()  # the wedge is never lung
