"""One lung: a pneumonectomy, or a lung collapsed under a large effusion (canonical grid, LPS mm).

* Pneumonectomy (``Confounders(pneumonectomy="left" | "right")``): the removed lung's pleural cavity is filled
  with fluid (5..25 HU) or soft tissue (35..55 HU, ``pneumonectomy_fill``), its bronchi and vessels gone; the
  mediastinum (heart, great vessels, trachea) is shifted towards the empty side and the remaining lung is
  hyperexpanded across the midline, most anteriorly (the anterior junction line moves, the spine stays).
* Collapsed lung (``collapsed_lung="left" | "right"``): a large effusion (5..18 HU) fills most of that
  hemithorax, the lung collapsed into a small aerated remnant at the hilum wrapped in a band of collapsed lung
  (30..50 HU); the mediastinum is pushed a little towards the other side.

Both work by shifting the thoracic contents in x (:func:`shift_mediastinum`) after the tubes are painted and
before the nodules are placed, so nodules lie in the remaining (or remaining aerated) lung, and record which
voxels belong to the patient's left and right (:attr:`OneLung.left`): after the shift, a lung's side is where
it came from, never which side of x = 0 it lies on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import smoothstep
from .scene import Scene

#: Shift of the anterior mediastinum towards the empty hemithorax, as a share of the cavity's half width.
PNEUMONECTOMY_SHIFT = 0.9
#: The same, away from a large effusion.
EFFUSION_SHIFT = 0.2
#: Share of a collapsed lung that stays aerated, and that is collapsed lung (soft tissue) around it.
REMNANT_SHARE = 0.2
COLLAPSED_SHARE = 0.1


@dataclass
class OneLung:
    """What the one-lung painters leave: ``left`` (bool ``[z, y, x]``, canonical): the voxels of the patient's
    left hemithorax after the shift (its lung is the left lung, wherever in x it lies)."""

    left: np.ndarray


def _shift_map(scene: Scene, toward: float, amount: float) -> np.ndarray:
    """Source x (mm, ``[z, y, x]``) of each voxel once the thoracic contents move towards ``toward`` (+1: +x,
    patient left; -1: -x) by ``amount`` × the cavity's half width anteriorly, tapering to none at the spine,
    below the lung bases and towards the apex (the trachea bends gradually); the chest wall and the spine stay in place."""
    L = scene.layout
    g = scene.grid
    z = g.zs[:, None, None]
    y = g.ys[None, :, None]
    x = g.xs[None, None, :]
    f = np.maximum(L.apex_factor(z), 1e-6)
    b = np.where(y < 0, L.cav_b_ant, L.cav_b_post)
    half = L.cav_a * f * np.sqrt(np.clip(1.0 - (y / (b * f)) ** 2, 0.0, 1.0))  # cavity half width of each row
    va, vb = L.vb_axes
    front = smoothstep(L.spine_y - vb, -0.5 * L.cav_b_ant, y)  # 0 at the spine, 1 anteriorly
    u = L.u(z)
    levels = smoothstep(-0.95, -0.55, u) * (1.0 - smoothstep(0.2, 0.95, u))  # none below the bases nor at the apex
    s = np.minimum(amount * L.cav_a * front * levels, 0.65 * half)
    xp = toward * x  # the emptied side at xp > 0
    a = np.maximum(half, 1e-6)
    src = np.where(xp < s, -a + (xp + a) * a / (a + s), (xp - s) * a / np.maximum(a - s, 1e-6))
    src = np.where(np.abs(xp) < half, src, xp)
    return toward * src


def shift_mediastinum(scene: Scene, arrays: list[np.ndarray], *, toward: float, amount: float) -> np.ndarray:
    """Move the thoracic contents of ``arrays`` (``[z, y, x]``, in place, nearest neighbour) towards ``toward``
    (see :func:`_shift_map`); returns the source x (mm) of each voxel."""
    g = scene.grid
    src = _shift_map(scene, toward, amount)
    idx = np.clip(np.rint((src - g.xs[0]) / g.pixel_spacing), 0, g.xs.size - 1).astype(np.intp)
    idx = np.broadcast_to(idx, g.shape)
    for arr in arrays:
        arr[...] = np.take_along_axis(arr, idx, axis=2)
    return np.broadcast_to(src, g.shape)


def _pleural_cavity(scene: Scene, src_x: np.ndarray) -> np.ndarray:
    """The pleural cavities (before bones and airways are carved out) at each voxel's source position."""
    g = scene.grid
    return scene.layout.in_lung(src_x, g.ys[None, :, None], g.zs[:, None, None])


