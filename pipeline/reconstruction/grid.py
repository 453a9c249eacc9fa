"""Voxel-grid helpers shared by the organ segmentation modules (arrays ``[k, j, i]``, LPS mm).

:class:`Grid` is the working grid a segmentation runs on: the volume's HU as a
torch tensor, average-pooled by integer factors for large volumes, with the
pooled grid's own :class:`~pipeline.geometry.Geometry`. The functions map between
array axes, voxel indices and DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..volume import CTVolume
from . import morph


class Grid:
    """The working grid: HU tensor (possibly average-pooled) and its geometry.

    ``factors`` are the integer pooling factors along ``(k, j, i)``; ``(1, 1, 1)``
    keeps the volume's own grid. ``hu`` is float32 HU on ``device``; ``geometry``
    places the pooled voxels' centres in LPS mm; ``full`` is the input volume.
    """

    def __init__(self, volume: CTVolume, device: torch.device, factors: tuple[int, int, int]):
        self.full = volume
        self.factors = factors
        hu = morph.to_tensor(volume.array, device).to(torch.float32)
        if factors != (1, 1, 1):
            hu = F.avg_pool3d(hu[None, None], kernel_size=factors, stride=factors, ceil_mode=True)[0, 0]
        self.hu = hu
        fk, fj, fi = factors
        g = volume.geometry
        origin = g.index_to_lps([(fi - 1) / 2, (fj - 1) / 2, (fk - 1) / 2])
        spacing = (g.spacing[0] * fi, g.spacing[1] * fj, g.spacing[2] * fk)
        self.geometry = g.with_(shape=tuple(hu.shape), spacing=spacing, origin=origin)

    @property
    def voxel_ml(self) -> float:
        """Volume of one working voxel in mL."""
        return float(np.prod(self.geometry.spacing)) / 1000.0

    def radius(self, mm: float) -> tuple[int, int, int]:
        """A radius of ``mm`` millimetres in working voxels along ``(k, j, i)``."""
        return morph.radius_vox(mm, self.geometry.spacing)

    def in_plane_radius(self, mm: float) -> tuple[int, int, int]:
        """A radius of ``mm`` millimetres within a slice, in working voxels along ``(k, j, i)``.

        0 across the slices (along the array axis of the slice direction), and at least one voxel
        along the two in-plane axes, for slice-by-slice morphology.
        """
        sa = self.geometry.array_axis(2)
        rk, rj, ri = (0 if d == sa else max(1, v) for d, v in enumerate(self.radius(mm)))
        return rk, rj, ri


def bbox(mask: np.ndarray, margin: int) -> tuple[slice, slice, slice] | None:
    """Slices (``[k, j, i]``) of the bounding box of ``mask`` grown by ``margin`` voxels (None when empty)."""
    out = []
    for ax in range(3):
        nz = np.nonzero(mask.any(axis=tuple(a for a in range(3) if a != ax)))[0]
        if nz.size == 0:
            return None
        out.append(slice(max(0, int(nz[0]) - margin), min(mask.shape[ax], int(nz[-1]) + 1 + margin)))
    return out[0], out[1], out[2]
