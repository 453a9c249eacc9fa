"""Turn a CT volume (LPS, ``[k, j, i]`` HU) into the detector's network input.

The result is exactly what MONAI's bundle preprocessing gives
(``Orientation(RAS) → Spacing(pixdim, bilinear, border) → ScaleIntensityRange(clip)``):
a float32 tensor ``(1, X, Y, Z)`` in RAS orientation on the grid that keeps the
centre of the first RAS-oriented voxel and has ``round((n - 1) * s / t) + 1``
voxels per axis. It is built in one pass, slab by slab along Z, straight from
the (possibly memory-mapped, int16) source array: no full float copy of the
series, no separate re-orientation copy. Crops (the lung region) are views.

:class:`InputGrid` maps network-input voxel coordinates ``(x, y, z)`` back to
the source series' indices ``(i, j, k)`` and to LPS mm.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..volume import LPS_TO_RAS, CTVolume, Geometry

log = logging.getLogger(__name__)

SLAB_VOXELS = 16_000_000  # output voxels per preprocessing slab (≈ 64 MB float32)


@dataclass(frozen=True)
class Window:
    """``ScaleIntensityRange``: HU ``a_min..a_max`` → ``b_min..b_max``, clipped when ``clip``."""

    a_min: float = -1024.0
    a_max: float = 300.0
    b_min: float = 0.0
    b_max: float = 1.0
    clip: bool = True


@dataclass(frozen=True)
class InputGrid:
    """Geometry of a network input relative to its source series.

    ``to_source`` is a 4×4 matrix mapping homogeneous input voxel coordinates
    ``(x, y, z, 1)`` (RAS-oriented, model spacing) to continuous source indices
    ``(i, j, k, 1)`` of the ORIGINAL series (crop offsets included).
    """

    shape_xyz: tuple[int, int, int]
    spacing_xyz: tuple[float, float, float]
    to_source: np.ndarray
    source: Geometry

    @property
    def affine_lps(self) -> np.ndarray:
        """4×4: input voxel ``(x, y, z, 1)`` → LPS mm."""
        return self.source.affine_lps @ self.to_source

    @property
    def affine_ras(self) -> np.ndarray:
        """4×4: input voxel ``(x, y, z, 1)`` → RAS mm (the MetaTensor affine MONAI would carry)."""
        return LPS_TO_RAS @ self.affine_lps

    def xyz_to_ijk(self, xyz: np.ndarray) -> np.ndarray:
        """Input voxel coordinates ``(..., 3)`` → continuous source indices ``(..., 3)`` (i, j, k)."""
        xyz = np.asarray(xyz, dtype=np.float64)
        return xyz @ self.to_source[:3, :3].T + self.to_source[:3, 3]

    def xyz_to_lps(self, xyz: np.ndarray) -> np.ndarray:
        """Input voxel coordinates ``(..., 3)`` → LPS mm ``(..., 3)``."""
        aff = self.affine_lps
        xyz = np.asarray(xyz, dtype=np.float64)
        return xyz @ aff[:3, :3].T + aff[:3, 3]

    def lps_to_xyz(self, lps: np.ndarray) -> np.ndarray:
        """LPS mm ``(..., 3)`` → continuous input voxel coordinates ``(..., 3)``."""
        inv = np.linalg.inv(self.affine_lps)
        lps = np.asarray(lps, dtype=np.float64)
        return lps @ inv[:3, :3].T + inv[:3, 3]


def ras_axes(geometry: Geometry) -> list[tuple[int, bool]]:
    """For RAS output axes x, y, z: ``(source index axis c, flipped)`` as MONAI's Orientation picks them."""
    ras_dirs = np.diag([-1.0, -1.0, 1.0]) @ geometry.direction  # column c = RAS direction of index axis c
    order: list[tuple[int, bool]] = [(-1, False)] * 3
    used: set[int] = set()
    # greedy by largest |cosine|, like nibabel's io_orientation for near-axis-aligned grids
    pairs = sorted(((abs(ras_dirs[w, c]), w, c) for w in range(3) for c in range(3)), reverse=True)
    for _, w, c in pairs:
        if order[w][0] >= 0 or c in used:
            continue
        order[w] = (c, bool(ras_dirs[w, c] < 0))
        used.add(c)
    return order


def _axis_positions(n_src: int, s_src: float, t_out: float, flipped: bool) -> np.ndarray:
    """Continuous source indices sampled by MONAI's Spacing along one axis (after orientation)."""
    n_out = max(1, int(np.round((n_src - 1) * s_src / t_out + 1.0)))  # numpy's half-to-even, as MONAI
    pos = np.arange(n_out, dtype=np.float64) * (t_out / s_src)
    pos = np.clip(pos, 0.0, n_src - 1.0)
    return (n_src - 1.0) - pos if flipped else pos


