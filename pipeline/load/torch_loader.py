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

from ..errors import CacheError, LoaderError
from ..ingest.measured import continued_past_edge, measured_boxes, measured_mask
from ..volume import CTVolume
from .base import BaseLoader, Job, resolve_device, source_window
from .geometry import InputGeometry, plan_input
from .result import LoadedCase
from .spec import PreprocessSpec, Roi

log = logging.getLogger(__name__)

__all__ = ["SLAB_VOXELS", "TorchLoader", "preprocess_array", "preprocess_volume"]


#: Output voxels per preprocessing slab (about 64 MB as float32): bounds memory on very long series.
SLAB_VOXELS = 16_000_000


def _resample_axis(t: torch.Tensor, dim: int, positions: np.ndarray) -> torch.Tensor:
    """Linear interpolation of ``t`` along ``dim`` at continuous indices ``positions`` of ``t`` (edge-clamped)."""
    n_src = t.shape[dim]
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


def _source_range(pos: np.ndarray, n_src: int) -> tuple[int, int]:
    """Source index range ``[a, b)`` that linear interpolation at ``pos`` (clamped) reads."""
    pos = np.clip(pos, 0.0, n_src - 1)
    return int(np.floor(pos.min())), min(int(np.floor(pos.max())) + 2, n_src)


