"""Findings reported with the lung restriction on reach the segmented lungs: a nodule bulging from the pleura does,
a blob in the mediastinum or chest wall, its centre farther from the lungs than its own radius, does not.

The synthetic chest has two air-filled lungs parted by a 24 mm mediastinum; a dense blob (6 mm, 200 HU) lies in the
mediastinum 7 mm from the right lung's edge, and a 10 mm nodule bulges from the right lung's lateral pleura. The
real-scan check measures every reported finding of the COPDGene chest (4.2 mm pixels) and the planning chest
against the reconstruction's segmented lungs.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.detection.findings import Finding, Findings
from pipeline.detection.postprocess import limit_to_lungs
from pipeline.volume import CTVolume, Geometry, float3


def _ball(shape: tuple[int, int, int], centre_kji: tuple[float, float, float], radius_vox: np.ndarray) -> np.ndarray:
    kji = np.indices(shape).astype(np.float64)
    d2 = sum(((kji[a] - centre_kji[a]) / radius_vox[a]) ** 2 for a in range(3))
    return np.asarray(d2 <= 1.0)


def _chest() -> tuple[CTVolume, dict[str, tuple[float, float, float]]]:
    """A 40 x 64 x 64 chest (2 x 2 x 2.5 mm, LPS): lungs at i 8..25 and 38..55, mediastinum between; the centres
    (source index i, j, k) of a mediastinal blob and of a juxtapleural nodule."""
    hu = np.full((40, 64, 64), -1000.0, np.float32)
    hu[2:38, 8:56, 2:62] = 40.0  # body
    hu[6:34, 16:48, 8:26] = -850.0  # right lung (small x)
    hu[6:34, 16:48, 38:56] = -850.0  # left lung
    spacing_kji = np.array([2.5, 2.0, 2.0])
    blob = (29.0, 32.0, 20.0)  # (i, j, k): centre 3.5 voxels (7 mm) from the right lung's medial face (i = 25.5)
    pleural = (8.0, 32.0, 20.0)  # on the right lung's lateral face (i = 7.5): half the nodule in the lung
    hu[_ball(hu.shape, blob[::-1], 3.0 / spacing_kji)] = 200.0
    hu[_ball(hu.shape, pleural[::-1], 5.0 / spacing_kji)] = 30.0
    geom = Geometry(hu.shape, (2.0, 2.0, 2.5), (-64.0, -64.0, -50.0))
    return CTVolume(hu, geom), {"mediastinal blob": blob, "juxtapleural nodule": pleural}


def _finding(volume: CTVolume, ijk: tuple[float, float, float], diameter_mm: float, score: float) -> Finding:
    centre = volume.geometry.index_to_lps(np.asarray(ijk, dtype=np.float64))
    half = diameter_mm / 2.0
    return Finding(
        center_lps=float3(centre),
        box_min_lps=float3(centre - half),
        box_max_lps=float3(centre + half),
        diameter_mm=diameter_mm,
        score=score,
        voxel_ijk=(int(ijk[0]), int(ijk[1]), int(ijk[2])),
        slice_number=int(ijk[2]) + 1,
    )


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


def test_a_blob_in_the_mediastinum_is_dropped_and_a_juxtapleural_nodule_kept(detector):
    vol, centres = _chest()
    region, roi = detector.lung_roi(vol)  # the quick mask, limited to the lungs the detector segments
    assert roi is not None and region.limit is not None
    blob = _finding(vol, centres["mediastinal blob"], 6.0, 0.9)
    pleural = _finding(vol, centres["juxtapleural nodule"], 10.0, 0.8)
    found = Findings([blob, pleural], restricted_to_lungs=True)
    kept = limit_to_lungs(vol, found, region, margin_mm=detector.config.lung_filter_margin_mm)
    assert [f.diameter_mm for f in kept.candidates] == [10.0], "the mediastinal blob must go, the pleural nodule stay"
    # the blob is 7 mm from the lungs, more than its 3 mm radius: its edge lies 4 mm inside the mediastinum
    assert region.limit_distance_mm(np.array([centres["mediastinal blob"]]))[0] > 3.0


def test_the_limit_reach_is_the_findings_radius_whatever_the_voxel_size():
    """On a coarse grid (4.2 mm pixels, the COPDGene chest's) a finding one voxel beyond the lungs' face is kept only
    when its radius reaches that face; distances are to the faces of the blocks the coarse voxels stand for."""
    from pipeline.detection.lungs import LungRegion

    mask = np.zeros((10, 12, 12), bool)
    mask[2:8, 3:9, 2:6] = True  # lung: source i 2..5 (stride 1), face at i = 5.5
    searched = mask.copy()
    searched[2:8, 3:9, 2:9] = True  # the search reaches past the lung (the threshold mask is grown)
    region = LungRegion(searched, (1, 1, 1), (4.2, 4.2, 4.0)).limited_to(LungRegion(mask, (1, 1, 1), (4.2, 4.2, 4.0)))
    ijk = np.array([[6.0, 5.0, 5.0], [7.0, 5.0, 5.0], [4.0, 5.0, 5.0]])  # 0.5, 1.5 voxels out; inside
    np.testing.assert_allclose(region.limit_distance_mm(ijk), [2.1, 6.3, 0.0], atol=1e-9)
    np.testing.assert_array_equal(region.keeps(ijk, 8.0, radius_mm=np.array([3.0, 3.0, 0.0])), [True, False, True])
    np.testing.assert_array_equal(region.keeps(ijk, 8.0, radius_mm=np.array([2.0, 7.0, 0.0])), [False, True, True])
    assert not region.keeps(ijk[1:2], 5.0, radius_mm=np.array([7.0]))[0]  # never beyond the filter margin


def test_block_distances_match_a_fine_distance_transform():
    """Distances to the blocks of a coarse mask equal the fine grid's distance transform to those blocks' voxels."""
    from pipeline.detection.lungs import LungRegion

    rng = np.random.default_rng(5)
    coarse = ndimage.binary_opening(rng.random((8, 9, 10)) > 0.6)
    coarse[3:5, 3:6, 4:7] = True
    stride = (2, 3, 2)  # (k, j, i)
    spacing = (1.1, 1.3, 2.0)  # (i, j, k) mm
    region = LungRegion(coarse, stride, spacing).limited_to(LungRegion(coarse, stride, spacing))
    fine = coarse.repeat(2, 0).repeat(3, 1).repeat(2, 2)
    edt = ndimage.distance_transform_edt(~fine, sampling=[2.0, 1.3, 1.1])
    kji = rng.integers(0, fine.shape, size=(200, 3))
    got = region.limit_distance_mm(kji[:, ::-1].astype(float))
    # a fine voxel centre's distance to the blocks' faces is its EDT to the nearest block voxel less half a voxel
    # per axis it is out on: bounded by the EDT and the EDT less half the fine voxel's diagonal
    want = edt[tuple(kji.T)]
    assert np.all(got <= want + 1e-9) and np.all(got >= want - 0.5 * np.linalg.norm([2.0, 1.3, 1.1]) - 1e-9)
    assert np.all((got == 0) == (want == 0))


def _lung_reach(
    case_volume: CTVolume, findings: Findings, segmented: dict[str, np.ndarray] | None = None
) -> list[tuple[int, float, float, float]]:
    """(number, score, distance mm, radius mm) of each reported finding to the reconstruction's segmented lungs
    (``segmented``: the reconstruction's masks already made, bool ``[k, j, i]`` by organ; else the lungs segmented here)."""
    from pipeline.reconstruction.segment import segment_organs

    if segmented is None:  # the reconstruction's segmentation (its masks; no meshes needed here)
        segmented = segment_organs(case_volume, organs=["lung_left", "lung_right"], device="cpu").masks
    lungs = np.logical_or.reduce([np.asarray(segmented[o]) > 0 for o in ("lung_left", "lung_right")])
    from pipeline.detection.lungs import LungRegion

    region = LungRegion(lungs, (1, 1, 1), case_volume.spacing, size_ijk=case_volume.geometry.size_ijk)
    region = region.limited_to(region)
    ijk = case_volume.lps_to_index(np.array([f.center_lps for f in findings])) if len(findings) else np.zeros((0, 3))
    dist = region.limit_distance_mm(ijk) if len(findings) else np.zeros(0)
    return [(n + 1, f.score, float(d), f.diameter_mm / 2.0) for n, (f, d) in enumerate(zip(findings, dist))]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["copdgene", "rt_planning_chest"])
def test_real_chest_findings_reach_the_segmented_lungs(case, tmp_path_factory):
    """Every finding at the operating point lies inside the reconstruction's lungs or within its own radius of them
    (the COPDGene chest's hilar finding at LPS (-32.5, -139.3, -172.9) lay one 4.2 mm pixel outside)."""
    from pipeline.detection import detect, load_findings
    from pipeline.ingest import load_series
    from tests._support.real_ct import detected_rt_planning_chest, require_real_ct, segmented_rt_planning_chest

    root = require_real_ct()
    folder = {"copdgene": "cip_copdgene_chest_64/ct-64Dicom", "rt_planning_chest": "chest_ct_rt_planning_dicom"}[case]
    volume = load_series(root / folder)
    segmented = None
    if case == "rt_planning_chest":  # ctpipe detect's findings (the model's operating point) and the segmented lungs,
        found = load_findings(detected_rt_planning_chest(tmp_path_factory) / "c.findings.json")  # once for the suite
        segmented = segmented_rt_planning_chest(tmp_path_factory)
    else:
        found = detect(volume)
    assert len(found) > 0
    far = [r for r in _lung_reach(volume, found, segmented) if r[2] > r[3] + 1e-6]
    assert not far, f"{case}: findings (number, score, distance mm, radius mm) outside the lungs: {far}"
