"""Upper abdomen under the diaphragm: liver, spleen, kidneys, mesenteric fat, stomach and colon (HU, LPS mm).

Painted only in the abdominal cavity below the diaphragm (where the plain
phantom fills the cavity with liver or soft tissue), clear of the lungs by
the diaphragm's thickness (at least 4 mm at adult size). The liver ends
60..90 mm below the deepest costophrenic recess (its right lobe lowest); below and beside it the
cavity holds a mix of mesenteric fat and bowel loops.

With ``bowel_gas`` the stomach (under the left dome) and the colon
(ascending, transverse, descending) hold gas on the non-dependent side and
fluid below a horizontal air-fluid level: gas anterior when supine, posterior
when prone (gravity along :attr:`Scene.down`). Their gas is the ``bowel_gas``
mask, never lung. Organs enhance with the contrast phase
(:mod:`pipeline.phantom.contrast`).
"""

from __future__ import annotations

import numpy as np

from .anatomy import ABDOMEN, AIR, LIVER, AnatomyPainter
from .noise import SmoothField
from .scene import Scene
from .tubes import Tubes, index_box, signed_distance

MESENTERIC_FAT = -95.0
BOWEL = 30.0


def _ellipsoid(scene: Scene, centre: np.ndarray, axes: np.ndarray) -> tuple[tuple[slice, slice, slice], np.ndarray] | None:
    """Box (canonical slices) around an axis-aligned ellipsoid and its normalised radius² there (< 1 inside)."""
    g = scene.grid
    box = index_box(g, centre - axes, centre + axes)
    if box is None:
        return None
    q = (((g.zs[box[0]] - centre[2]) / axes[2]) ** 2)[:, None, None]
    q = q + (((g.ys[box[1]] - centre[1]) / axes[1]) ** 2)[None, :, None]
    q = q + (((g.xs[box[2]] - centre[0]) / axes[0]) ** 2)[None, None, :]
    return box, q


def _level_split(scene: Scene, box: tuple[slice, slice, slice], level: float) -> np.ndarray:
    """In ``box``: True on the non-dependent side of the horizontal level ``level`` (mm along gravity), where gas floats."""
    g = scene.grid
    h = scene.height(g.xs[box[2]][None, :], g.ys[box[1]][:, None])
    return np.broadcast_to((h < level)[None], (box[0].stop - box[0].start,) + h.shape)


