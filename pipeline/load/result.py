"""What a loader yields for each case: the model input with its geometry, or the error."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CtpipeError, LoaderError
from ..volume import CTVolume
from .geometry import InputGeometry

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LoadedCase"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedCase:
    """One case out of a loader.

    Exactly one of ``tensor`` and ``error`` is set.

    Attributes
    ----------
    case_id: the cache id of the case.
    tensor: model input, float32 ``(1, X, Y, Z)`` channel-first in RAS axis order, on the
        loader's device (values in ``spec.output_range``).
    geometry: maps tensor voxel indices (x, y, z) to LPS mm (:meth:`InputGeometry.input_index_to_lps`).
    error: the :class:`~pipeline.errors.CacheError` / :class:`~pipeline.errors.LoaderError`
        that stopped this case (it names the case and the fix); the batch goes on.
    loader: ``"dali"`` or ``"torch"``.
    measured: for a gantry-tilt corrected source, the voxels of its grid some image measured, per source slice k
        the rows and columns ``[j0, j1, i0, i1]`` (:data:`pipeline.ingest.measured.MEASURED_BOXES_KEY`); None when
        every voxel was. :meth:`to_volume` carries it onto the model grid.
    """

    case_id: str
    tensor: torch.Tensor | None = None
    geometry: InputGeometry | None = None
    error: CtpipeError | None = None
    loader: str = ""
    measured: list[list[int]] | None = None

    @property
    def ok(self) -> bool:
        """True when the case loaded."""
        return self.error is None and self.tensor is not None

    def unwrap(self) -> torch.Tensor:
        """The tensor, or raise the case's error."""
        if self.error is not None:
            raise self.error
        if self.tensor is None:  # pragma: no cover - constructor contract
            raise LoaderError("case has neither a tensor nor an error", where=f"case {self.case_id}")
        return self.tensor

    def input_index_to_lps(self, idx: np.ndarray) -> np.ndarray:
        """Tensor voxel indices ``(N, 3)`` (x, y, z) → LPS mm ``(N, 3)``."""
        return self._geom().input_index_to_lps(idx)

    def lps_to_input_index(self, lps: np.ndarray) -> np.ndarray:
        """LPS mm ``(N, 3)`` → continuous tensor indices (x, y, z)."""
        return self._geom().lps_to_input_index(lps)

    def to_volume(self) -> CTVolume:
        """The model input as a :class:`CTVolume` on its LPS grid (values are model units, not HU).

        A tilt-corrected source's unmeasured voxels (:attr:`measured`) stay unmeasured: a model voxel counts as
        measured (:func:`pipeline.ingest.measured.measured_mask`) only where every source voxel its interpolation
        reads was, never in the padding."""
        tensor = self.unwrap()
        arr = tensor[0].permute(2, 1, 0).detach().cpu().numpy()
        metadata: dict[str, object] = {"case_id": self.case_id}
        if self.measured is not None:
            from ..ingest.measured import MEASURED_BOXES_KEY, measured_mask, with_measured

            geom = self._geom()
            source = measured_mask(geom.source, {MEASURED_BOXES_KEY: self.measured})
            if source is not None and geom.src_axis[2] == 2:  # model slices z are source slices: rectangles per slice
                metadata = with_measured(metadata, _on_input_grid(source, geom).transpose(2, 1, 0))
            elif source is not None:
                log.info("case %s: the model's slices are not the source's; its voxels all count as measured", self.case_id)
        return CTVolume(np.ascontiguousarray(arr), self._geom().geometry, metadata=metadata)

    def _geom(self) -> InputGeometry:
        if self.geometry is None:
            raise LoaderError(
                "the case failed to load, so it has no geometry", where=f"case {self.case_id}", fix="check LoadedCase.error"
            )
        return self.geometry

    def __repr__(self) -> str:
        if self.error is not None:
            return f"LoadedCase({self.case_id!r}, error={self.error})"
        shape = tuple(self.tensor.shape) if self.tensor is not None else None
        dev = self.tensor.device if self.tensor is not None else None
        return f"LoadedCase({self.case_id!r}, shape={shape}, device={dev}, loader={self.loader!r})"


def _on_input_grid(measured: np.ndarray, geometry: InputGeometry) -> np.ndarray:
    """Bool ``(X, Y, Z)`` on the model grid of ``geometry``: the voxels whose linear interpolation reads only source
    voxels that ``measured`` (bool ``[k, j, i]`` on ``geometry.source``) holds (unmeasured wins at the boundary); the
    padding is unmeasured."""
    m = np.transpose(np.asarray(measured, dtype=bool), [2 - geometry.src_axis[a] for a in range(3)])
    for a in range(3):
        plan = geometry.axis(a)
        pos = np.clip(plan.positions(), 0.0, plan.n_src - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.where(pos > lo, np.minimum(lo + 1, plan.n_src - 1), lo)
        taken = np.take(m, lo, axis=a) & np.take(m, hi, axis=a)
        shape = list(taken.shape)
        shape[a] = plan.size
        out = np.zeros(shape, dtype=bool)
        index: list[slice] = [slice(None)] * 3
        index[a] = slice(plan.valid_lo, plan.valid_hi)
        out[tuple(index)] = taken
        m = out
    return m
