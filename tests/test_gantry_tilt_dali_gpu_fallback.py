"""DALI's GPU mode: a tilted batch whose pipeline fails fails alone, and keeps the GPU file reader for the others.

A tilt-corrected case never streams through DALI's numpy file reader: the loader reads it on the CPU, fills its
unmeasured wedge and hands it to DALI by an external source. When the pipeline of such a batch could not be built or
run on the GPU, the loader took it for a failure of the GPU file reader: it logged that the reader was unavailable,
turned it off for every later batch (untilted cases then read on the CPU and copied over) and tried the tilted batch
again. The failure is now that batch's own: its cases are loaded one by one, the log says which pipeline failed, and
later batches keep the GPU reader.

The GPU mode's decisions run here on the CPU: a test double of the loader builds the real CPU pipeline for untilted
cases (noting whether the GPU reader was asked for), and a failing one for a tilted case, as a GPU may.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.detection import Detector
from pipeline.errors import LoaderError
from pipeline.ingest import load_series
from pipeline.ingest.measured import measured_mask
from pipeline.load import DaliLoader, dali_available
from tests.test_gantry_tilt_detector_lungs import _write

pytestmark = pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed")

GPU_ERROR = "Critical error in pipeline:\nError in GPU operator `nvidia.dali.fn.resize`,\nencountered:\nCUDA out of memory"


class _FailingPipeline:
    def run(self) -> Any:
        raise RuntimeError(GPU_ERROR)


class _GpuModeLoader(DaliLoader):
    """The DALI loader deciding as in GPU mode, on the CPU; the pipeline of a tilted case fails to build or run."""

    def __init__(self, cache: CaseCache, spec: Any, *, fail: str) -> None:
        super().__init__(cache, spec, device="cpu", batch_size=1, num_threads=1)
        self.device, self._gpu_reader = "cuda", True  # GPU mode: DALI's GPU numpy reader first
        self.fail = fail
        self.builds: list[tuple[str, bool]] = []  # (first case, GPU reader asked for)

    def _on_cpu(self, call: Any) -> Any:
        self.device = "cpu"
        try:
            return call()
        finally:
            self.device = "cuda"

    def _build(self, jobs: list[Any], batch_size: int) -> Any:
        self.builds.append((jobs[0].case_id, self._gpu_reader))
        if measured_mask(jobs[0].entry.geometry, jobs[0].entry.sidecar.get("metadata") or {}) is not None:
            if self.fail == "build":
                raise RuntimeError(GPU_ERROR)
            return _FailingPipeline()
        return self._on_cpu(lambda: super(_GpuModeLoader, self)._build(jobs, batch_size))

    def _to_torch(self, tensor: Any) -> Any:
        return self._on_cpu(lambda: super(_GpuModeLoader, self)._to_torch(tensor))


@pytest.mark.parametrize("fail", ["build", "run"])
def test_a_failed_tilted_batch_fails_alone_and_later_batches_keep_the_gpu_reader(tmp_path, caplog, fail):
    cache = CaseCache(tmp_path / "cache")
    cache.write("tilted", load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True))
    cache.write("straight", load_series(_write(tmp_path / "straight", tilt_deg=0.0)))
    loader = _GpuModeLoader(cache, Detector(device="cpu").spec, fail=fail)
    with caplog.at_level(logging.WARNING, logger="pipeline.load"):
        tilted, straight = list(loader.load(["tilted", "straight"]))
    assert not tilted.ok and isinstance(tilted.error, LoaderError) and "CUDA out of memory" in str(tilted.error)
    assert straight.ok and np.isfinite(straight.unwrap().numpy()).all()
    # the untilted case still streams through the GPU reader, which the tilted batch never used
    assert [asked for case, asked in loader.builds if case == "straight"] == [True]
    assert loader._gpu_reader
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "reader" in m], messages  # no word of a reader that did not fail
    assert any("tilted" in m and "CUDA out of memory" in m for m in messages), messages
