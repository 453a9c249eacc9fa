"""A one-call network input for a volume, with the detector's intensity window.

All preprocessing (MONAI ``Orientation(RAS) → Spacing → ScaleIntensityRange``,
slab-wise from memory-mapped int16 arrays, crops as views) lives in
:mod:`pipeline.load`; :func:`prepare_input` is a thin front end to
:func:`pipeline.load.preprocess_volume` for scripts that hold a ``CTVolume``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ConfigError, LoaderError
from ..intensity import HUWindow
from ..load import InputGeometry, PreprocessSpec, preprocess_volume
from ..load.torch_loader import SLAB_VOXELS
from ..volume import CTVolume

#: The detector's name for :class:`pipeline.intensity.HUWindow` (MONAI's ``ScaleIntensityRange``).
Window = HUWindow


def prepare_input(
    volume: CTVolume,
    *,
    spacing: Sequence[float],
    window: HUWindow,
    slab_voxels: int = SLAB_VOXELS,
) -> tuple[torch.Tensor, InputGeometry]:
    """Network input ``(1, X, Y, Z)`` float32 (RAS, ``spacing`` mm along x, y, z) on the CPU, and its geometry.

    The geometry maps input voxels ``(x, y, z)`` to LPS mm (:meth:`InputGeometry.input_index_to_lps`).
    """
    if len(spacing) != 3:
        raise ConfigError(f"spacing must be 3 sizes in mm (x, y, z), got {spacing!r}", where="spacing")
    spec = PreprocessSpec.from_window(window, spacing=(float(spacing[0]), float(spacing[1]), float(spacing[2])))
    case = preprocess_volume(volume, spec, device="cpu", slab_voxels=slab_voxels)
    tensor = case.unwrap()
    if case.geometry is None:  # pragma: no cover - a case with a tensor always has its geometry
        raise LoaderError("the preprocessed volume has no geometry", where=f"case {case.case_id}")
    return tensor, case.geometry
