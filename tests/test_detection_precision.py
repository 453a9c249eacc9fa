"""Number format of the detector's network: chosen by hardware, switchable, close to float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.detection import precision
from pipeline.detection.infer import Detector
from pipeline.detection.precision import autocast_dtype, conv_layout, native_bf16_in, precision_name


def test_cpuinfo_flags_decide_bf16():
    assert native_bf16_in("processor : 0\nflags : fpu sse avx512f avx512_bf16 avx512vl\n")
    assert native_bf16_in("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not native_bf16_in("flags : fpu sse avx2 avx512f\n")
    assert not native_bf16_in("Features : fp asimd\n")


def test_autocast_dtype_by_device(monkeypatch):
    assert autocast_dtype(torch.device("cpu"), False) is None
    assert autocast_dtype(torch.device("cuda"), False) is None
    assert autocast_dtype(torch.device("cuda"), True) is torch.float16
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert autocast_dtype(torch.device("cpu"), True) is torch.bfloat16
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert autocast_dtype(torch.device("cpu"), True) is None
    assert [precision_name(d) for d in (None, torch.float16, torch.bfloat16)] == ["float32", "float16", "bfloat16"]


def test_convolutions_run_channels_last_on_a_cpu_only():
    assert conv_layout(torch.device("cpu")) == torch.channels_last_3d
    assert conv_layout(torch.device("cuda")) == torch.contiguous_format


@pytest.mark.slow
@pytest.mark.skipif(not precision.cpu_has_native_bf16(), reason="this CPU has no native bfloat16")
def test_bf16_findings_match_float32():
    """On a phantom the demo model's confident findings agree between bfloat16 and float32 (every candidate
    compared, not only those at the model's operating point)."""
    from pipeline.phantom import generate_phantom

    ph = generate_phantom(5, matrix=160, pixel_spacing=1.8, slice_spacing=2.5, n_nodules=3, nodule_diameter_mm=(8.0, 20.0))
    fast = Detector(device="cpu", postprocess=False, all_candidates=True).detect(ph.volume, lung_mask=ph.masks)
    exact = Detector(device="cpu", amp=False, postprocess=False, all_candidates=True).detect(ph.volume, lung_mask=ph.masks)
    assert (fast.precision, exact.precision) == ("bfloat16", "float32")
    top = [f for f in exact if f.score > 0.5]
    assert len(top) >= 3
    for f in top:
        d = [np.linalg.norm(np.subtract(g.center_lps, f.center_lps)) for g in fast]
        g = fast[int(np.argmin(d))]
        assert min(d) < 1.5, (f, d)
        assert abs(g.score - f.score) < 0.04
