"""ctpipe's detector against MONAI's own bundle pipeline: same weights, same input → same findings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.detection.bundle import LoadedModel, load_bundle
from pipeline.detection.infer import Detector
from pipeline.detection.model_config import FORMAT, model_config_from_dict
from pipeline.detection.network import box_iou_float32, build_detector, build_network
from pipeline.detection.reference import monai_detect, monai_preprocess
from pipeline.load import preprocess_volume
from tests._support.detection import SMALL_ARCH, bundle_state_dict, chest_volume, small_model, write_bundle

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _assert_same(found, ref, spacing):
    ours = found.candidates  # every candidate, reported or below the operating point: MONAI's full output
    assert len(ours) == len(ref["score"]) > 5
    c = np.array([f.center_lps for f in ours])
    s = np.array([f.score for f in ours])
    order = np.argsort(-ref["score"], kind="stable")
    np.testing.assert_allclose(s, ref["score"][order], atol=1e-3)
    dist_vox = np.abs(c - ref["center_lps"][order]) / np.asarray(spacing)
    assert dist_vox.max() < 1.0
    bmin = np.array([f.box_min_lps for f in ours])
    np.testing.assert_allclose(bmin, ref["box_min_lps"][order], atol=0.5 * min(spacing))


@pytest.mark.parametrize("direction", [np.eye(3), np.diag([-1.0, 1.0, -1.0]), np.array([[0, 1.0, 0], [1.0, 0, 0], [0, 0, 1.0]])])
@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_preprocess_equals_monai_transforms(direction, dtype):
    vol = chest_volume(shape_kji=(23, 41, 37), spacing=(0.77, 0.9, 1.25), direction=direction, dtype=dtype)
    model = LoadedModel(
        model_config_from_dict(
            {
                "format": FORMAT,
                "spacing_mm_ras": [1.5, 1.5, 2.0],
                "intensity_window": {"a_min": -1024, "a_max": 300, "b_min": 0, "b_max": 1, "clip": True},
                "network": {},
                "anchors": {},
                "box_selector": {},
                "sliding_window": {"roi_size": [8, 8, 8]},
                "size_divisible": [16, 16, 8],
            },
            where=__import__("pathlib").Path("x.json"),
        ),
        torch.nn.Identity(),
    )
    ref = monai_preprocess(model.config, volume=vol)
    spec = model.config.preprocess_spec(size_divisible=(1, 1, 1))
    for slab in (10**9, 500):  # whole volume and many small slabs give the same result
        case = preprocess_volume(vol, spec, device="cpu", slab_voxels=slab)
        ours = case.unwrap()
        assert ours.shape == ref.shape
        assert torch.allclose(ours, ref.as_tensor().float(), atol=1e-5)
        np.testing.assert_allclose(case.geometry.affine_ras, ref.affine.numpy(), atol=1e-6)


@pytest.mark.slow
def test_bundle_architecture_parity_with_monai(tmp_path):
    """Exact bundle network (ResNet-50 FPN) from a bundle folder; MetaTensor and ITK-file inputs."""
    root = write_bundle(tmp_path / "bundle")
    model = load_bundle(root)
    assert model.config.spacing == (2.0, 2.0, 2.5) and model.config.roi_size == (512, 512, 192)
    assert model.config.selector["nms_thresh"] == 0.22
    vol = chest_volume(shape_kji=(30, 48, 48), spacing=(1.6, 1.6, 2.5), direction=np.diag([1.0, -1.0, 1.0]))
    det = Detector(model=model, device="cpu", amp=False, restrict_to_lungs=False, postprocess=False)
    ours = det.detect(vol)
    assert not ours.sliding_window
    ref = monai_detect(model, volume=vol)
    _assert_same(ours, ref, model.config.spacing)
    # reported: those at or above ctpipe's operating point for bundles
    assert ours.score_threshold == 0.5 and "MONAI" in ours.threshold_source
    assert [f.score for f in ours] == [f.score for f in ours.candidates if f.score >= 0.5]
    # the same series read back by MONAI's LoadImage(ITKReader, affine_lps_to_ras=True)
    import SimpleITK as sitk

    sitk.WriteImage(vol.to_sitk(), str(tmp_path / "ct.nii.gz"))
    ref_file = monai_detect(model, image_path=tmp_path / "ct.nii.gz")
    _assert_same(ours, ref_file, model.config.spacing)


def test_sliding_window_parity_with_monai(tmp_path):
    model = small_model(tmp_path, roi=(32, 32, 16))
    vol = chest_volume(shape_kji=(30, 56, 56), spacing=(1.4, 1.4, 2.5), seed=1)
    det = Detector(model=model, device="cpu", amp=False, restrict_to_lungs=False, postprocess=False)
    ours = det.detect(vol)
    assert ours.sliding_window
    ref = monai_detect(model, volume=vol)
    _assert_same(ours, ref, model.config.spacing)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detector_iou_equals_monais_and_keeps_the_same_boxes(seed, tmp_path):
    from monai.data.box_utils import box_iou, non_max_suppression

    g = torch.Generator().manual_seed(seed)
    lower = torch.rand(1500, 3, generator=g) * 120.0
    boxes = torch.cat([lower, lower + torch.rand(1500, 3, generator=g) * 15.0 + 0.5], dim=1)
    for i in range(0, 1500, 150):  # values that round
        assert torch.equal(box_iou_float32(boxes, boxes[i : i + 1]), box_iou(boxes, boxes[i : i + 1]))
    boxes = (boxes * 4).round() / 4  # shared edges and equal boxes
    scores = (torch.rand(1500, generator=g) * 20).round() / 20  # tied scores
    kept = non_max_suppression(boxes, scores, 0.22, 300, box_overlap_metric=box_iou_float32)
    assert 50 < len(kept) and torch.equal(kept, non_max_suppression(boxes, scores, 0.22, 300))
    model = small_model(tmp_path)
    assert Detector(model=model, device="cpu")._detector.box_selector.box_overlap_metric is box_iou_float32
    assert build_detector(model.network, model.config.anchors, model.config.selector).box_selector.box_overlap_metric is box_iou


def test_bundle_state_dict_keys_match_real_bundle_layout():
    state = bundle_state_dict()
    assert len(state) == 190
    assert sum(v.numel() for k, v in state.items() if "running" not in k and "num_batches" not in k) == pytest.approx(
        20.9e6, rel=0.01
    )
    assert "feature_extractor.body.conv1.weight" in state
    assert tuple(state["feature_extractor.body.conv1.weight"].shape) == (64, 1, 7, 7, 7)


def test_bundle_config_drives_preprocessing(tmp_path):
    root = write_bundle(tmp_path / "b", pixdim=(1.8, 1.6, 3.0), score_thresh=0.3, patch=(96, 96, 48))
    cfg = load_bundle(root).config
    assert cfg.spacing == (1.8, 1.6, 3.0)
    assert cfg.selector["score_thresh"] == 0.3
    assert cfg.roi_size == (96, 96, 48)
    assert cfg.overlap == 0.25
    assert cfg.anchors["base_anchor_shapes"][2] == [10.0, 10.0, 6.0]
    assert cfg.window.a_min == -1024.0 and cfg.window.clip


def test_loader_input_gives_the_same_findings(tmp_path):
    """The batch runner may feed the loader's tensors (pipeline.load) instead of volumes: same findings."""
    from pipeline.load import preprocess_volume

    model = small_model(tmp_path)
    vol = chest_volume(shape_kji=(30, 56, 56), spacing=(1.4, 1.4, 2.5), seed=2, direction=np.diag([-1.0, 1.0, 1.0]))
    det = Detector(model=model, device="cpu", amp=False, restrict_to_lungs=False, postprocess=False)
    ours = det.detect(vol)
    case = preprocess_volume(vol, model.config.preprocess_spec(size_divisible=(1, 1, 1)), device="cpu", case_id="c1")
    loaded = det.detect_loaded(case, series_uid=vol.series_uid)
    assert len(loaded) == len(ours) > 5
    assert det.spec == model.config.preprocess_spec(size_divisible=(1, 1, 1))
    np.testing.assert_allclose([f.score for f in loaded], [f.score for f in ours], atol=1e-4)
    np.testing.assert_allclose([f.center_lps for f in loaded], [f.center_lps for f in ours], atol=0.05)
    assert [f.voxel_ijk for f in loaded] == [f.voxel_ijk for f in ours]


