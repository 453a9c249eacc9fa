"""Body, thoracic cavity, lungs, mediastinum, heart, spine and sternum painted slab by slab (HU).

Everything here is evaluated on the canonical grid (axes +S, +P, +L; LPS mm)
with numpy broadcasting: z-invariant cross-sections (body layers, spine,
sternum) are computed once as 2-D maps and combined with per-slice terms.
"""

from __future__ import annotations

import numpy as np

from .layout import Layout
from .scanner import CanonicalGrid

# tissue values, HU
AIR = -1000.0
SKIN = 35.0
FAT = -100.0
MUSCLE = 48.0
SOFT = 38.0
MEDIASTINAL_FAT = -85.0
BLOOD = 42.0
LIVER = 58.0
ABDOMEN = 40.0
CSF = 12.0
DISC = 85.0
CANCELLOUS = 360.0
CORTICAL = 950.0
AIRWAY_WALL = 45.0
CARTILAGE = 120.0
VESSEL = 42.0

_P = 2.2  # super-ellipse exponent of the body outline (a little boxier than an ellipse)


def _superellipse(x: np.ndarray, y: np.ndarray, a: float, b_ant: float, b_post: float) -> np.ndarray:
    b = np.where(y < 0, b_ant, b_post)
    return np.abs(x / a) ** _P + np.abs(y / b) ** _P < 1.0


