"""The detector's intensity window, and a one-call network input for a volume.

All preprocessing (MONAI ``Orientation(RAS) → Spacing → ScaleIntensityRange``,
slab-wise from memory-mapped int16 arrays, crops as views) lives in
:mod:`pipeline.load`; :func:`prepare_input` is a thin front end to
:func:`pipeline.load.preprocess_volume` for scripts that hold a ``CTVolume``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..load import InputGeometry, PreprocessSpec, preprocess_volume
from ..load.torch_loader import SLAB_VOXELS
from ..volume import CTVolume


@dataclass(frozen=True)
class Window:
    """``ScaleIntensityRange``: HU ``a_min..a_max`` → ``b_min..b_max``, clipped when ``clip``."""

    a_min: float = -1024.0
    a_max: float = 300.0
    b_min: float = 0.0
    b_max: float = 1.0
    clip: bool = True


def prepare_input(
    volume: CTVolume,
    *,
    spacing: Sequence[float],
    window: Window,
    slab_voxels: int = SLAB_VOXELS,
) -> tuple[torch.Tensor, InputGeometry]:
    """Network input ``(1, X, Y, Z)`` float32 (RAS, ``spacing`` mm along x, y, z) on the CPU, and its geometry.

    The geometry maps input voxels ``(x, y, z)`` to LPS mm (:meth:`InputGeometry.input_index_to_lps`).
    """
    spec = PreprocessSpec(spacing=tuple(spacing), intensity_window=(window.a_min, window.a_max),
                          output_range=(window.b_min, window.b_max), clip=window.clip)
    case = preprocess_volume(volume, spec, device="cpu", slab_voxels=slab_voxels)
    return case.unwrap(), case.geometry  # type: ignore[return-value]
