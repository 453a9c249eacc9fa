"""Resampling of voxel arrays from one :class:`~pipeline.geometry.Geometry` to another (torch, on the GPU when
one is present); :meth:`CTVolume.resample <pipeline.volume.CTVolume.resample>` and
:meth:`LabelMap.resample <pipeline.volume.LabelMap.resample>` use it."""

from __future__ import annotations

from typing import Literal

import numpy as np

from .errors import GeometryError
from .geometry import DIRECTION_TOL, Geometry


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resample_array(
    array: np.ndarray,
    src: Geometry,
    dst: Geometry,
    *,
    order: Literal["linear", "nearest"] = "linear",
    device: str | int | None = None,
) -> np.ndarray:
    """Resample ``array`` from grid ``src`` to grid ``dst`` (same direction, any spacing/origin).

    Trilinear (``order="linear"``) or nearest-neighbour interpolation done
    separably along each axis with torch, on the GPU when one is present.
    Samples outside ``src`` take the value of the nearest edge voxel. ``device``: a name of
    :mod:`pipeline.devices` (``auto``, ``cpu``, ``gpu``, ``cuda``, ``cuda:N``) or a GPU number; ``None`` is ``auto``.
    """
    import torch

    from .devices import resolve_device

    if not np.allclose(src.direction, dst.direction, atol=DIRECTION_TOL):
        raise GeometryError("resample_array needs grids with equal direction cosines")
    if order not in ("linear", "nearest"):
        raise GeometryError(
            f"{order!r} is not an interpolation order",
            where="order",
            fix="pass order='linear' (trilinear, for HU) or order='nearest' (for label maps and masks)",
        )
    dev = torch.device(default_device() if device is None else resolve_device(device, where="device"))
    # continuous source index of each destination voxel, per axis (i, j, k)
    offset = src.lps_to_index(dst.origin)
    ratio = np.asarray(dst.spacing) / np.asarray(src.spacing)
    t = torch.from_numpy(np.ascontiguousarray(array)).to(dev)
    if order == "linear":
        t = t.to(torch.float32)
    # tensor dims are [k, j, i]; axis c of (i, j, k) is tensor dim 2 - c
    for c in range(3):
        dim = 2 - c
        n_src = src.size_ijk[c]
        n_dst = dst.size_ijk[c]
        pos = torch.arange(n_dst, dtype=torch.float64, device=dev) * float(ratio[c]) + float(offset[c])
        pos = pos.clamp(0, n_src - 1)
        if order == "nearest":
            idx = torch.floor(pos + 0.5).long().clamp(0, n_src - 1)
            t = t.index_select(dim, idx)
            continue
        lo = torch.floor(pos).long().clamp(0, n_src - 1)
        hi = (lo + 1).clamp(max=n_src - 1)
        w = (pos - lo.to(torch.float64)).to(torch.float32)
        shape = [1, 1, 1]
        shape[dim] = n_dst
        w = w.view(shape)
        t = t.index_select(dim, lo) * (1 - w) + t.index_select(dim, hi) * w
    return t.cpu().numpy()


def resample_measured(
    measured: np.ndarray,
    src: Geometry,
    dst: Geometry,
    *,
    order: Literal["linear", "nearest"] = "linear",
) -> np.ndarray:
    """Bool ``[k, j, i]`` on ``dst``: which voxels of an array resampled from ``src`` with :func:`resample_array`
    (same ``order``) hold only measured values, given ``measured`` (bool ``[k, j, i]`` on ``src``, e.g. the voxels some
    image of a tilt-corrected grid measured, :func:`pipeline.ingest.measured.measured_mask`).

    Unmeasured wins at the boundary: a linearly resampled voxel counts as measured only when every source voxel its
    interpolation reads with a weight above 0 was; a nearest-neighbour one when its nearest source voxel was, and
    both at an exact half-way tie. Positions are those :func:`resample_array` samples (index space, outside ``src``
    the edge voxel)."""
    if not np.allclose(src.direction, dst.direction, atol=DIRECTION_TOL):
        raise GeometryError("resample_measured needs grids with equal direction cosines")
    m = np.asarray(measured, dtype=bool)
    offset = src.lps_to_index(dst.origin)
    ratio = np.asarray(dst.spacing) / np.asarray(src.spacing)
    for c in range(3):  # axis c of (i, j, k) is array dim 2 - c
        dim, n_src = 2 - c, src.size_ijk[c]
        pos = np.clip(np.arange(dst.size_ijk[c], dtype=np.float64) * float(ratio[c]) + float(offset[c]), 0, n_src - 1)
        if order == "nearest":
            a = np.clip(np.floor(pos + 0.5), 0, n_src - 1).astype(np.int64)  # resample_array's pick
            b = np.clip(np.ceil(pos - 0.5), 0, n_src - 1).astype(np.int64)  # the other one at a tie
        else:
            a = np.floor(pos).astype(np.int64)
            b = np.where(pos > a, np.minimum(a + 1, n_src - 1), a)
        m = np.take(m, a, axis=dim) & np.take(m, b, axis=dim)
    return m
