"""Timing of work that may run on a CUDA device.

A call that launches CUDA kernels returns once they are queued, before they have run: a plain clock around it
measures the launch, not the work. :class:`DeviceTimer` brackets a block with CUDA events and synchronises the
device at its end, so that the time counts the work the block queued; on a CPU it is the plain wall clock.
torch is imported only for a CUDA device.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any


def is_cuda(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device`` or a name such as ``"cuda:1"``) is a CUDA device."""
    return str(getattr(device, "type", device)).startswith("cuda")


def cuda_events(device: Any) -> tuple[Any, Any]:
    """A (start, end) pair of timing CUDA events for ``device``; ``(None, None)`` for any other device."""
    if not is_cuda(device):
        return None, None
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


class DeviceTimer:
    """Seconds a ``with`` block took on ``device``, the CUDA work it queued included.

    On a CUDA device a start event is recorded on the device's current stream when the block begins; when it ends
    the device is synchronised (every stream) and an end event recorded, so :attr:`seconds` runs from the start
    event (work queued before the block is not counted) to the end of everything the block queued. On any other
    device, and for a block that raises (no synchronisation then), it is the wall clock. ``ms``: the same in
    milliseconds.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.seconds = 0.0
        self._events: tuple[Any, Any] = (None, None)
        self._stream: Any = None
        self._t0 = 0.0

    @property
    def ms(self) -> float:
        return self.seconds * 1000.0

    def __enter__(self) -> DeviceTimer:
        self._events = cuda_events(self.device)
        if self._events[0] is not None:
            import torch

            self._stream = torch.cuda.current_stream(torch.device(self.device))
            self._events[0].record(self._stream)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        start, end = self._events
        if start is None or exc_type is not None:
            self.seconds = time.perf_counter() - self._t0
            return
        import torch

        torch.cuda.synchronize(torch.device(self.device))
        end.record(self._stream)
        end.synchronize()
        self.seconds = start.elapsed_time(end) / 1000.0
