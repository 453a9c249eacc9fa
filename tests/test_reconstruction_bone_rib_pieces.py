"""Anterolateral rib pieces without a resolved cortex are bone; bright confounders beside them are not.

On 2 mm slices a rib crossing the slice obliquely holds only part of its thin cortex in each voxel:
the piece is 300-500 HU, never the 600 HU of a cortex seed, and lies apart from the seeded rest of
its rib. The scene (1 mm pixels, 2 mm slices, LPS: +x the patient's left, +y posterior) is a chest
with two lungs, a vertebra with a resolved cortex, and in the left chest wall an isolated rib piece
beside a thin contrast-filled vessel running along the body; a calcified plate (an aortic wall)
and a calcified node between the lungs, and a bright table bar outside the body.
"""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction import bone as bone_mod
from pipeline.reconstruction.rib_pieces import rib_pieces
from tests._support.bone import segment_bone_of

N, NK = 200, 16  # pixels per side (1 mm), slices (2 mm)
SPACING = (1.0, 1.0, 2.0)  # mm along i (x), j (y), k (z)


def _bar(j: np.ndarray, i: np.ndarray, a: tuple[float, float], b: tuple[float, float], half_width: float) -> np.ndarray:
    """Pixels within ``half_width`` mm of the segment from ``a`` to ``b`` (``(j, i)`` in mm)."""
    p, q = np.array(a), np.array(b)
    d = q - p
    t = np.clip(((j - p[0]) * d[0] + (i - p[1]) * d[1]) / float(d @ d), 0.0, 1.0)
    return np.hypot(j - (p[0] + t * d[0]), i - (p[1] + t * d[1])) <= half_width


def _near_curve(j: np.ndarray, i: np.ndarray, points: np.ndarray, half_width: float) -> np.ndarray:
    """Pixels within ``half_width`` mm of a polyline sampled densely as ``points`` (``(n, 2)``, ``(j, i)`` in mm)."""
    d = np.full(j.shape, np.inf)
    for pj, pi in points:
        d = np.minimum(d, np.hypot(j - pj, i - pi))
    return d <= half_width


