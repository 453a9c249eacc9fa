"""PreprocessSpec validation, the HU window and bundle parsing; make_loader's automatic choice and its log line."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from pipeline.bundle import BundleConfig, SlidingWindow
from pipeline.cache import CaseCache
from pipeline.errors import BundleError, ConfigError, LoaderError
from pipeline.intensity import HUWindow
from pipeline.load import BUNDLE_LUNG_NODULE, DaliLoader, PreprocessSpec, Roi, TorchLoader, dali_available, make_loader
from pipeline.load import select as select_mod
from pipeline.volume import CTVolume, Geometry

HAVE_DALI = dali_available()[0]

# the shape of the lung_nodule_ct_detection bundle's inference.json (abridged), with "@" references
BUNDLE_CONFIG = {
    "spacing": [0.703125, 0.703125, 1.25],
    "size_divisible": [16, 16, 8],
    "detector": {"_target_": "RetinaNetDetector", "network": "@network", "size_divisible": "@size_divisible"},
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image", "reader": "itkreader", "affine_lps_to_ras": True},
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
            {"_target_": "Spacingd", "keys": "image", "pixdim": "@spacing", "padding_mode": "border"},
            {
                "_target_": "ScaleIntensityRanged",
                "keys": "image",
                "a_min": -1024.0,
                "a_max": 300.0,
                "b_min": 0.0,
                "b_max": 1.0,
                "clip": True,
            },
            {"_target_": "EnsureTyped", "keys": "image"},
        ],
    },
}


def test_from_bundle_config_dict_and_file(tmp_path):
    spec = PreprocessSpec.from_bundle_config(BUNDLE_CONFIG)
    assert spec == BUNDLE_LUNG_NODULE
    path = tmp_path / "bundle" / "configs" / "inference.json"
    path.parent.mkdir(parents=True)
    cfg = json.loads(json.dumps(BUNDLE_CONFIG))
    cfg["preprocessing"]["transforms"][4]["a_max"] = 400.0
    path.write_text(json.dumps(cfg))
    spec2 = PreprocessSpec.from_bundle_config(tmp_path / "bundle", pad_method="end")
    assert spec2.intensity_window == (-1024.0, 400.0) and spec2.pad_method == "end" and spec2.size_divisible == (16, 16, 8)


def test_from_bundle_config_errors(tmp_path):
    cfg = json.loads(json.dumps(BUNDLE_CONFIG))
    del cfg["preprocessing"]["transforms"][3]
    with pytest.raises(ConfigError, match="pixdim"):
        PreprocessSpec.from_bundle_config(cfg)
    cfg = json.loads(json.dumps(BUNDLE_CONFIG))
    cfg["preprocessing"]["transforms"][3]["pixdim"] = "@nowhere"
    with pytest.raises(ConfigError, match="nowhere"):
        PreprocessSpec.from_bundle_config(cfg)
    cfg["preprocessing"]["transforms"][3]["pixdim"] = "$[0.7, 0.7, 1.25]"
    with pytest.raises(ConfigError, match="expression"):
        PreprocessSpec.from_bundle_config(cfg)
    with pytest.raises(ConfigError, match="cannot read"):
        PreprocessSpec.from_bundle_config(tmp_path / "absent.json")


# MONAI's lung_nodule_ct_detection inference.json as published (abridged): the spacing is switched
# by "_disabled_" references, and size_divisible is set only inside network_def
ZOO_DETECTION_CONFIG = {
    "whether_raw_luna16": False,
    "whether_resampled_luna16": "$(not @whether_raw_luna16)",
    "imports": ["$import glob", "$import os"],
    "bundle_root": "./",
    "infer_patch_size": [512, 512, 192],
    "network_def": {
        "_target_": "RetinaNet",
        "spatial_dims": 3,
        "num_classes": 1,
        "num_anchors": 3,
        "feature_extractor": "@feature_extractor",
        "size_divisible": [16, 16, 8],
    },
    "detector_ops": [
        "$@detector.set_target_keys(box_key='box', label_key='label')",
        "$@detector.set_box_selector_parameters(score_thresh=0.02,topk_candidates_per_level=1000,nms_thresh=0.22,detections_per_img=300)",
        "$@detector.set_sliding_window_inferer(roi_size=@infer_patch_size,overlap=0.25,sw_batch_size=1,mode='constant',device='cpu')",
    ],
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image", "_disabled_": "@whether_raw_luna16"},
            {
                "_target_": "LoadImaged",
                "keys": "image",
                "reader": "itkreader",
                "affine_lps_to_ras": True,
                "_disabled_": "@whether_resampled_luna16",
            },
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
            {
                "_target_": "Spacingd",
                "keys": "image",
                "pixdim": [0.703125, 0.703125, 1.25],
                "_disabled_": "@whether_resampled_luna16",
            },
            {
                "_target_": "ScaleIntensityRanged",
                "keys": "image",
                "a_min": -1024.0,
                "a_max": 300.0,
                "b_min": 0.0,
                "b_max": 1.0,
                "clip": True,
            },
            {"_target_": "EnsureTyped", "keys": "image"},
        ],
    },
}


def test_zoo_detection_config_gives_the_bundle_spec():
    assert PreprocessSpec.from_bundle_config(ZOO_DETECTION_CONFIG) == BUNDLE_LUNG_NODULE
    for evaluate in (False, True):  # read as written, and as MONAI's ConfigParser resolves it
        cfg = BundleConfig(ZOO_DETECTION_CONFIG, evaluate=evaluate)
        assert cfg.spacing() == (0.703125, 0.703125, 1.25) and cfg.size_divisible() == (16, 16, 8)
        assert cfg.hu_window() == HUWindow(-1024.0, 300.0, 0.0, 1.0, clip=True)
        assert cfg.box_selector() == {
            "score_thresh": 0.02,
            "topk_candidates_per_level": 1000,
            "nms_thresh": 0.22,
            "detections_per_img": 300,
        }
        assert cfg.detector_sliding_window() == SlidingWindow(roi_size=(512, 512, 192), overlap=0.25, sw_batch_size=1)
    # a transform is off only when "_disabled_" is literally true
    cfg = json.loads(json.dumps(ZOO_DETECTION_CONFIG))
    cfg["preprocessing"]["transforms"][4]["_disabled_"] = True
    assert BundleConfig(cfg).spacing() is None


def test_bundle_config_expressions_are_run_only_when_asked():
    cfg = {
        "highres": True,
        "pixdim": "$[1.5, 1.5, 1.5] if @highres else [3.0, 3.0, 3.0]",
        "batch": {"n": 2},
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "Spacingd", "keys": "image", "pixdim": "@pixdim"},
                {"_target_": "Orientationd", "keys": "image", "axcodes": "LPS"},
            ],
        },
        "inferer": {
            "_target_": "SlidingWindowInferer",
            "roi_size": 96,
            "sw_batch_size": "@batch#n",
            "overlap": 0.5,
            "mode": "gaussian",
        },
    }
    with pytest.raises(BundleError, match=r"preprocessing#transforms#0#pixdim is an expression") as err:
        BundleConfig(cfg).spacing()
    assert "bundle config" in str(err.value) and "Fix:" in str(err.value)
    evaluated = BundleConfig(cfg, evaluate=True)
    assert evaluated.spacing() == (1.5, 1.5, 1.5)
    assert BundleConfig(cfg).sliding_window_inferer() == SlidingWindow(
        roi_size=(96, 96, 96), overlap=0.5, sw_batch_size=2, mode="gaussian"
    )
    with pytest.raises(BundleError, match=r"Orientationd.axcodes .* is 'LPS'"):
        evaluated.require_ras()
    with pytest.raises(ConfigError, match="LPS"):
        PreprocessSpec.from_bundle_config({**cfg, "pixdim": [1.0, 1.0, 1.0]})


def test_bundle_config_errors_name_file_and_key(tmp_path):
    cfg = json.loads(json.dumps(BUNDLE_CONFIG))
    cfg["preprocessing"]["transforms"][4]["a_max"] = -2000.0
    path = tmp_path / "inference.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(BundleError, match=r"ScaleIntensityRanged \(preprocessing#transforms#4\): .*a_min < a_max") as err:
        BundleConfig.read(path).hu_window()
    assert err.value.where == str(path)
    cfg["preprocessing"]["transforms"][3]["pixdim"] = [0.7, 0.7]
    with pytest.raises(BundleError, match=r"Spacingd.pixdim \(preprocessing#transforms#3#pixdim\) must be 3 positive sizes"):
        BundleConfig(cfg).spacing()
    cfg["size_divisible"] = [16, 1.5, 8]
    with pytest.raises(BundleError, match="size_divisible must be 3 positive integers"):
        BundleConfig(cfg).size_divisible()
    with pytest.raises(BundleError, match="must be a JSON object"):
        BundleConfig([1, 2, 3])  # type: ignore[arg-type]
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BundleError, match="bad.json is not valid JSON"):
        BundleConfig.read(tmp_path / "bad.json")
    with pytest.raises(BundleError, match="configs/inference.json does not exist"):
        BundleConfig.read(tmp_path / "no_bundle")


def test_hu_window_is_validated_and_shared():
    w = HUWindow(-1000, 400.0, -1, 1, clip=True)
    assert w.scale_params() == (-1000.0, 1400.0, -1.0, 2.0) and isinstance(w.a_min, float)
    assert HUWindow.from_json(w.to_json()) == w
    spec = PreprocessSpec.from_window(w, spacing=(1.0, 1.0, 1.0))
    assert spec.intensity_window == (-1000.0, 400.0) and spec.output_range == (-1.0, 1.0) and spec.window == w
    with pytest.raises(ConfigError, match="a_min < a_max"):
        HUWindow(300, -1024)
    with pytest.raises(ConfigError, match="output_range b_max must be finite"):
        HUWindow(-1024, 300, 0, float("inf"))
    with pytest.raises(ConfigError, match="has no clip"):
        HUWindow.from_json({"a_min": -1024, "a_max": 300, "b_min": 0, "b_max": 1})


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(spacing=(0.7, 0, 1.25)), "spacing"),
        (dict(spacing=(0.7, 0.7)), "3 values"),
        (dict(intensity_window=(300, -1024)), "a_min < a_max"),
        (dict(size_divisible=(16, 0, 8)), "size_divisible"),
        (dict(size_divisible=(16, 1.5, 8)), "size_divisible"),
        (dict(pad_method="middle"), "pad_method"),
        (dict(orientation="LPS"), "not supported"),
        (dict(output_range=(0, float("nan"))), "output_range"),
    ],
)
def test_spec_validation(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        PreprocessSpec(**kwargs)


def test_spec_is_keyword_only_frozen_and_round_trips():
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        PreprocessSpec((0.7, 0.7, 1.25))  # type: ignore[misc]
    spec = PreprocessSpec(spacing=(0.7, None, 1.0), size_divisible=8, roi=Roi(lo=(0, 0, 0), hi=(10, 10, 10), margin_mm=5))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'clip'"):
        spec.clip = False  # type: ignore[misc]
    assert spec.clip is True
    assert spec.size_divisible == (8, 8, 8)
    assert PreprocessSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    with pytest.raises(ConfigError, match="unknown"):
        PreprocessSpec.from_json({"spasing": [1, 1, 1]})
    with pytest.raises(ConfigError, match="margin"):
        Roi(lo=(0, 0, 0), hi=(1, 1, 1), margin_mm=-1)


@pytest.fixture()
def cache(tmp_path) -> CaseCache:
    c = CaseCache(tmp_path)
    arr = np.zeros((6, 8, 8), np.int16)
    c.write("a", CTVolume(arr, Geometry(shape=arr.shape, spacing=(1, 1, 1), origin=(0, 0, 0))))
    return c


@pytest.mark.skipif(not HAVE_DALI, reason="nvidia-dali not installed")
def test_make_loader_picks_dali_by_default_when_installed(cache, caplog):
    caplog.set_level(logging.INFO, logger="pipeline.load.select")
    ld = make_loader(cache, BUNDLE_LUNG_NODULE, device="cpu")
    assert isinstance(ld, DaliLoader) and "loader: DALI on CPU" in caplog.text and "installed" in caplog.text


def test_make_loader_choice_and_log_line(cache, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="pipeline.load.select")
    ld = make_loader(cache, BUNDLE_LUNG_NODULE, loader="torch", device="cpu")
    assert isinstance(ld, TorchLoader) and "loader: torch on CPU (asked for" in caplog.text
    caplog.clear()
    monkeypatch.setattr(select_mod, "dali_available", lambda: (False, "nvidia-dali is not installed (test)"))
    ld = make_loader(cache, BUNDLE_LUNG_NODULE, loader="auto", device="cpu")
    assert isinstance(ld, TorchLoader)
    assert "loader: torch on CPU (DALI unavailable: nvidia-dali is not installed (test))" in caplog.text
    with pytest.raises(LoaderError, match="loader='dali' was asked for"):
        make_loader(cache, BUNDLE_LUNG_NODULE, loader="dali", device="cpu")
    with pytest.raises(LoaderError, match="unknown loader"):
        make_loader(cache, BUNDLE_LUNG_NODULE, loader="fast")
    with pytest.raises(LoaderError, match="batch_size"):
        make_loader(cache, BUNDLE_LUNG_NODULE, loader="torch", batch_size=0)
