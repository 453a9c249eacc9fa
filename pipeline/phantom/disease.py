"""Lung disease: emphysema, pleural effusion and atelectasis (HU and masks; canonical grid, LPS mm).

* Emphysema: low-attenuation areas (about -985 HU before blur and noise) in a
  chosen fraction of the lung, in blobs of about 5..15 mm, predominantly in the
  upper lungs. They stay lung; the ``emphysema`` mask holds the lung voxels
  that are emphysematous in the final phantom (not vessel, nodule or airway),
  and the true emphysema index is their share of the lung masks.
* Pleural effusion: fluid (5..18 HU) along the dependent chest wall of the
  lower pleural cavity (the posterior costophrenic region when supine, the
  anterior one when prone): in each column along gravity, the lung within a
  depth of the column's most dependent lung voxel; the depth is greatest at
  the base and thins upwards.
* Atelectasis: a band of collapsed lung (30..50 HU, enhancing with contrast)
  inside the effusion or, without one, along the dependent wall.

Effusion and atelectasis replace lung: the lung and vessel masks exclude
them, as LUNA16's automatically computed lung masks exclude dense lung.
"""

from __future__ import annotations

import numpy as np

from .noise import SmoothField
from .scene import Scene

LAA_HU = -985.0


def paint_emphysema(scene: Scene, hu: np.ndarray, lung: np.ndarray, slab: int = 16) -> None:
    """Lower the HU of ``scene.conf.emphysema`` of the lung voxels to about -985; record the mask (before tubes)."""
    frac = scene.conf.emphysema
    mask = np.zeros(lung.shape, dtype=bool)
    scene.masks["emphysema"] = mask
    if frac <= 0 or not lung.any():
        return
    L = scene.layout
    g = scene.grid
    rng = scene.rngs["disease"]
    f = 5.0 * L.scale
    field = SmoothField(rng, g.shape, (f / g.slice_spacing + 1, f / g.pixel_spacing + 1, f / g.pixel_spacing + 1), 1.0)
    tilt = (0.5 * np.clip(L.u(g.zs), -1.0, 1.0)).astype(np.float32)  # upper-lobe predominance
    values: list[np.ndarray] = []
    for k0 in range(0, g.shape[0], slab):
        k1 = min(k0 + slab, g.shape[0])
        m = lung[k0:k1]
        values.append((field.slab(k0, k1) + tilt[k0:k1, None, None])[m] if m.any() else np.zeros(0, np.float32))
    threshold = float(np.quantile(np.concatenate(values), 1.0 - frac))
    for n, k0 in enumerate(range(0, g.shape[0], slab)):
        k1 = min(k0 + slab, g.shape[0])
        v = values[n]
        low = v > threshold
        m = lung[k0:k1].copy()
        m[m] = low
        mask[k0:k1] = m
        hu[k0:k1][m] = LAA_HU + 8.0 * (v[low] - threshold)


def _above_lowest_lung(scene: Scene, lung: np.ndarray) -> np.ndarray:
    """Distance (mm, float32) along gravity from each voxel up from its column's most dependent lung voxel.

    Columns run along the axis gravity follows (y for supine and prone, x for decubitus).
    """
    g = scene.grid
    dx, dy = float(scene.down[0]), float(scene.down[1])
    axis, sign, coords = (1, dy, g.ys) if abs(dy) >= abs(dx) else (2, dx, g.xs)
    h = (coords * sign).astype(np.float32)  # height along gravity of each index on that axis
    n = lung.shape[axis]
    if sign > 0:  # the floor is at the high indices: the last lung voxel of the column
        idx = n - 1 - np.argmax(np.flip(lung, axis=axis), axis=axis)
    else:
        idx = np.argmax(lung, axis=axis)
    lowest = np.expand_dims(h[idx], axis)
    shape = [1, 1, 1]
    shape[axis] = n
    return lowest - h.reshape(shape)


def paint_pleura(scene: Scene, hu: np.ndarray, lung: np.ndarray, vessels: np.ndarray) -> None:
    """Effusion and atelectasis (after the tubes): painted over lung, removed from ``lung`` and ``vessels``."""
    conf = scene.conf
    L = scene.layout
    g = scene.grid
    s = L.scale
    rng = scene.rngs["disease"]
    U = rng.uniform
    eff = np.zeros(g.shape, dtype=bool)
    atel = np.zeros(g.shape, dtype=bool)
    scene.masks["effusion"] = eff
    scene.masks["atelectasis"] = atel
    if conf.effusion == "none" and conf.atelectasis == "none":
        return
    u = L.u(g.zs)
    sides = {"left": scene.x > 0, "right": scene.x < 0}

    def taper(depth: float, u_top: float) -> np.ndarray:
        return depth * np.clip((u_top - u) / (u_top + 0.8), 0.0, 1.0) ** 0.6

    def chosen(option: str) -> np.ndarray:
        out = np.zeros_like(sides["left"])
        for name, m in sides.items():
            if option in (name, "both"):
                out = out | m
        return out

    below_wall = _above_lowest_lung(scene, lung)
    d_eff = taper(U(15.0, 40.0) * s, U(-0.3, 0.1)) if conf.effusion != "none" else np.zeros_like(u)
    if conf.effusion != "none":
        eff |= lung & (below_wall < d_eff[:, None, None]) & chosen(conf.effusion)[None]
    if conf.atelectasis != "none":
        w = scene.across(scene.x, scene.y)
        wobble = 1.0 + 0.35 * np.cos(w / (30.0 * s) + U(0.0, 2.0 * np.pi))
        d_at = taper(U(8.0, 20.0) * s, U(-0.2, 0.2))
        limit = (d_eff * (conf.effusion != "none"))[:, None, None] + d_at[:, None, None] * wobble[None]
        atel |= lung & ~eff & (below_wall < limit) & chosen(conf.atelectasis)[None] & (d_at > 0)[:, None, None]
    fluid = U(5.0, 18.0)
    collapsed = U(30.0, 50.0) + scene.blood["atelectasis_gain"]
    hu[eff] = fluid
    hu[atel] = collapsed
    lung &= ~(eff | atel)
    vessels &= lung
    voxel_ml = g.pixel_spacing**2 * g.slice_spacing / 1000.0
    for name, m in (("effusion", eff), ("atelectasis", atel)):
        scene.truth[name] = {
            "sides": getattr(conf, name),
            "volume_ml": {
                side: round(float(np.count_nonzero(m & sides[side][None])) * voxel_ml, 1) for side in ("left", "right")
            },
        }
