"""The torch loader: the same model inputs as the DALI loader, with torch ops (GPU when present).

Used where DALI is not installed, or on request (``make_loader(..., loader="torch")``).
Resampling is separable linear interpolation at exactly the source positions that
MONAI's ``Spacing`` samples (see :mod:`pipeline.load.geometry`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import CacheError, LoaderError
from ..volume import CTVolume
from .base import BaseLoader, Job, resolve_device, source_window
from .geometry import InputGeometry, plan_input
from .result import LoadedCase
from .spec import PreprocessSpec, Roi

log = logging.getLogger(__name__)

__all__ = ["TorchLoader", "preprocess_array", "preprocess_volume"]


def _resample_axis(t: torch.Tensor, dim: int, positions: np.ndarray, n_src: int) -> torch.Tensor:
    """Linear interpolation of ``t`` along ``dim`` at continuous indices ``positions`` (edge-clamped)."""
    pos = np.clip(positions, 0.0, n_src - 1)
    lo = np.floor(pos).astype(np.int64)
    w = pos - lo
    if len(pos) == n_src and np.array_equal(lo, np.arange(n_src)) and not np.any(w > 1e-9):
        return t  # identity
    if len(pos) and np.array_equal(lo, np.arange(n_src - 1, n_src - 1 - len(pos), -1)[: len(pos)]) and not np.any(w > 1e-9):
        return t.flip(dim) if len(pos) == n_src else t.index_select(dim, torch.as_tensor(lo, device=t.device))
    hi = np.minimum(lo + 1, n_src - 1)
    dev = t.device
    a = t.index_select(dim, torch.as_tensor(lo, device=dev))
    b = t.index_select(dim, torch.as_tensor(hi, device=dev))
    shape = [1] * t.ndim
    shape[dim] = len(pos)
    wt = torch.as_tensor(w, dtype=torch.float32, device=dev).view(shape)
    return torch.lerp(a, b, wt)


def preprocess_array(array: torch.Tensor | np.ndarray, geometry: InputGeometry, spec: PreprocessSpec, *,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """HU array ``[k, j, i]`` on ``geometry.source`` → model input ``(1, X, Y, Z)`` float32 (RAS order).

    Steps: axis order (x, y, z) → cast → resample (with the RAS flips) → window/scale/clip →
    constant padding. ``geometry`` comes from :func:`~pipeline.load.geometry.plan_input`.
    """
    t = torch.as_tensor(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
    # source [k, j, i] → model axes (x, y, z) first, while the data is small (int16, before resampling)
    perm = [2 - geometry.src_axis[a] for a in range(3)]
    t = t.to(device=device, non_blocking=True).permute(*perm).contiguous().to(torch.float32)
    pads = [0] * 6
    # shrinking axes first, then the least-growing ones: smaller intermediate volumes
    for a in sorted(range(3), key=lambda a: -geometry.axis(a).ratio):
        plan = geometry.axis(a)
        t = _resample_axis(t, a, plan.positions(), plan.n_src)
        # F.pad lists the last dim first: dims (0, 1, 2) ↔ pad slots (4, 2, 0)
        slot = 2 * (2 - a)
        pads[slot], pads[slot + 1] = plan.valid_lo, plan.size - plan.valid_hi
    a0, ar, b0, br, lo, hi = source_window(spec)
    t = t.sub(a0)  # a new tensor: never write into the caller's array
    t = t.div_(ar).mul_(br).add_(b0)
    if spec.clip:
        t = t.clamp_(lo, hi)
    if any(pads):
        t = F.pad(t, pads, mode="constant", value=spec.pad_value)
    return t.unsqueeze(0)


def preprocess_volume(volume: CTVolume, spec: PreprocessSpec, *, device: str = "auto", roi: Roi | None = None,
                      case_id: str = "volume") -> LoadedCase:
    """Preprocess an in-memory :class:`CTVolume` (HU, LPS) exactly as the loaders do a cached case."""
    geometry = plan_input(volume.geometry, spec, roi=roi, case=case_id)
    tensor = preprocess_array(np.asarray(volume.array), geometry, spec, device=resolve_device(device))
    return LoadedCase(case_id, tensor=tensor, geometry=geometry, loader="torch")


class TorchLoader(BaseLoader):
    """Cached cases → model inputs with torch (``device="auto"|"cpu"|"gpu"``).

    Reading the ``.npy`` files and preprocessing overlap on ``num_threads`` worker
    threads on a CPU (two on a GPU); torch ops release the GIL; results come back in order.
    """

    name = "torch"

    def _one(self, job: Job) -> LoadedCase:
        err: CacheError | LoaderError
        try:
            arr = np.load(job.entry.array_path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            err = CacheError(f"case {job.case_id}: array cannot be read ({exc})", where=job.entry.array_path,
                             fix="ingest the case again")
            return LoadedCase(job.case_id, error=err, loader=self.name)
        if tuple(arr.shape) != job.entry.geometry.shape:
            err = CacheError(f"case {job.case_id}: array is {arr.shape} but the sidecar says {job.entry.geometry.shape}",
                             where=job.entry.array_path, fix="ingest the case again")
            return LoadedCase(job.case_id, error=err, loader=self.name)
        try:
            tensor = preprocess_array(arr, job.geometry, self.spec, device=self.device)
        except (RuntimeError, MemoryError) as exc:
            err = LoaderError(f"case {job.case_id}: preprocessing failed ({exc})", where=job.entry.array_path,
                              fix="check free memory; try device='cpu' or a smaller batch")
            return LoadedCase(job.case_id, error=err, loader=self.name)
        return LoadedCase(job.case_id, tensor=tensor, geometry=job.geometry, loader=self.name)

    def _run(self, jobs: list[Job]) -> Iterator[LoadedCase]:
        if not jobs:
            return
        # CPU: cases in parallel on the worker threads; GPU: one case reads while another computes
        workers = max(1, min(self.num_threads if self.device == "cpu" else 2, len(jobs)))
        if workers == 1:
            for job in jobs:
                yield self._one(job)
            return
        ahead = workers + 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ctpipe-load") as pool:
            pending: deque[Future[LoadedCase]] = deque()
            it = iter(jobs)
            for job in it:
                pending.append(pool.submit(self._one, job))
                if len(pending) >= ahead:
                    break
            while pending:
                result = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(self._one, nxt))
                yield result
