"""Synthetic chest-like volumes, bundle folders in MONAI's layout and small ctpipe models, for the detector tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from pipeline.detection.bundle import LoadedModel, load_model
from pipeline.detection.model_config import FORMAT
from pipeline.detection.network import BUNDLE_ARCHITECTURE, build_network
from pipeline.volume import CTVolume, Geometry


def chest_volume(
    shape_kji=(40, 64, 64), spacing=(1.4, 1.4, 2.5), seed=0, nodules=((0.3, 0.0, 0.0, 8.0),), direction=None, dtype=np.int16
) -> CTVolume:
    """Body (soft tissue) in air, two lungs (-850 HU), solid spheres (nodules, +30 HU) in the lungs.

    ``nodules``: (fx, fy, fz, diameter_mm) with f* the position as a fraction (-1..1) of the half-extent.
    """
    rng = np.random.default_rng(seed)
    nk, nj, ni = shape_kji
    k, j, i = np.meshgrid(np.arange(nk), np.arange(nj), np.arange(ni), indexing="ij")
    x = (i - (ni - 1) / 2) * spacing[0]
    y = (j - (nj - 1) / 2) * spacing[1]
    z = (k - (nk - 1) / 2) * spacing[2]
    ax, ay, az = ni * spacing[0] / 2, nj * spacing[1] / 2, nk * spacing[2] / 2
    arr = np.full(shape_kji, -1000.0)
    body = (x / (0.9 * ax)) ** 2 + (y / (0.75 * ay)) ** 2 <= 1
    arr[body] = 40.0
    for side in (-1, 1):
        lung = ((x - side * 0.42 * ax) / (0.3 * ax)) ** 2 + (y / (0.5 * ay)) ** 2 + (z / (0.85 * az)) ** 2 <= 1
        arr[lung] = -850.0
    for fx, fy, fz, d in nodules:
        c = np.array([fx * ax, fy * ay, fz * az])
        arr[(x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2 <= (d / 2) ** 2] = 30.0
    arr += rng.normal(0, 15, arr.shape)
    geom = Geometry(
        shape=shape_kji,
        spacing=spacing,
        origin=(-ax + spacing[0] / 2, -ay + spacing[1] / 2, -az + spacing[2] / 2),
        direction=np.eye(3) if direction is None else direction,
    )
    return CTVolume(arr.astype(dtype), geom, metadata={"SeriesInstanceUID": f"1.2.3.{seed}"})


def inference_json(pixdim=(2.0, 2.0, 2.5), score_thresh=0.02, patch=(512, 512, 192), depth=50) -> dict:
    """An ``inference.json`` in the layout of MONAI's lung_nodule_ct_detection bundle."""
    return {
        "imports": ["$import glob", "$import os"],
        "bundle_root": ".",
        "image_key": "image",
        "ckpt_dir": "$@bundle_root + '/models'",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "amp": True,
        "spatial_dims": 3,
        "num_classes": 1,
        "size_divisible": [16, 16, 8],
        "infer_patch_size": list(patch),
        "anchor_generator": {
            "_target_": "monai.apps.detection.utils.anchor_utils.AnchorGeneratorWithAnchorShape",
            "feature_map_scales": [1, 2, 4],
            "base_anchor_shapes": [[6, 8, 4], [8, 6, 5], [10, 10, 6]],
        },
        "backbone": f"$monai.networks.nets.resnet.resnet{depth}(spatial_dims=3,n_input_channels=1,conv1_t_stride=[2,2,1],conv1_t_size=[7,7,7])",
        "feature_extractor": "$monai.apps.detection.networks.retinanet_network.resnet_fpn_feature_extractor(@backbone,3,False,[1,2],None)",
        "network_def": {
            "_target_": "RetinaNet",
            "spatial_dims": "@spatial_dims",
            "num_classes": "@num_classes",
            "num_anchors": 3,
            "feature_extractor": "@feature_extractor",
            "size_divisible": "@size_divisible",
            "use_list_output": False,
        },
        "network": "$@network_def.to(@device)",
        "detector": {
            "_target_": "RetinaNetDetector",
            "network": "@network",
            "anchor_generator": "@anchor_generator",
            "debug": False,
            "spatial_dims": "@spatial_dims",
            "num_classes": "@num_classes",
            "size_divisible": "@size_divisible",
        },
        "detector_ops": [
            "$@detector.set_target_keys(box_key='box', label_key='label')",
            f"$@detector.set_box_selector_parameters(score_thresh={score_thresh},topk_candidates_per_level=1000,nms_thresh=0.22,detections_per_img=300)",
            "$@detector.set_sliding_window_inferer(roi_size=@infer_patch_size,overlap=0.25,sw_batch_size=1,mode='constant',device='cpu')",
        ],
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "LoadImaged", "keys": "@image_key", "reader": "itkreader", "affine_lps_to_ras": True},
                {"_target_": "EnsureChannelFirstd", "keys": "@image_key"},
                {"_target_": "Orientationd", "keys": "@image_key", "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": "@image_key", "pixdim": list(pixdim), "padding_mode": "border"},
                {
                    "_target_": "ScaleIntensityRanged",
                    "keys": "@image_key",
                    "a_min": -1024.0,
                    "a_max": 300.0,
                    "b_min": 0.0,
                    "b_max": 1.0,
                    "clip": True,
                },
                {"_target_": "EnsureTyped", "keys": "@image_key"},
            ],
        },
        "inferer": {
            "_target_": "scripts.detection_inferer.RetinaNetInferer",
            "detector": "@detector",
            "force_sliding_window": False,
        },
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {
                    "_target_": "ClipBoxToImaged",
                    "box_keys": "box",
                    "label_keys": "label",
                    "box_ref_image_keys": "@image_key",
                    "remove_empty": True,
                },
                {
                    "_target_": "AffineBoxToWorldCoordinated",
                    "box_keys": "box",
                    "box_ref_image_keys": "@image_key",
                    "affine_lps_to_ras": True,
                },
                {"_target_": "ConvertBoxModed", "box_keys": "box", "src_mode": "xyzxyz", "dst_mode": "cccwhd"},
            ],
        },
        "checkpointloader": {
            "_target_": "CheckpointLoader",
            "load_path": "$@bundle_root + '/models/model.pt'",
            "load_dict": {"model": "@network"},
        },
    }