def test_no_max_pool_option_doubles_the_finest_feature_map():
    """``no_max_pool`` really removes the backbone's pooling (the FPN walks the backbone's children itself)."""
    x = torch.zeros(1, 1, 64, 64, 32)
    sizes = {}
    for flag in (False, True):
        net = build_network({**SMALL_ARCH, "no_max_pool": flag}).eval()
        with torch.no_grad():
            feats = net.feature_extractor(x)
        sizes[flag] = tuple(next(iter(feats.values())).shape[2:])
    assert sizes[False] == (16, 16, 16)  # conv1 stride (2, 2, 1), then the pool halves every axis
    assert sizes[True] == (32, 32, 32)


def test_the_bundle_pipeline_built_by_monais_own_config_parser_finds_the_same(tmp_path):
    """The reference above runs MONAI's classes on ctpipe's reading of the bundle; here MONAI's ``ConfigParser``
    builds the network, the detector (its ``detector_ops`` run) and the pre- and post-processing from the bundle's
    own ``inference.json``, as ``monai.bundle`` does, with its checkpoint loaded: the same findings as ctpipe's."""
    import SimpleITK as sitk
    from monai.bundle import ConfigParser

    root = write_bundle(tmp_path / "bundle", patch=(96, 96, 48))
    parser = ConfigParser()
    parser.read_config(str(root / "configs" / "inference.json"))
    parser["bundle_root"] = str(root)
    parser["device"] = "$torch.device('cpu')"
    network = parser.get_parsed_content("network")
    network.load_state_dict(torch.load(root / "models" / "model.pt", map_location="cpu", weights_only=True))
    network.eval()
    detector = parser.get_parsed_content("detector")
    parser.get_parsed_content("detector_ops")  # evaluating its expressions applies them to the parsed detector
    detector.eval()
    vol = chest_volume(shape_kji=(30, 48, 48), spacing=(1.6, 1.6, 2.5), direction=np.diag([1.0, -1.0, 1.0]))
    sitk.WriteImage(vol.to_sitk(), str(tmp_path / "ct.nii.gz"))
    data = parser.get_parsed_content("preprocessing")({"image": str(tmp_path / "ct.nii.gz")})
    image = data["image"]
    with torch.no_grad():
        out = detector([image], use_inferer=any(int(s) > int(r) for s, r in zip(image.shape[1:], (96, 96, 48))))[0]
    scores = out[detector.pred_score_key].float()  # the bundle's target keys: "box", "label", "label_scores"
    data.update(box=out["box"].float(), label=out["label"], score=scores)
    # clip to the image, to world coordinates (affine_lps_to_ras: back to the file's LPS), xyzxyz -> cccwhd
    data = parser.get_parsed_content("postprocessing")(data)
    ref_centres = np.asarray(data["box"], dtype=np.float64).reshape(-1, 6)[:, :3]  # LPS mm
    ours = Detector(model=load_bundle(root), device="cpu", amp=False, restrict_to_lungs=False, postprocess=False)
    found = ours.detect(vol).candidates
    assert len(found) == len(ref_centres) > 5
    order = np.argsort(-np.asarray(data["score"], dtype=np.float64), kind="stable")
    np.testing.assert_allclose([f.score for f in found], np.asarray(data["score"], dtype=np.float64)[order], atol=1e-3)
    dist_vox = np.abs(np.array([f.center_lps for f in found]) - ref_centres[order]) / np.asarray((2.0, 2.0, 2.5))
    assert dist_vox.max() < 1.0
