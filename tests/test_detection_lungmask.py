"""The lungs detection keeps its findings in: a lung mask given to the detector, else the lungs it segments itself.

The search (network input, small-blob candidates) is the detector's quick threshold mask's in every path (the
search its operating point was calibrated with); the lungs drop the findings outside them. ``ctpipe run`` limits
them as ``ctpipe detect`` does, to the detector's own lungs, whatever lung mask the reconstruction kept.
The synthetic chest below has two air-filled "lungs" (right: small i, left: large i); the case mask names only
the right one, so a search with the quick mask alone would reach the left lung.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.detection.lungs import segmented_lung_region
from pipeline.volume import CTVolume, Geometry


def _chest() -> tuple[CTVolume, np.ndarray]:
    """A 40 x 64 x 64 volume (2.5 x 2 x 2 mm): soft-tissue body, two air lungs; the right lung's mask."""
    hu = np.full((40, 64, 64), -1000.0, np.float32)
    hu[2:38, 8:56, 4:60] = 40.0  # body
    hu[6:34, 16:48, 8:28] = -850.0  # right lung (patient's right: small x, small i)
    hu[6:34, 16:48, 36:56] = -850.0  # left lung
    right = np.zeros(hu.shape, bool)
    right[6:34, 16:48, 8:28] = True
    geom = Geometry(hu.shape, (2.0, 2.0, 2.5), (-64.0, -64.0, -50.0))
    return CTVolume(hu, geom), right


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


def test_lung_roi_limits_the_findings_to_the_case_mask_and_searches_the_quick_mask(detector):
    vol, right = _chest()
    region, roi = detector.lung_roi(vol, lung_mask=right, margin_mm=0.0)
    quick, roi_quick = detector.lung_roi(vol, margin_mm=0.0)  # bare volume: the quick threshold mask finds both lungs
    assert roi_quick is not None and roi_quick.hi[0] >= 52
    # ... and the lung segmentation limits the findings to both lungs
    assert quick.limit is not None and np.array_equal(quick.limit, quick.mask & segmented_lung_region(vol).mask)
    # the search (candidates, network input) is the quick mask's, whatever the case mask
    assert np.array_equal(region.mask, quick.mask)
    assert roi is not None and (roi.lo, roi.hi) == (roi_quick.lo, roi_quick.hi)
    # the findings kept: the right lung only
    left_lung, right_lung = np.array([[46.0, 32.0, 20.0]]), np.array([[16.0, 32.0, 20.0]])  # (i, j, k)
    assert quick.keeps(left_lung, 4.0)[0] and not region.keeps(left_lung, 4.0)[0] and region.keeps(right_lung, 0.0)[0]
    assert region.near(left_lung, 0.0)[0]  # searched there all the same


def test_without_a_case_mask_bowel_gas_below_the_lungs_is_searched_but_never_reported(detector):
    """Pure gas (colon, -1000 HU) below the lungs: the quick threshold mask holds it, the segmented lungs do not."""
    vol, _ = _chest()
    hu = np.array(vol.array)
    hu[3:5, 12:52, 6:58] = -1000.0  # gas under the lung bases (small k = inferior), a 2.5 mm diaphragm between
    gas_vol = CTVolume(hu, vol.geometry)
    region, roi = detector.lung_roi(gas_vol, margin_mm=0.0)
    gas = np.array([[32.0, 32.0, 3.0]])  # (i, j, k): in the gas, 7.5 mm below the lung bases
    lungs = np.array([[16.0, 32.0, 20.0], [46.0, 32.0, 20.0]])
    assert roi is not None and region.near(gas, 0.0)[0]  # searched there (the calibrated search)
    assert region.limit is not None and not region.keeps(gas, 0.0)[0] and region.keeps(lungs, 0.0).all()


def test_gas_alone_is_not_searched_and_the_reason_says_so(detector):
    """Pure gas in the body (an abdomen below the lungs): the threshold mask holds it, the segmentation finds no lung."""
    vol, _ = _chest()
    gas = CTVolume(np.where(np.asarray(vol.array) < -500, np.float32(-1000.0), vol.array), vol.geometry)
    found = detector.detect(gas)
    assert len(found) == 0 and not found.candidates
    assert found.reason is not None and found.reason.startswith("no lungs found in the series") and "gas" in found.reason


