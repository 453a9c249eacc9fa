"""The small-blob search's filters on a torch device (a GPU): the same maxima as :mod:`.candidates` on the CPU.

:func:`device_maxima` takes the clipped HU array that :func:`.candidates.blob_candidates` searches and returns
what its CPU filters give: the local maxima of the best scale-normalised Laplacian-of-Gaussian response, that
response, the index of its scale and the Hessian's eigenvalue ratio there. Each Gaussian is SciPy's
(``ndimage.gaussian_filter`` with ``mode="nearest"``: the same kernel, truncated at the same radius, the edge
voxel repeated), applied axis by axis as sums of shifted copies in float32, so no convolution routine's reduced
precision (TF32 on recent NVIDIA GPUs) enters; the Laplacian, the best scale (a tie keeps the smaller) and the
3 × 3 × 3 maxima follow the CPU code step by step. Only the maxima's positions and values come back to the host,
with each maximum's neighbourhood, whose Hessian measure (:func:`hessian_ratio`, shared with the CPU search) is
taken there.
Values agree with the CPU's to float32 rounding; a maximum whose response ties a neighbour's to the last bits may
differ.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _gaussian_weights(sigma_vox: float, truncate: float) -> np.ndarray:
    """SciPy's 1-D Gaussian kernel (``ndimage.gaussian_filter``): radius ``int(truncate * sigma + 0.5)``, weights
    summing to 1."""
    radius = int(truncate * float(sigma_vox) + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-0.5 * (x / float(sigma_vox)) ** 2)
    return w / w.sum()


def _smooth_axis(x: torch.Tensor, weights: np.ndarray, axis: int) -> torch.Tensor:
    """``x`` (K, J, I) correlated along ``axis`` with ``weights`` (odd length), the edge voxel repeated beyond the
    ends (SciPy's ``mode="nearest"``)."""
    radius = len(weights) // 2
    n = x.shape[axis]
    pad = [0, 0, 0, 0, 0, 0]  # F.pad order: last axis first
    pad[2 * (2 - axis)] = pad[2 * (2 - axis) + 1] = radius
    padded = F.pad(x[None, None], pad, mode="replicate")[0, 0]
    out = torch.zeros_like(x)
    for t, w in enumerate(weights):
        out += float(w) * padded.narrow(axis, t, n)
    return out


def _gaussian(x: torch.Tensor, sigma_vox: np.ndarray, truncate: float) -> torch.Tensor:
    for axis in range(3):
        x = _smooth_axis(x, _gaussian_weights(float(sigma_vox[axis]), truncate), axis)
    return x


def _laplacian(f: torch.Tensor, spacing_kji: np.ndarray) -> torch.Tensor:
    """Second-difference Laplacian (HU/mm^2), 0 on the outermost voxels (as :func:`.candidates._laplacian_mm`)."""
    out = torch.zeros_like(f)
    c = f[1:-1, 1:-1, 1:-1]
    inner = out[1:-1, 1:-1, 1:-1]
    pairs = (
        (f[:-2, 1:-1, 1:-1], f[2:, 1:-1, 1:-1]),
        (f[1:-1, :-2, 1:-1], f[1:-1, 2:, 1:-1]),
        (f[1:-1, 1:-1, :-2], f[1:-1, 1:-1, 2:]),
    )
    for axis, (before, after) in enumerate(pairs):
        inner += (before + after - 2.0 * c) * float(np.float32(1.0 / float(spacing_kji[axis]) ** 2))
    return out


def hessian_ratio(smoothed: np.ndarray, kji: np.ndarray, spacing_kji: np.ndarray) -> np.ndarray:
    """Smallest over largest Hessian eigenvalue magnitude of ``smoothed`` (K, J, I; a grid of ``spacing_kji`` mm) at
    ``kji`` (M, 3) (1: a ball, about 0: a tube or a wall), 0 where the intensity is not a maximum along every
    direction (an eigenvalue >= 0); positions on the outermost voxels are taken one voxel inside. Shared by the CPU
    search and :func:`device_maxima`."""
    k, j, i = (np.clip(kji[:, a], 1, smoothed.shape[a] - 2) for a in range(3))
    f = smoothed
    h = np.empty((len(k), 3, 3))
    c = f[k, j, i]
    h[:, 0, 0] = f[k + 1, j, i] + f[k - 1, j, i] - 2 * c
    h[:, 1, 1] = f[k, j + 1, i] + f[k, j - 1, i] - 2 * c
    h[:, 2, 2] = f[k, j, i + 1] + f[k, j, i - 1] - 2 * c
    h[:, 0, 1] = h[:, 1, 0] = (f[k + 1, j + 1, i] - f[k + 1, j - 1, i] - f[k - 1, j + 1, i] + f[k - 1, j - 1, i]) / 4
    h[:, 0, 2] = h[:, 2, 0] = (f[k + 1, j, i + 1] - f[k + 1, j, i - 1] - f[k - 1, j, i + 1] + f[k - 1, j, i - 1]) / 4
    h[:, 1, 2] = h[:, 2, 1] = (f[k, j + 1, i + 1] - f[k, j + 1, i - 1] - f[k, j - 1, i + 1] + f[k, j - 1, i - 1]) / 4
    h /= np.outer(spacing_kji, spacing_kji)[None]
    ev = np.linalg.eigvalsh(h)  # ascending: most negative first
    return np.where(ev[:, 2] < 0, ev[:, 2] / np.minimum(ev[:, 0], -1e-9), 0.0)


def _device_hessian_ratio(f: torch.Tensor, kji: torch.Tensor, spacing_kji: np.ndarray) -> np.ndarray:
    """:func:`hessian_ratio` of ``f`` at ``kji`` (M, 3): each position's 3 x 3 x 3 neighbourhood is gathered on the
    device and the ratio taken on the host, with the neighbourhoods stacked along k (neighbourhood m's centre at
    k = 3m + 1)."""
    shape = torch.tensor(f.shape, device=f.device)
    centre = torch.minimum(torch.clamp(kji, min=1), shape - 2)  # as hessian_ratio: one voxel inside the edge
    d = torch.arange(-1, 2, device=f.device)
    dk, dj, di = (x.reshape(-1) for x in torch.meshgrid(d, d, d, indexing="ij"))
    nb = f[centre[:, 0, None] + dk, centre[:, 1, None] + dj, centre[:, 2, None] + di]  # (M, 27)
    stacked = nb.reshape(-1, 3, 3).double().cpu().numpy()  # (3M, 3, 3)
    m = np.arange(len(kji))
    return hessian_ratio(stacked, np.stack([3 * m + 1, np.ones_like(m), np.ones_like(m)], axis=1), spacing_kji)


@torch.no_grad()
def device_maxima(
    arr: np.ndarray,
    radii_mm: tuple[float, ...],
    spacing_kji: np.ndarray,
    *,
    min_response_hu: float,
    truncate: float,
    device: str | torch.device,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For ``arr`` (K, J, I; HU, already clipped) on a grid of ``spacing_kji`` (mm): the local maxima (M, 3; k, j, i)
    of the best response at or above ``min_response_hu``, their response (HU, float64), the index of their scale in
    ``radii_mm`` and their Hessian ratio (see the module docstring)."""
    x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).to(device)
    best = torch.empty_like(x)
    scale = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    smoothed = []
    for n, r in enumerate(radii_mm):
        sigma_mm = r / np.sqrt(3.0)
        s = _gaussian(x, sigma_mm / np.asarray(spacing_kji, dtype=np.float64), truncate)
        smoothed.append(s)
        resp = _laplacian(s, spacing_kji) * float(np.float32(-(sigma_mm**2)))
        if n == 0:
            best.copy_(resp)
            continue
        better = resp > best
        best = torch.where(better, resp, best)
        scale[better] = n
    top = F.max_pool3d(best[None, None], kernel_size=3, stride=1, padding=1)[0, 0]  # the padding never wins
    peaks = (best == top) & (best >= min_response_hu)
    kji = torch.nonzero(peaks)
    if len(kji) == 0:
        empty = np.zeros(0)
        return np.zeros((0, 3), dtype=int), empty, np.zeros(0, dtype=np.uint8), empty
    k, j, i = kji.T
    which_t = scale[k, j, i]
    ratio = np.zeros(len(kji))
    which = which_t.cpu().numpy()
    for n in range(len(radii_mm)):
        sel = which == n
        if sel.any():
            ratio[sel] = _device_hessian_ratio(smoothed[n], kji[torch.from_numpy(sel).to(kji.device)], spacing_kji)
    return kji.cpu().numpy(), best[k, j, i].double().cpu().numpy(), which, ratio
