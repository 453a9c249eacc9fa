"""Smooth random textures, partial-volume blur and correlated CT noise (all in HU, float32).

* :class:`SmoothField`: a band-limited random field, drawn on a coarse grid and
  interpolated with separable Gaussian weight matrices (three matrix products, no
  per-voxel Python work); evaluated slab by slab.
* :func:`blur_and_noise`: Gaussian blur along the slice axis (slice profile of
  the given thickness), then white noise, then an in-plane blur of both
  (reconstruction kernel), so CT noise is correlated within a slice.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter, gaussian_filter1d


def _weights(n: int, n_coarse: int, step: float, sigma: float) -> np.ndarray:
    pos = np.arange(n) / step + 1.0  # coarse index of each fine sample (one padding cell)
    w = np.exp(-0.5 * ((pos[:, None] - np.arange(n_coarse)[None, :]) / sigma) ** 2)
    w /= np.sqrt((w**2).sum(axis=1, keepdims=True))  # unit variance for unit-variance coarse noise
    return w.astype(np.float32)


class SmoothField:
    """Zero-mean random field of standard deviation ``amplitude`` on a grid of ``shape`` [z, y, x].

    ``feature_vox`` gives the correlation length along each axis in voxels.
    """

    def __init__(self, rng: np.random.Generator, shape: tuple[int, int, int], feature_vox: tuple[float, float, float], amplitude: float):
        steps = [max(float(f), 1.0) for f in feature_vox]
        coarse = [int(np.ceil(n / st)) + 3 for n, st in zip(shape, steps)]
        g = rng.standard_normal(coarse).astype(np.float32) * np.float32(amplitude)
        self._wz = _weights(shape[0], coarse[0], steps[0], 0.7)
        wy = _weights(shape[1], coarse[1], steps[1], 0.7)
        wx = _weights(shape[2], coarse[2], steps[2], 0.7)
        h = np.tensordot(g, wx, axes=([2], [1]))  # (cz, cy, nx)
        self._h = np.matmul(wy[None], h)  # (cz, ny, nx)
        self.shape = shape

    def slab(self, k0: int, k1: int) -> np.ndarray:
        """Field values of canonical slices ``k0 <= z < k1`` (float32)."""
        wz = self._wz[k0:k1]
        flat = self._h.reshape(self._h.shape[0], -1)
        return (wz @ flat).reshape(k1 - k0, self.shape[1], self.shape[2])


def _kernel_power(sigma: float, truncate: float) -> float:
    """Sum of squared weights of scipy's 1-D Gaussian kernel (the variance kept by the filter)."""
    radius = int(truncate * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-0.5 * (x / sigma) ** 2)
    w /= w.sum()
    return float((w**2).sum())


def blur_and_noise(
    hu: np.ndarray,
    rng: np.random.Generator,
    *,
    sigma_vox_zyx: tuple[float, float, float],
    noise_hu: float,
    slab: int = 16,
) -> None:
    """Partial-volume blur and correlated noise, in place on ``hu`` [z, y, x] (float32, HU).

    The slice profile is a Gaussian of ``sigma_vox_zyx[0]`` slices. White
    noise is then added and blurred in-plane together with the anatomy (the
    reconstruction kernel), so the noise is correlated within a slice; it is
    scaled so that its standard deviation is ``noise_hu`` after the blur.
    """
    truncate = 3.0
    sz, sy, sx = sigma_vox_zyx
    if sz >= 0.15:
        gaussian_filter1d(hu, sz, axis=0, output=hu, mode="nearest", truncate=truncate)
    blur = sy >= 0.15 or sx >= 0.15
    power = 1.0
    if sy >= 0.15:
        power *= _kernel_power(sy, truncate)
    if sx >= 0.15:
        power *= _kernel_power(sx, truncate)
    gain = np.float32(noise_hu / np.sqrt(power))
    for k0 in range(0, hu.shape[0], slab):
        part = hu[k0 : k0 + slab]
        if noise_hu > 0:
            noise = rng.standard_normal(part.shape, dtype=np.float32)
            noise *= gain
            part += noise
        if blur:
            gaussian_filter(part, (0.0, sy if sy >= 0.15 else 0.0, sx if sx >= 0.15 else 0.0), output=part, mode="nearest", truncate=truncate)