def test_a_case_mask_limits_the_quick_mask_and_never_widens_it(detector):
    from pipeline.detection.lungs import quick_lung_mask, region_from_mask

    vol, right = _chest()
    quick = quick_lung_mask(vol)
    generous = right.copy()
    generous[6:34, 16:48, 8:36] = True  # the right lung and the soft tissue up to the left lung (mediastinum)
    region, _ = detector.lung_roi(vol, lung_mask=generous, margin_mm=0.0)
    assert region.limit is not None and np.array_equal(region.limit, quick.mask & region_from_mask(generous, vol).mask)
    assert int(region.limit.sum()) < int(region_from_mask(generous, vol).mask.sum())
    mediastinum = np.array([[32.0, 32.0, 20.0]])  # (i, j, k): soft tissue between the lungs, in the case mask
    assert not region.keeps(mediastinum, 0.0)[0]
    # a mask that misses the air entirely (e.g. one made for another series) is searched as it is, with a warning
    body_only = np.zeros(vol.shape, bool)
    body_only[2:6, 8:16, 4:60] = True
    alone, roi = detector.lung_roi(vol, lung_mask=body_only, margin_mm=0.0)
    assert roi is not None and np.array_equal(alone.mask, region_from_mask(body_only, vol).mask)
    # an empty case mask (no lungs segmented): no search at all, though the quick mask finds air
    none, roi = detector.lung_roi(vol, lung_mask=np.zeros(vol.shape, bool), margin_mm=0.0)
    assert none.empty and roi is None
    found = detector.detect(vol, lung_mask=np.zeros(vol.shape, bool))
    assert len(found) == 0 and "no lung" in found.reason


def test_runner_load_limits_to_the_detectors_own_lungs_as_detect_does_whatever_mask_the_case_keeps(tmp_path, detector):
    import torch

    from pipeline.cache import CaseCache
    from pipeline.config import load_config
    from pipeline.runner.model_stages import _Loading
    from pipeline.runner.recon_stages import save_lung_mask
    from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

    vol, right = _chest()
    cfg = load_config(overrides={"detector.lung_restriction": True}, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=tmp_path)
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(tmp_path))
    ctx = CaseContext(case=spec, attempt=0, workdir=tmp_path / "work", worker=worker)
    CaseCache(worker.cache_dir).write("c1", vol)

    bare = _Loading(worker)(ctx)  # no case mask kept
    save_lung_mask(worker.cache_dir, "c1", right)  # the reconstruction's lungs (here the right one alone)
    item = _Loading(worker)(ctx)
    assert item["region"] is item["lungs"]  # lung restriction on: findings are restricted to the lungs
    # the lungs `ctpipe detect` limits its candidates to, kept mask or not: the same candidates in both commands
    region, _ = detector.lung_roi(vol)
    for got in (bare, item):
        assert got["lungs"].limit is not None and np.array_equal(got["lungs"].limit, region.limit)
    # the model input is the one `ctpipe detect` gives the network: the quick mask's box
    assert torch.equal(item["case"].unwrap(), bare["case"].unwrap())


def test_quick_mask_keeps_a_lung_cut_by_a_small_field_of_view_and_drops_a_table_foam_core():
    from pipeline.detection.lungs import quick_lung_mask

    rng = np.random.default_rng(0)
    hu = np.full((40, 64, 64), 40.0, np.float32)  # small field of view: the body fills the image
    hu[:, :4, :] = -1000.0  # air in front of the patient, across the whole width
    hu[6:34, 16:48, 0:24] = -850.0  # right lung, cut by the image's left edge
    hu[6:34, 16:48, 36:56] = -850.0  # left lung, inside the body
    hu[:, 56:60, :] = -880.0  # a table's foam core below the patient, from side to side
    hu += rng.normal(0.0, 15.0, hu.shape).astype(np.float32)
    vol = CTVolume(hu, Geometry(hu.shape, (2.0, 2.0, 2.5), (-64.0, -64.0, -50.0)))
    region = quick_lung_mask(vol, step_mm=4.0)
    assert region.stride == (2, 2, 2)
    full = np.kron(region.mask, np.ones((2, 2, 2), bool))[:40, :64, :64]  # back on the source grid
    assert full[20, 30, 5] and full[20, 30, 45]  # both lungs, the cut one too
    assert not full[:, 56:60, :].any()  # never the table's foam core
    assert not full[:, :4, :].any()  # nor the air around the patient


def test_quick_mask_keeps_a_nodule_against_the_mediastinum_within_the_filter_margin():
    """Held-out evaluation phantom 247 (``scripts/train_detector.py`` ``heldout_phantom``) has a 17 mm solid nodule
    against the left hilum and mediastinal pleura. The quick mask, sampled every 4 mm, lies up to a sample inside the
    lungs' edge: it put that nodule's centre 8.9 mm from the lungs, beyond the detector's 8 mm filter margin
    (``lung_filter_margin_mm``), and the nodule was never a candidate. Every nodule must be within the margin, and
    the mask no larger than a quarter beyond the true lungs and airway sampled alike."""
    from pipeline.detection.lungs import quick_lung_mask, region_from_mask
    from tests._support.scripts import import_script

    ph = import_script("train_detector").heldout_phantom(247)
    vol = ph.volume
    region = quick_lung_mask(vol)
    centres = vol.lps_to_index(np.array([n.center_lps for n in ph.nodules]))
    assert max(n.diameter_mm for n in ph.nodules) > 17.0
    assert region.near(centres, 8.0).all()
    truth = region_from_mask(ph.masks["lung_left"] | ph.masks["lung_right"] | ph.masks["airway"], vol)
    assert region.mask.sum() <= 1.25 * truth.mask.sum()  # grown by a sample, not into the mediastinum


