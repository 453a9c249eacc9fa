"""Shared behaviour of the loaders: validate cache entries, plan geometry, keep case order, isolate bad cases."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cache import CacheEntry, CaseCache
from ..devices import resolve_device
from ..errors import CacheError, CtpipeError, LoaderError
from .geometry import InputGeometry, plan_input
from .result import LoadedCase
from .spec import PreprocessSpec, Roi

log = logging.getLogger(__name__)

__all__ = ["BaseLoader", "Job", "resolve_device"]

SUPPORTED_DTYPES = ("<i2", "<f4")


@dataclass(frozen=True)
class Job:
    """A validated case ready for a loader: its cache entry and planned model-input geometry.

    ``array``: the case's HU voxels ``[k, j, i]`` (the entry's shape and dtype) to prepare instead of its cached
    file's, e.g. with NaN or infinite voxels set to air; None: the cached file is read."""

    case_id: str
    entry: CacheEntry
    geometry: InputGeometry
    array: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return str(self.entry.sidecar["dtype"])

    @property
    def perm(self) -> tuple[int, int, int]:
        return self.geometry.src_axis


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class BaseLoader:
    """Turns cached cases into model inputs; subclasses implement :meth:`_run`.

    All public iteration yields :class:`LoadedCase` objects in the order the case ids
    were given. A case that cannot be loaded yields a ``LoadedCase`` with ``error``
    set (a :class:`CacheError` or :class:`LoaderError` naming the case); the others
    still load.
    """

    name = "base"

    def __init__(
        self,
        cache: CaseCache | str | os.PathLike[str],
        spec: PreprocessSpec,
        *,
        device: str = "auto",
        batch_size: int = 1,
        num_threads: int | None = None,
    ):
        if not isinstance(spec, PreprocessSpec):
            raise LoaderError(
                f"spec must be a PreprocessSpec, got {type(spec).__name__}",
                where="loader",
                fix="build one with PreprocessSpec(...) or PreprocessSpec.from_bundle_config(...)",
            )
        if int(batch_size) < 1:
            raise LoaderError(f"batch_size must be >= 1, got {batch_size!r}", where="loader")
        self.cache = cache if isinstance(cache, CaseCache) else CaseCache(cache)
        self.spec = spec
        self.device = resolve_device(device)
        self.batch_size = int(batch_size)
        self.num_threads = int(num_threads) if num_threads else default_threads()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cache={str(self.cache.root)!r}, device={self.device!r}, batch_size={self.batch_size})"

    # -- planning ------------------------------------------------------------------------------
    def _roi_for(self, entry: CacheEntry, rois: Mapping[str, Roi]) -> Roi | None:
        if entry.case_id in rois:
            return rois[entry.case_id]
        if self.spec.roi is not None:
            return self.spec.roi
        if self.spec.roi_key:
            raw = (entry.sidecar.get("extra") or {}).get(self.spec.roi_key)
            if raw is not None:
                return Roi.from_json(raw)
        return None

    def prepare(self, case_id: str, *, roi: Roi | None = None, array: np.ndarray | None = None) -> Job:
        """Validate the cache entry of ``case_id`` and plan its model input. Raises CacheError/LoaderError.

        ``array``: HU voxels ``[k, j, i]`` on the entry's grid to prepare instead of the cached file's (see
        :class:`Job`); cast to the entry's dtype."""
        try:
            entry = self.cache.entry(case_id)
        except CtpipeError as exc:
            if isinstance(exc, CacheError):
                raise CacheError(f"case {case_id}: {exc.problem}", where=exc.where, fix=exc.fix) from exc
            raise CacheError(
                f"case {case_id}: sidecar geometry is invalid ({exc.problem})",
                where=exc.where or case_id,
                fix="ingest the case again",
            ) from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheError(
                f"case {case_id}: sidecar is malformed ({type(exc).__name__}: {exc})",
                where=self.cache.sidecar_path(case_id),
                fix="ingest the case again",
            ) from exc
        if entry.sidecar["dtype"] not in SUPPORTED_DTYPES:
            raise LoaderError(
                f"case {case_id}: array dtype {entry.sidecar['dtype']!r} is not int16 or float32",
                where=entry.array_path,
                fix="write the case with CaseCache.write (it stores int16 or float32)",
            )
        if array is not None:
            if tuple(np.shape(array)) != entry.geometry.shape:
                raise LoaderError(
                    f"case {case_id}: the voxels given are {tuple(np.shape(array))} but the cached case is "
                    f"{entry.geometry.shape} ([k, j, i])",
                    where=entry.array_path,
                    fix="pass the voxels of this case's cached volume (CaseCache.read), changed in place of its own",
                )
            array = np.ascontiguousarray(array, dtype=np.dtype(entry.sidecar["dtype"]))
        chosen = roi if roi is not None else self._roi_for(entry, {})
        geometry = plan_input(entry.geometry, self.spec, roi=chosen, case=case_id)
        return Job(case_id, entry, geometry, array=array)

    def _prepare_all(
        self, case_ids: Iterable[str], rois: Mapping[str, Roi], arrays: Mapping[str, np.ndarray] | None = None
    ) -> list[Job | LoadedCase]:
        items: list[Job | LoadedCase] = []
        for case_id in case_ids:
            try:
                items.append(self.prepare(case_id, roi=rois.get(case_id), array=(arrays or {}).get(case_id)))
            except (CacheError, LoaderError) as exc:
                log.warning("%s loader skips case %s: %s", self.name, case_id, exc)
                items.append(LoadedCase(case_id, error=exc, loader=self.name))
            except CtpipeError as exc:
                err = LoaderError(f"case {case_id}: {exc}", where=case_id, fix=exc.fix)
                log.warning("%s loader skips case %s: %s", self.name, case_id, err)
                items.append(LoadedCase(case_id, error=err, loader=self.name))
        return items

    # -- iteration -------------------------------------------------------------------------------
    def load(
        self,
        case_ids: Iterable[str] | None = None,
        *,
        rois: Mapping[str, Roi | Mapping[str, Any]] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
    ) -> Iterator[LoadedCase]:
        """Yield one :class:`LoadedCase` per id (all cached cases when ``None``), in order.

        ``rois`` maps case ids to crop boxes (:class:`Roi` or its JSON), overriding the spec's. ``arrays`` maps case
        ids to HU voxels ``[k, j, i]`` on their cached grid that this loader prepares instead of the cached files'
        (e.g. a volume with its NaN voxels set to air); the entries' geometry and metadata still apply.
        """
        ids = list(self.cache.case_ids() if case_ids is None else case_ids)
        if isinstance(case_ids, str):
            ids = [case_ids]
        from .spec import normalise_rois

        items = self._prepare_all(ids, normalise_rois(rois), arrays)
        jobs = [item for item in items if isinstance(item, Job)]
        results = self._run(jobs)
        for item in items:
            if isinstance(item, LoadedCase):
                yield item
            else:
                yield next(results)

    def batches(
        self, case_ids: Iterable[str] | None = None, *, rois: Mapping[str, Any] | None = None
    ) -> Iterator[list[LoadedCase]]:
        """Like :meth:`load`, grouped in lists of ``batch_size`` (shapes may differ within a list)."""
        batch: list[LoadedCase] = []
        for case in self.load(case_ids, rois=rois):
            batch.append(case)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def load_one(self, case_id: str, *, roi: Roi | None = None, array: np.ndarray | None = None) -> LoadedCase:
        """Load a single case (see :meth:`load`; ``array``: its voxels in place of the cached file's)."""
        rois = {case_id: roi} if roi is not None else None
        return next(self.load([case_id], rois=rois, arrays={case_id: array} if array is not None else None))

    def __iter__(self) -> Iterator[LoadedCase]:
        return self.load()

    def _run(self, jobs: list[Job]) -> Iterator[LoadedCase]:
        """Yield exactly one LoadedCase per job, in order."""
        raise NotImplementedError


def source_window(spec: PreprocessSpec) -> tuple[float, float, float, float, float, float]:
    """Window constants ``(a_min, a_range, b_min, b_range, lo, hi)`` with clamp bounds (float32-rounded)."""
    a0, ar, b0, br = spec.scale_params()
    lo, hi = sorted(spec.output_range)
    f = [float(np.float32(v)) for v in (a0, ar, b0, br, lo, hi)]
    return (f[0], f[1], f[2], f[3], f[4], f[5])