def _chest() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(hu, body, parts)``: the scene of the module docstring, ``[k, j, i]``; ``parts`` are masks of its pieces."""
    j, i = np.meshgrid(np.arange(N) + 0.5, np.arange(N) + 0.5, indexing="ij")  # mm
    body2 = ((i - 100) / 95) ** 2 + ((j - 100) / 85) ** 2 < 1.0
    lung_l = ((i - 140) / 30) ** 2 + ((j - 95) / 45) ** 2 < 1.0  # patient's left: larger x
    lung_r = ((i - 60) / 30) ** 2 + ((j - 95) / 45) ** 2 < 1.0
    r_vert = np.hypot(j - 155, i - 100)
    hu = np.full((NK, N, N), -1000.0)
    hu[:, body2] = 40.0
    hu[:, lung_l | lung_r] = -850.0
    hu[:, r_vert < 12] = 1100.0
    hu[:, r_vert < 11] = 180.0
    parts = {k: np.zeros((NK, N, N), dtype=bool) for k in ("rib", "vessel", "plate", "node", "table")}

    def wall(deg: np.ndarray) -> np.ndarray:  # (j, i) mm on the left lung's outline, 12 % out (about 5 mm)
        t = np.radians(deg)
        return np.stack([95 + 1.12 * 45 * np.sin(t), 140 + 1.12 * 30 * np.cos(t)], axis=1)

    # the rib piece: 2 mm thick, about 30 mm long, in the left anterolateral wall outside the lung, over 3 slices
    for k, start in ((6, -62.0), (7, -58.0), (8, -54.0)):
        parts["rib"][k] = _near_curve(j, i, wall(np.linspace(start, start + 30.0, 60)), 1.0)
    # a thin contrast-filled vessel (3 mm wide, 350 HU) in front of it, running along the body
    ((vj, vi),) = wall(np.array([-78.0]))
    parts["vessel"][:] = np.hypot(j - vj, i - vi) <= 1.5
    # between the lungs: a calcified aortic wall plate (2 mm thick, 25 mm long) and a calcified node (6 mm)
    parts["plate"][5:9] = _bar(j, i, (80.0, 95.0), (102.0, 105.0), 1.0)
    parts["node"][9:12] = np.hypot(j - 65, i - 100) <= 3.0
    # the table: a long bright bar under the patient, outside the body
    parts["table"][:] = _bar(j, i, (190.0, 30.0), (190.0, 170.0), 1.0)
    for name, level in (("rib", 420.0), ("vessel", 350.0), ("plate", 450.0), ("node", 450.0), ("table", 400.0)):
        hu[parts[name]] = level
    hu += np.random.default_rng(3).normal(0.0, 10.0, hu.shape)
    body = np.repeat(body2[None], NK, axis=0)
    lungs = np.repeat((lung_l | lung_r)[None], NK, axis=0)
    for name in ("rib", "vessel", "plate", "node"):  # in the body, apart from the lungs
        assert body[parts[name]].all() and not (parts[name] & lungs).any(), name
    return hu.astype(np.float32), body, parts


def _segment(hu: np.ndarray, body: np.ndarray) -> np.ndarray:
    return segment_bone_of(hu, body, spacing=SPACING)


def test_an_isolated_rib_piece_in_the_chest_wall_is_bone_and_the_vessel_calcifications_and_table_are_not():
    hu, body, parts = _chest()
    assert hu[parts["rib"]].max() < bone_mod.SEED_HU  # no cortex seed: only its shape and place tell it
    bone = _segment(hu, body)
    rib = float(bone[parts["rib"]].mean())
    assert rib > 0.8, f"only {rib:.0%} of the rib piece in the chest wall is bone"
    for name in ("vessel", "plate", "node", "table"):
        assert not bone[parts[name]].any(), f"{int(bone[parts[name]].sum())} voxels of the {name} are bone"
    assert bone[:, 145, 100].all()  # the seeded vertebra stays bone


def test_a_rib_piece_must_lie_beyond_a_lung_and_cross_the_body_axis():
    """The same bar between the lungs (the mediastinum), beyond a trachea, or turned along the body is no rib piece."""
    _, body, parts = _chest()
    hu = np.where(body, 40.0, -1000.0)
    hu[:, 30:160, 105:150] = -850.0  # one lung, 45 mm wide, at +x of the body's centre
    smooth = hu.astype(np.float32)
    spacing_kji = (SPACING[2], SPACING[1], SPACING[0])
    none = np.zeros_like(body)
    beyond = parts["rib"] & False
    beyond[6:9, 60:90, 160] = True  # 10 mm lateral to the lung, in-plane along j: across the body's axis
    kept = rib_pieces(beyond, none, body, smooth, spacing=spacing_kji, slice_axis=0)
    assert kept[beyond].all()
    inside = np.zeros_like(body)
    inside[6:9, 60:90, 95] = True  # the same bar on the body's centre side of the lung
    assert not rib_pieces(inside, none, body, smooth, spacing=spacing_kji, slice_axis=0).any()
    trachea = np.where(body, 40.0, -1000.0).astype(np.float32)
    trachea[:, 90:110, 105:125] = -1000.0  # 20 mm of air beside the centre: a trachea, not a lung
    by_trachea = np.zeros_like(body)
    by_trachea[6:9, 85:115, 130] = True  # a calcified aortic arch wall beside it
    assert not rib_pieces(by_trachea, none, body, trachea, spacing=spacing_kji, slice_axis=0).any()
    along = np.zeros_like(body)
    along[:, 75, 160] = True  # a bar beyond the lung running along the body (32 mm over 16 slices)
    assert not rib_pieces(along, none, body, smooth, spacing=spacing_kji, slice_axis=0).any()