def test_region_from_a_dict_of_label_maps_is_the_lungs_not_the_whole_volume():
    """``reconstruct(...).masks`` is a dict of :class:`LabelMap`: its lungs, not every voxel, are the region."""
    from pipeline.detection.lungs import region_from_mask
    from pipeline.volume import LabelMap

    vol, right = _chest()
    left = np.zeros_like(right)
    left[6:34, 16:48, 36:56] = True
    masks = {
        "lung_right": LabelMap(right.astype(np.uint8), vol.geometry, labels={1: "lung_right"}),
        "lung_left": LabelMap(left.astype(np.uint8), vol.geometry, labels={1: "lung_left"}),
        "heart": LabelMap(np.ones(right.shape, np.uint8), vol.geometry, labels={1: "heart"}),
    }
    from_maps = region_from_mask(masks, vol)
    from_array = region_from_mask(right | left, vol)
    assert np.array_equal(from_maps.mask, from_array.mask)
    assert from_maps.mask.sum() < 0.5 * from_maps.mask.size  # the lungs, not the whole grid
    # keys in any case; a dict naming no lung, a mask on another grid and a file name are refused, not taken as empty
    assert np.array_equal(region_from_mask({"Lungs": right | left}, vol).mask, from_array.mask)
    from pipeline.errors import GeometryError

    with pytest.raises(GeometryError, match=r"no key .* names a lung \(keys: \['left', 'right'\]\)"):
        region_from_mask({"left": left, "right": right}, vol)
    far = LabelMap(right.astype(np.uint8), vol.geometry.with_(origin=(500.0, 500.0, 500.0)), labels={1: "lungs"})
    with pytest.raises(GeometryError, match="another grid than the volume"):
        region_from_mask(far, vol)
    with pytest.raises(GeometryError, match="is a str, not an array"):
        region_from_mask("lungs.nii.gz", vol)  # type: ignore[arg-type]


def test_the_lung_roi_of_a_reconstruction_is_that_of_its_lung_masks(detector):
    """``detect(vol, lung_mask=reconstruct(vol))``: the reconstruction itself gives its lungs, as its ``masks`` do."""
    from pipeline.reconstruction import reconstruct

    vol, right = _chest()
    rec = reconstruct(vol, organs="lung_left,lung_right", render=False)
    assert rec.mask("lung_right").any() and rec.mask("lung_left").any()
    region, roi = detector.lung_roi(vol, lung_mask=rec, margin_mm=0.0)
    same, same_roi = detector.lung_roi(vol, lung_mask=rec.masks, margin_mm=0.0)
    assert region.limit is not None and np.array_equal(region.limit, same.limit)
    assert roi is not None and same_roi is not None and (roi.lo, roi.hi) == (same_roi.lo, same_roi.hi)


def test_real_abdomen_with_the_lung_bases_reports_nothing_in_the_bowel(detector, caplog):
    """The real TotalSegmentator abdomen (122 x 101 x 112 at 3 mm; lung bases at its top, colon and bowel gas below):
    the quick threshold mask holds the colon's gas, and before the segmented lungs limited the findings the demo model
    reported three findings in the colon. Every candidate now lies within the filter margin of the reference lungs."""
    from scipy import ndimage

    from tests._support.real_ct import totalseg_abdomen

    case = totalseg_abdomen()  # skips with a reason when ../shared/real_ct is absent
    vol, ref = case.volume, case.reference
    with caplog.at_level(logging.INFO, logger="pipeline.detection"):
        found = detector.detect(vol, case_id=case.name)
    assert found.reason is None and found.candidates, "the lung bases are searched"
    # the colon's gas outweighs the lung bases in the threshold mask: expected here, said once, and no warning
    said = [r for r in caplog.records if r.name == "pipeline.detection.infer_input"]
    assert [(r.levelname, "bowel gas" in r.getMessage()) for r in said] == [("INFO", True)]
    lungs = ref["lung_left"] | ref["lung_right"]
    dist_mm = ndimage.distance_transform_edt(~lungs, sampling=vol.spacing[::-1])
    ijk = np.rint(vol.lps_to_index(np.array([f.center_lps for f in found.candidates]))).astype(int)
    far = dist_mm[ijk[:, 2], ijk[:, 1], ijk[:, 0]]
    margin = detector.config.lung_filter_margin_mm + 4.0  # the coarse 4 mm grid of the limit
    assert far.max() <= margin, f"{int((far > margin).sum())} candidates up to {far.max():.0f} mm from the lungs"
    assert not ref["gas_organs"][ijk[:, 2], ijk[:, 1], ijk[:, 0]].any()