def _regions(scene: Scene, painter: AnatomyPainter, hu: np.ndarray, slab: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """(fill, deep): abdominal cavity voxels below the diaphragm, and those a diaphragm's thickness below it."""
    L = scene.layout
    dia = max(4.0 * L.scale, 1.5 * scene.grid.pixel_spacing)
    fill = np.zeros(hu.shape, dtype=bool)
    deep = np.zeros(hu.shape, dtype=bool)
    for k0 in range(0, hu.shape[0], slab):
        k1 = min(k0 + slab, hu.shape[0])
        zs = scene.grid.zs[k0:k1].astype(np.float32)[:, None, None]
        sub = hu[k0:k1]
        f = (
            painter.cavity(scene.grid.zs[k0:k1])
            & (zs <= painter.dz2[None])
            & ((sub == np.float32(LIVER)) | (sub == np.float32(ABDOMEN)))
        )
        fill[k0:k1] = f
        deep[k0:k1] = f & (zs < painter.dz2[None] - np.float32(dia))
    return fill, deep


def paint_abdomen(scene: Scene, painter: AnatomyPainter, hu: np.ndarray) -> None:
    """Paint the abdominal organs (and, with ``bowel_gas``, stomach and colon) into ``hu``; fill ``bowel_gas``."""
    L = scene.layout
    g = scene.grid
    s = L.scale
    rng = scene.rngs["abdomen"]
    U = rng.uniform
    blood = scene.blood
    fill, deep = _regions(scene, painter, hu)
    base = L.z_of_u(-1.0)
    # liver: the right upper quadrant, its left lobe reaching across the front, its right lobe lowest
    y = g.ys[:, None]
    x = g.xs[None, :]
    edge = L.cav_a * (0.1 - 0.45 * y / np.where(y < 0, L.cav_b_ant, L.cav_b_post))
    # its lower surface: deepest (60..90 mm below the recess) in the right lobe, rising towards its edges
    q = ((x + 0.55 * L.cav_a) / (0.9 * L.cav_a)) ** 2 + ((y - 0.1 * L.cav_b_post) / (1.1 * L.cav_b_ant)) ** 2
    reach = U(60.0, 90.0) * s * np.sqrt(np.clip(1.0 - q, 0.0, 1.0))
    liver = fill & (x < edge)[None] & (g.zs[:, None, None] > base - reach[None])
    hu[liver] = blood["liver"]
    rest = deep & ~liver
    f = 9.0 * s
    field = SmoothField(rng, g.shape, (f / g.slice_spacing + 1, f / g.pixel_spacing + 1, f / g.pixel_spacing + 1), 1.0)
    for k0 in range(0, g.shape[0], 16):
        k1 = min(k0 + 16, g.shape[0])
        m = rest[k0:k1]
        if m.any():
            mix = np.clip((field.slab(k0, k1)[m] + 0.3) / 0.8, 0.0, 1.0)
            hu[k0:k1][m] = BOWEL + mix * (MESENTERIC_FAT - BOWEL)
    # spleen and kidneys
    va, _ = L.vb_axes
    cy_s = 0.4 * L.cav_b_post
    spl = np.array([0.68 * L.cav_a, cy_s, 0.0])
    spl_axes = np.array([22.0, 45.0, 50.0]) * s * U(0.9, 1.1)
    spl[2] = float(L.diaphragm_z(spl[0], spl[1])) - 0.5 * spl_axes[2]
    organs: list[tuple[np.ndarray, np.ndarray, float, float | None]] = [(spl, spl_axes, blood["spleen"], None)]
    z_k = base - U(15.0, 35.0) * s
    for side, dz in ((1.0, 0.0), (-1.0, -15.0 * s)):
        c = np.array([side * (va + 36.0 * s), L.spine_y - 4.0 * s, z_k + dz])
        organs.append((c, np.array([26.0, 22.0, 52.0]) * s * U(0.9, 1.1), blood["kidney_cortex"], blood["kidney_medulla"]))
    kidney_voxels = 0
    for c, axes, outer_hu, inner_hu in organs:
        e = _ellipsoid(scene, c, axes)
        if e is None:
            continue
        box, q = e
        m = (q < 1.0) & deep[box]
        hu[box][m] = outer_hu
        if inner_hu is not None:
            core = m & (q < (1.0 - 7.0 * s / float(axes.min())) ** 2)
            hu[box][core] = inner_hu
            kidney_voxels += int(m.sum())
    scene.truth["kidneys_in_scan"] = kidney_voxels > 0
    gas = np.zeros(g.shape, dtype=bool)
    if scene.conf.bowel_gas:
        _paint_colon(scene, hu, deep, gas)
        _paint_stomach(scene, hu, deep, gas)
    scene.masks["bowel_gas"] = gas


def _paint_colon(scene: Scene, hu: np.ndarray, deep: np.ndarray, gas: np.ndarray) -> None:
    L = scene.layout
    s = L.scale
    rng = scene.rngs["abdomen"]
    U = rng.uniform
    a, ba, bp = L.cav_a, L.cav_b_ant, L.cav_b_post
    base = L.z_of_u(-1.0)
    pts = np.array(
        [
            [-0.66 * a, -0.1 * ba, base - 230.0 * s],
            [-0.62 * a, -0.1 * ba, base - 95.0 * s],
            [-0.3 * a, -0.58 * ba, base - 110.0 * s],
            [0.3 * a, -0.58 * ba, base - 100.0 * s],
            [0.66 * a, -0.15 * ba, base - 55.0 * s],
            [0.68 * a, -0.1 * ba, base - 230.0 * s],
        ]
    )
    pts[:, :2] += rng.normal(0.0, 4.0 * s, (len(pts), 2))
    colon = Tubes()
    colon.add_polyline(pts, U(18.0, 24.0) * s)
    sd = np.empty(scene.grid.shape, dtype=np.float32)
    box = signed_distance(scene.grid, colon.split(15.0 * s), sd, pad=2.0 * scene.grid.pixel_spacing)
    if box is None:
        return
    wall = max(2.5 * s, 1.0 * scene.grid.pixel_spacing)
    d = sd[box]
    inside = (d < 0) & deep[box]
    lumen = inside & (d < -wall)
    extent = abs(scene.down[0]) * a + abs(scene.down[1]) * (bp if scene.down[1] >= 0 else ba)
    up = _level_split(scene, box, U(-0.35, 0.25) * extent)
    sub = hu[box]
    sub[inside] = scene.blood["bowel_wall"]
    sub[lumen & up] = AIR
    sub[lumen & ~up] = U(0.0, 30.0)
    gas[box] |= lumen & up


def _paint_stomach(scene: Scene, hu: np.ndarray, deep: np.ndarray, gas: np.ndarray) -> None:
    L = scene.layout
    s = L.scale
    U = scene.rngs["abdomen"].uniform
    axes = np.array([42.0, 36.0, 55.0]) * s * U(0.85, 1.15)
    c = np.array([0.4 * L.cav_a, -0.15 * L.cav_b_ant, 0.0])
    dia = max(4.0 * s, 1.5 * scene.grid.pixel_spacing)
    c[2] = float(L.diaphragm_z(c[0], c[1])) - dia - 0.55 * axes[2]
    e = _ellipsoid(scene, c, axes)
    if e is None:
        return
    box, q = e
    wall = max(3.0 * s, 1.2 * scene.grid.pixel_spacing)
    inside = (q < 1.0) & deep[box]
    lumen = inside & (q < (1.0 - wall / float(axes.min())) ** 2)
    h_c = float(scene.height(c[0], c[1]))
    ext = abs(scene.down[0]) * axes[0] + abs(scene.down[1]) * axes[1]
    up = _level_split(scene, box, h_c - ext + U(0.3, 0.65) * 2.0 * ext)
    sub = hu[box]
    sub[inside] = scene.blood["bowel_wall"]
    sub[lumen & up] = AIR
    sub[lumen & ~up] = U(5.0, 25.0)
    gas[box] |= lumen & up
