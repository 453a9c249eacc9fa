"""A nodule beside a tilt-corrected grid's unmeasured wedge: its lung level is read from measured voxels only.

The nodule segmentation sets its threshold half-way between the nodule and the lung around it (the median of the dark
voxels about the finding's box). Without a lung mask it took the -1024 HU wedge that no tilted image reached for lung:
the lung level fell, the threshold with it, and the nodule was measured larger than beside measured lung. The crop
it reads carries which of its voxels were measured, and the unmeasured ones now never set the level.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from pipeline.ingest.measured import measured_mask, with_measured
from pipeline.reconstruction.nodules import segment_nodule
from pipeline.volume import CTVolume, Geometry

N, WEDGE_COLUMNS, RADIUS_MM = 40, 14, 4.0


def _lung_with_nodule_beside_a_wedge() -> tuple[CTVolume, dict]:
    """1 mm voxels: noisy lung (-850 HU), a blurred solid nodule (40 HU, 4 mm radius) at the centre, and the first
    columns of every slice unmeasured (-1024 HU) as a tilted image's edge leaves them; the nodule's finding."""
    rng = np.random.default_rng(3)
    hu = -850.0 + rng.normal(0.0, 30.0, (N, N, N))
    kk, jj, ii = np.indices(hu.shape)
    ball = (kk - 20) ** 2 + (jj - 20) ** 2 + (ii - 20) ** 2 <= RADIUS_MM**2
    hu += ndimage.gaussian_filter(ball.astype(float), 0.7) * 890.0
    measured = np.ones(hu.shape, bool)
    measured[:, :, :WEDGE_COLUMNS] = False
    hu[~measured] = -1024.0
    geom = Geometry(hu.shape, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))
    vol = CTVolume(hu.astype(np.float32), geom, metadata=with_measured({}, measured))
    finding = {"center_lps": [20.0, 20.0, 20.0], "box_min_lps": [14.0, 14.0, 14.0], "box_max_lps": [26.0, 26.0, 26.0]}
    return vol, finding


def test_the_unmeasured_wedge_never_sets_a_nodules_lung_level():
    vol, finding = _lung_with_nodule_beside_a_wedge()
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None and not measured.all()
    alone = segment_nodule(vol, finding)
    in_measured = segment_nodule(vol, finding, lung_mask=measured)  # the level from the measured lung, given
    assert alone.error is None and in_measured.error is None
    assert alone.threshold_hu == in_measured.threshold_hu
    assert alone.volume_mm3 == in_measured.volume_mm3
    # about a 4 mm ball's volume (268 mm³)
    assert abs(in_measured.volume_mm3 - 4.0 / 3.0 * np.pi * RADIUS_MM**3) < 0.2 * 268.0