class AnatomyPainter:
    """Paints the analytic (non-tubular) anatomy of a :class:`Layout` on a canonical grid.

    The lung parenchyma is denser towards the floor: posteriorly by default,
    along ``down`` (an LPS (x, y) unit vector, see :mod:`pipeline.phantom.scene`) when given.
    """

    def __init__(self, layout: Layout, grid: CanonicalGrid, down: np.ndarray | None = None):
        self.L = layout
        self.g = grid
        L = layout
        x = grid.xs[None, :]
        y = grid.ys[:, None]
        # body layers (z-invariant)
        t1 = L.skin
        t2 = L.skin + L.fat
        body = _superellipse(x, y, L.body_a, L.body_b_ant, L.body_b_post)
        dermis = _superellipse(x, y, L.body_a - t1, L.body_b_ant - t1, L.body_b_post - t1)
        muscle = _superellipse(x, y, L.body_a - t2, L.body_b_ant - t2, L.body_b_post - t2)
        wall = _superellipse(x, y, L.body_a - t2 - L.muscle, L.body_b_ant - t2 - L.muscle, L.body_b_post - t2 - L.muscle_post)
        hu2 = np.full(body.shape, AIR, dtype=np.float32)
        hu2[body] = SKIN
        hu2[dermis] = FAT
        hu2[muscle] = MUSCLE
        hu2[wall] = SOFT
        self.body2 = body
        self.inner2 = muscle  # bones stay under the subcutaneous fat
        self.hu2 = hu2
        self.dz2 = L.diaphragm_z(x, y).astype(np.float32)
        self.abdomen2 = np.where(x < 0.15 * L.cav_a, LIVER, ABDOMEN).astype(np.float32)
        ex, ey, er = L.esophagus
        self.eso2 = (x - ex) ** 2 + (y - ey) ** 2 < er**2
        # what the lungs keep clear of, split into z-invariant maps and cheap per-slice terms
        g = L.gap
        self.excl2 = L.static_mediastinum(x, y, g)
        self.excl_aorta2 = self.excl2 | L.aorta_disc(x, y, g)
        self.cav_y2 = np.where(y < 0, L.cav_b_ant, L.cav_b_post).astype(np.float32)  # (ny, 1)
        self.x32 = grid.xs.astype(np.float32)
        self.y32 = grid.ys.astype(np.float32)
        yc = 0.5 * (L.spine_y - L.cav_b_ant)
        bm = 0.5 * (L.spine_y + L.cav_b_ant) + g
        self.med_y2 = (((grid.ys - yc) / bm) ** 2).astype(np.float32)
        cx, cy, _ = L.heart_c
        ca, sa = np.cos(L.heart_angle), np.sin(L.heart_angle)
        dx, dy = x - cx, y - cy
        self.heart_xy = {}
        for grow in (0.0, g):
            a, b, _ = (v + grow for v in L.heart_axes)
            self.heart_xy[grow] = (((dx * ca + dy * sa) / a) ** 2 + ((-dx * sa + dy * ca) / b) ** 2).astype(np.float32)
        if down is None:
            gradient = L.lung_hu + L.lung_gradient_hu * (grid.ys / L.cav_b_post)
            self.gradient2 = np.broadcast_to(gradient.astype(np.float32)[:, None], (grid.ys.size, grid.xs.size))
        else:
            b_y = np.where(y > 0, L.cav_b_post, L.cav_b_ant)
            rel = np.clip(x * down[0] / L.cav_a + y * down[1] / b_y, -1.5, 1.5)
            self.gradient2 = (L.lung_hu + L.lung_gradient_hu * rel).astype(np.float32)
        self._spine_maps(x, y)
        self._sternum_maps(x, y)
        self._scapula_maps(x, y)

    # -- z-invariant bone cross-sections ------------------------------------------------
    def _spine_maps(self, x: np.ndarray, y: np.ndarray) -> None:
        L = self.L
        s = L.scale
        va, vb = L.vb_axes
        cort = max(1.2 * s, 0.7 * L.pixel)
        yv = L.spine_y
        body = (x / va) ** 2 + ((y - yv) / vb) ** 2 < 1.0
        core = (x / (va - cort)) ** 2 + ((y - yv) / (vb - cort)) ** 2 < 1.0
        cy = yv + vb + L.canal_r + 1.0 * s
        rr = np.hypot(x, y - cy)
        canal = rr < L.canal_r
        arch = (rr < L.canal_r + max(4.0 * s, 1.2 * L.pixel)) & ~canal
        tip = min(cy + L.canal_r + 28.0 * s, L.body_b_post - L.skin - L.fat - 0.3 * L.muscle_post)
        arch |= (np.abs(x) < max(3.0 * s, 0.8 * L.pixel)) & (y > cy) & (y < tip)
        arch |= (np.abs(y - cy) < max(3.5 * s, 0.8 * L.pixel)) & (np.abs(x) < va + 4.0 * s)
        arch &= (y > yv + 0.3 * vb) | ~body
        vert = (body | arch) & self.inner2
        hu = np.where(core, CANCELLOUS, CORTICAL).astype(np.float32)
        hu[arch] = CORTICAL * 0.8
        self.vert_bone2 = vert
        self.vert_hu2 = hu
        self.disc2 = body
        self.canal2 = canal

    def _sternum_maps(self, x: np.ndarray, y: np.ndarray) -> None:
        L = self.L
        sx, sy, sa = L.sternum
        sb = max(5.0 * L.scale, 1.5 * L.pixel)
        cort = max(1.0 * L.scale, 0.6 * L.pixel)
        outer = ((x - sx) / sa) ** 2 + ((y - sy) / sb) ** 2 < 1.0
        inner = ((x - sx) / max(sa - cort, 1e-3)) ** 2 + ((y - sy) / max(sb - cort, 1e-3)) ** 2 < 1.0
        self.sternum2 = outer & self.inner2
        self.sternum_hu2 = np.where(inner, CANCELLOUS, CORTICAL).astype(np.float32)

    def _scapula_maps(self, x: np.ndarray, y: np.ndarray) -> None:
        """Shoulder blades: thin curved plates in the back muscles, lateral to the spine."""
        L = self.L
        inset = L.skin + L.fat + 0.45 * L.muscle_post
        a = L.body_a - inset
        b = L.body_b_post - inset
        rho = np.sqrt((x / a) ** 2 + (y / b) ** 2)
        half = max(2.0 * L.scale, 0.8 * L.pixel) / b
        phi = np.arctan2(np.abs(x), y)  # 0 at the back midline
        plate = (np.abs(rho - 1.0) < half) & (phi > 0.45) & (phi < 1.05) & (y > 0)
        self.scapula2 = plate & self.inner2
        self.scapula_u = (0.2, 0.9)

    def vertebra_level(self, z: np.ndarray) -> np.ndarray:
        """True where slice height z (mm) cuts a vertebral body, False in an intervertebral disc."""
        L = self.L
        phase = np.mod(z - L.z_mid - L.vert_phase * L.vert_period, L.vert_period)
        return phase > L.disc

    def cavity(self, zs: np.ndarray) -> np.ndarray:
        """:meth:`Layout.in_cavity` on slices at heights ``zs`` (float32, separable terms)."""
        L = self.L
        f = np.maximum(L.apex_factor(zs), 1e-6).astype(np.float32)[:, None, None]
        xt = (self.x32[None, None, :] / (np.float32(L.cav_a) * f)) ** 2
        yt = (self.y32[None, :, None] / (self.cav_y2[None, :, :] * f)) ** 2
        return xt + yt < 1.0

    def _heart(self, zs: np.ndarray, grow: float) -> np.ndarray | None:
        """:meth:`Layout.in_heart` grown by ``grow`` mm on slices ``zs``, or None when no slice cuts it."""
        L = self.L
        c = L.heart_axes[2] + grow
        zt = ((zs - L.heart_c[2]) / c) ** 2
        if zt.min() >= 1.0:
            return None
        return self.heart_xy[grow][None] + zt.astype(np.float32)[:, None, None] < 1.0

    def heart_region(self, zs: np.ndarray, cav: np.ndarray | None = None) -> np.ndarray | None:
        """The heart's voxels (blood, painted 42 HU) on slices ``zs`` within the cavity ``cav``, or None when none."""
        heart = self._heart(zs, 0.0)
        if heart is None:
            return None
        if cav is None:
            cav = self.cavity(zs)
        heart &= cav & (zs[:, None, None] > self.dz2[None] - 0.1 * self.L.half_h)
        return heart

    # -- slabs ------------------------------------------------------------------------------
    def paint(self, k0: int, k1: int, texture: np.ndarray | None, hu: np.ndarray, lung: np.ndarray, bone: np.ndarray) -> None:
        """Write HU, lung and bone of canonical slices ``k0 <= z < k1`` into ``hu``, ``lung``, ``bone`` (slab views).

        ``texture`` (HU) is added to the lung parenchyma.
        """
        L = self.L
        zs = self.g.zs[k0:k1]
        n = k1 - k0
        hu[:] = self.hu2
        cav = self.cavity(zs)
        above = self.dz2[None] < zs.astype(np.float32)[:, None, None]
        np.copyto(hu, np.where(above, np.float32(MEDIASTINAL_FAT), self.abdomen2[None]), where=cav)
        heart = self.heart_region(zs, cav)
        if heart is not None:
            hu[heart] = BLOOD
        np.logical_and(cav, above, out=lung)
        lung &= np.where((zs < L.aorta_top)[:, None, None], self.excl_aorta2[None], self.excl2[None]) == 0
        w = (L.mediastinum_half_width(zs) + L.gap).astype(np.float32)
        ell = (self.x32[None, None, :] / w[:, None, None]) ** 2 + self.med_y2[None, :, None]
        lung &= ell >= 1.0
        heart_g = self._heart(zs, L.gap)
        if heart_g is not None:
            lung &= ~heart_g
        vals = np.broadcast_to(self.gradient2[None], hu.shape)
        if texture is not None:
            vals = vals + texture
        np.copyto(hu, vals, where=lung)
        hu[:, self.eso2] = SOFT
        bone[:] = False
        vlevel = self.vertebra_level(zs)
        su0, su1 = L.sternum_u
        u = L.u(zs)
        for k in range(n):
            if vlevel[k]:
                np.copyto(hu[k], self.vert_hu2, where=self.vert_bone2)
                bone[k] |= self.vert_bone2
            else:
                hu[k][self.disc2] = DISC
            hu[k][self.canal2] = CSF
            if su0 <= u[k] <= su1:
                np.copyto(hu[k], self.sternum_hu2, where=self.sternum2)
                bone[k] |= self.sternum2
            if self.scapula_u[0] <= u[k] <= self.scapula_u[1]:
                hu[k][self.scapula2] = CORTICAL * 0.75
                bone[k] |= self.scapula2
        lung &= ~bone
