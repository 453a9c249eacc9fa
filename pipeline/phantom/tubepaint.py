"""Painting the tubular anatomy (aorta, pulmonary vessels, airways, ribs) into a phantom's HU (canonical grid, LPS mm).

With ``blood`` values (a confounded phantom) the mediastinal vessels are
painted per group with their own HU (aorta and arch branches, pulmonary
arteries, pulmonary veins) and the voxels of enhanced blood are returned; the
geometry (and so the lung masks) is the same as with one value for all.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import binary_dilation

from . import anatomy as T
from .bronchi import bronchus_tubes
from .layout import Layout
from .scanner import CanonicalGrid
from .tubes import Tubes, coverage, signed_distance
from .vessels import airway_tubes, aorta_tubes, is_artery_tree, rib_tubes, split_trunks, vessel_trees


def _near(sd: np.ndarray, box: tuple[slice, slice, slice], limit: float) -> np.ndarray:
    """Flat indices of the voxels in ``box`` whose signed distance is below ``limit`` mm."""
    k, j, i = np.nonzero(sd[box] < limit)
    return np.ravel_multi_index((k + box[0].start, j + box[1].start, i + box[2].start), sd.shape)


def _blend(flat_hu: np.ndarray, idx: np.ndarray, alpha: np.ndarray, value: float | np.ndarray) -> None:
    """Mix ``value`` (HU) into the voxels ``idx`` with weights ``alpha`` (0..1)."""
    old = flat_hu[idx]
    flat_hu[idx] = old + alpha * (np.asarray(value, dtype=np.float32) - old)


def arch_branches(layout: Layout, z_top: float) -> Tubes:
    """Brachiocephalic, left common carotid and left subclavian arteries: from the arch up to ``z_top`` (LPS mm)."""
    s = layout.scale
    z0 = layout.z_of_u(layout.u_arch) + layout.arch_rise
    tubes = Tubes()
    for (x0, y0), (x1, y1), r in (
        ((-4.0, -16.0), (-16.0, -10.0), 6.5),
        ((3.0, -12.0), (12.0, -6.0), 4.5),
        ((10.0, -8.0), (24.0, 0.0), 5.0),
    ):
        if z_top > z0:
            tubes.add(np.array([x0 * s, y0 * s, z0]), np.array([x1 * s, y1 * s, max(z_top, z0 + 1.0)]), r * s)
    return tubes


def paint_tubes(
    layout: Layout,
    grid: CanonicalGrid,
    rngs: tuple[np.random.Generator, np.random.Generator, np.random.Generator],
    hu: np.ndarray,
    lung: np.ndarray,
    bone: np.ndarray,
    body: np.ndarray,
    inner2: np.ndarray,
    blood: dict[str, float] | None = None,
    bronchi: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, Tubes, np.ndarray | None]:
    """Paint aorta, pulmonary vessels, airways and ribs into ``hu`` (canonical grid, in place).

    Updates ``lung`` (clear of mediastinal vessels, airway lumen, cartilage and
    bone) and ``bone`` (ribs and clavicles added, within the 2-D ``inner2`` region); returns the vessel and airway-lumen masks,
    the intrapulmonary vessel tubes and, with ``blood`` (HU by group: ``aorta``,
    ``pulmonary_artery``, ``pulmonary_vein``, ``lung_vessels``), the blood voxels of
    every vessel (not bone). With ``bronchi`` (a generator), the lung arteries get their bronchi
    (:mod:`.bronchi`; their lumens join the airway mask). Only voxels near a tube surface are touched.
    """
    r_vessel, r_air, r_rib = rngs
    ps = grid.pixel_spacing
    shape = grid.shape
    sd = np.empty(shape, dtype=np.float32)
    flat_hu, flat_sd, flat_bone, flat_lung = hu.reshape(-1), sd.reshape(-1), bone.reshape(-1), lung.reshape(-1)
    vessels = np.zeros(shape, dtype=bool)
    airway = np.zeros(shape, dtype=bool)
    blood_mask = np.zeros(shape, dtype=bool) if blood is not None else None
    pad = 1.5 * ps
    edge = 0.5 * ps
    max_piece = max(4.0 * ps, 6.0 * layout.scale)
    aorta = aorta_tubes(layout, grid.zs[0] - 20.0)
    medi = Tubes()
    medi.extend(aorta)
    roots: list[int] = []
    inner, trunks = vessel_trees(layout, r_vessel, roots=roots)
    medi.extend(trunks)
    if blood is not None:
        aorta.extend(arch_branches(layout, grid.zs[-1] + 20.0))
        medi.extend(arch_branches(layout, grid.zs[-1] + 20.0))
    box = signed_distance(grid, medi.split(max_piece), sd, pad=pad + layout.gap)
    if box is not None:
        if blood is None:
            idx = _near(sd, box, edge)
            _blend(flat_hu, idx, coverage(flat_sd[idx], ps) * ~flat_bone[idx], T.BLOOD)
        flat_lung[_near(sd, box, layout.gap)] = False
    if blood is not None and blood_mask is not None:
        arteries, veins = split_trunks(trunks)
        for group, group_hu in ((aorta, blood["aorta"]), (arteries, blood["pulmonary_artery"]), (veins, blood["pulmonary_vein"])):
            box = signed_distance(grid, group.split(max_piece), sd, pad=pad)
            if box is None:
                continue
            idx = _near(sd, box, edge)
            d = flat_sd[idx]
            _blend(flat_hu, idx, coverage(d, ps) * ~flat_bone[idx], group_hu)
            inside = idx[(d < 0) & ~flat_bone[idx]]
            blood_mask.reshape(-1)[inside] = True
    box = signed_distance(grid, inner.split(max_piece), sd, pad=pad)
    if box is not None:
        idx = _near(sd, box, edge)
        d = flat_sd[idx]
        _blend(flat_hu, idx, coverage(d, ps) * ~flat_bone[idx], T.VESSEL if blood is None else blood["lung_vessels"])
        vessels.reshape(-1)[idx[d < 0]] = True
    if bronchi is not None:
        arteries, tree = Tubes(), []
        for a, b, ra, rb, root in zip(inner.a, inner.b, inner.ra, inner.rb, roots):
            if is_artery_tree(root):
                arteries.add(a, b, ra, rb)
                tree.append(root)
        free = (lung & body & ~vessels).reshape(-1)  # the bronchi are painted in the lung, around its vessels
        for tubes, tissue in zip(bronchus_tubes(arteries, tree, bronchi), (T.AIRWAY_WALL, T.AIR)):
            box = signed_distance(grid, tubes.split(max_piece), sd, pad=pad)
            if box is None:
                continue
            idx = _near(sd, box, edge)
            idx = idx[free[idx]]
            d = flat_sd[idx]
            _blend(flat_hu, idx, coverage(d, ps), tissue)
            if tissue == T.AIR:  # the lumens join the airway truth
                airway.reshape(-1)[idx[d < 0]] = True
    air = airway_tubes(layout, r_air, grid.zs[-1] + 20.0)
    wall = layout.trachea_wall
    box = signed_distance(grid, air.split(max_piece), sd, pad=pad + wall)
    if box is not None:
        idx = _near(sd, box, edge + wall)
        d = flat_sd[idx]
        keep = ~flat_bone[idx]
        _blend(flat_hu, idx, coverage(d - np.float32(wall), ps) * keep, T.AIRWAY_WALL)
        # thick slices: the wall also covers every voxel touching the lumen, so lumen never meets lung
        lumen_box = sd[box] < 0
        rim = binary_dilation(lumen_box, structure=np.ones((3, 3, 3), dtype=bool)) & ~lumen_box & ~bone[box]
        hu[box][rim] = T.AIRWAY_WALL
        _blend(flat_hu, idx, coverage(d, ps) * keep, T.AIR)
        inside = idx[d < 0]
        airway.reshape(-1)[inside[body.reshape(-1)[inside]]] = True
    ribs, cartilage = rib_tubes(layout, r_rib)
    wall_zone = inner2.reshape(-1)  # bones and cartilage stay under the subcutaneous fat
    plane = shape[1] * shape[2]
    box = signed_distance(grid, cartilage.split(max_piece), sd, pad=pad)
    if box is not None:
        idx = _near(sd, box, edge)
        d = flat_sd[idx]
        _blend(flat_hu, idx, coverage(d, ps) * ~flat_bone[idx] * wall_zone[idx % plane], T.CARTILAGE)
        flat_lung[idx[d < 0]] = False
    box = signed_distance(grid, ribs.split(max_piece), sd, pad=pad)
    if box is not None:
        cort = max(1.2 * layout.scale, 0.7 * ps)
        idx = _near(sd, box, edge)
        idx = idx[wall_zone[idx % plane]]
        d = flat_sd[idx]
        value = np.where(d > -cort, np.float32(T.CORTICAL), np.float32(T.CANCELLOUS))
        _blend(flat_hu, idx, coverage(d, ps), value)
        flat_bone[idx[d < 0]] = True
    lung &= ~(airway | bone)
    vessels &= lung
    if blood_mask is not None:
        blood_mask &= ~(airway | bone)
        blood_mask |= vessels
    return vessels, airway, inner, blood_mask
