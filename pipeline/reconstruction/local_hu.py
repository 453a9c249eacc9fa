"""Local HU statistics on the working grid: 3-wide box sums, in-plane 3x3 mean, median and spread, image noise.

Tensors are ``[k, j, i]`` (LPS mm geometry, see :mod:`pipeline.volume`) of HU; ``slice_axis``
is the array axis across the slices, so "in-plane" means the two other axes. The in-plane 3x3
standard deviation of HU (the "spread", HU) is texture: trabecular bone is textured, blood and
soft tissue are smooth up to the image noise. The image noise (HU) is the lower quartile of
that spread over soft tissue (in-plane mean between :data:`SOFT_LOW_HU` and :data:`SOFT_HIGH_HU`),
where the quartile keeps organ edges and vessels out of the estimate.
"""

from __future__ import annotations

import torch

__all__ = [
    "image_noise",
    "in_plane_mean",
    "in_plane_median_at",
    "in_plane_spread",
    "masked_in_plane_mean",
    "noise_hu",
    "soft_tissue",
    "sum3",
]

SOFT_LOW_HU = -100.0  # soft tissue's in-plane 3x3 mean is above this (HU): fat and air are below
SOFT_HIGH_HU = 100.0  # and below this (HU): bone and contrast-enhanced blood are above
NOISE_SAMPLES = 500_000  # at most about this many soft-tissue voxels enter the noise estimate
DEFAULT_NOISE_HU = 20.0  # image noise (HU) assumed where a scan holds no soft tissue


def sum3(t: torch.Tensor, dims: tuple[int, ...], *, zero_edges: bool = False) -> torch.Tensor:
    """Sum over a window of 3 along each of ``dims`` (edges replicated, or zero outside); separable."""
    out = t
    for d in dims:
        n = out.shape[d]
        first, last = out.narrow(d, 0, 1), out.narrow(d, n - 1, 1)
        if zero_edges:
            first, last = torch.zeros_like(first), torch.zeros_like(last)
        pad = torch.cat([first, out, last], dim=d)
        out = pad.narrow(d, 0, n) + pad.narrow(d, 1, n) + pad.narrow(d, 2, n)
    return out


def _in_plane(slice_axis: int) -> tuple[int, ...]:
    """The two array axes within a slice."""
    return tuple(d for d in range(3) if d != slice_axis)


def in_plane_mean(hu: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """The 3x3 in-plane mean of ``hu`` (edges replicated); ``slice_axis`` is the array axis across the slices."""
    return sum3(hu, _in_plane(slice_axis)) / 9.0


def in_plane_spread(hu: torch.Tensor, slice_axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3x3 in-plane mean, 3x3 in-plane standard deviation) of ``hu`` (HU, edges replicated)."""
    inplane = _in_plane(slice_axis)
    mean = sum3(hu, inplane) / 9.0
    spread = (sum3(hu * hu, inplane) / 9.0 - mean * mean).clamp(min=0).sqrt()
    return mean, spread


def masked_in_plane_mean(hu: torch.Tensor, mask: torch.Tensor, slice_axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean HU, count) over the voxels of ``mask`` in each voxel's in-plane 3x3 neighbourhood (itself included).

    Outside the image counts as outside ``mask``; the mean is 0 where the count is 0. ``hu``
    and ``mask`` are ``[k, j, i]`` tensors of one shape.
    """
    inplane = _in_plane(slice_axis)
    w = mask.to(hu.dtype)
    count = sum3(w, inplane, zero_edges=True)
    return sum3(hu * w, inplane, zero_edges=True) / count.clamp(min=1), count


def soft_tissue(mean: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """The voxels of ``where`` whose in-plane mean ``mean`` (HU) is that of soft tissue (see the module docstring)."""
    return where & (mean > SOFT_LOW_HU) & (mean < SOFT_HIGH_HU)


def noise_hu(spread: torch.Tensor, soft: torch.Tensor) -> float:
    """Image noise (HU): the lower quartile of ``spread`` over ``soft`` (:data:`DEFAULT_NOISE_HU` when empty)."""
    values = spread[soft]
    values = values[:: max(1, values.numel() // NOISE_SAMPLES)]
    return float(torch.quantile(values, 0.25)) if values.numel() else DEFAULT_NOISE_HU


def image_noise(hu: torch.Tensor, body: torch.Tensor, slice_axis: int) -> float:
    """Image noise (HU): the lower quartile of the in-plane 3x3 standard deviation in soft tissue of ``body``."""
    mean, spread = in_plane_spread(hu, slice_axis)
    return noise_hu(spread, soft_tissue(mean, body))


def in_plane_median_at(hu: torch.Tensor, where: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """The 3x3 in-plane median of ``hu`` (edges replicated) at the voxels of ``where``, NaN elsewhere."""
    inplane = _in_plane(slice_axis)
    pad = [0, 0, 0, 0, 0, 0]  # F.pad order: last dim first
    for d in inplane:
        pad[2 * (2 - d)] = pad[2 * (2 - d) + 1] = 1
    padded = torch.nn.functional.pad(hu[None, None], pad, mode="replicate")[0, 0]
    n0, n1 = (hu.shape[d] for d in inplane)
    values = []
    for a in range(3):
        for b in range(3):
            view = padded.narrow(inplane[0], a, n0).narrow(inplane[1], b, n1)
            values.append(view[where])
    out = torch.full_like(hu, float("nan"))
    if values[0].numel():
        out[where] = torch.stack(values).median(dim=0).values
    return out
