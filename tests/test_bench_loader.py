"""scripts/bench_loader.py: its MONAI peers and the output comparison."""

from __future__ import annotations

import pytest
import torch

from tests._support.scripts import import_script

pytest.importorskip("monai")
bench_loader = import_script("bench_loader")


def test_compare_reports_a_shape_mismatch_without_subtracting():
    a, b = [torch.zeros(1, 4, 4, 8)], [torch.zeros(1, 4, 4, 16)]
    assert bench_loader.compare(a, b)[0] is False
    assert bench_loader.compare(a, [])[0] is False
    same, mx = bench_loader.compare([torch.ones(2, 3)], [torch.zeros(2, 3)])
    assert same and mx == 1.0


def test_device_peer_gives_the_worker_peers_output(tmp_path):
    """The GPU recipe (EnsureTyped to the device, ThreadDataLoader) run with device="cpu" matches the DataLoader."""
    from pipeline.cache import CaseCache

    cache = CaseCache(tmp_path)
    cache.write("case00", bench_loader.synthetic_chest(48, 12, 200.0, seed=0))
    ids = cache.case_ids()
    workers = [b[0]["image"].as_tensor() for b in bench_loader.monai_loader(cache, ids, 0)]
    on_device = [b[0]["image"].as_tensor() for b in bench_loader.monai_loader(cache, ids, 0, device="cpu")]
    same, mx = bench_loader.compare(on_device, workers)
    assert same and mx < 1e-5
