"""Acquisition confounders: metal with streak artefacts, and a sharp reconstruction kernel (HU, canonical grid).

* Metal (painted at 6000 HU before blur, so above 2000 HU after it and
  clipped to 3071 as stored): a chest ``port`` (a titanium reservoir, a
  disc about 25 mm across, in the upper anterior chest's subcutaneous fat) or
  ``spine`` hardware (two rods behind the laminae over three to four levels,
  with pedicle screws into the vertebral bodies). The ``metal`` mask holds it;
  it is not ``bone``.
* Streaks: on each slice through metal, bright and dark lines radiate from
  every metal piece across the whole slice (decaying with distance), with a
  dark band between neighbouring pieces (beam hardening).
* ``sharp`` kernel: the slice profile as usual, then an edge-enhancing
  in-plane kernel (a narrow Gaussian plus an unsharp mask) applied to image
  and noise; the noise is four times the standard kernel's ``noise_hu``.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import center_of_mass, gaussian_filter, gaussian_filter1d, label

from .scene import Scene
from .tubes import Tubes, index_box, signed_distance

METAL_HU = 6000.0
SHARP_NOISE_FACTOR = 4.0


def paint_metal(scene: Scene, hu: np.ndarray, bone: np.ndarray) -> None:
    """Paint the metal object into ``hu`` (after the tubes); fill the ``metal`` mask, clear it from ``bone``."""
    g = scene.grid
    mask = np.zeros(g.shape, dtype=bool)
    scene.masks["metal"] = mask
    kind = scene.conf.metal
    scene.truth["metal"] = {"present": False, "kind": kind}
    if kind == "none":
        return
    L = scene.layout
    s = L.scale
    ps = g.pixel_spacing
    U = scene.rngs["metal"].uniform
    z_lo, z_hi = float(g.zs[0]), float(g.zs[-1])

    def within_scan(z: float, margin: float) -> float:  # metal where the scan is, near its usual place
        return float(np.clip(z, z_lo + margin, z_hi - margin)) if z_hi - z_lo > 2 * margin else 0.5 * (z_lo + z_hi)

    tubes = Tubes()
    if kind == "port":
        side = -1.0 if U() < 0.75 else 1.0  # usually in the right chest
        x = side * 0.42 * L.body_a
        r = max(12.5 * s, 2.0 * ps)
        half = max(5.0 * s, 1.5 * ps)
        # the skin in front of the disc's lateral edge (the chest curves back there)
        y_skin = -(L.body_b_ant * (1.0 - min((abs(x) + r) / L.body_a, 1.0) ** 2.2) ** (1.0 / 2.2))
        y = y_skin + L.skin + half + 0.5 * max(L.fat - 2.0 * half, 0.0)
        z = within_scan(L.z_of_u(U(0.45, 0.65)), r + g.slice_spacing)
        centre = [x, y, z]
        box = index_box(g, np.array([x - r, y - half, z - r]), np.array([x + r, y + half, z + r]))
        if box is not None:  # a disc: radius r in the coronal plane, 2 * half thick front to back
            rad = np.hypot((g.zs[box[0]] - z)[:, None, None], (g.xs[box[2]] - x)[None, None, :])
            disc = (rad < r) & (np.abs(g.ys[box[1]] - y) < half)[None, :, None]
            mask[box] = disc
    else:
        period = L.vert_period
        cy = L.spine_y + L.vb_axes[1] + L.canal_r + 1.0 * s
        y_rod = cy + 0.6 * L.canal_r
        x_rod = L.canal_r + 8.0 * s
        z0 = L.z_mid + L.vert_phase * period + 0.5 * (L.disc + period)
        count = int(U(3.0, 4.99))
        z_mid = within_scan(L.z_of_u(U(-0.6, 0.1)), 0.5 * count * period)
        n0 = int(np.round((z_mid - z0) / period - 0.5 * (count - 1)))
        levels = z0 + period * (n0 + np.arange(count))
        r_rod = max(3.0 * s, 1.0 * ps)
        r_screw = max(2.5 * s, 1.0 * ps)
        for side in (-1.0, 1.0):
            tubes.add(
                np.array([side * x_rod, y_rod, levels[0] - 0.3 * period]),
                np.array([side * x_rod, y_rod, levels[-1] + 0.3 * period]),
                r_rod,
            )
            for zl in levels:
                tubes.add(np.array([side * x_rod, y_rod, zl]), np.array([side * 0.3 * L.vb_axes[0], L.spine_y, zl]), r_screw)
        centre = [0.0, y_rod, float(np.mean(levels))]
    if len(tubes):
        sd = np.empty(g.shape, dtype=np.float32)
        box = signed_distance(g, tubes.split(10.0 * s), sd, pad=ps)
        if box is not None:
            mask[box] |= sd[box] < 0
    hu[mask] = METAL_HU
    bone &= ~mask
    scene.truth["metal"] = {
        "present": bool(mask.any()),
        "kind": kind,
        "center_lps": [round(float(v), 2) for v in centre],
        "volume_mm3": round(float(mask.sum()) * ps * ps * g.slice_spacing, 1),
    }


def add_streaks(scene: Scene, hu: np.ndarray) -> None:
    """Streak artefacts on every slice through metal (before blur and noise, in place)."""
    mask = scene.masks.get("metal")
    if mask is None or not mask.any():
        return
    g = scene.grid
    L = scene.layout
    s = L.scale
    rng = scene.rngs["metal"]
    n_lines = 16
    angles = rng.uniform(0.0, np.pi, n_lines)
    signs = np.where(np.arange(n_lines) % 2 == 0, 1.0, -1.0) * rng.uniform(0.5, 1.0, n_lines)
    strength = rng.uniform(400.0, 800.0)
    width = max(1.0 * s, 0.8 * g.pixel_spacing)
    r0 = 40.0 * s
    ref_area = np.pi * (8.0 * s) ** 2
    x = g.xs[None, :].astype(np.float32)
    y = g.ys[:, None].astype(np.float32)
    px_area = g.pixel_spacing**2
    for k in np.flatnonzero(mask.any(axis=(1, 2))):
        lab, n = label(mask[k])
        pieces = []
        for idx in range(1, n + 1):
            j, i = center_of_mass(lab == idx)
            area = float(np.count_nonzero(lab == idx)) * px_area
            pieces.append(
                (float(np.interp(i, np.arange(g.xs.size), g.xs)), float(np.interp(j, np.arange(g.ys.size), g.ys)), area)
            )
        field = np.zeros(hu.shape[1:], dtype=np.float32)
        for xc, yc, area in pieces:
            amp = strength * min(1.0, np.sqrt(area / ref_area))
            dx, dy = x - xc, y - yc
            decay = r0 / (np.sqrt(dx * dx + dy * dy) + r0)
            for th, sg in zip(angles, signs):
                perp = dx * np.float32(np.sin(th)) - dy * np.float32(np.cos(th))
                field += np.float32(amp * sg) * np.exp(-0.5 * (perp / width) ** 2) * decay
        for a in range(len(pieces)):
            for b in range(a + 1, len(pieces)):
                (xa, ya, aa), (xb, yb, ab) = pieces[a], pieces[b]
                length = np.hypot(xb - xa, yb - ya)
                if length < 1e-3:
                    continue
                ux, uy = (xb - xa) / length, (yb - ya) / length
                t = (x - xa) * ux + (y - ya) * uy
                perp = (x - xa) * uy - (y - ya) * ux
                band = np.exp(-0.5 * (perp / (2.0 * width)) ** 2) * ((t > 0) & (t < length))
                field -= np.float32(0.8 * strength * min(1.0, np.sqrt(min(aa, ab) / ref_area))) * band
        hu[k] += field
    scene.truth["metal"]["streak_hu"] = round(float(strength), 1)


def _sharp_filter(img: np.ndarray, pixel: float) -> np.ndarray:
    """The sharp kernel in-plane (axes 1, 2): narrow Gaussian plus an unsharp mask (about 1.2 mm)."""
    sa, sb = 0.3 / pixel, 1.2 / pixel
    narrow = gaussian_filter(img, (0.0, sa, sa), mode="nearest", truncate=3.0) if sa >= 0.15 else img.copy()
    wide = gaussian_filter(narrow, (0.0, sb, sb), mode="nearest", truncate=3.0)
    narrow += np.float32(1.0) * (narrow - wide)
    return narrow


def sharp_blur_and_noise(
    hu: np.ndarray, rng: np.random.Generator, *, sigma_z: float, pixel: float, noise_hu: float, slab: int = 16
) -> float:
    """Slice profile (Gaussian of ``sigma_z`` slices), then white noise and the sharp kernel per slab, in place.

    The noise is scaled to a standard deviation of ``4 * noise_hu`` after the
    kernel; returns that standard deviation (HU).
    """
    if sigma_z >= 0.15:
        gaussian_filter1d(hu, sigma_z, axis=0, output=hu, mode="nearest", truncate=3.0)
    n = int(6 * 1.2 / pixel) + 8
    delta = np.zeros((1, 2 * n + 1, 2 * n + 1), dtype=np.float32)
    delta[0, n, n] = 1.0
    power = float((_sharp_filter(delta, pixel).astype(np.float64) ** 2).sum())
    target = SHARP_NOISE_FACTOR * noise_hu
    gain = np.float32(target / np.sqrt(power))
    for k0 in range(0, hu.shape[0], slab):
        part = hu[k0 : k0 + slab]
        if noise_hu > 0:
            noise = rng.standard_normal(part.shape, dtype=np.float32)
            noise *= gain
            part += noise
        part[:] = _sharp_filter(part, pixel)
    return target