def paint_one_lung(
    scene: Scene,
    hu: np.ndarray,
    lung: np.ndarray,
    bone: np.ndarray,
    vessels: np.ndarray,
    airway: np.ndarray,
    body: np.ndarray,
) -> OneLung | None:
    """A pneumonectomy or a collapsed lung (see the module docstring), painted in place; None when neither is asked."""
    conf = scene.conf
    if conf.pneumonectomy == "none" and conf.collapsed_lung == "none":
        return None
    side = conf.pneumonectomy if conf.pneumonectomy != "none" else conf.collapsed_lung
    sign = 1.0 if side == "left" else -1.0  # the emptied side: +x is the patient's left
    removed = conf.pneumonectomy != "none"
    arrays = [hu, lung, bone, vessels, airway, body, *scene.masks.values()]
    if removed:
        src = shift_mediastinum(scene, arrays, toward=sign, amount=PNEUMONECTOMY_SHIFT)
    else:
        src = shift_mediastinum(scene, arrays, toward=-sign, amount=EFFUSION_SHIFT)
    left = src > 0
    own = left if side == "left" else ~left
    rng = scene.rngs["disease"]
    voxel_ml = scene.grid.pixel_spacing**2 * scene.grid.slice_spacing / 1000.0
    if removed:
        space = (_pleural_cavity(scene, src) | lung) & own & ~bone
        fill = rng.uniform(5.0, 25.0) if conf.pneumonectomy_fill == "fluid" else rng.uniform(35.0, 55.0)
        hu[space] = fill
        for m in (lung, vessels, airway, *(scene.masks[n] for n in ("contrast_blood", "emphysema") if n in scene.masks)):
            m &= ~space
        scene.truth["pneumonectomy"] = {
            "side": side,
            "fill": conf.pneumonectomy_fill,
            "fill_hu": round(float(fill), 1),
            "space_ml": round(float(np.count_nonzero(space)) * voxel_ml, 1),
        }
    else:
        _collapse(scene, hu, lung, vessels, airway, own & lung, sign, rng)
    remaining = lung & ~own
    across = remaining & ((scene.grid.xs[None, None, :] > 0) == (side == "left"))
    scene.truth["lung_across_midline_ml"] = round(float(np.count_nonzero(across)) * voxel_ml, 1)
    return OneLung(left=np.ascontiguousarray(left))


def _collapse(
    scene: Scene,
    hu: np.ndarray,
    lung: np.ndarray,
    vessels: np.ndarray,
    airway: np.ndarray,
    own_lung: np.ndarray,
    sign: float,
    rng: np.random.Generator,
) -> None:
    """A lung collapsed under a large effusion: the lung voxels of ``own_lung`` nearest the hilum stay aerated
    (:data:`REMNANT_SHARE`), the next ones are collapsed lung (:data:`COLLAPSED_SHARE`), the rest fluid."""
    L = scene.layout
    g = scene.grid
    if not own_lung.any():
        return
    hilum = (sign * (L.med_w_top + L.gap), 0.0, L.z_of_u(L.u_carina - 0.15))
    k, j, i = np.nonzero(own_lung)
    d = (
        ((g.xs[i] - hilum[0]) / L.cav_a) ** 2
        + ((g.ys[j] - hilum[1]) / L.cav_b_post) ** 2
        + ((g.zs[k] - hilum[2]) / L.half_h) ** 2
    )
    lo, hi = np.quantile(d, [REMNANT_SHARE, REMNANT_SHARE + COLLAPSED_SHARE])
    U = rng.uniform
    fluid = U(5.0, 18.0)
    collapsed_hu = U(30.0, 50.0) + scene.blood.get("atelectasis_gain", 0.0)
    eff = np.zeros(g.shape, dtype=bool)
    atel = np.zeros(g.shape, dtype=bool)
    eff[k[d > hi], j[d > hi], i[d > hi]] = True
    band = (d > lo) & (d <= hi)
    atel[k[band], j[band], i[band]] = True
    hu[eff] = fluid
    hu[atel] = collapsed_hu
    lung &= ~(eff | atel)
    vessels &= lung
    airway &= ~(eff | atel)
    scene.add_mask("effusion", eff)
    scene.add_mask("atelectasis", atel)
    voxel_ml = g.pixel_spacing**2 * g.slice_spacing / 1000.0
    side = "left" if sign > 0 else "right"
    scene.truth["collapsed_lung"] = {
        "side": side,
        "effusion_ml": round(float(np.count_nonzero(eff)) * voxel_ml, 1),
        "collapsed_ml": round(float(np.count_nonzero(atel)) * voxel_ml, 1),
        "aerated_ml": round(float(np.count_nonzero(own_lung & lung)) * voxel_ml, 1),
    }
