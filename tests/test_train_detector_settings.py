"""``scripts/train_detector.py`` writes the inference settings the shipped demo model runs with, so that
``scripts/train_demo.sh`` reproduces the model the operating point and the held-out figures belong to."""

from __future__ import annotations

import argparse
import json

import torch

from pipeline.detection.model_config import DEMO_MODEL_JSON, MODEL_KEYS
from pipeline.detection.network import build_network
from tests._support.scripts import import_script


def test_the_trainer_writes_the_shipped_models_settings(tmp_path) -> None:
    trainer = import_script("train_detector")
    shipped = json.loads(DEMO_MODEL_JSON.read_text())
    torch.manual_seed(0)
    net = build_network(trainer.ARCH)
    args = argparse.Namespace(
        init=None,
        init_label=None,
        seed0=1000,
        n_train=80,
        torch_seed=7,
        batch=4,
        accum=1,
        lr=5e-4,
        steps=600,
        warmup=20,
        threads=1,
    )
    out = tmp_path / DEMO_MODEL_JSON.name
    trainer.write_model(net, out, args, {"step": 600, "loss": 0.3, "precision": "float32"})
    written = json.loads(out.read_text())
    assert MODEL_KEYS <= set(shipped)
    for key in sorted(MODEL_KEYS):
        assert written[key] == shipped[key], f"{key}: the trainer writes {written[key]}, the shipped model has {shipped[key]}"