def preprocess_array(
    array: torch.Tensor | np.ndarray,
    geometry: InputGeometry,
    spec: PreprocessSpec,
    *,
    device: str | torch.device = "cpu",
    slab_voxels: int = SLAB_VOXELS,
    measured: np.ndarray | None = None,
) -> torch.Tensor:
    """HU array ``[k, j, i]`` on ``geometry.source`` → model input ``(1, X, Y, Z)`` float32 (RAS order).

    Steps: axis order (x, y, z) → cast → resample (with the RAS flips) → window/scale/clip →
    constant padding. ``geometry`` comes from :func:`~pipeline.load.geometry.plan_input`.

    Memory-bounded: the output is built in slabs of at most ``slab_voxels`` voxels along
    model axis z; each slab reads only the source sub-box it needs (a view of ``array``,
    which may be a memory-mapped int16 ``.npy``; a crop to a region of interest reads only
    that region), so a 512×512×1000 series never exists as one float copy.

    ``measured``: bool ``[k, j, i]``, the voxels some image measured on a tilt-corrected grid
    (:func:`pipeline.ingest.measured.measured_mask`); the network then reads the unmeasured wedge as each image
    continued past its edge (:func:`~pipeline.ingest.measured.continued_past_edge`), not as the -1024 HU fill, whose
    edge against the lung it took for nodules. None (any untilted series): the array as it is.
    """
    plans = [geometry.axis(a) for a in range(3)]
    positions = [p.positions() for p in plans]
    shape = tuple(p.size for p in plans)
    a0, ar, b0, br, lo_v, hi_v = source_window(spec)
    padded = any(p.valid_lo > 0 or p.valid_hi < p.size for p in plans)
    out = (
        torch.full((1, *shape), spec.pad_value, dtype=torch.float32, device=device)
        if padded
        else torch.empty((1, *shape), dtype=torch.float32, device=device)
    )
    if not all(len(pos) for pos in positions):
        return out  # the crop holds no image voxel: padding only
    # a tilt-corrected grid's wedge is read from the nearest measured row or column of the source array
    source = None if measured is None else (array.cpu().numpy() if isinstance(array, torch.Tensor) else array)
    x0, x1, y0, y1, zb = plans[0].valid_lo, plans[0].valid_hi, plans[1].valid_lo, plans[1].valid_hi, plans[2].valid_lo
    # array dim of the source axis feeding model axis a is 2 - src_axis
    src_dim = [2 - p.src_axis for p in plans]
    nz = len(positions[2])
    slab = max(1, min(nz, int(slab_voxels) // max(1, len(positions[0]) * len(positions[1]))))
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        sl: list[slice] = [slice(None)] * 3
        pos_here = [positions[0], positions[1], positions[2][z0:z1]]
        rel = []
        for a in range(3):
            first, last = _source_range(pos_here[a], plans[a].n_src)
            sl[src_dim[a]] = slice(first, last)
            rel.append(np.clip(pos_here[a], 0.0, plans[a].n_src - 1) - first)
        if source is None or measured is None:
            chunk = array[tuple(sl)]  # a view: only this slab's source voxels are read
        else:  # the slab's voxels, its unmeasured ones read from the nearest measured row or column
            chunk = continued_past_edge(source, measured, box=(sl[0], sl[1], sl[2]))
        if isinstance(chunk, np.ndarray):  # a read-only (memory-mapped) slab is read into memory here, once
            chunk = np.ascontiguousarray(chunk) if chunk.flags.writeable else np.array(chunk)
        t = torch.as_tensor(chunk) if isinstance(chunk, np.ndarray) else chunk
        # source [k, j, i] → model axes (x, y, z) first, while the data is small (int16, before resampling)
        t = t.to(device=device, non_blocking=True).permute(*src_dim).contiguous().to(torch.float32)
        # shrinking axes first, then the least-growing ones: smaller intermediate volumes
        for a in sorted(range(3), key=lambda a: -plans[a].ratio):
            t = _resample_axis(t, a, rel[a])
        t = t.sub(a0)  # a new tensor: never write into the caller's array
        t = t.div_(ar).mul_(br).add_(b0)
        if spec.clip:
            t = t.clamp_(lo_v, hi_v)
        out[0, x0:x1, y0:y1, zb + z0 : zb + z1] = t
    return out


def preprocess_volume(
    volume: CTVolume,
    spec: PreprocessSpec,
    *,
    device: str = "auto",
    roi: Roi | None = None,
    case_id: str = "volume",
    slab_voxels: int = SLAB_VOXELS,
) -> LoadedCase:
    """Preprocess an in-memory (or memory-mapped) :class:`CTVolume` (HU, LPS) exactly as the loaders do a cached case.

    ``roi`` crops (LPS mm or source indices, see :class:`Roi`); only the voxels the crop
    needs are read. See :func:`preprocess_array` for ``slab_voxels``.
    """
    geometry = plan_input(volume.geometry, spec, roi=roi, case=case_id)
    measured = measured_mask(volume.geometry, volume.metadata)
    tensor = preprocess_array(
        volume.array, geometry, spec, device=resolve_device(device), slab_voxels=slab_voxels, measured=measured
    )
    boxes = None if measured is None else measured_boxes(measured)
    return LoadedCase(case_id, tensor=tensor, geometry=geometry, loader="torch", measured=boxes)


class TorchLoader(BaseLoader):
    """Cached cases → model inputs with torch (``device="auto"|"cpu"|"gpu"``).

    Reading the ``.npy`` files and preprocessing overlap on ``num_threads`` worker
    threads on a CPU (two on a GPU); torch ops release the GIL; results come back in order.
    """

    name = "torch"

    def _one(self, job: Job) -> LoadedCase:
        err: CacheError | LoaderError
        try:  # the voxels given in place of the cached file's, or the file, read slab by slab
            arr = job.array if job.array is not None else np.load(job.entry.array_path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            err = CacheError(
                f"case {job.case_id}: array cannot be read ({exc})", where=job.entry.array_path, fix="ingest the case again"
            )
            return LoadedCase(job.case_id, error=err, loader=self.name)
        if tuple(arr.shape) != job.entry.geometry.shape:
            err = CacheError(
                f"case {job.case_id}: array is {arr.shape} but the sidecar says {job.entry.geometry.shape}",
                where=job.entry.array_path,
                fix="ingest the case again",
            )
            return LoadedCase(job.case_id, error=err, loader=self.name)
        try:
            measured = measured_mask(job.entry.geometry, job.entry.sidecar.get("metadata") or {})
            tensor = preprocess_array(arr, job.geometry, self.spec, device=self.device, measured=measured)
        except (RuntimeError, MemoryError) as exc:
            err = LoaderError(
                f"case {job.case_id}: preprocessing failed ({exc})",
                where=job.entry.array_path,
                fix="check free memory; try device='cpu' or a smaller batch",
            )
            return LoadedCase(job.case_id, error=err, loader=self.name)
        boxes = None if measured is None else measured_boxes(measured)
        return LoadedCase(job.case_id, tensor=tensor, geometry=job.geometry, loader=self.name, measured=boxes)

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
