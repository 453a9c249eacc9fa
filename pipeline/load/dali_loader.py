"""The DALI loader: cached ``.npy`` cases → model inputs with NVIDIA DALI (GPU when present, CPU otherwise).

One DALI pipeline streams a run of cases: ``fn.readers.numpy`` (``device="gpu"``
with GPUDirect Storage when the loader runs on a GPU) → ``fn.transpose`` of the
(small, int16) source array to the model's axis order → 3-D ``fn.resize`` (linear,
no antialiasing, per-sample output size and source ROI so that it samples exactly
where MONAI's ``Spacing`` does; a reversed ROI does the RAS flips) →
window/scale/clamp → ``fn.slice`` with out-of-bounds padding (crop and pad to
divisibility in one step). Per-sample arguments come from an external source
aligned with the reader's file order, so a batch may hold volumes of different
sizes. Outputs are copied once into torch tensors on the same device (no host
round trip on a GPU).

Voxels handed to the loader in place of a cached file's (``load_one(case_id, array=...)``: the run's load stage hands
it a volume whose NaN or infinite voxels it set to air) go through the same pipeline from an external source on the
CPU, as a tilt-corrected case's do, never through ``fn.readers.numpy``. When DALI fails on them, the case's error names those voxels in
memory, never the cached file (which DALI did not read).

A gantry-tilt corrected case (its cache entry says which voxels its images measured,
:func:`pipeline.ingest.measured.measured_mask`) is read as the torch loader and
``ctpipe detect`` read it: its unmeasured wedge as each image continued past its edge
(:func:`~pipeline.ingest.measured.continued_past_edge`, on the CPU, as the torch loader
fills it), never as the -1024 HU fill. DALI has no per-slice edge clamp, so such cases
are read and filled on the CPU and handed to the same pipeline by an external source
(copied to the GPU in GPU mode) instead of ``fn.readers.numpy``; untilted cases stream
as before.

In GPU mode, a pipeline that cannot be built or run with DALI's GPU numpy reader is rebuilt with the CPU reader
(its arrays copied to the GPU) for that batch and every later one. A tilt-corrected batch's pipeline uses no reader:
its failure is its own (its cases are loaded one by one, each failing alone) and later batches keep the GPU reader.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..cache import CaseCache
from ..errors import CacheError, LoaderError
from ..ingest.measured import continued_past_edge, measured_boxes, measured_mask
from .base import BaseLoader, Job, source_window
from .geometry import InputGeometry
from .result import LoadedCase
from .spec import PreprocessSpec

log = logging.getLogger(__name__)

__all__ = ["DaliLoader", "dali_available", "resize_arguments"]


def dali_available() -> tuple[bool, str]:
    """``(True, version)`` when ``nvidia.dali`` imports, else ``(False, reason)``."""
    try:
        import nvidia.dali as dali
    except ImportError as exc:
        return False, f"nvidia-dali is not installed ({exc})"
    except OSError as exc:  # a broken native library
        return False, f"nvidia-dali failed to load ({exc})"
    return True, str(getattr(dali, "__version__", "?"))


def _summary(exc: BaseException) -> str:
    """The informative line of a DALI error (the text after "encountered:"), else its first line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if "encountered:" in lines:
        after = lines[lines.index("encountered:") + 1 :]
        if after:
            return after[0]
    for ln in lines:
        if not ln.startswith(("Critical error", "Current pipeline")):
            return ln
    return lines[0] if lines else type(exc).__name__


