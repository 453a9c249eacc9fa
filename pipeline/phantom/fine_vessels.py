"""Peripheral lung vessels finer than a voxel, painted by their partial volume (LPS mm, HU).

The vessel trees of :mod:`.vessels` stop at what the scan resolves and are painted by
:func:`.tubes.coverage`, which renders a tube of any calibre at nearly full blood density on
its axis. Real lungs also hold the vessels beyond: branches of 0.4-1 mm radius that a
voxel of 1-2 mm only partly contains. On a real chest CT they are the faint dots and short
lines of about -700 to -150 HU that fill the periphery (several hundred local maxima per
litre of lung in each 150 HU band from -600 to -150 HU); seen in cross-section they look like
small ground-glass nodules, the confusers a detector trained on bright phantom vessels mistakes
for them.

:func:`paint_fine_vessels` grows small trees (a segment, then two generations of two tapering
children) from random points of the lung, pointing away from the hilum, and adds each
segment's volume to the voxels it passes (trilinear splat of samples every quarter voxel):
a voxel's blood fraction is the vessel volume inside it over its own volume, so the
brightness follows the calibre and the voxel size as partial volume does on a scanner.
The slice profile, in-plane kernel and noise of the acquisition act on them afterwards.
"""

from __future__ import annotations

import numpy as np

from .layout import Layout
from .scanner import CanonicalGrid
from .vessels import hilum

#: Small trees per litre of lung, and each tree's first radius range (mm).
TREES_PER_LITRE = 400.0
ROOT_RADIUS_MM = (0.45, 0.85)
GENERATIONS = 2  # after the root segment: up to 1 + 2 + 4 segments per tree


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def fine_vessel_segments(
    layout: Layout, grid: CanonicalGrid, lung: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments ``a → b`` (LPS mm, (n, 3) each) and their radii (mm, (n,)) of the fine trees in ``lung``."""
    voxel_mm3 = grid.pixel_spacing**2 * grid.slice_spacing
    cells = np.flatnonzero(lung.reshape(-1))
    n_trees = int(rng.poisson(TREES_PER_LITRE * len(cells) * voxel_mm3 / 1e6))
    if n_trees == 0:
        return np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)
    k, j, i = np.unravel_index(rng.choice(cells, size=n_trees), lung.shape)
    jitter = rng.uniform(-0.5, 0.5, (n_trees, 3))  # (x, y, z)
    start = grid.lps_of(np.stack([k + jitter[:, 2], j + jitter[:, 1], i + jitter[:, 0]], axis=1))
    hila = np.stack([hilum(layout, -1.0), hilum(layout, 1.0)])
    side = (start[:, 0] > 0).astype(int)  # +x is the patient's left
    direction = _unit(_unit(start - hila[side]) + 0.7 * rng.normal(size=(n_trees, 3)))
    radius = rng.uniform(*ROOT_RADIUS_MM, n_trees)
    a_all, b_all, r_all = [], [], []
    for _ in range(GENERATIONS + 1):
        length = rng.uniform(5.0, 11.0, len(start)) * (0.6 + radius)
        end = start + direction * length[:, None]
        a_all.append(start)
        b_all.append(end)
        r_all.append(radius)
        # two children at each end, turned 20-45 degrees apart, thinner by Murray's law (about 0.79)
        start = np.repeat(end, 2, axis=0)
        parent = np.repeat(direction, 2, axis=0)
        turn = _unit(np.cross(parent, rng.normal(size=parent.shape)))
        angle = np.deg2rad(rng.uniform(20.0, 45.0, len(start)))
        direction = _unit(parent * np.cos(angle)[:, None] + turn * np.sin(angle)[:, None])
        radius = np.repeat(radius, 2) * rng.uniform(0.72, 0.86, len(start))
    return np.concatenate(a_all), np.concatenate(b_all), np.concatenate(r_all)


def blood_fraction(grid: CanonicalGrid, a: np.ndarray, b: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """Per-voxel fraction (0..1, float32, canonical grid) filled by the segments ``a → b`` of ``radius`` mm."""
    shape = grid.shape
    seg = b - a
    length = np.linalg.norm(seg, axis=1)
    # samples every quarter voxel (at least two per segment), each carrying its share of the segment's volume
    samples = np.maximum(2, np.ceil(length / (0.25 * min(grid.pixel_spacing, grid.slice_spacing)))).astype(np.int64)
    owner = np.repeat(np.arange(len(a)), samples)
    first = np.cumsum(samples) - samples
    t = (np.arange(len(owner)) - first[owner] + 0.5) / samples[owner]
    idx = grid.index_of(a[owner] + t[:, None] * seg[owner])  # continuous (z, y, x)
    voxel_mm3 = float(np.prod(grid.spacing_zyx))
    volume = (np.pi * radius**2 * length / samples / voxel_mm3)[owner]  # share of one voxel per sample
    base = np.floor(idx).astype(np.int64)
    w = idx - base
    frac = np.zeros(int(np.prod(shape)), dtype=np.float64)
    for corner in np.ndindex(2, 2, 2):  # trilinear splat onto the 8 surrounding voxels
        c = base + np.asarray(corner)
        ok = np.all((c >= 0) & (c < np.asarray(shape)), axis=1)
        wt = np.prod(np.where(np.asarray(corner, bool), w, 1.0 - w), axis=1)
        flat = np.ravel_multi_index(tuple(c[ok].T), shape)
        frac += np.bincount(flat, weights=volume[ok] * wt[ok], minlength=frac.size)
    return np.minimum(frac, 1.0).astype(np.float32).reshape(shape)


def paint_fine_vessels(
    layout: Layout, grid: CanonicalGrid, hu: np.ndarray, lung: np.ndarray, rng: np.random.Generator, *, blood_hu: float
) -> int:
    """Paint sub-voxel peripheral vessels into ``hu`` (canonical grid, in place) inside ``lung``; returns their segment count.

    Each voxel moves from its own HU towards ``blood_hu`` by its blood fraction (:func:`blood_fraction`);
    voxels outside ``lung`` (walls, larger vessels, nodules placed later) are not touched.
    """
    a, b, radius = fine_vessel_segments(layout, grid, lung, rng)
    if not len(a):
        return 0
    frac = blood_fraction(grid, a, b, radius)
    frac *= lung
    hu += frac * (np.float32(blood_hu) - hu)
    return len(a)
