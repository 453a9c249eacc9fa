"""PreprocessSpec validation and bundle parsing; make_loader's automatic choice and its log line."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.errors import ConfigError, LoaderError
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
            {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -1024.0, "a_max": 300.0,
             "b_min": 0.0, "b_max": 1.0, "clip": True},
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


@pytest.mark.parametrize("kwargs, words", [
    (dict(spacing=(0.7, 0, 1.25)), "spacing"),
    (dict(spacing=(0.7, 0.7)), "3 values"),
    (dict(intensity_window=(300, -1024)), "a_min < a_max"),
    (dict(size_divisible=(16, 0, 8)), "size_divisible"),
    (dict(size_divisible=(16, 1.5, 8)), "size_divisible"),
    (dict(pad_method="middle"), "pad_method"),
    (dict(orientation="LPS"), "not supported"),
    (dict(output_range=(0, float("nan"))), "output_range"),
])
def test_spec_validation(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        PreprocessSpec(**kwargs)


def test_spec_is_keyword_only_frozen_and_round_trips():
    with pytest.raises(TypeError):
        PreprocessSpec((0.7, 0.7, 1.25))  # type: ignore[misc]
    spec = PreprocessSpec(spacing=(0.7, None, 1.0), size_divisible=8, roi=Roi(lo=(0, 0, 0), hi=(10, 10, 10), margin_mm=5))
    with pytest.raises(AttributeError):
        spec.clip = False  # type: ignore[misc]
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


def test_make_loader_choice_and_log_line(cache, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="pipeline.load.select")
    ld = make_loader(cache, BUNDLE_LUNG_NODULE, loader="torch", device="cpu")
    assert isinstance(ld, TorchLoader) and "loader: torch on CPU (asked for" in caplog.text
    if HAVE_DALI:
        caplog.clear()
        ld = make_loader(cache, BUNDLE_LUNG_NODULE, device="cpu")
        assert isinstance(ld, DaliLoader) and "loader: DALI on CPU" in caplog.text and "installed" in caplog.text
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
