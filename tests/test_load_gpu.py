"""GPU mode: the same model inputs on the GPU as on the CPU (run by scripts/gpu_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.cache import CaseCache
from pipeline.load import DaliLoader, PreprocessSpec, TorchLoader, dali_available, make_loader
from pipeline.volume import CTVolume, Geometry

pytestmark = pytest.mark.gpu
SPEC = PreprocessSpec(spacing=(0.703125, 0.703125, 1.25), size_divisible=(16, 16, 8))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> CaseCache:
    c = CaseCache(tmp_path_factory.mktemp("gpu_cache"))
    rng = np.random.default_rng(0)
    for n, (shape, direction) in enumerate([((20, 64, 60), np.eye(3)), ((24, 50, 56), np.diag([-1.0, 1.0, -1.0]))]):
        arr = rng.integers(-1200, 1600, size=shape).astype(np.int16)
        c.write(f"g{n}", CTVolume(arr, Geometry(shape=shape, spacing=(0.8, 0.75, 2.0), origin=(0, 0, n), direction=direction)))
    return c


def _compare(a, b, what):
    for x, y in zip(a, b):
        assert x.ok and y.ok, (x.error, y.error)
        assert x.geometry == y.geometry
        diff = (x.tensor.cpu() - y.tensor.cpu()).abs()
        assert float(diff.max()) < 1e-5, (
            f"{what} {x.case_id}: max abs diff {float(diff.max()):.3g}, mean {float(diff.mean()):.3g}"
        )


def test_torch_loader_gpu_equals_cpu(cache):
    gpu = list(TorchLoader(cache, SPEC, device="gpu").load())
    assert all(c.tensor.is_cuda for c in gpu)
    _compare(gpu, list(TorchLoader(cache, SPEC, device="cpu").load()), "torch GPU vs CPU")


@pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed on this GPU machine")
def test_dali_gpu_equals_torch_cpu(cache):
    ld = make_loader(cache, SPEC, loader="dali", device="gpu", batch_size=2)
    assert isinstance(ld, DaliLoader)
    gpu = list(ld.load())
    assert all(c.tensor.is_cuda and c.tensor.dtype == torch.float32 for c in gpu)
    _compare(gpu, list(TorchLoader(cache, SPEC, device="cpu").load()), "DALI GPU vs torch CPU")


@pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed on this GPU machine")
def test_dali_gpu_reads_a_tilted_case_as_the_torch_loader_does(tmp_path):
    """A gantry-tilt corrected case: DALI on the GPU (its wedge filled before the copy to the GPU) gives the torch
    loader's input, the wedge read as each image continued past its edge."""
    from pipeline.ingest import load_series
    from tests.test_gantry_tilt_detector_lungs import _write

    cache = CaseCache(tmp_path / "cache")
    cache.write("tilted", load_series(_write(tmp_path / "src", tilt_deg=15.0), allow_gantry_tilt=True))
    gpu = DaliLoader(cache, SPEC, device="cuda").load_one("tilted")
    cpu = TorchLoader(cache, SPEC, device="cpu").load_one("tilted")
    assert gpu.unwrap().is_cuda
    assert cpu.measured is not None and gpu.measured == cpu.measured
    torch.testing.assert_close(gpu.unwrap().cpu(), cpu.unwrap(), rtol=0, atol=2e-4)
