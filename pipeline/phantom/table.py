"""The patient table under the patient, and a mattress/blanket on it (HU, canonical grid, LPS mm).

The table lies on the floor side of the patient (gravity follows the patient
position: posterior for supine, anterior for prone) with an air gap between
them, spans the whole scan length and is wider than most fields of view:

* ``curved``: a diagnostic table, a trough curved up at the sides (radius
  550..800 mm), a carbon-fibre shell (400..800 HU) around a foam core
  (about -850 HU), thicker in the middle;
* ``flat``: a radiotherapy couch, a flat sandwich panel (shell and foam core)
  with rounded edges.

A blanket or mattress (-80..-20 HU) lies on the table, fills the gap and
touches the patient's back. The ``table`` mask holds table and blanket; the
patient's ``body`` never includes them. Sizes scale with the anatomy.
"""

from __future__ import annotations

import numpy as np

from .scene import Scene

AIR = -1000.0


def _alpha(d: np.ndarray, pixel: float) -> np.ndarray:
    """Fraction of a voxel inside a boundary from the signed depth ``d`` (mm, positive inside)."""
    return np.clip(0.5 + d / pixel, 0.0, 1.0)


def paint_table(scene: Scene, hu: np.ndarray, body: np.ndarray, patient_points: np.ndarray) -> None:
    """Paint the table (and blanket) into ``hu`` where the patient is not; fill the ``table`` mask and truth.

    ``patient_points`` (n, 2) are LPS (x, y) points of the patient's outline
    (trunk and arms); the table's top keeps the gap below all of them.
    """
    conf = scene.conf
    scene.add_mask("table", np.zeros(scene.grid.shape, dtype=bool))
    if conf.table == "none":
        scene.truth["table"] = {"kind": "none", "blanket": False}
        return
    rng = scene.rngs["table"]
    L = scene.layout
    s = L.scale
    ps = scene.grid.pixel_spacing
    U = rng.uniform
    gap = max(U(4.0, 12.0) * s, 1.5 * ps)
    skin = max(2.5 * s, 1.2 * ps)
    if conf.table == "curved":
        radius, width, thick = U(550.0, 800.0) * s, U(420.0, 480.0) * s, U(35.0, 50.0) * s
    else:
        radius, width, thick = np.inf, U(500.0, 540.0) * s, U(45.0, 60.0) * s
    hp = scene.height(patient_points[:, 0], patient_points[:, 1])
    wp = scene.across(patient_points[:, 0], patient_points[:, 1])
    top0 = float(np.max(hp + wp**2 / (2.0 * radius))) + gap
    h = scene.height(scene.x, scene.y)
    w = scene.across(scene.x, scene.y)
    h_top = top0 - w**2 / (2.0 * radius)
    h_bot = top0 + thick - w**2 / (3.0 * radius)
    half = 0.5 * width
    if conf.table == "flat":  # rounded long edges
        edge = np.clip(np.abs(w) - (half - 0.5 * thick), 0.0, None)
        bulge = 0.5 * thick - np.sqrt(np.clip((0.5 * thick) ** 2 - edge**2, 0.0, None))
        h_top = h_top + bulge
        h_bot = h_bot - bulge
    depth = np.minimum(np.minimum(h - h_top, h_bot - h), half - np.abs(w))
    outer = _alpha(depth, ps)
    inner = _alpha(depth - skin, ps)
    shell_hu = U(400.0, 800.0)
    foam_hu = U(-900.0, -780.0)
    table_hu = AIR + outer * (shell_hu - AIR) + inner * (foam_hu - shell_hu)
    table2 = outer > 0.5
    region = outer > 0
    for k in range(hu.shape[0]):
        m = region & ~body[k]
        hu[k][m] = table_hu[m]
    table3 = np.broadcast_to(table2[None], scene.grid.shape) & ~body
    blanket_hu = None
    if conf.blanket:
        thick_b = gap + U(4.0, 10.0) * s
        width_b = U(0.75, 0.95) * width
        d_b = np.minimum(np.minimum(h - (h_top - thick_b), h_top - h), 0.5 * width_b - np.abs(w))
        a_b = _alpha(d_b, ps) * (depth < 0)
        blanket_hu = U(-80.0, -20.0)
        blanket2 = a_b > 0.5
        for k in range(hu.shape[0]):
            m = (a_b > 0) & ~body[k]
            hu[k][m] += a_b[m] * (blanket_hu - hu[k][m])
        table3 = table3 | (np.broadcast_to(blanket2[None], scene.grid.shape) & ~body)
    scene.masks["table"] = table3
    scene.truth["table"] = {
        "kind": conf.table,
        "blanket": bool(conf.blanket),
        "gap_mm": round(float(gap), 2),
        "width_mm": round(float(width), 1),
        "shell_hu": round(float(shell_hu), 1),
        "foam_hu": round(float(foam_hu), 1),
        "blanket_hu": None if blanket_hu is None else round(float(blanket_hu), 1),
    }
