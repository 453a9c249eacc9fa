"""Air outside the body is never lung, whatever the patient's position: in a prone (HFP) scan with a blanket, the air
between the table under the anterior chest and the body spans the image from side to side; on the detector's coarse
grid (4 mm blocks, whose means read that air mixed with the table's foam as about -880 HU, like lung) it was taken
for the largest lung (about 24,000 coarse voxels in front of the chest)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.detection.lungs import region_from_mask, segmented_lung_region
from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import realistic_confounders


@pytest.mark.slow
def test_the_air_between_a_prone_patient_and_the_table_is_not_lung():
    c = realistic_confounders(1)
    assert c.table == "curved" and c.blanket  # the air gap under the anterior chest, closed by the blanket
    ph = generate_phantom(1, confounders=c, patient_position="HFP", matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0)
    found = segmented_lung_region(ph.volume, device="cpu")
    truth = region_from_mask(ph.masks, ph.volume)
    assert found.stride == truth.stride and found.flips == truth.flips
    near = ndimage.binary_dilation(truth.mask, iterations=2)
    outside = found.mask & ~near
    assert outside.sum() < 0.01 * truth.mask.sum(), f"{int(outside.sum())} coarse voxels of lung away from the lungs"
    labels, n = ndimage.label(found.mask)
    for lab in range(1, n + 1):
        i = np.nonzero(labels == lab)[2]
        assert i.max() - i.min() < 0.8 * found.mask.shape[2], "a 'lung' spanning the image width"
    assert found.mask.sum() >= 0.85 * truth.mask.sum()  # the lungs themselves are still found
