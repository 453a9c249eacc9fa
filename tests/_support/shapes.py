"""Synthetic shapes, a small synthetic chest with its true masks (defined in LPS mm) and the Dice overlap, for the tests."""

from __future__ import annotations

import numpy as np

from pipeline.volume import CTVolume, Geometry


def lps_grids(geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full LPS x, y, z arrays [k, j, i] of a grid (mm)."""
    nk, nj, ni = geometry.shape
    kk, jj, ii = np.meshgrid(np.arange(nk), np.arange(nj), np.arange(ni), indexing="ij")
    ijk = np.stack([ii, jj, kk], axis=-1).astype(np.float64)
    lps = geometry.index_to_lps(ijk)
    return lps[..., 0], lps[..., 1], lps[..., 2]


def tilted_volume(tilt_deg: float, markers: list[np.ndarray], *, n: int = 90, spacing_mm: float = 1.5) -> CTVolume:
    """Soft tissue (40 HU) on an ``n``³ grid centred on the LPS origin and turned ``tilt_deg`` about L-R (a gantry-tilt
    corrected series), with bone balls (1200 HU, radius 5 mm) at ``markers`` (LPS mm)."""
    t = np.radians(tilt_deg)
    direction = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(t), -np.sin(t)], [0.0, np.sin(t), np.cos(t)]])
    origin = -(direction * spacing_mm) @ np.full(3, (n - 1) / 2)
    geom = Geometry(shape=(n, n, n), spacing=(spacing_mm,) * 3, origin=tuple(origin), direction=direction)
    x, y, z = lps_grids(geom)
    arr = np.full(geom.shape, 40.0, np.float32)
    for m in markers:
        arr[(x - m[0]) ** 2 + (y - m[1]) ** 2 + (z - m[2]) ** 2 <= 25.0] = 1200.0
    return CTVolume(arr, geom)


def sphere_mask(shape=(40, 40, 40), center=(20, 20, 20), radius=12.0) -> np.ndarray:
    """A ball of ``radius`` voxels around ``center`` (k, j, i) in a boolean array of ``shape`` [k, j, i]."""
    k, j, i = np.ogrid[: shape[0], : shape[1], : shape[2]]
    return (k - center[0]) ** 2 + (j - center[1]) ** 2 + (i - center[2]) ** 2 <= radius**2


def synthetic_chest(
    *,
    n: int = 96,
    spacing: float = 1.5,
    slices: int = 64,
    slice_spacing: float = 2.0,
    direction: np.ndarray | None = None,
    noise: float = 15.0,
    seed: int = 0,
    merged: bool = False,
    with_airway: bool = True,
) -> tuple[CTVolume, dict[str, np.ndarray]]:
    """A chest-like volume (HU) and its true masks, built in LPS mm so any direction works.

    Left lung at +x (patient's left). ``merged=True`` makes the lungs touch at the mid-line.
    """
    direction = np.eye(3) if direction is None else np.asarray(direction, dtype=float)
    size = np.array([n * spacing, n * spacing, slices * slice_spacing])
    # place the grid so that its LPS box is centred on 0
    sp = np.array([spacing, spacing, slice_spacing])
    centre_index = (np.array([n, n, slices]) - 1) / 2.0
    origin = -(direction * sp[None, :]) @ centre_index
    geom = Geometry(shape=(slices, n, n), spacing=tuple(sp), origin=tuple(origin), direction=direction)
    x, y, z = lps_grids(geom)
    w = size[0] / 2
    body = (x / (0.85 * w)) ** 2 + (y / (0.6 * w)) ** 2 <= 1.0
    lung_rx, lung_ry, lung_rz = 0.30 * w, 0.38 * w, 0.40 * size[2]
    gap = 0.0 if merged else 0.06 * w
    cx = lung_rx + gap
    lungs = {}
    for name, sgn in (("lung_left", 1.0), ("lung_right", -1.0)):
        lungs[name] = ((x - sgn * cx) / lung_rx) ** 2 + (y / lung_ry) ** 2 + ((z + 0.05 * size[2]) / lung_rz) ** 2 <= 1.0
    if merged:
        lungs["lung_right"] &= ~lungs["lung_left"]
    # trachea from the top down to the carina, main bronchi into each lung
    r_t = max(2.5 * spacing, 0.07 * w)
    carina = 0.12 * size[2]
    trachea = (x**2 + (y + 0.1 * w) ** 2 <= r_t**2) & (z >= carina) & (z <= size[2] / 2 - 2)
    bronchi = np.zeros_like(trachea)
    for sgn in (1.0, -1.0):
        # a straight tube from the carina towards the lung centre, going down and out
        p0 = np.array([0.0, -0.1 * w, carina])
        p1 = np.array([sgn * cx, -0.05 * w, carina - 0.15 * size[2]])
        d = p1 - p0
        t = ((x - p0[0]) * d[0] + (y - p0[1]) * d[1] + (z - p0[2]) * d[2]) / (d @ d)
        t = np.clip(t, 0, 1)
        dist2 = (x - p0[0] - t * d[0]) ** 2 + (y - p0[1] - t * d[1]) ** 2 + (z - p0[2] - t * d[2]) ** 2
        bronchi |= dist2 <= (0.75 * r_t) ** 2
    airway = (trachea | bronchi) & body
    if not with_airway:
        airway[:] = False
    from scipy import ndimage

    airway_wall = ndimage.binary_dilation(airway, iterations=1) & ~airway & body
    spine = (x / (0.12 * w)) ** 2 + ((y - 0.42 * w) / (0.1 * w)) ** 2 <= 1.0
    ring = (x / (0.8 * w)) ** 2 + (y / (0.55 * w)) ** 2
    ribs = (ring <= 1.0) & (ring >= 0.86) & (np.cos(z / (0.12 * size[2]) * np.pi) > 0.3) & (y > -0.4 * w)
    bone = (spine | ribs) & body
    for name in lungs:
        lungs[name] &= ~airway & ~bone
    vessels = np.zeros_like(body)
    for sgn in (1.0, -1.0):
        vessels |= ((x - sgn * cx) ** 2 + (y - 0.05 * w) ** 2 <= (0.05 * w) ** 2) & (np.abs(z) < 0.25 * size[2])
    hu = np.full(geom.shape, -1000.0, dtype=np.float32)
    hu[body] = 40.0
    hu[lungs["lung_left"] | lungs["lung_right"]] = -850.0
    hu[vessels & (lungs["lung_left"] | lungs["lung_right"])] = 40.0
    hu[airway_wall] = 40.0
    hu[airway] = -1000.0
    hu[bone] = 700.0
    rng = np.random.default_rng(seed)
    hu += rng.normal(0.0, noise, hu.shape).astype(np.float32)
    masks = {"body": body, "airway": airway, "bone": bone, **lungs}
    return CTVolume(hu, geom, metadata={"SeriesInstanceUID": "1.2.3.synthetic"}), masks


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two masks (1.0 when both are empty)."""
    a = a.astype(bool)
    b = b.astype(bool)
    denom = a.sum() + b.sum()
    return 1.0 if denom == 0 else 2.0 * float((a & b).sum()) / float(denom)