def _lerp_axis(t: torch.Tensor, dim: int, pos: np.ndarray, base: int) -> torch.Tensor:
    """Linear interpolation of ``t`` along ``dim`` at absolute positions ``pos`` (``base`` = index of t's first element)."""
    p = torch.from_numpy(pos - base)
    n = t.shape[dim]
    lo = torch.floor(p).long().clamp(0, n - 1)
    hi = (lo + 1).clamp(max=n - 1)
    w = (p - lo.double()).float()
    if torch.all(w == 0):
        return t.index_select(dim, lo)
    shape = [1] * t.ndim
    shape[dim] = len(pos)
    w = w.view(shape)
    a = t.index_select(dim, lo)
    b = t.index_select(dim, hi)
    return torch.lerp(a, b, w)


def prepare_input(
    volume: CTVolume,
    *,
    spacing: Sequence[float],
    window: Window,
    lo_ijk: Sequence[int] | None = None,
    hi_ijk: Sequence[int] | None = None,
    slab_voxels: int = SLAB_VOXELS,
) -> tuple[torch.Tensor, InputGrid]:
    """Network input ``(1, X, Y, Z)`` float32 (RAS, ``spacing`` mm along x, y, z) and its :class:`InputGrid`.

    ``lo_ijk``/``hi_ijk`` restrict the work to the source sub-grid ``lo <= (i, j, k) < hi``
    (e.g. the lungs' box); the grid then starts at that sub-grid's first RAS voxel.
    Non-finite voxels must have been handled by the caller.
    """
    geom = volume.geometry
    size = np.asarray(geom.size_ijk)
    lo = np.zeros(3, int) if lo_ijk is None else np.clip(np.asarray(lo_ijk, int), 0, size - 1)
    hi = size.copy() if hi_ijk is None else np.clip(np.asarray(hi_ijk, int), lo + 1, size)
    axes = ras_axes(geom)
    t_out = [float(v) for v in spacing]
    positions: list[np.ndarray] = []
    to_source = np.zeros((4, 4))
    to_source[3, 3] = 1.0
    for w, (c, flipped) in enumerate(axes):
        n = int(hi[c] - lo[c])
        pos = _axis_positions(n, geom.spacing[c], t_out[w], flipped) + lo[c]
        positions.append(pos)
        step = t_out[w] / geom.spacing[c]
        to_source[c, w] = -step if flipped else step
        to_source[c, 3] = pos[0]
    shape_xyz = tuple(len(p) for p in positions)
    out = torch.empty((1, *shape_xyz), dtype=torch.float32)
    arr = volume.array  # [k, j, i]
    # array dim of source index axis c is 2 - c; output axis w reads source axis axes[w][0]
    src_dim = [2 - axes[w][0] for w in range(3)]
    nz = shape_xyz[2]
    per_z = max(1, shape_xyz[0] * shape_xyz[1])
    slab = max(1, min(nz, slab_voxels // per_z))
    scale = (window.b_max - window.b_min) / (window.a_max - window.a_min)
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        # source range needed along every axis for this slab
        sl: list[slice] = [slice(None)] * 3
        bases = [0, 0, 0]
        for w in range(3):
            pos = positions[w][z0:z1] if w == 2 else positions[w]
            a = int(np.floor(pos.min()))
            b = min(int(np.floor(pos.max())) + 2, int(size[axes[w][0]]))
            sl[src_dim[w]] = slice(a, b)
            bases[w] = a
        t = torch.from_numpy(np.array(arr[tuple(sl)], dtype=np.float32))  # one copy of the slab, as float
        for w in (2, 0, 1):  # Z first: it usually shrinks the slab the most
            pos = positions[w][z0:z1] if w == 2 else positions[w]
            t = _lerp_axis(t, src_dim[w], pos, bases[w])
        t = t.permute(src_dim[0], src_dim[1], src_dim[2])  # → (X, Y, Z) view
        t = (t - window.a_min) * scale + window.b_min
        if window.clip:
            t = t.clamp_(min(window.b_min, window.b_max), max(window.b_min, window.b_max))
        out[0, :, :, z0:z1] = t
    grid = InputGrid(
        shape_xyz=shape_xyz,  # type: ignore[arg-type]
        spacing_xyz=(t_out[0], t_out[1], t_out[2]),
        to_source=to_source,
        source=geom,
    )
    log.debug("network input %s from source box lo=%s hi=%s", shape_xyz, lo.tolist(), hi.tolist())
    return out, grid