def resize_arguments(geometry: InputGeometry) -> dict[str, np.ndarray]:
    """Per-sample DALI arguments in model axis order (x, y, z) (the source array is transposed first).

    ``size``/``roi_start``/``roi_end`` for ``fn.resize`` and ``anchor``/``shape`` for
    ``fn.slice``. DALI samples output pixel ``m`` at input coordinate
    ``roi_start + (m + 0.5) * (roi_end - roi_start) / size`` where pixel ``i`` has its
    centre at ``i + 0.5``; choosing ``roi_start = q0 * r + (1 - r) / 2`` and
    ``roi_end = roi_start + size * r`` puts output ``m`` at source index ``(q0 + m) * r``,
    MONAI's position; the mirrored ROI gives ``n - 1 - (q0 + m) * r`` for a flipped axis.
    """
    size = np.zeros(3, np.float32)
    start = np.zeros(3, np.float32)
    end = np.zeros(3, np.float32)
    anchor = np.zeros(3, np.int32)
    shape = np.zeros(3, np.int32)
    for a in range(3):
        p = geometry.axis(a)
        d = a
        count = max(1, p.valid_hi - p.valid_lo)
        q0 = p.valid_lo + p.anchor
        half = 0.5 * (1.0 - p.ratio)
        if p.flip:
            s = p.n_src - q0 * p.ratio - half
            e = s - count * p.ratio
        else:
            s = q0 * p.ratio + half
            e = s + count * p.ratio
        size[d], start[d], end[d] = count, s, e
        anchor[d], shape[d] = -p.valid_lo, p.size
    return {"size": size, "roi_start": start, "roi_end": end, "anchor": anchor, "shape": shape}


def _measured(job: Job) -> np.ndarray | None:
    """Bool ``[k, j, i]``: the voxels of ``job``'s cached case that some image measured; None when all were."""
    return measured_mask(job.entry.geometry, job.entry.sidecar.get("metadata") or {})


def _boxes(job: Job) -> list[list[int]] | None:
    """``job``'s measured voxels as :attr:`LoadedCase.measured` holds them (None when all were)."""
    measured = _measured(job)
    return None if measured is None else measured_boxes(measured)


def _from_cpu(job: Job) -> bool:
    """Whether ``job``'s voxels reach DALI from the CPU by an external source (:func:`_filled_array`): voxels given in
    place of the cached file's, or a tilt-corrected grid whose wedge is filled; otherwise DALI's reader reads the file."""
    return job.array is not None or _measured(job) is not None


def _filled_array(job: Job) -> np.ndarray:
    """``job``'s HU array ``[k, j, i]`` (its own dtype: the voxels given in place of the cached file's, else the cached
    file's) with the unmeasured wedge of a tilt-corrected grid read as each image continued past its edge
    (:func:`~pipeline.ingest.measured.continued_past_edge`).

    A file that cannot be read raises RuntimeError, as DALI's reader does: the loader then retries the batch's cases
    one by one, and this one fails alone."""
    try:
        arr = job.array if job.array is not None else np.load(job.entry.array_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"numpy file {job.entry.array_path} cannot be read ({exc})") from exc
    measured = _measured(job)
    return np.ascontiguousarray(arr) if measured is None else continued_past_edge(arr, measured)


