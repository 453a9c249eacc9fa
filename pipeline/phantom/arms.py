"""Arms: at the patient's sides or raised beside the head (HU, ``body`` and ``bone`` masks; LPS mm).

Each arm is a tapered tube (skin, subcutaneous fat, muscle) from the shoulder
to the wrist around its bones: the humerus (cortex around fatty marrow) in
the upper arm, radius and ulna in the forearm.

* ``sides``: the arms hang beside the chest, a thin air gap (at least one
  pixel) from the chest wall, a little towards the table;
* ``sides_touching``: the same, pressed against the chest wall (no gap);
* ``raised``: upper arms from the shoulders up beside the head, so they are in
  the top slices of a chest scan only, touching the upper chest.

Arms are part of ``body``; their bones are ``bone``. They are painted only
outside the trunk and cropped by the field of view like the rest.
"""

from __future__ import annotations

import numpy as np

from .anatomy import CORTICAL, FAT, MUSCLE, SKIN
from .scene import Scene, body_outline, trunk_half_width
from .tubes import Tubes, coverage, signed_distance

MARROW = 20.0


def _arm_tubes(scene: Scene, side: float) -> tuple[Tubes, Tubes]:
    """(soft-tissue tube, bone tubes) of one arm; ``side`` +1 left, -1 right."""
    L = scene.layout
    s = L.scale
    rng = scene.rngs["arms"]
    U = rng.uniform
    r_arm = U(38.0, 46.0) * s
    r_hum = U(10.0, 12.0) * s
    z_sh = L.z_of_u(1.0) + U(0.0, 15.0) * s
    arm, bones = Tubes(), Tubes()
    if scene.conf.arms == "raised":
        base = np.array([side * (L.body_a - 0.6 * r_arm), 0.0, z_sh - 25.0 * s])
        elbow = np.array([side * (0.45 * L.body_a + r_arm), -15.0 * s, z_sh + 290.0 * s])
        arm.add(base, elbow, r_arm, 0.8 * r_arm)
        head = np.array([side * (L.body_a + 0.2 * r_arm), 0.0, z_sh - 5.0 * s])
        bones.add(head, head + 0.25 * (elbow - head), 1.8 * r_hum, r_hum)
        bones.add(head + 0.25 * (elbow - head), elbow, r_hum, r_hum)
        return arm, bones
    dy = float(scene.down[1])
    b = L.body_b_post if dy > 0 else L.body_b_ant
    yc = 0.2 * b * dy
    gap = max(U(2.0, 5.0) * s, 1.2 * scene.grid.pixel_spacing) if scene.conf.arms == "sides" else -U(3.0, 8.0) * s
    xc = trunk_half_width(L, yc) + gap + r_arm
    outline = body_outline(L, 1440)
    for _ in range(6):  # push out until the nearest trunk point is r_arm + gap away
        dmin = float(np.min(np.hypot(outline[:, 0] - xc, outline[:, 1] - yc)))
        xc += r_arm + gap - dmin
    x = side * xc
    z_el = z_sh - U(280.0, 320.0) * s
    z_wr = z_el - U(230.0, 260.0) * s
    arm.add_polyline(
        np.array([[x, yc, z_sh + 10.0 * s], [x, yc, z_el], [x + side * 4.0 * s, yc - 12.0 * s, z_wr]]),
        np.array([r_arm, 0.88 * r_arm, 0.62 * r_arm]),
    )
    bones.add(np.array([x, yc, z_sh]), np.array([x, yc, z_sh - 30.0 * s]), 1.8 * r_hum, r_hum)
    bones.add(np.array([x, yc, z_sh - 30.0 * s]), np.array([x, yc, z_el + 8.0 * s]), r_hum, 1.3 * r_hum)
    for off, r in ((-9.0, 0.55), (9.0, 0.6)):
        a = np.array([x, yc + off * s, z_el])
        bones.add(a, np.array([x + side * 4.0 * s, yc - 12.0 * s + off * s, z_wr]), r * r_hum)
    return arm, bones


def paint_arms(scene: Scene, hu: np.ndarray, body: np.ndarray, bone: np.ndarray, trunk2: np.ndarray) -> np.ndarray:
    """Paint the arms into ``hu`` outside the trunk (2-D ``trunk2``); add them to ``body`` and ``bone``.

    Returns (n, 2) LPS (x, y) points of the arms' outlines within the scan
    (for the table), empty when there are no arms.
    """
    scene.truth["arms"] = scene.conf.arms
    if scene.conf.arms == "none":
        return np.zeros((0, 2))
    grid = scene.grid
    L = scene.layout
    ps = grid.pixel_spacing
    sd = np.empty(grid.shape, dtype=np.float32)
    sdb = np.empty(grid.shape, dtype=np.float32)
    outside = ~trunk2
    skin = L.skin
    fat = max(scene.rngs["arms"].uniform(4.0, 12.0) * L.scale, 1.2 * ps)
    cort = max(3.0 * L.scale, 0.8 * ps)
    points = []
    for side in (-1.0, 1.0):
        arm, bones = _arm_tubes(scene, side)
        points.append(_outline_points(arm, grid.zs[0], grid.zs[-1]))
        box = signed_distance(grid, arm.split(20.0 * L.scale), sd, pad=2.0 * ps)
        if box is None:
            continue
        d = sd[box]
        alpha = coverage(d, ps) * outside[box[1:]][None]
        value = np.where(d > -skin, np.float32(SKIN), np.where(d > -skin - fat, np.float32(FAT), np.float32(MUSCLE)))
        bbox = signed_distance(grid, bones.split(20.0 * L.scale), sdb, pad=2.0 * ps)
        if bbox is not None:
            db = np.full(d.shape, 2.0 * ps, dtype=np.float32)
            # bones lie inside the arm's box: copy their distances into it
            inter = tuple(slice(max(a.start, b.start), min(a.stop, b.stop)) for a, b in zip(box, bbox))
            if all(sl.stop > sl.start for sl in inter):
                rel = tuple(slice(sl.start - a.start, sl.stop - a.start) for sl, a in zip(inter, box))
                db[rel] = sdb[inter]
            bone_alpha = coverage(db, ps)
            bone_value = np.where(db > -cort, np.float32(CORTICAL), np.float32(MARROW))
            value = value + bone_alpha * (bone_value - value)
            in_bone = (db < 0) & (d < 0) & outside[box[1:]][None]
            bone[box] |= in_bone
        sub = hu[box]
        sub += alpha * (value - sub)
        body[box] |= (d < 0) & outside[box[1:]][None]
    return np.concatenate(points) if points else np.zeros((0, 2))


def _outline_points(tubes: Tubes, z_lo: float, z_hi: float, n: int = 48) -> np.ndarray:
    """Axial outline points (x, y) of the tubes' cross-sections between heights ``z_lo`` and ``z_hi`` (mm)."""
    a, b, ra, rb = tubes.arrays()
    out = []
    ang = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
    for p, q, r0, r1 in zip(a, b, ra, rb):
        for t in np.linspace(0.0, 1.0, 24):
            c = p + t * (q - p)
            if z_lo - r0 <= c[2] <= z_hi + r0:
                r = r0 + t * (r1 - r0)
                out.append(np.stack([c[0] + r * np.cos(ang), c[1] + r * np.sin(ang)], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2))
