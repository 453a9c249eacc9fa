"""Air outside the body is never lung, whatever the patient's position: in a prone (HFP) scan with a blanket, the air
between the table under the anterior chest and the body spans the image from side to side; on the detector's coarse
grid (4 mm blocks, whose means read that air mixed with the table's foam as about -880 HU, like lung) it was taken
for the largest lung (about 24,000 coarse voxels in front of the chest)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import ndimage

from pipeline.detection.lungs import region_from_mask, segmented_lung_region
from pipeline.phantom import generate_phantom
from pipeline.phantom.confounders import realistic_confounders
from pipeline.reconstruction.organs import SegmentParams
from pipeline.reconstruction.segment import segment_organs
from pipeline.volume import CTVolume


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


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFP", "HFS"])
def test_the_body_and_lungs_hold_no_air_from_outside_the_skin(position):
    """The organ segmentation's body (volume, skin outline in the renderings, the region the lungs and airway are
    searched in) and its lungs leave out the air around the patient, the table's foam core and the air between the
    table's shells, prone or supine, on a curved table under a mattress and a blanket."""
    c = realistic_confounders(1)
    ph = generate_phantom(
        1, confounders=c, patient_position=position, matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    seg = segment_organs(ph.volume, organs=("body", "lung_left", "lung_right"), device="cpu")
    assert not seg.errors, seg.errors
    hu = np.asarray(ph.volume.array)
    skin = ph.masks["body"].astype(bool)
    body = seg.masks["body"]
    air_outside = body & ~skin & (hu < -500.0)
    assert not air_outside.any(), f"{int(air_outside.sum())} voxels of air outside the skin inside the body"
    assert 0.95 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"
    lungs = seg.masks["lung_left"] | seg.masks["lung_right"]
    assert not (lungs & ~skin).any(), f"{int((lungs & ~skin).sum())} voxels of lung outside the skin"
    truth = ph.masks["lung_left"].astype(bool) | ph.masks["lung_right"].astype(bool)
    assert lungs.sum() >= 0.9 * truth.sum()  # the lungs themselves are still found


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFP", "HFS"])
def test_the_table_is_left_out_of_the_body_at_coarse_working_pixels(position):
    """On 4 mm working pixels (a coarse, low-dose or old series) the table is still found: at such pixels only the
    lower shell looks thin and a few thin bits of the patient's edge count as shell; the body once took in the
    mattress, the table's foam core and the air between its shells (+53 %)."""
    c = realistic_confounders(1)
    ph = generate_phantom(
        1, confounders=c, patient_position=position, matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    params = SegmentParams(work_voxel_mm=4.0, work_min_voxels=1)
    seg = segment_organs(ph.volume, organs=("body",), device="cpu", params=params)
    assert not seg.errors, seg.errors
    assert seg.info["work_factors_kji"] == str((1, 2, 2))
    hu = np.asarray(ph.volume.array)
    skin = ph.masks["body"].astype(bool)
    body = seg.masks["body"]
    air_outside = body & ~skin & (hu < -500.0)
    assert not air_outside.any(), f"{int(air_outside.sum())} voxels of air outside the skin inside the body"
    assert 0.95 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFP", "HFS"])
@pytest.mark.parametrize(("work_mm", "factors"), [(6.0, (2, 3, 3)), (8.0, (2, 4, 4))])
def test_the_table_and_mattress_are_left_out_of_the_body_on_a_6_or_8mm_working_grid(position, work_mm, factors):
    """On a configured 6 or 8 mm working grid the mattress and the table's upper shell blur into one layer of tissue
    under the patient and the lower shell into the foam: no table was found there, and the body took in the
    mattress and some of the air between the shells (+14 % and 486 voxels of air at 6 mm, prone)."""
    c = realistic_confounders(1)
    ph = generate_phantom(
        1, confounders=c, patient_position=position, matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0
    )
    params = SegmentParams(work_voxel_mm=work_mm, work_min_voxels=1)
    seg = segment_organs(ph.volume, organs=("body",), device="cpu", params=params)
    assert not seg.errors, seg.errors
    assert seg.info["work_factors_kji"] == str(factors)
    hu = np.asarray(ph.volume.array)
    skin = ph.masks["body"].astype(bool)
    table = ph.masks["table"].astype(bool)
    body = seg.masks["body"]
    air_outside = body & ~skin & (hu < -500.0)
    assert not air_outside.any(), f"{int(air_outside.sum())} voxels of air outside the skin inside the body"
    assert (body & table).sum() <= 0.01 * skin.sum(), f"{int((body & table).sum())} voxels of table or mattress in the body"
    assert 0.95 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"


@pytest.mark.slow
def test_the_table_is_left_out_of_a_native_64x64_series_at_4mm_pixels():
    """A series reconstructed on 64x64 pixels of 4 mm (the prone phantom's 2 mm pixels averaged in 2x2 blocks, as
    the scanner's coarser pixels read them), segmented with the default parameters: the body once took in the
    mattress, the table's foam core and the air between its shells."""
    ph = generate_phantom(
        1,
        confounders=realistic_confounders(1),
        patient_position="HFP",
        matrix=128,
        pixel_spacing=2.0,
        slice_spacing=4.0,
        n_nodules=0,
    )
    geom = ph.volume.geometry
    nk, nj, ni = ph.volume.array.shape
    hu = np.asarray(ph.volume.array, dtype=np.float32).reshape(nk, nj // 2, 2, ni // 2, 2).mean(axis=(2, 4))
    skin = ph.masks["body"].astype(np.float32).reshape(nk, nj // 2, 2, ni // 2, 2).mean(axis=(2, 4)) >= 0.5
    d = np.asarray(geom.direction)
    origin = np.asarray(geom.origin) + 0.5 * (d[:, 0] * geom.spacing[0] + d[:, 1] * geom.spacing[1])
    coarse = dataclasses.replace(
        geom,
        shape=hu.shape,
        spacing=(2 * geom.spacing[0], 2 * geom.spacing[1], geom.spacing[2]),
        origin=(float(origin[0]), float(origin[1]), float(origin[2])),
    )
    seg = segment_organs(CTVolume(hu, coarse), organs=("body",), device="cpu")
    assert not seg.errors, seg.errors
    assert seg.info["work_factors_kji"] == str((1, 1, 1))
    body = seg.masks["body"]
    air_outside = body & ~skin & (hu < -500.0)
    assert not air_outside.any(), f"{int(air_outside.sum())} voxels of air outside the skin inside the body"
    assert 0.9 * skin.sum() <= body.sum() <= 1.01 * skin.sum(), f"body {int(body.sum())} voxels, skin {int(skin.sum())}"