def test_distances_to_the_lungs_are_the_euclidean_distance_transform_and_nothing_is_near_an_empty_mask():
    from scipy import ndimage

    from pipeline.detection.lungs import LungRegion

    rng = np.random.default_rng(3)
    mask = ndimage.binary_opening(rng.random((14, 18, 22)) > 0.8) | (rng.random((14, 18, 22)) > 0.995)
    mask[5:9, 6:12, 4:9] = True
    region = LungRegion(mask, (2, 3, 3), (1.3, 1.3, 2.0))  # coarse voxels 4 x 3.9 x 3.9 mm (k, j, i)
    edt = ndimage.distance_transform_edt(~mask, sampling=np.array([2.0, 1.3, 1.3]) * [2, 3, 3])
    kji = np.argwhere(np.ones(mask.shape, bool))
    ijk = kji[:, ::-1] * np.array([3, 3, 2])  # the source index each coarse voxel stands for
    for margin in (0.0, 3.0, 5.0, 8.0, 12.5):  # none on a distance the grid has (rounding could tip it)
        np.testing.assert_array_equal(region.near(ijk, margin), edt[tuple(kji.T)] <= margin)
    empty = LungRegion(np.zeros_like(mask), (2, 3, 3), (1.3, 1.3, 2.0))
    assert not empty.near(ijk, 1e6).any()
    assert not region.limited_to(empty).keeps(ijk, 1e6).any()


def test_median_of_each_border_component_is_ndimage_median():
    from scipy import ndimage

    from pipeline.detection.lungs import _label_medians

    rng = np.random.default_rng(5)
    hu = rng.normal(-900.0, 80.0, (12, 30, 30)).astype(np.float32)
    labels, n = ndimage.label(hu < -950.0)
    index = np.unique(labels[:, 0, :])[1:]
    assert n > 20 and len(index) > 5
    np.testing.assert_array_equal(_label_medians(hu, labels, index), ndimage.median(hu, labels, index=index))


@pytest.mark.parametrize("flips", [(True, False, False), (False, True, True), (True, True, True)], ids=["i", "jk", "ijk"])
def test_the_lung_region_is_the_same_whatever_the_storage_order(flips):
    """The same chest stored with columns, rows or slices in the other order (feet first, prone, mirrored rows): the
    coarse lung grid samples the same positions, so the network's input box (LPS mm) and the inside/outside test do
    not move (sampled from voxel 0 of the storage order, the box moved by a voxel and the planning chest's findings
    went from 6 to 8)."""
    from pipeline.detection.lungs import quick_lung_mask, region_from_mask

    vol, right = _chest()
    axes = tuple(2 - c for c in range(3) if flips[c])
    other = CTVolume(np.flip(vol.array, axes).copy(), vol.geometry.flipped(flips))
    probe = np.array([[10.0, 20.0, 7.0], [27.0, 30.0, 20.0], [28.0, 30.0, 20.0], [35.0, 15.0, 5.0], [7.0, 47.0, 33.0]])
    np.testing.assert_allclose(vol.index_to_lps(probe), other.index_to_lps(other.lps_to_index(vol.index_to_lps(probe))))
    builds = {
        "quick": quick_lung_mask,
        "segmented": lambda v: segmented_lung_region(v, device="cpu"),
        "given": lambda v: region_from_mask(right if v is vol else np.flip(right, axes).copy(), v),
    }
    for name, build in builds.items():
        a, b = build(vol), build(other)
        boxes = []
        for v, region in ((vol, a), (other, b)):
            lo, hi = region.bbox_ijk(5.0, v.geometry.size_ijk)
            corners = v.index_to_lps(np.array([lo, np.asarray(hi) - 1], float))
            boxes.append(np.sort(corners, axis=0))  # the box's LPS extent
        np.testing.assert_allclose(boxes[0], boxes[1], err_msg=name)
        lps = vol.index_to_lps(probe)
        for margin in (0.0, 4.0):
            near_a = a.near(vol.geometry.lps_to_index(lps), margin)
            near_b = b.near(other.geometry.lps_to_index(lps), margin)
            np.testing.assert_array_equal(near_a, near_b, err_msg=name)
