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


def test_a_held_out_phantom_follows_the_protocol_asked_for() -> None:
    """``--eval-protocol`` (``heldout_phantom(protocol=...)``): the phantom's grid is the protocol's, LPS mm; a bad
    protocol is refused before any phantom is made."""
    import pytest

    trainer = import_script("train_detector")
    ph = trainer.heldout_phantom(449, protocol={"matrix": 96, "pixel_spacing": 2.0, "slice_spacing": 2.5})
    geo = ph.volume.geometry
    assert geo.shape[1:] == (96, 96)  # [k, j, i]
    assert geo.spacing[:2] == pytest.approx((2.0, 2.0))  # (i, j, k) mm
    thick = trainer.phantom_confounders(449).thick_slices_mm  # a thick-slice phantom keeps its own slices
    assert geo.spacing[2] == pytest.approx(thick or 2.5)
    with pytest.raises(SystemExit):
        trainer.main(["--eval-only", "--eval-seeds", "1", "--eval-seed0", "449", "--eval-protocol", "100", "5", "1.25"])
