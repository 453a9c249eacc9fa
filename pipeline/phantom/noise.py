"""Smooth random textures, partial-volume blur and correlated CT noise (all in HU, float32).

* :class:`SmoothField`: a band-limited random field, drawn and smoothed on a
  coarse grid and interpolated linearly to the voxels; evaluated slab by slab.
* :func:`blur_and_noise`: Gaussian blur along the slice axis (slice profile of
  the given thickness), then white noise, then an in-plane blur of both
  (reconstruction kernel), so CT noise is correlated within a slice.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter, gaussian_filter1d


def _linear(n: int, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Coarse index below each of ``n`` fine samples (coarse cell = ``step`` samples) and the weight of the next one."""
    pos = np.arange(n) / step + 1.0  # one padding cell before the first sample
    i0 = np.floor(pos).astype(np.intp)
    return i0, (pos - i0).astype(np.float32)


class SmoothField:
    """Zero-mean random field of standard deviation ``amplitude`` on a grid of ``shape`` [z, y, x].

    White noise on a coarse grid (one cell per ``feature_vox`` voxels along
    each axis) is smoothed there and interpolated linearly to the fine grid:
    a few gathers per voxel, no matrix products (so the result does not
    depend on the BLAS library or its threads).
    """

    def __init__(
        self, rng: np.random.Generator, shape: tuple[int, int, int], feature_vox: tuple[float, float, float], amplitude: float
    ):
        steps = [max(float(f), 1.0) for f in feature_vox]
        coarse = [int(np.ceil(n / st)) + 3 for n, st in zip(shape, steps)]
        g = rng.standard_normal(coarse).astype(np.float32)
        g = gaussian_filter(g, 0.7, mode="wrap")
        g *= np.float32(amplitude / max(float(g.std()), 1e-6))
        ix, fx = _linear(shape[2], steps[2])
        h = g[:, :, ix] * (1 - fx) + g[:, :, ix + 1] * fx  # (cz, cy, nx)
        iy, fy = _linear(shape[1], steps[1])
        fy = fy[None, :, None]
        self._h = h[:, iy, :] * (1 - fy) + h[:, iy + 1, :] * fy  # (cz, ny, nx)
        self._iz, self._fz = _linear(shape[0], steps[0])
        self.shape = shape

    def slab(self, k0: int, k1: int) -> np.ndarray:
        """Field values of canonical slices ``k0 <= z < k1`` (float32)."""
        iz = self._iz[k0:k1]
        fz = self._fz[k0:k1][:, None, None]
        out = self._h[iz] * (1 - fz)
        out += self._h[iz + 1] * fz
        return out


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
            gaussian_filter(
                part, (0.0, sy if sy >= 0.15 else 0.0, sx if sx >= 0.15 else 0.0), output=part, mode="nearest", truncate=truncate
            )
