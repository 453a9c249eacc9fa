"""Cubes of HU around candidate positions, the false-positive classifier's input (positions in LPS mm).

A cube has ``patch`` voxels per side on a grid of ``spacing_mm`` along the patient's L, P and S axes, whatever the
series' orientation, stored ``[S, P, L]``; its values are the series' HU sampled trilinearly (outside the series the
edge value), windowed to :data:`HU_WINDOW` and scaled to 0..1. :func:`extract_patches` cuts them on the CPU
(NumPy); :class:`DevicePatches` cuts the same cubes on a torch device (``grid_sample`` on the series' voxels around
the positions, uploaded once), where the network that scores them runs, so that on a GPU neither the cutting nor
the copy of the cubes waits on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from ..volume import CTVolume

HU_WINDOW = (-1000.0, 400.0)


def extract_patches(volume: CTVolume, centers_lps: np.ndarray, *, patch: int = 24, spacing_mm: float = 1.0) -> np.ndarray:
    """Cubes around ``centers_lps`` (N, 3; LPS mm) as float32 ``(N, patch, patch, patch)`` in 0..1.

    Each cube is sampled (trilinear) on a grid of ``spacing_mm`` along L, P, S, stored ``[S, P, L]``;
    HU are windowed to ``HU_WINDOW``. Outside the series the edge value is repeated. On a grid whose axes run along
    L, P and S (in any order and sense) trilinear sampling on such a cube is three 1-D linear interpolations, one per
    axis (:func:`_axis_weights`); an oblique grid is sampled point by point (:func:`sample_windowed`). Both give the
    same values.
    """
    centers = np.asarray(centers_lps, dtype=np.float64).reshape(-1, 3)
    out = np.empty((len(centers), patch, patch, patch), dtype=np.float32)
    if not len(centers):
        return out
    ax = (np.arange(patch) - (patch - 1) / 2.0) * spacing_mm
    direction = np.asarray(volume.direction, dtype=np.float64)
    if not np.all((np.abs(direction) < 1e-6) | (np.abs(direction) > 1.0 - 1e-6)):
        offsets = _unit_offsets(patch) * spacing_mm  # (P^3, 3) L, P, S
        for n in range(len(centers)):
            out[n] = sample_windowed(volume, centers[n], offsets).reshape(patch, patch, patch)
        return out
    geometry = volume.geometry
    # index i, j, k per mm along the L, P or S axis each runs along; the array axes ([k, j, i]) along S, P, L
    step = np.array([sign for _, sign in geometry.axis_map()]) / np.asarray(volume.spacing, dtype=np.float64)
    order = [geometry.array_axis(q) for q in (2, 1, 0)]
    size_kji = volume.array.shape
    ijk = volume.lps_to_index(centers).reshape(-1, 3)
    # per array axis (k, j, i): each cube's first voxel (N,), width (N,) and weights (N, P, widest)
    (fk, nk, wk), (fj, nj, wj), (fi, ni, wi) = (
        _axis_weights(ijk[:, a, None] + ax[None, :] * step[a], size_kji[2 - a]) for a in (2, 1, 0)
    )
    fk, nk, fj, nj, fi, ni = (v.tolist() for v in (fk, nk, fj, nj, fi, ni))  # Python ints: cheap slicing below
    cubes = np.empty((len(ijk), patch, patch, patch), dtype=np.float32)  # (a, b, c) along k, j, i
    for n in range(len(ijk)):
        crop = np.asarray(volume.array[fk[n] : fk[n] + nk[n], fj[n] : fj[n] + nj[n], fi[n] : fi[n] + ni[n]], dtype=np.float32)
        along_i = crop @ wi[n, :, : ni[n]].T  # (k, j, c)
        along_j = np.matmul(wj[n, :, : nj[n]], along_i)  # (k, b, c)
        np.matmul(wk[n, :, : nk[n]], along_j.reshape(nk[n], -1), out=cubes[n].reshape(patch, -1))  # (a, b * c)
    # [S, P, L], windowed: the whole stack at once
    out[:] = cubes.transpose(0, *(o + 1 for o in order))
    lo_hu, hi_hu = HU_WINDOW
    np.clip(out, lo_hu, hi_hu, out=out)
    out -= np.float32(lo_hu)
    out /= np.float32(hi_hu - lo_hu)
    return out


def _axis_weights(coords: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear interpolation at continuous indices ``coords`` (N, M) along an axis of ``size`` voxels, outside it the
    edge voxel: for each of the N rows, the first voxel used (N,), the number of voxels used (N,) and the weights
    (N, M, widest) on voxels ``first .. first + used - 1`` (zero beyond)."""
    below = np.floor(coords)
    frac = coords - below
    i0 = np.clip(below.astype(int), 0, size - 1)
    i1 = np.clip(below.astype(int) + 1, 0, size - 1)
    first = np.minimum(i0.min(axis=1), i1.min(axis=1))
    used = np.maximum(i0.max(axis=1), i1.max(axis=1)) - first + 1
    weights = np.zeros((*coords.shape, int(used.max())), dtype=np.float32)
    rows, cols = np.indices(coords.shape)
    # one entry per (row, col) in each statement; both land on the edge voxel outside the series
    weights[rows, cols, i0 - first[:, None]] += (1.0 - frac).astype(np.float32)
    weights[rows, cols, i1 - first[:, None]] += frac.astype(np.float32)
    return first, used, weights


