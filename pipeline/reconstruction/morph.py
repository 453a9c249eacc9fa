"""Binary morphology and connected components for segmentation.

Masks are boolean arrays indexed ``[k, j, i]`` (see :mod:`pipeline.volume`).
Dilation, erosion, closing and opening run in torch (separable running ORs with
box structuring elements, on the GPU when the tensor lives there); connected
component labelling, which torch lacks, uses :func:`scipy.ndimage.label` on the
CPU. Outside the array counts as "like the nearest voxel" for erosion, so an
organ that leaves the field of view is not eaten away at the cut.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from scipy import ndimage

log = logging.getLogger(__name__)

# 6-connectivity in 3-D, and in-plane 4-connectivity for slice-wise operations
CONN6 = ndimage.generate_binary_structure(3, 1)


def radius_vox(radius_mm: float, spacing_ijk: Sequence[float]) -> tuple[int, int, int]:
    """Half-widths in voxels ``(rk, rj, ri)`` of a box of half-size ``radius_mm`` (spacing in mm, (i, j, k))."""
    si, sj, sk = (float(s) for s in spacing_ijk)
    return (int(round(radius_mm / sk)), int(round(radius_mm / sj)), int(round(radius_mm / si)))


def _or_ahead(m: torch.Tensor, dim: int, step: int) -> torch.Tensor:
    """``out[i] = m[i] | m[i + step]`` along ``dim`` (beyond the end counts as False)."""
    n = m.shape[dim]
    out = m.clone()
    if step < n:
        out.narrow(dim, 0, n - step).logical_or_(m.narrow(dim, step, n - step))
    return out


def _dilate_axis(m: torch.Tensor, dim: int, r: int) -> torch.Tensor:
    """Running OR over the centred window ``[i - r, i + r]`` along ``dim`` in O(log r) passes."""
    if r <= 0:
        return m
    n = m.shape[dim]
    if r <= 2:  # direct shifts: one copy and 2r in-place ORs
        out = m.clone()
        for s in range(1, min(r, n - 1) + 1):
            out.narrow(dim, s, n - s).logical_or_(m.narrow(dim, 0, n - s))
            out.narrow(dim, 0, n - s).logical_or_(m.narrow(dim, s, n - s))
        return out
    shape = list(m.shape)
    shape[dim] = r
    padded = torch.cat([torch.zeros(shape, dtype=torch.bool, device=m.device), m], dim=dim)
    length = 2 * r + 1
    acc = padded
    width = 1
    while 2 * width <= length:
        acc = _or_ahead(acc, dim, width)  # acc[i] = OR of padded[i : i + 2 * width]
        width *= 2
    if width < length:
        acc = _or_ahead(acc, dim, length - width)
    return acc.narrow(dim, 0, m.shape[dim]).contiguous()


def dilate(mask: torch.Tensor, radius: Sequence[int]) -> torch.Tensor:
    """Binary dilation of a bool tensor ``[k, j, i]`` by a box of half-widths (rk, rj, ri) voxels.

    Separable running-OR with doubling shifts: a few bool passes per axis, on any device.
    """
    out = mask.to(torch.bool)
    for dim, r in enumerate(radius):
        out = _dilate_axis(out, dim, int(r))
    return out if out is not mask else mask.clone()


def erode(mask: torch.Tensor, radius: Sequence[int]) -> torch.Tensor:
    """Binary erosion (the dual of :func:`dilate`); the array border does not erode."""
    return ~dilate(~mask.to(torch.bool), radius)


def closing(mask: torch.Tensor, radius: Sequence[int]) -> torch.Tensor:
    """Dilation then erosion: fills gaps and notches narrower than the box."""
    return erode(dilate(mask, radius), radius)


def opening(mask: torch.Tensor, radius: Sequence[int]) -> torch.Tensor:
    """Erosion then dilation: removes bridges and specks thinner than the box."""
    return dilate(erode(mask, radius), radius)


def label(mask: np.ndarray, structure: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of a bool array: ``(labels int32, sizes)`` where ``sizes[n]`` counts label n (sizes[0] = 0)."""
    labels, n = ndimage.label(mask, structure=CONN6 if structure is None else structure)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    sizes[0] = 0
    return labels, sizes


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 6-connected component of ``mask`` (all False when it is empty)."""
    labels, sizes = label(mask)
    if sizes.size <= 1 or sizes.max() == 0:
        return np.zeros_like(mask, dtype=bool)
    return labels == int(np.argmax(sizes))


def keep_labels(labels: np.ndarray, keep: Sequence[int] | np.ndarray, n_labels: int) -> np.ndarray:
    """Boolean mask of voxels whose label is in ``keep`` (a lookup table, no per-label loop)."""
    lut = np.zeros(n_labels + 1, dtype=bool)
    lut[np.asarray(keep, dtype=np.int64)] = True
    lut[0] = False
    return lut[labels]


def in_plane_cross(slice_axis: int) -> np.ndarray:
    """3×3×3 structure of 4-connectivity within each slice across array axis ``slice_axis`` (no link between slices)."""
    structure = np.zeros((3, 3, 3), dtype=bool)
    plane: list[slice] = [slice(None)] * 3
    plane[slice_axis] = slice(1, 2)
    structure[tuple(plane)] = CONN6[tuple(plane)]
    return structure


def fill_holes(mask: np.ndarray, *, slice_axis: int | None = None) -> np.ndarray:
    """Fill background regions not connected to the array border.

    With ``slice_axis`` (an array axis, 0..2) the filling is done per slice
    across that axis (in-plane 4-connectivity), which closes organs that are
    open at the top and bottom of the scan; without it, in 3-D.
    """
    background = ~mask
    structure = CONN6 if slice_axis is None else in_plane_cross(slice_axis)
    labels, n = ndimage.label(background, structure=structure)
    outside = labels_on_border(labels, n, slice_axis=slice_axis)
    outside[0] = False
    return mask | ~outside[labels] & background


def labels_on_border(labels: np.ndarray, n: int, *, slice_axis: int | None = None) -> np.ndarray:
    """Bool ``(n + 1,)``: which of the labels ``0..n`` of ``labels`` (a 3-D label array) touch the array's border; with
    ``slice_axis``, only the faces along the other two axes (the slices' edges, not the first and last slice)."""
    on_border = np.zeros(n + 1, dtype=bool)
    for ax in range(3):
        if ax == slice_axis:
            continue
        for end in (0, -1):
            face: list[int | slice] = [slice(None)] * 3
            face[ax] = end
            on_border[np.unique(labels[tuple(face)])] = True
    return on_border


@contextmanager
def torch_threads(device: torch.device, n: int | None) -> Iterator[None]:
    """Run CPU torch work with ``n`` intra-op threads (restored afterwards); no-op on a GPU or for None.

    The mask operations here are memory-bound; on a shared CPU extra threads mostly wait for each other.
    """
    if device.type != "cpu" or not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def to_tensor(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A torch tensor on ``device`` sharing memory with ``array`` on the CPU when possible: a read-only array (a
    cached case read as a memory map) is copied, since torch cannot keep a tensor from writing into it."""
    return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array)).to(device)
