"""Synthetic CT volumes with smooth structures beyond a lung window on both sides, for the loader tests."""

from __future__ import annotations

import numpy as np

from pipeline.volume import CTVolume, Geometry


def synthetic(shape, spacing, direction=np.eye(3), origin=(-120.5, -80.25, -310.0), dtype=np.int16, seed=0) -> CTVolume:
    """Smooth structures spanning -1200..1600 HU (beyond the window on both sides) plus noise."""
    rng = np.random.default_rng(seed)
    k, j, i = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij")
    hu = 900 * np.sin(i / 4.3) + 700 * np.cos(j / 5.1) + 400 * np.sin(k / 2.7 + 1) - 200 + rng.normal(0, 40, shape)
    return CTVolume(hu.astype(dtype), Geometry(shape=shape, spacing=spacing, origin=origin, direction=direction))