def sample_windowed(volume: CTVolume, center_lps: np.ndarray, offsets_mm: np.ndarray) -> np.ndarray:
    """HU of ``volume`` (trilinear; outside the series the edge value) at ``center_lps + offsets_mm`` (LPS mm;
    offsets (M, 3)), windowed to ``HU_WINDOW`` and scaled to 0..1, float32 (M,)."""
    arr = volume.array
    shape_kji = np.asarray(arr.shape)
    reach_vox = np.ceil(np.abs(offsets_mm).max() * np.sqrt(3) / np.asarray(volume.spacing)[::-1]).astype(int) + 2
    c = np.round(volume.lps_to_index(center_lps).reshape(3)[::-1]).astype(int)
    lo = np.clip(c - reach_vox, 0, shape_kji - 1)
    hi = np.clip(c + reach_vox + 1, lo + 1, shape_kji)
    crop = np.asarray(arr[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]], dtype=np.float32)
    kji = volume.lps_to_index(np.asarray(center_lps, np.float64) + offsets_mm)[:, ::-1] - lo
    vals = ndimage.map_coordinates(crop, kji.T, order=1, mode="nearest")
    lo_hu, hi_hu = HU_WINDOW
    return ((np.clip(vals, lo_hu, hi_hu) - lo_hu) / (hi_hu - lo_hu)).astype(np.float32)


def _unit_offsets(patch: int) -> np.ndarray:
    """The cube's points (P^3, 3) as L, P, S offsets in grid steps from its centre, in ``[S, P, L]`` order."""
    ax = np.arange(patch) - (patch - 1) / 2.0
    zz, yy, xx = np.meshgrid(ax, ax, ax, indexing="ij")
    return np.stack([xx.ravel(), yy.ravel(), zz.ravel()], axis=1)


class DevicePatches:
    """The cubes of :func:`extract_patches` for ``centers_lps`` (N, 3; LPS mm), one channel per grid spacing of
    ``spacings_mm``, cut on ``device``.

    The series' voxels that any cube reaches (the box around all of them, within the series) are copied to the
    device once, as float32; :meth:`cubes` then samples a batch of positions with ``torch.nn.functional.grid_sample``
    (trilinear, ``align_corners=True``; ``padding_mode="border"`` repeats the edge value outside the series, as
    :func:`extract_patches` does). Same values as :func:`extract_patches` up to float32 rounding, on any grid
    orientation.
    """

    def __init__(
        self,
        volume: CTVolume,
        centers_lps: np.ndarray,
        *,
        patch: int,
        spacings_mm: Sequence[float],
        device: str | torch.device,
    ) -> None:
        self.patch = int(patch)
        self.spacings_mm = tuple(float(s) for s in spacings_mm)
        self.device = torch.device(device)
        centers = np.asarray(centers_lps, dtype=np.float64).reshape(-1, 3)
        # (P^3, 3): index (i, j, k) steps per mm of grid spacing, the series' affine being linear
        unit = volume.lps_to_index(_unit_offsets(self.patch)) - volume.lps_to_index(np.zeros(3))
        ijk = volume.lps_to_index(centers).reshape(-1, 3)
        size_ijk = np.asarray(volume.array.shape[::-1])
        if len(centers):
            reach = np.abs(unit).max(axis=0) * max(self.spacings_mm)
            lo = np.clip(np.floor(ijk.min(axis=0) - reach).astype(int), 0, size_ijk - 1)
            hi = np.clip(np.ceil(ijk.max(axis=0) + reach).astype(int) + 1, lo + 1, size_ijk)
        else:
            lo, hi = np.zeros(3, dtype=int), np.ones(3, dtype=int)
        crop = np.ascontiguousarray(volume.array[lo[2] : hi[2], lo[1] : hi[1], lo[0] : hi[0]])
        self._voxels = torch.from_numpy(crop).to(self.device).float()[None, None]  # (1, 1, K, J, I)
        self._scale = torch.tensor(2.0 / np.maximum(hi - lo - 1, 1), dtype=torch.float32, device=self.device)
        self._centres = torch.from_numpy(ijk - lo).float().to(self.device)  # (N, 3) i, j, k within the copy
        self._unit = torch.from_numpy(unit).float().to(self.device)

    def __len__(self) -> int:
        return int(self._centres.shape[0])

    def cubes(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Float32 ``(n, C, P, P, P)`` on the device for positions ``start .. stop - 1`` (default: all), in 0..1."""
        centres = self._centres[start:stop]
        n, p = int(centres.shape[0]), self.patch
        out = torch.empty((n, len(self.spacings_mm), p, p, p), dtype=torch.float32, device=self.device)
        if n == 0:
            return out
        lo_hu, hi_hu = HU_WINDOW
        for c, spacing in enumerate(self.spacings_mm):
            points = centres[:, None, :] + self._unit[None] * spacing  # (n, P^3, 3) continuous i, j, k
            grid = (points * self._scale - 1.0).reshape(1, n * p, p, p, 3)  # x, y, z = i, j, k in -1..1
            hu = F.grid_sample(self._voxels, grid, mode="bilinear", padding_mode="border", align_corners=True)
            out[:, c] = ((hu.reshape(n, p, p, p).clamp(lo_hu, hi_hu) - lo_hu) / (hi_hu - lo_hu)).float()
        return out
