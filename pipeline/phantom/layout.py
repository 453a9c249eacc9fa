"""Per-case anatomy layout: sizes and positions of the chest structures (LPS, mm).

A :class:`Layout` is drawn from a random generator and scaled so that the
chest fills the field of view (``scale = FOV / 360 mm``). Every position is in
patient coordinates (LPS, mm): the body axis is the line ``x = 0, y = 0``; the
lungs span ``z_mid ± half_h`` (apex at ``u = +1`` with ``u = (z - z_mid) / half_h``,
the deepest costophrenic recess at ``u = -1``).

The analytic predicates here (:meth:`Layout.in_cavity`, :meth:`Layout.in_lung`)
take broadcastable coordinate arrays, so the same code answers for a single
point, a list of points or a whole slab of voxels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOMINAL_FOV_MM = 360.0


def smoothstep(a: float, b: float, v: np.ndarray) -> np.ndarray:
    t = np.clip((np.asarray(v, dtype=np.float64) - a) / (b - a), 0.0, 1.0)
    return t * t * (3 - 2 * t)


@dataclass(frozen=True)
class Layout:
    """Anatomy sizes (mm) and positions (LPS mm) of one phantom case."""

    scale: float
    pixel: float
    # body outline (ellipse, flatter at the back) and its layers
    body_a: float
    body_b_ant: float
    body_b_post: float
    skin: float
    fat: float
    muscle: float
    muscle_post: float
    wall: float
    # lungs
    z_mid: float
    half_h: float
    gap: float
    band_w: float
    med_w_low: float
    med_w_top: float
    lung_hu: float
    lung_gradient_hu: float
    # diaphragm domes: (x, y, u of the peak) for right (x < 0) and left lungs
    dome_right: tuple[float, float, float]
    dome_left: tuple[float, float, float]
    dome_depth: float
    # heart ellipsoid
    heart_c: tuple[float, float, float]
    heart_axes: tuple[float, float, float]
    heart_angle: float
    # great vessels, trachea, oesophagus (x, y) and radii
    aorta_desc: tuple[float, float, float]
    aorta_asc: tuple[float, float, float]
    u_arch: float
    arch_rise: float
    esophagus: tuple[float, float, float]
    trachea: tuple[float, float, float]
    trachea_wall: float
    u_carina: float
    # spine and sternum
    spine_y: float
    vb_axes: tuple[float, float]
    canal_r: float
    vert_period: float
    disc: float
    vert_phase: float
    sternum: tuple[float, float, float]
    sternum_u: tuple[float, float]
    rib_r: float

    # -- derived sizes -------------------------------------------------------------
    @property
    def cav_a(self) -> float:
        return self.body_a - self.skin - self.fat - self.muscle - self.wall

    @property
    def cav_b_ant(self) -> float:
        return self.body_b_ant - self.skin - self.fat - self.muscle - self.wall

    @property
    def cav_b_post(self) -> float:
        return self.body_b_post - self.skin - self.fat - self.muscle_post - self.wall

    def u(self, z: np.ndarray) -> np.ndarray:
        return (np.asarray(z, dtype=np.float64) - self.z_mid) / self.half_h

    def z_of_u(self, u: float) -> float:
        return self.z_mid + u * self.half_h

    def apex_factor(self, z: np.ndarray) -> np.ndarray:
        """Relative size (0..1) of the thoracic cavity's cross-section at height z (1 below the upper chest)."""
        u = self.u(z)
        u0 = 0.25
        t = np.clip((u - u0) / (1.0 - u0), 0.0, 1.0)
        return np.sqrt(np.clip(1.0 - t**2, 0.0, 1.0))

    # -- predicates -------------------------------------------------------------------
    def in_cavity(self, x: np.ndarray, y: np.ndarray, z: np.ndarray, grow: float = 0.0) -> np.ndarray:
        """Inside the thoracic cavity outline (ellipse shrinking at the apex), grown by ``grow`` mm."""
        f = np.maximum(self.apex_factor(z), 1e-6)
        b = np.where(np.asarray(y) < 0, self.cav_b_ant, self.cav_b_post)
        return (np.asarray(x) / (self.cav_a * f + grow)) ** 2 + (np.asarray(y) / (b * f + grow)) ** 2 < 1.0

    def diaphragm_z(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Height (LPS z, mm) of the diaphragm's upper surface: two domes, deep posterior recesses."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        heights = []
        for dx, dy, du in (self.dome_right, self.dome_left):
            q = ((x - dx) / (0.75 * self.cav_a)) ** 2 + ((y - dy) / (0.95 * self.cav_b_post)) ** 2
            heights.append(self.z_of_u(du) - self.dome_depth * q)
        return np.maximum(np.where(x < 0, heights[0], heights[1]), self.z_of_u(-1.0))

    def in_heart(self, x: np.ndarray, y: np.ndarray, z: np.ndarray, grow: float = 0.0) -> np.ndarray:
        cx, cy, cz = self.heart_c
        a, b, c = self.heart_axes
        ca, sa = np.cos(self.heart_angle), np.sin(self.heart_angle)
        dx = np.asarray(x) - cx
        dy = np.asarray(y) - cy
        xr = dx * ca + dy * sa
        yr = -dx * sa + dy * ca
        return (xr / (a + grow)) ** 2 + (yr / (b + grow)) ** 2 + ((np.asarray(z) - cz) / (c + grow)) ** 2 < 1.0

    def mediastinum_half_width(self, z: np.ndarray) -> np.ndarray:
        """Half width (mm) of the mediastinum's central ellipse at height z (wider above the heart)."""
        return self.med_w_low + (self.med_w_top - self.med_w_low) * smoothstep(-0.25, 0.15, self.u(z))

    def static_mediastinum(self, x: np.ndarray, y: np.ndarray, grow: float = 0.0) -> np.ndarray:
        """The z-invariant part of what the lungs keep clear of: central band, oesophagus, vertebral bodies."""
        x = np.asarray(x)
        y = np.asarray(y)
        m = np.abs(x) < self.band_w + grow
        ex, ey, er = self.esophagus
        m = m | ((x - ex) ** 2 + (y - ey) ** 2 < (er + grow) ** 2)
        va, vb = self.vb_axes
        return m | ((x / (va + grow)) ** 2 + ((y - self.spine_y) / (vb + grow)) ** 2 < 1.0)

    def aorta_disc(self, x: np.ndarray, y: np.ndarray, grow: float = 0.0) -> np.ndarray:
        """Cross-sections of the ascending and descending aorta (true below :meth:`aorta_top`)."""
        x = np.asarray(x)
        y = np.asarray(y)
        ax, ay, ar = self.aorta_desc
        m = (x - ax) ** 2 + (y - ay) ** 2 < (ar + grow) ** 2
        ax, ay, ar = self.aorta_asc
        return m | ((x - ax) ** 2 + (y - ay) ** 2 < (ar + grow) ** 2)

    @property
    def aorta_top(self) -> float:
        """Height (LPS z, mm) of the top of the aortic arch."""
        return self.z_of_u(self.u_arch) + self.arch_rise + self.aorta_asc[2]

    def in_mediastinal_ellipse(self, x: np.ndarray, y: np.ndarray, z: np.ndarray, grow: float = 0.0) -> np.ndarray:
        """The central mediastinum (great vessels, trachea, lymph nodes): widest midway front to back."""
        yc = 0.5 * (self.spine_y - self.cav_b_ant)
        bm = 0.5 * (self.spine_y + self.cav_b_ant) + grow
        w = self.mediastinum_half_width(z) + grow
        return (np.asarray(x) / w) ** 2 + ((np.asarray(y) - yc) / bm) ** 2 < 1.0

    def in_mediastinum(self, x: np.ndarray, y: np.ndarray, z: np.ndarray, grow: float = 0.0) -> np.ndarray:
        """Structures the lungs keep clear of: central band and mediastinum, heart, aorta, oesophagus, spine."""
        m = self.static_mediastinum(x, y, grow)
        m = m | (self.aorta_disc(x, y, grow) & (np.asarray(z) < self.aorta_top))
        m = m | self.in_mediastinal_ellipse(x, y, z, grow)
        return m | self.in_heart(x, y, z, grow)

    def in_lung(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Inside either pleural cavity (the lungs, before bones and airways are carved out)."""
        inside = self.in_cavity(x, y, z) & (np.asarray(z) > self.diaphragm_z(x, y))
        return inside & ~self.in_mediastinum(x, y, z, grow=self.gap)


def draw_layout(rng: np.random.Generator, *, fov_mm: float, pixel: float, scan_length_mm: float, z_center: float) -> Layout:
    """Draw a plausible adult chest scaled to a field of view of ``fov_mm`` (mm)."""
    s = fov_mm / NOMINAL_FOV_MM
    U = rng.uniform
    px = pixel
    body_a = 168.0 * s * U(0.9, 0.98)
    body_b_ant = 118.0 * s * U(0.88, 1.0)
    body_b_post = 112.0 * s * U(0.9, 1.0)
    skin = max(2.0 * s, 0.8 * px)
    fat = max(14.0 * s * U(0.5, 1.4), 1.5 * px)
    muscle = max(9.0 * s * U(0.8, 1.2), 1.5 * px)
    muscle_post = max(18.0 * s * U(0.8, 1.2), 2.0 * px)
    rib_r = max(4.5 * s, 1.3 * px)
    wall = 2 * rib_r + max(3.0 * s, 1.0 * px)
    # the chest keeps its proportions unless the scan is too short for it
    half_h = min(130.0 * s * U(0.92, 1.05), scan_length_mm / 2.3)
    gap = max(2.5 * s, 1.2 * px)
    band_w = max(6.0 * s, 1.6 * px)
    cav_b_post = body_b_post - skin - fat - muscle_post - wall
    vb_a, vb_b = max(20.0 * s, 4.0 * px), max(16.0 * s, 3.2 * px)
    spine_y = cav_b_post - 0.8 * vb_b
    canal_r = 7.5 * s
    ey = spine_y - vb_b - 9.0 * s
    esophagus = (4.0 * s, ey, 6.5 * s)
    trachea_r = max(8.0 * s, 2.0 * px) * U(0.9, 1.1)
    trachea_wall = max(2.0 * s, 1.5 * px)
    trachea = (0.0, ey - 6.5 * s - trachea_r - trachea_wall - 2.0 * s, trachea_r)
    cav_b_ant = body_b_ant - skin - fat - muscle - wall
    heart_axes = (52.0 * s * U(0.9, 1.1), 42.0 * s * U(0.9, 1.1), 46.0 * s * U(0.9, 1.1))
    heart_y = -cav_b_ant + heart_axes[1] + 6.0 * s
    z_mid = z_center
    heart_c = (14.0 * s * U(0.7, 1.3), heart_y, z_mid - 0.42 * half_h)
    u_arch = U(0.28, 0.38)
    aorta_r = 11.0 * s * U(0.9, 1.1)
    aorta_desc = (22.0 * s, spine_y - 0.35 * vb_b, aorta_r)
    aorta_asc = (-6.0 * s, heart_y + 0.15 * heart_axes[1], aorta_r * 1.15)
    dome_depth = 0.9 * half_h
    dome_right = (-0.5 * (body_a - 40 * s), -0.15 * cav_b_ant, U(-0.42, -0.3))
    dome_left = (0.5 * (body_a - 40 * s), -0.15 * cav_b_ant, U(-0.55, -0.42))
    sternum = (0.0, -cav_b_ant - 0.5 * (wall) + 1.0 * s, 14.0 * s)
    return Layout(
        scale=s,
        pixel=px,
        body_a=body_a,
        body_b_ant=body_b_ant,
        body_b_post=body_b_post,
        skin=skin,
        fat=fat,
        muscle=muscle,
        muscle_post=muscle_post,
        wall=wall,
        z_mid=z_mid,
        half_h=half_h,
        gap=gap,
        band_w=band_w,
        med_w_low=12.0 * s,
        med_w_top=24.0 * s * U(0.9, 1.15),
        lung_hu=U(-860.0, -830.0),
        lung_gradient_hu=U(25.0, 50.0),
        dome_right=dome_right,
        dome_left=dome_left,
        dome_depth=dome_depth,
        heart_c=heart_c,
        heart_axes=heart_axes,
        heart_angle=np.deg2rad(U(20.0, 40.0)),
        aorta_desc=aorta_desc,
        aorta_asc=aorta_asc,
        u_arch=u_arch,
        arch_rise=14.0 * s,
        esophagus=esophagus,
        trachea=trachea,
        trachea_wall=trachea_wall,
        u_carina=u_arch - U(0.12, 0.2),
        spine_y=spine_y,
        vb_axes=(vb_a, vb_b),
        canal_r=canal_r,
        vert_period=2.3 * half_h / 12.0 * 0.95,
        disc=max(4.5 * s, 1.0 * px),
        vert_phase=U(0.0, 1.0),
        sternum=sternum,
        sternum_u=(U(-0.6, -0.45), U(0.45, 0.6)),
        rib_r=rib_r,
    )