def bundle_state_dict(seed=0, arch=None) -> dict:
    """Random weights for the bundle architecture with a zero classification bias (scores around 0.5)."""
    torch.manual_seed(seed)
    net = build_network(arch or BUNDLE_ARCHITECTURE)
    with torch.no_grad():
        net.classification_head.cls_logits.bias.zero_()
    return net.state_dict()


def write_bundle(root: Path, *, state=None, config=None, **cfg_kwargs) -> Path:
    """A MONAI bundle folder at ``root`` (configs/inference.json, configs/metadata.json, models/model.pt); returns ``root``."""
    (root / "configs").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "inference.json").write_text(json.dumps(config or inference_json(**cfg_kwargs), indent=1))
    (root / "configs" / "metadata.json").write_text(json.dumps({"version": "0.6.8-test"}))
    torch.save(state if state is not None else bundle_state_dict(), root / "models" / "model.pt")
    return root


SMALL_ARCH = {
    "kind": "small_resnet_fpn",
    "block": "basic",
    "layers": [1, 1, 1, 1],
    "block_inplanes": [16, 32, 64, 128],
    "conv1_t_stride": [2, 2, 1],
    "conv1_t_size": [7, 7, 5],
    "returned_layers": [1, 2],
    "fpn_channels": 16,
    "num_classes": 1,
    "num_anchors": 3,
    "size_divisible": [16, 16, 8],
}


def small_model(tmp_path: Path, *, roi=(192, 192, 160), spacing=(1.5, 1.5, 2.0), seed=3) -> LoadedModel:
    """A small RetinaNet (``SMALL_ARCH``, random weights, zero classification bias) saved in ``tmp_path`` as a ctpipe model JSON, loaded."""
    torch.manual_seed(seed)
    net = build_network(SMALL_ARCH)
    with torch.no_grad():
        net.classification_head.cls_logits.bias.zero_()
    torch.save(net.state_dict(), tmp_path / "small.pt")
    data = {
        "format": FORMAT,
        "name": "small-test",
        "spacing_mm_ras": list(spacing),
        "intensity_window": {"a_min": -1024, "a_max": 300, "b_min": 0, "b_max": 1, "clip": True},
        "network": SMALL_ARCH,
        "anchors": {"feature_map_scales": [1, 2, 4], "base_anchor_shapes": [[3, 3, 2], [5, 5, 4], [8, 8, 6]]},
        "box_selector": {"score_thresh": 0.05, "topk_candidates_per_level": 1000, "nms_thresh": 0.22, "detections_per_img": 100},
        "sliding_window": {"roi_size": list(roi), "overlap": 0.25, "mode": "constant"},
        "size_divisible": [16, 16, 8],
        "weights": "small.pt",
    }
    (tmp_path / "small.json").write_text(json.dumps(data))
    return load_model(tmp_path / "small.json")


def two_mm_finding(**fields):
    """A :class:`pipeline.detection.findings.Finding` of a 2 mm box centred at LPS (1, 2, 3) mm; ``fields`` override
    any of its fields (score 0.9, voxel (4, 5, 6), slice 7 unless given)."""
    from pipeline.detection.findings import Finding

    base = dict(
        center_lps=(1.0, 2.0, 3.0),
        box_min_lps=(0.0, 1.0, 2.0),
        box_max_lps=(2.0, 3.0, 4.0),
        diameter_mm=2.0,
        score=0.9,
        voxel_ijk=(4, 5, 6),
        slice_number=7,
    )
    return Finding(**{**base, **fields})
