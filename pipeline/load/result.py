"""What a loader yields for each case: the model input with its geometry, or the error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CtpipeError, LoaderError
from ..volume import CTVolume
from .geometry import InputGeometry

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LoadedCase"]


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
    """

    case_id: str
    tensor: torch.Tensor | None = None
    geometry: InputGeometry | None = None
    error: CtpipeError | None = None
    loader: str = ""

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
        """The model input as a :class:`CTVolume` on its LPS grid (values are model units, not HU)."""
        tensor = self.unwrap()
        arr = tensor[0].permute(2, 1, 0).detach().cpu().numpy()
        return CTVolume(np.ascontiguousarray(arr), self._geom().geometry, metadata={"case_id": self.case_id})

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
