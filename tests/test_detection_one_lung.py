"""The detector after a pneumonectomy: it searches the remaining lung (its nodules are found, the one in the part
that crosses the midline too) and each finding keeps that lung's side (LPS: +x is the patient's left)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.dicom_out import lung_side_masks
from pipeline.phantom import Confounders, generate_phantom
from pipeline.reconstruction.nodule_geometry import lung_side

GRID = dict(matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=4, nodule_diameter_mm=(8.0, 14.0))
MATCH_MM = 6.0


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize(("side", "seed"), [("left", 33), ("right", 30)])
def test_nodules_of_the_remaining_lung_are_found_with_its_side(detector, side, seed):
    ph = generate_phantom(seed, confounders=Confounders(pneumonectomy=side), **GRID)
    kept = "right" if side == "left" else "left"
    findings = detector.detect(ph.volume)
    assert findings.reason is None
    centres = np.array([f.center_lps for f in findings.findings])
    sides = lung_side_masks(ph.volume, device="cpu")
    assert f"lung_{side}" not in sides
    found = []
    for nodule in ph.nodules:
        c = np.asarray(nodule.center_lps)
        if np.linalg.norm(centres - c, axis=1).min() <= max(MATCH_MM, nodule.diameter_mm / 2):
            found.append(nodule)
            assert lung_side(c, ph.volume.geometry, sides) == kept, nodule
    assert len(found) >= 3, [(n.center_lps, n.diameter_mm) for n in ph.nodules]
    if side == "left":  # this seed's 11 mm nodule lies across the midline (x > 0) in the right lung
        across = [n for n in found if n.center_lps[0] > 0]
        assert across and all(n.lung == "lung_right" for n in across)
    for f in findings.findings:  # no finding in the emptied hemithorax
        assert lung_side(np.asarray(f.center_lps), ph.volume.geometry, sides) == kept, f.center_lps


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_small_collapsed_lung_is_searched(side):
    """A lung collapsed to about 5 % of the other (the threshold mask's largest components leave it out) is searched
    and its findings kept: the segmented lungs hold it."""
    from pipeline.detection.infer_input import lung_region
    from pipeline.detection.lungs import region_from_mask
    from tests.test_reconstruction_one_lung import shrunk_remnant

    ph = generate_phantom(
        21,
        confounders=Confounders(table="curved", bowel_gas=True, collapsed_lung=side),
        matrix=128,
        pixel_spacing=2.0,
        slice_spacing=4.0,
        n_nodules=0,
    )
    volume, remnant = shrunk_remnant(ph, side, 0.25)
    region = lung_region(volume, None, device="cpu")
    want = region_from_mask(remnant, volume).mask
    assert region.limit is not None
    searched = (region.mask & region.limit & want).sum() / want.sum()
    # the coarse segmentation holds 65-75 % of the voxels the remnant's mask touches (a 4 mm grid of block means)
    assert searched >= 0.6, f"{searched:.0%} of the collapsed {side} lung searched"
    other = region_from_mask(ph.masks[f"lung_{'right' if side == 'left' else 'left'}"], volume).mask
    assert (region.mask & region.limit & other).sum() >= 0.8 * other.sum()  # the other lung as before
    assert not (region.limit & region_from_mask(ph.masks["bowel_gas"], volume).mask & ~want & ~other).any()