class DaliLoader(BaseLoader):
    """Cached cases → model inputs with DALI. ``device="auto"|"cpu"|"gpu"``.

    ``batch_size`` samples go through the pipeline together on ``num_threads`` CPU
    threads with ``prefetch`` batches queued ahead. See :class:`BaseLoader` for the
    iteration methods (``load``, ``batches``, ``load_one``).
    """

    name = "dali"

    def __init__(
        self,
        cache: CaseCache | str | os.PathLike[str],
        spec: PreprocessSpec,
        *,
        device: str = "auto",
        batch_size: int = 1,
        num_threads: int | None = None,
        prefetch: int = 2,
    ):
        ok, why = dali_available()
        if not ok:
            raise LoaderError(
                why, where="DALI loader", fix="pip install nvidia-dali-cuda120 (Linux x86_64) or use loader='torch'"
            )
        super().__init__(cache, spec, device=device, batch_size=batch_size, num_threads=num_threads)
        self.prefetch = max(1, int(prefetch))
        self._gpu_reader = self.device != "cpu"

    # -- pipeline ------------------------------------------------------------------------------
    def _build(self, jobs: list[Job], batch_size: int) -> Any:
        from nvidia.dali import fn, types
        from nvidia.dali import math as dmath
        from nvidia.dali.pipeline import Pipeline

        files = [str(job.entry.array_path) for job in jobs]
        args = [resize_arguments(job.geometry) for job in jobs]
        n = len(jobs)
        keys = ("size", "roi_start", "roi_end", "anchor", "shape")
        # voxels given, or a tilt-corrected run (its wedge filled): the arrays come from the external source, not the reader
        filled = _from_cpu(jobs[0])

        def source(info: Any) -> tuple[list[np.ndarray], ...]:
            first = info.iteration * batch_size
            if first >= n:
                raise StopIteration
            idx = [min(first + s, n - 1) for s in range(batch_size)]  # the reader repeats the last sample too
            data = ([_filled_array(jobs[i]) for i in idx],) if filled else ()
            return data + tuple([args[i][k] for i in idx] for k in keys)

        gpu = self.device != "cpu"
        device_id = (torch.device(self.device).index or 0) if gpu else None
        a0, ar, b0, br, lo, hi = source_window(self.spec)
        src_axis = jobs[0].geometry.src_axis
        perm = [2 - src_axis[a] for a in range(3)]  # array [k, j, i] → model axes (x, y, z)
        pipe = Pipeline(
            batch_size=batch_size, num_threads=self.num_threads, device_id=device_id, prefetch_queue_depth=self.prefetch, seed=0
        )
        with pipe:
            reader_dev = "gpu" if gpu and self._gpu_reader and not filled else "cpu"
            if filled:
                x, size, roi_start, roi_end, anchor, shape = fn.external_source(
                    source=source, num_outputs=6, batch=True, batch_info=True
                )
            else:
                x = fn.readers.numpy(
                    files=files,
                    device=reader_dev,
                    name="reader",
                    pad_last_batch=True,
                    shuffle_after_epoch=False,
                    random_shuffle=False,
                )
                size, roi_start, roi_end, anchor, shape = fn.external_source(
                    source=source, num_outputs=5, batch=True, batch_info=True
                )
            if gpu and reader_dev == "cpu":
                x = x.gpu()
            x = fn.transpose(x, perm=perm)
            x = fn.reshape(x, layout="DHW")
            x = fn.expand_dims(x, axes=[3], new_axis_names="C")
            x = fn.resize(  # type: ignore[assignment]
                x,
                size=size,
                roi_start=roi_start,
                roi_end=roi_end,
                antialias=False,
                interp_type=types.INTERP_LINEAR,  # type: ignore[attr-defined]
                dtype=types.FLOAT,  # type: ignore[attr-defined]
                subpixel_scale=False,
            )
            x = (x - a0) / ar * br + b0
            if self.spec.clip:
                x = dmath.clamp(x, lo, hi)
            x = fn.slice(
                x,
                anchor,
                shape,
                axes=[0, 1, 2],
                normalized_anchor=False,
                normalized_shape=False,
                out_of_bounds_policy="pad",
                fill_values=self.spec.pad_value,
            )
            pipe.set_outputs(x)
        pipe.build()
        return pipe

    def _to_torch(self, tensor: Any) -> torch.Tensor:
        """One DALI sample ``(X, Y, Z, 1)`` → torch ``(1, X, Y, Z)`` (a single copy, on the same device)."""
        shape = tuple(tensor.shape())
        if self.device == "cpu":
            out = torch.from_numpy(np.array(tensor, copy=True))
        else:
            from nvidia.dali.plugin.pytorch import feed_ndarray

            out = torch.empty(shape, dtype=torch.float32, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(out.device))
        return out.view(1, *shape[:3])

    # -- running ---------------------------------------------------------------------------------
    def _run(self, jobs: list[Job]) -> Iterator[LoadedCase]:
        # split into runs sharing dtype, axis permutation and source (the reader, or the external source of voxels
        # given and of tilt-corrected arrays with their wedge filled): uniform within one DALI pipeline
        keys = [(job.dtype, job.perm, _from_cpu(job)) for job in jobs]
        start = 0
        while start < len(jobs):
            stop = start
            while stop < len(jobs) and keys[stop] == keys[start]:
                stop += 1
            yield from self._run_uniform(jobs[start:stop])
            start = stop

    def _gpu_read(self, jobs: list[Job]) -> bool:
        """Whether the pipeline of ``jobs`` (one run: read from the CPU or not) reads their files with DALI's GPU numpy
        reader: a failure of that pipeline may be the reader's, and the loader then reads on the CPU from then on. A
        tilt-corrected run's arrays (their wedge filled), and voxels given in place of the files', come from the CPU,
        never from the reader: its failure is its own, and later runs keep the GPU reader."""
        return self._gpu_reader and self.device != "cpu" and not _from_cpu(jobs[0])

    def _run_uniform(self, jobs: list[Job]) -> Iterator[LoadedCase]:
        done = 0
        # read (and filled) on the CPU, handed to DALI by an external source (named in the log)
        what = "case(s)"
        if _measured(jobs[0]) is not None:
            what = "tilt-corrected case(s), read on the CPU,"
        elif jobs[0].array is not None:
            what = "case(s) handed over in memory"
        while done < len(jobs):
            rest = jobs[done:]
            bs = min(self.batch_size, len(rest))
            try:
                pipe = self._build(rest, bs)
            except RuntimeError as exc:
                if self._gpu_read(rest):
                    log.warning(
                        "DALI GPU numpy reader unavailable (%s); reading on the CPU and copying to the GPU", _summary(exc)
                    )
                    self._gpu_reader = False
                    continue
                log.warning(
                    "DALI pipeline for %d %s from %s could not be built (%s); loading the next %d one by one",
                    len(rest),
                    what,
                    rest[0].case_id,
                    _summary(exc),
                    bs,
                )
                for job in rest[:bs]:
                    yield self._retry_single(job)
                done += bs
                continue
            try:
                for b in range(0, len(rest), bs):
                    batch = rest[b : b + bs]
                    try:
                        (out,) = pipe.run()
                    except (RuntimeError, StopIteration) as exc:
                        if self._gpu_read(rest) and done == 0 and b == 0:
                            log.warning(
                                "DALI GPU numpy reader failed (%s); reading on the CPU and copying to the GPU", _summary(exc)
                            )
                            self._gpu_reader = False
                            break  # rebuild with the CPU reader for the same cases
                        log.warning(
                            "DALI batch of %d %s from %s failed (%s); retrying them one by one",
                            len(batch),
                            what,
                            batch[0].case_id,
                            _summary(exc),
                        )
                        for job in batch:
                            yield self._retry_single(job)
                        done += len(batch)
                        break  # the pipeline's state is unknown after an error: rebuild for the rest
                    for s, job in enumerate(batch):
                        tensor = self._to_torch(out[s])
                        yield LoadedCase(
                            job.case_id, tensor=tensor, geometry=job.geometry, loader=self.name, measured=_boxes(job)
                        )
                    done += len(batch)
            finally:
                del pipe

    def _retry_single(self, job: Job) -> LoadedCase:
        try:
            pipe = self._build([job], 1)
            (out,) = pipe.run()
            tensor = self._to_torch(out[0])
            del pipe
        except RuntimeError as exc:
            msg = _summary(exc) if str(exc) else type(exc).__name__
            err: CacheError | LoaderError
            if job.array is not None:  # DALI never read the cached file: the voxels handed over are the source
                err = LoaderError(
                    f"case {job.case_id}: DALI preprocessing failed on the case's voxels handed over in memory in place "
                    f"of its cached file's (e.g. its NaN or infinite voxels set to air) ({msg})",
                    where=f"case {job.case_id}, voxels in memory",
                    fix="retry with loader='torch' to see whether those voxels are at fault (the cached file was not read)",
                )
            elif not job.entry.array_path.is_file():
                err = CacheError(
                    f"case {job.case_id}: the cached array file is gone (removed after it was validated)",
                    where=job.entry.array_path,
                    fix="ingest the case again",
                )
            elif "numpy" in msg.lower() or "file" in msg.lower():
                err = CacheError(
                    f"case {job.case_id}: the cached array cannot be read by DALI ({msg})",
                    where=job.entry.array_path,
                    fix="ingest the case again",
                )
            else:
                err = LoaderError(
                    f"case {job.case_id}: DALI preprocessing failed ({msg})",
                    where=job.entry.array_path,
                    fix="retry with loader='torch' to see whether the case itself is at fault",
                )
            log.warning("%s", err)
            return LoadedCase(job.case_id, error=err, loader=self.name)
        return LoadedCase(job.case_id, tensor=tensor, geometry=job.geometry, loader=self.name, measured=_boxes(job))
