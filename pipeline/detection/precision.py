"""Which number format and memory layout the detector's networks run in.

Mixed precision where the hardware runs it natively: float16 autocast on CUDA,
bfloat16 autocast on CPUs with native bfloat16 instructions (AVX512-BF16 or AMX,
where oneDNN's 3-D convolutions run about twice as fast), float32 otherwise.
Box selection, coordinates and everything after the network stay float32.
On a CPU the 3-D convolutions run channels-last (:func:`conv_layout`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_in(cpuinfo: str) -> bool:
    """True when the ``flags`` line of a ``/proc/cpuinfo`` text lists AVX512-BF16 or AMX-BF16."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return any(f in _BF16_FLAGS for f in line.split(":", 1)[1].split())
    return False


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when this CPU runs bfloat16 natively (Linux ``/proc/cpuinfo``); False elsewhere or when unreadable."""
    try:
        return native_bf16_in(Path("/proc/cpuinfo").read_text())
    except OSError as exc:
        log.debug("cannot read /proc/cpuinfo (%s); CPU inference stays float32", exc)
        return False


def autocast_dtype(device: torch.device, amp: bool) -> torch.dtype | None:
    """The autocast dtype for ``device`` (``None``: float32, no autocast).

    ``amp=False`` always gives float32 (what MONAI's bundle pipeline uses on a CPU).
    """
    if not amp:
        return None
    if device.type == "cuda":
        return torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return None


def precision_name(dtype: torch.dtype | None) -> str:
    """``"float32"``, ``"float16"`` or ``"bfloat16"``."""
    return "float32" if dtype is None else str(dtype).removeprefix("torch.")


def conv_layout(device: torch.device) -> torch.memory_format:
    """The memory layout 3-D convolutions run fastest in on ``device``: channels-last on a CPU (oneDNN, about
    25 % faster for the RetinaNet, 1.8 times for the patch classifier; the same results), contiguous elsewhere."""
    return torch.channels_last_3d if device.type == "cpu" else torch.contiguous_format
