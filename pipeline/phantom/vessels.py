"""Tubular anatomy in patient coordinates (LPS, mm): lung vessel trees, airways, aorta and ribs.

Vessel and bronchial trees grow from the hila by repeated asymmetric
bifurcation (child radii follow Murray's law ``r³ = r1³ + r2³``), bending
outwards, until the radius falls below what the scan can show or the branch
would leave the lung. Their cross-sections on one axial slice are small
round blobs: the confusers a nodule detector has to learn to reject.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .layout import Layout
from .tubes import Tubes

Inside = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _units(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(n, 1e-12)


def grow_forest(
    rng: np.random.Generator,
    starts: np.ndarray,
    directions: np.ndarray,
    radii: np.ndarray,
    *,
    inside: Inside,
    centres: np.ndarray,
    min_radius: float,
    min_length: float,
    max_segments: int,
    trunk_steps: int = 1,
    length_factor: tuple[float, float] = (5.0, 9.0),
    max_generations: int = 64,
    asymmetry: tuple[float, float] = (0.55, 1.0),
    roots: list[int] | None = None,
) -> Tubes:
    """Bifurcating trees grown from ``starts`` (n, 3) along ``directions`` (n, 3), LPS mm.

    All branches of one generation grow together (vectorised). A branch is kept
    while its end point and midpoint are ``inside`` (after the first
    ``trunk_steps`` generations, which may cross the mediastinum), and splits
    into two thinner children (Murray's law, asymmetric) that bend away from
    their tree's ``centres`` point. Growth stops below ``min_radius`` mm or at
    ``max_segments`` segments (the thinnest branches are the ones missing).
    With ``roots`` (a list), the index of each tube's start in ``starts`` is appended to it, tube by tube.
    """
    tubes = Tubes()
    p = np.asarray(starts, dtype=np.float64).reshape(-1, 3)
    d = _units(np.asarray(directions, dtype=np.float64).reshape(-1, 3))
    r = np.asarray(radii, dtype=np.float64).reshape(-1)
    c = np.asarray(centres, dtype=np.float64).reshape(-1, 3)
    tree = np.arange(len(p))
    gen = 0
    while len(p) and len(tubes) < max_segments and gen < max_generations:
        length = np.maximum(r * rng.uniform(*length_factor, size=len(r)), min_length)
        end = p + length[:, None] * d
        if gen >= trunk_steps:
            mid = p + 0.5 * length[:, None] * d
            ok = inside(end[:, 0], end[:, 1], end[:, 2]) & inside(mid[:, 0], mid[:, 1], mid[:, 2])
            half = 0.5 * length
            end2 = p + half[:, None] * d
            ok2 = ~ok & (half >= min_length) & inside(end2[:, 0], end2[:, 1], end2[:, 2])
            end = np.where(ok2[:, None], end2, end)
            # a branch about to leave the lung turns back towards its tree's centre instead
            d3 = _units(d - 1.2 * _units(p - c))
            end3 = p + half[:, None] * d3
            ok3 = ~(ok | ok2) & (half >= min_length) & inside(end3[:, 0], end3[:, 1], end3[:, 2])
            end = np.where(ok3[:, None], end3, end)
            d = np.where(ok3[:, None], d3, d)
            keep = ok | ok2 | ok3
            p, d, r, c, end, tree = p[keep], d[keep], r[keep], c[keep], end[keep], tree[keep]
        room = max_segments - len(tubes)
        if len(p) > room:
            order = np.argsort(-r)[:room]
            p, d, r, c, end, tree = p[order], d[order], r[order], c[order], end[order], tree[order]
        r_end = 0.95 * r
        for n in range(len(p)):
            tubes.add(p[n], end[n], r[n], r_end[n])
        if roots is not None:
            roots.extend(int(t) for t in tree)
        n = len(p)
        alpha = rng.uniform(*asymmetry, n)
        r1 = r_end / (1.0 + alpha**3) ** (1.0 / 3.0)
        r2 = alpha * r1
        perp = rng.standard_normal((n, 3))
        perp = _units(perp - np.sum(perp * d, axis=1, keepdims=True) * d)
        th1 = np.deg2rad(rng.uniform(12.0, 30.0, n)) * (1.2 - 0.4 * alpha)
        th2 = np.deg2rad(rng.uniform(30.0, 60.0, n))
        out = _units(end - c)
        d1 = _units(np.cos(th1)[:, None] * d + np.sin(th1)[:, None] * perp + 0.25 * out)
        d2 = _units(np.cos(th2)[:, None] * d - np.sin(th2)[:, None] * perp + 0.25 * out)
        nr = np.concatenate([r1, r2])
        keep = nr >= min_radius
        p = np.concatenate([end, end])[keep]
        d = np.concatenate([d1, d2])[keep]
        c = np.concatenate([c, c])[keep]
        tree = np.concatenate([tree, tree])[keep]
        r = nr[keep]
        gen += 1
    return tubes


def _lung_centre(layout: Layout, side: float) -> np.ndarray:
    return np.array([side * 0.55 * layout.cav_a, 0.1 * layout.cav_b_post, layout.z_of_u(-0.05)])


def hilum(layout: Layout, side: float) -> np.ndarray:
    """Where the bronchus and vessels of one lung enter it (LPS mm); side +1 left, -1 right."""
    s = layout.scale
    tx, ty, _ = layout.trachea
    return np.array([side * (layout.band_w + layout.gap + 6.0 * s), ty + 10.0 * s, layout.z_of_u(layout.u_carina - 0.14)])


def vessel_trees(layout: Layout, rng: np.random.Generator, *, roots: list[int] | None = None) -> tuple[Tubes, Tubes]:
    """Pulmonary arteries and veins: (branches inside the lungs, trunks in the mediastinum).

    The trunks alternate artery, vein (right lung, then left): see :func:`split_trunks`. With ``roots`` (a
    list), the tree of each branch inside the lungs is appended to it, branch by branch
    (:func:`is_artery_tree` tells the arteries' trees).
    """
    s = layout.scale
    px = layout.pixel
    trunks = Tubes()
    min_radius = max(0.4, 0.45 * px)
    budget = int(np.clip(16000 * s * s / max(px / 0.7, 0.5) ** 2, 300, 24000))
    heart_top = np.array([layout.heart_c[0] - 10 * s, layout.heart_c[1], layout.heart_c[2] + 0.55 * layout.heart_axes[2]])
    starts, dirs, radii, centres = [], [], [], []
    for side in (-1.0, 1.0):
        centre = _lung_centre(layout, side)
        h = hilum(layout, side)
        # arteries leave the hilum a little above, veins a little below and in front
        for kind, offset in (("artery", np.array([0.0, -4.0 * s, 6.0 * s])), ("vein", np.array([0.0, -14.0 * s, -16.0 * s]))):
            root = h + offset
            trunks.add(heart_top, root, 9.0 * s, 7.0 * s)
            for dx, dy, dz in _TRUNK_DIRECTIONS:
                starts.append(root)
                dirs.append(np.array([side * dx, dy, dz]) + rng.normal(0.0, 0.12, 3))
                radii.append((4.5 if kind == "artery" else 4.0) * s * rng.uniform(0.85, 1.1))
                centres.append(centre - 0.6 * (centre - h))
    inner = grow_forest(
        rng,
        np.array(starts),
        np.array(dirs),
        np.array(radii),
        inside=layout.in_lung,
        centres=np.array(centres),
        min_radius=min_radius,
        min_length=2.5 * px,
        max_segments=budget,
        trunk_steps=2,
        length_factor=(4.5, 8.0),
        asymmetry=(0.7, 1.0),
        roots=roots,
    )
    return inner, trunks


def is_artery_tree(root: int) -> bool:
    """Whether tree ``root`` of :func:`vessel_trees` is an artery's (its starts: per lung, the arteries' then
    the veins', one per trunk direction)."""
    return (root // len(_TRUNK_DIRECTIONS)) % 2 == 0


def split_trunks(trunks: Tubes) -> tuple[Tubes, Tubes]:
    """The mediastinal trunks of :func:`vessel_trees` as (pulmonary arteries, pulmonary veins)."""
    arteries, veins = Tubes(), Tubes()
    for n, (a, b, ra, rb) in enumerate(zip(trunks.a, trunks.b, trunks.ra, trunks.rb)):
        (arteries if n % 2 == 0 else veins).add(a, b, ra, rb)
    return arteries, veins


_TRUNK_DIRECTIONS = (
    (0.35, 0.1, 1.0),  # upper lobe
    (0.5, -0.6, 0.6),  # anterior upper
    (1.0, -0.35, 0.15),  # lateral / middle
    (0.9, 0.4, 0.1),  # posterior
    (0.6, -0.8, -0.5),  # anterior basal
    (0.45, 0.5, -0.9),  # posterior basal
    (0.8, 0.3, -0.4),  # lateral basal
    (0.7, -0.2, 0.8),  # lateral upper
    (0.3, 0.8, 0.5),  # posterior upper
    (0.2, -0.4, -1.0),  # medial basal
)


def airway_tubes(layout: Layout, rng: np.random.Generator, z_top: float) -> Tubes:
    """Air lumen of the trachea, main bronchi and a few generations of lobar bronchi (radii in mm)."""
    s = layout.scale
    px = layout.pixel
    tx, ty, tr = layout.trachea
    lumen = Tubes()
    carina = np.array([tx, ty + 4.0 * s, layout.z_of_u(layout.u_carina)])
    top = np.array([tx, ty - 6.0 * s, z_top])
    lumen.add(top, carina, tr, tr * 0.9)
    min_radius = max(1.1 * px, 0.9 * s)
    for side in (-1.0, 1.0):
        h = hilum(layout, side)
        r_main = tr * (0.72 if side < 0 else 0.64)
        lumen.add(carina, h, tr * 0.8, r_main)
        dirs = np.array([(side * 0.3, 0.0, 1.0), (side * 1.0, -0.3, -0.1), (side * 0.5, 0.3, -0.9)])
        dirs += rng.normal(0.0, 0.08, dirs.shape)
        lumen.extend(
            grow_forest(
                rng,
                np.repeat(h[None], 3, axis=0),
                dirs,
                np.full(3, r_main * 0.7),
                inside=layout.in_lung,
                centres=np.repeat(h[None], 3, axis=0),
                min_radius=min_radius,
                min_length=3.0 * px,
                max_segments=40,
                trunk_steps=1,
                length_factor=(4.0, 6.0),
                max_generations=3,
            )
        )
    return lumen


def aorta_tubes(layout: Layout, z_bottom: float) -> Tubes:
    """Ascending aorta, arch and descending aorta (LPS mm)."""
    ax, ay, ar = layout.aorta_asc
    dx, dy, dr = layout.aorta_desc
    z_arch = layout.z_of_u(layout.u_arch)
    z0 = layout.heart_c[2] + 0.3 * layout.heart_axes[2]
    t = np.linspace(0.0, np.pi, 9)
    arch = np.stack(
        [ax + (dx - ax) * (1 - np.cos(t)) / 2, ay + (dy - ay) * (1 - np.cos(t)) / 2, z_arch + layout.arch_rise * np.sin(t)],
        axis=1,
    )
    pts = np.vstack([[ax, ay, z0], arch, [dx, dy, z_bottom]])
    radii = np.concatenate([[ar], np.linspace(ar, dr, len(arch)), [dr]])
    tubes = Tubes()
    tubes.add_polyline(pts, radii)
    return tubes


def rib_tubes(layout: Layout, rng: np.random.Generator) -> tuple[Tubes, Tubes]:
    """Bones and costal cartilage of the chest wall: (ribs and clavicles, cartilage), LPS mm.

    Twelve pairs of ribs curve around the pleural cavity, sloping down to the
    front; ribs 1-10 join the sternum through costal cartilage; the clavicles
    run from the top of the sternum out and up in the anterior chest wall.
    """
    s = layout.scale
    va, vb = layout.vb_axes
    tubes = Tubes()
    cartilage = Tubes()
    sx, sy, sa = layout.sternum
    su0, su1 = layout.sternum_u
    n_ribs = 12
    for n in range(n_ribs):
        u_post = 0.8 - n * (1.75 / (n_ribs - 1))
        z_post = layout.z_of_u(u_post)
        drop = layout.half_h * rng.uniform(0.28, 0.38)
        floating = n >= 10
        for side in (-1.0, 1.0):
            pts = []
            phis = np.linspace(0.0, 1.0, 20)
            for f in phis:
                z = z_post - drop * f**1.3
                fac = float(layout.apex_factor(z))
                grow = layout.rib_r + 0.5 * layout.gap
                a = layout.cav_a * fac + grow
                b_post = layout.cav_b_post * fac + grow
                b_ant = layout.cav_b_ant * fac + grow
                x0 = va + 10.0 * s
                phi0 = np.arcsin(np.clip(x0 / a, 0.0, 1.0))
                x_end = 22.0 * s + 5.0 * s * max(n - 6, 0)
                phi1 = np.pi - np.arcsin(np.clip(x_end / a, 0.0, 1.0))
                if floating:
                    phi1 = np.pi * 0.55
                phi = phi0 + (phi1 - phi0) * f
                b = b_post if np.cos(phi) >= 0 else b_ant
                pts.append((side * a * np.sin(phi), b * np.cos(phi), z))
            head = (side * (va + 1.0 * s), layout.spine_y + 0.6 * vb, z_post + 0.5 * layout.rib_r)
            tubes.add_polyline(np.vstack([head, np.array(pts)]), layout.rib_r)
            if not floating:
                end = np.array(pts[-1])
                z_join = float(np.clip(end[2] + 6.0 * s, layout.z_of_u(su0) + layout.rib_r, layout.z_of_u(su1) - layout.rib_r))
                cartilage.add(end, np.array([sx + side * 0.8 * sa, sy, z_join]), 0.9 * layout.rib_r)
    # clavicles: in the anterior muscle layer, from the manubrium out to the shoulders
    inset = layout.skin + layout.fat + 0.5 * layout.muscle
    a = layout.body_a - inset
    b = layout.body_b_ant - inset
    z0 = layout.z_of_u(su1)
    phis = np.linspace(0.12, 0.95, 10)
    for side in (-1.0, 1.0):
        clavicle = np.stack([side * a * np.sin(phis), -b * np.cos(phis), z0 + 25.0 * s * phis], axis=1)
        tubes.add_polyline(clavicle, max(0.6 * layout.muscle, layout.rib_r))
    return tubes, cartilage
