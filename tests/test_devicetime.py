"""DeviceTimer: the wall clock on a CPU; on a GPU, the work a block queued counts too."""

from __future__ import annotations

import time

import pytest

from pipeline.devicetime import DeviceTimer, cuda_events, is_cuda


def test_on_a_cpu_it_is_the_wall_clock():
    with DeviceTimer("cpu") as clock:
        time.sleep(0.05)
    assert 0.045 <= clock.seconds < 30.0 and clock.ms == pytest.approx(clock.seconds * 1000.0)
    assert cuda_events("cpu") == (None, None) and not is_cuda("cpu") and is_cuda("cuda:1")


def test_a_block_that_raises_is_timed_and_the_error_passes():
    clock = DeviceTimer("cpu")
    with pytest.raises(ValueError, match="^the block's own error$"), clock:
        time.sleep(0.02)
        raise ValueError("the block's own error")
    assert 0.015 <= clock.seconds < 30.0


@pytest.mark.gpu
def test_on_a_gpu_the_queued_work_counts():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run scripts/gpu_check.sh on a GPU machine)")
    dev = torch.device("cuda:0")
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with DeviceTimer(dev) as clock:
        torch.cuda._sleep(200_000_000)  # queued: returns at once, the GPU spins for ~0.1 s or more
        launched = time.perf_counter() - t0
    assert clock.seconds > 5 * launched and clock.seconds > 0.02, (clock.seconds, launched)
