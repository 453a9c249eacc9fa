"""Which internal air is lung, and which lung is left (masks ``[k, j, i]`` on the working grid, LPS geometry).

Lung air is internal air (see :mod:`~pipeline.reconstruction.air`) that is either connected to
the airway tree or is parenchyma: its interior is at least :data:`PARENCHYMA_MARGIN_HU` denser
than the scan's air, which pure gas (stomach, bowel, colon, a trachea on its own) never is.
Regions must also hold at least ``min_lung_ml``; smaller lung-like pieces count only when they
lie within :data:`REACH_MM` of the main lungs and not below them (lung fragments cut off by a
fissure or vessel, not gas below the diaphragm). The main lungs are the largest lung region and
every lung region of at least :data:`MAIN_FRACTION` of it that reaches above its lowest slice, and a smaller one
on the other side of the airway, level with it: a lung collapsed under an effusion (:func:`_collapsed_partner`).
Bowel gas joined to a lung base through a thin partial-volume diaphragm is parted from it
(:func:`drop_gas_pockets`).

Left and right come from anatomy, in this order: the airway's LPS x (the trachea and main
bronchi lie between the lungs; a region spanning both sides of it is two lungs joined at a
junction and is split there), else the relation between the two largest lung regions (the
patient's left lung is the one at larger LPS x), else a region that erosion splits into two
lungs, else a single lung's side of the body's x mid-line (where the field of view leaves the
body whole). Never from which half of the image a region lies in. A "lung" of less than ``min_lung_ml`` on one
side (crumbs of lung air beside the airway, where the one lung of a pneumonectomy crosses the airway's x) is part
of the other side's lung (:func:`_no_crumb_lung`).

Each lung is then filled: a small closing and per-slice hole filling take in vessels and
nodules inside it (a large hole only where the lung encloses it in 3-D or beside the airway: the
liver dome that a lung base surrounds in a slice is not lung), :func:`pleural_notches` the nodules on its pleura (as LUNA16-style lung
masks hold them). The final boundary lies where a voxel is half parenchyma, half soft tissue
(:func:`boundary_threshold`).

Air that reaches, within one slice, from one side of the image to the other is never lung, whatever the patient's
position (:func:`_spanning_sides`): the mediastinum parts the lungs, so only air outside the body does (the air
between a prone patient's anterior chest and the table, closed off by a blanket, which a coarse grid's block means
read at lung density).

A lung on one side only, found without an airway, that runs through the whole scan (from its first
slice to its last) without reaching the image's side edges is not a lung (:func:`lone_column`): a
lung cut by the scan range at both ends lies at levels where both lungs are, so its partner would be
in the scan too. Such a column is lung-density material of a test object (a calibration phantom's
lung insert).

No lung air at all is not an error: :func:`select_lungs` returns empty masks and
``lungs = "absent"`` in its info, and ``why`` says what was found instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import ndimage

from ..volume import Geometry
from . import air as air_mod
from . import morph
from .air import AirRegions
from .grid import Grid, bbox
from .lung_surface import fill_lung, pleural_notches
from .organs import SegmentParams

log = logging.getLogger(__name__)

PARENCHYMA_MARGIN_HU = air_mod.PARENCHYMA_MARGIN_HU  # lung interior is at least this much denser than air
MAIN_FRACTION = 0.1  # lung regions of this share of the largest one are main lungs
PARTNER_BELOW = 0.1  # a smaller collapsed lung's centroid lies at most this share of the largest lung's height lower
REACH_MM = 4.0  # smaller lung pieces must lie this close to a main lung
PAIR_MIN_DX = 0.12  # two regions this far apart in x (share of the body's width) are a left and a right lung
PAIR_MIN_RATIO = 0.2  # the smaller of a lung pair holds at least this share of the larger
JUNCTION_FRACTION = 0.2  # a region with this share on each side of the airway is two joined lungs
GAS_PART_ML = 2.0  # an eroded part of the lung air this large that is pure gas is bowel gas
SOLID_HU = -100.0  # tissue the lung's filling took in that is this dense (vessels, nodules) stays in
_MAX_SPLIT_EROSIONS = 12


@dataclass
class Lungs:
    """Left and right lung masks on the working grid, how they were found, and the other internal gas.

    ``gas`` is internal air that is neither lung nor airway (bowel gas, including pockets parted
    from the lungs); the lungs' boundary must not grow into its partial-volume rim. ``kept`` is the
    solid tissue the lungs took in (vessels, nodules inside them or on the pleura, see
    :func:`pleural_notches`), which a boundary re-decided by HU must keep.
    """

    left: np.ndarray
    right: np.ndarray
    info: dict[str, float | str] = field(default_factory=dict)
    gas: np.ndarray | None = None
    kept: np.ndarray | None = None
    why: str = ""  # why there are no lungs, when there are none

    @property
    def found(self) -> bool:
        return bool(self.left.any() or self.right.any())


def lung_regions(regions: AirRegions, airway: np.ndarray | None, grid: Grid, p: SegmentParams) -> np.ndarray:
    """Labels of the air regions that are lung (see the module docstring); empty when there is none.

    A region connected to the airway counts for the air it holds beyond the airway: at least
    ``min_lung_ml`` once the airway, its one-voxel rim and one more voxel of erosion are taken away.
    A lone air tube (the pharynx and larynx of a head or neck scan, taken for a trachea) holds none.
    """
    r = regions
    min_vox = p.min_lung_ml / r.voxel_ml
    lung_like = r.parenchyma()
    if airway is not None and airway.any():
        dev = grid.hu.device
        near = morph.dilate(morph.to_tensor(airway, dev), (1, 1, 1)).cpu().numpy()
        touched = np.unique(r.labels[near])
        touched = touched[(touched > 0) & r.internal[touched]]
        if touched.size:
            beyond = morph.erode(morph.to_tensor(r.mask(touched) & ~near, dev), (1, 1, 1)).cpu().numpy()
            beyond_vox = np.bincount(r.labels[beyond], minlength=r.n + 1)
            lung_like[touched] |= beyond_vox[touched] >= min_vox
    lung_like[0] = False
    lung_like[_spanning_sides(r, np.nonzero(lung_like)[0], grid.geometry.array_axis(2))] = False
    big = lung_like & (r.size >= min_vox)
    if not big.any():
        return np.zeros(0, dtype=np.int64)
    largest = int(np.argmax(np.where(big, r.size, 0)))
    main = big & (r.size >= MAIN_FRACTION * r.size[largest]) & (r.z_hi >= r.z_lo[largest])
    main |= _collapsed_partner(r, big & ~main, largest, airway, grid)
    main_ids = np.nonzero(main)[0]
    extra = np.nonzero(big & ~main & (r.centroid[:, 2] >= np.nanmin(r.z_lo[main_ids])))[0]
    if extra.size:
        reach = morph.radius_vox(REACH_MM, grid.geometry.spacing)
        m = morph.to_tensor(r.mask(main_ids), grid.hu.device)
        near_main = morph.dilate(m, reach).cpu().numpy()
        touched = np.unique(r.labels[near_main])
        extra = np.intersect1d(extra, touched)
    return np.concatenate([main_ids, extra]).astype(np.int64)


def _spanning_sides(r: AirRegions, ids: np.ndarray, slice_axis: int) -> np.ndarray:
    """Those of the regions ``ids`` that, within one slice (array axis ``slice_axis``), connect one side of the image
    to the opposite side (in-slice 4-connectivity): air outside the body (around it, under a prone patient's chest);
    lungs never do, the mediastinum parts them."""
    labels = np.moveaxis(r.labels, slice_axis, 0)
    faces = np.concatenate([labels[:, [0, -1], :].ravel(), labels[:, :, [0, -1]].ravel()])
    ids = np.intersect1d(ids, faces)  # only a region at the image's sides can cross it (lungs mostly are not)
    if not ids.size:
        return ids
    labels = np.where(np.isin(labels, ids), labels, 0)
    cross = np.zeros((3, 3, 3), dtype=bool)
    cross[1] = ndimage.generate_binary_structure(2, 1)
    flat, _ = ndimage.label(labels > 0, structure=cross)
    across = np.union1d(np.intersect1d(flat[:, :, 0], flat[:, :, -1]), np.intersect1d(flat[:, 0, :], flat[:, -1, :]))
    across = across[across > 0]
    if not across.size:
        return np.zeros(0, dtype=ids.dtype)
    out = np.unique(labels[np.isin(flat, across)])
    for label in out:
        log.debug("lungs: an air region crossing the image from side to side (%.1f mL): outside the body", r.ml(int(label)))
    return out


def _collapsed_partner(r: AirRegions, candidates: np.ndarray, largest: int, airway: np.ndarray | None, grid: Grid) -> np.ndarray:
    """Per region (bool): a lung collapsed under an effusion, smaller than :data:`MAIN_FRACTION` of the largest lung.

    Such a lung (a few percent of the other, the aerated remnant at its hilum) is lung parenchyma (``candidates``:
    lung-like regions of at least ``min_lung_ml`` that are not main lungs) on the other side of the airway's LPS x
    from the largest lung, with its centroid no lower than :data:`PARTNER_BELOW` of the largest lung's height under
    that lung's centroid (stomach and colon gas lie under the diaphragm, lower). Only with an airway: it tells
    the sides apart.
    """
    out = np.zeros_like(candidates)
    if airway is None or not airway.any() or not candidates.any():
        return out
    x_airway = float(grid.geometry.centroid_lps(airway)[0])
    c = r.centroid
    other_side = np.sign(c[:, 0] - x_airway) == -np.sign(c[largest, 0] - x_airway)
    level = c[:, 2] >= c[largest, 2] - PARTNER_BELOW * (r.z_hi[largest] - r.z_lo[largest])
    out = candidates & other_side & level
    for label in np.nonzero(out)[0]:
        log.debug("lungs: a small lung on the other side (%.1f mL): a collapsed lung", r.ml(int(label)))
    return out


def _two_largest(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    labels, sizes = morph.label(mask)
    order = np.argsort(sizes)[::-1]
    a = labels == order[0]
    if sizes.size < 3 or sizes[order[1]] == 0:
        return a, np.zeros_like(a), 0.0
    return a, labels == order[1], float(sizes[order[1]] / sizes[order[0]])


def _grow_back(cores: list[torch.Tensor], mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Dilate competing cores inside ``mask`` one voxel at a time (first come, first served) until it is claimed."""
    taken = cores[0] | cores[1]
    for _ in range(max(steps + 2, 500)):  # until nothing is left to claim
        grown = [morph.dilate(c, (1, 1, 1)) & mask & ~taken for c in cores]
        both = grown[0] & grown[1]
        grown[1] &= ~both
        if not (grown[0].any() or grown[1].any()):
            break
        cores = [cores[0] | grown[0], cores[1] | grown[1]]
        taken = cores[0] | cores[1]
    return cores


def drop_gas_pockets(lung_air: np.ndarray, hu: np.ndarray, air_level_hu: float, grid: Grid, p: SegmentParams) -> np.ndarray:
    """Lung air without bowel gas that joins it through a thin, partial-volume diaphragm.

    Eroding the lung air by one (then two) voxels parts such a pocket from the lung; a part of at
    least :data:`GAS_PART_ML` whose median HU is pure gas (less than :data:`PARENCHYMA_MARGIN_HU`
    above the air level) is gas, and what it claims when the parts grow back is removed. Bullae and
    emphysema stay: they are not parted from the lung by so thin an erosion.
    """
    box = bbox(lung_air, 2)
    if box is None:
        return lung_air
    sub = lung_air[box]
    hu_sub = hu[box]
    t = morph.to_tensor(sub, grid.hu.device)
    for depth in (1, 2):
        core = morph.erode(t, (depth, depth, depth)).cpu().numpy() & sub
        labels, sizes = morph.label(core)
        n = sizes.size - 1
        if n < 2:
            continue
        hist, centres = air_mod.hu_histograms(hu_sub[core], labels[core], n, p.lung_hu)
        median = air_mod.histogram_medians(hist, centres)
        big = sizes * grid.voxel_ml >= GAS_PART_ML
        gas = big & (median < air_level_hu + PARENCHYMA_MARGIN_HU)
        gas[0] = False
        if not gas.any() or not (big & ~gas).any():
            continue
        cores = [
            morph.to_tensor(morph.keep_labels(labels, np.nonzero(gas)[0], n), grid.hu.device),
            morph.to_tensor(morph.keep_labels(labels, np.nonzero(~gas & (sizes > 0))[0], n), grid.hu.device),
        ]
        claimed = _grow_back(cores, t, depth)[0].cpu().numpy()
        log.debug("gas pockets parted from the lungs: %.1f mL", float(claimed.sum()) * grid.voxel_ml)
        out = lung_air.copy()
        out[box] &= ~claimed
        return out
    return lung_air


def _erosion_split(
    mask: np.ndarray, geometry: Geometry, device: torch.device, min_dx_mm: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Two lungs joined at a thin junction: erode in-plane until two comparable parts appear, then grow them back."""
    m = morph.to_tensor(mask, device)
    cur = m
    in_plane = [1, 1, 1]
    in_plane[geometry.array_axis(2)] = 0
    for step in range(1, _MAX_SPLIT_EROSIONS + 1):
        cur = morph.erode(cur, in_plane)
        ca, cb, r = _two_largest(cur.cpu().numpy())
        if not ca.any():
            return None
        if r >= PAIR_MIN_RATIO:
            ga, gb = _grow_back([morph.to_tensor(ca, device), morph.to_tensor(cb, device)], m, step)
            a, b = ga.cpu().numpy(), gb.cpu().numpy()
            if abs(_centroid_x(a, geometry) - _centroid_x(b, geometry)) < min_dx_mm:
                return None  # two parts of one lung, not a pair
            log.debug("lungs split after %d erosions", step)
            return a, b
    return None


def _cut_at(mask: np.ndarray, geometry: Geometry, x_ref: float) -> tuple[np.ndarray, np.ndarray]:
    """Split at the LPS x with the fewest lung voxels within 25 mm of ``x_ref``: (left part, right part)."""
    x = np.broadcast_to(geometry.lps_coordinate(0), mask.shape)
    xs = x[mask]
    bins = np.linspace(x_ref - 25.0, x_ref + 25.0, 26)
    hist, _ = np.histogram(xs, bins=bins)
    best = int(np.argmin(hist))
    cut = 0.5 * (bins[best] + bins[best + 1])
    return mask & (x >= cut), mask & (x < cut)


def _centroid_x(mask: np.ndarray, geometry: Geometry) -> float:
    return float(geometry.centroid_lps(mask)[0])


def _body_midline(body: np.ndarray, lung: np.ndarray, geometry: Geometry) -> float | None:
    """The body's median LPS x over the lung's slices, or None where the field of view cuts the body in x."""
    axis = geometry.array_axis(2)
    rows = np.asarray(lung.any(axis=tuple(a for a in range(3) if a != axis)), dtype=bool)
    b = np.compress(rows, body, axis=axis)
    if not b.any():
        return None
    x = np.compress(rows, np.broadcast_to(geometry.lps_coordinate(0), body.shape), axis=axis)
    lo, hi = float(x.min()), float(x.max())
    bx = x[b]
    tol = 0.5 * max(geometry.spacing)
    if bx.min() <= lo + tol or bx.max() >= hi - tol:
        return None
    return float(np.median(bx))


def assign_sides(
    lung_air: np.ndarray, airway_x: float | None, body: np.ndarray, grid: Grid
) -> tuple[np.ndarray, np.ndarray, str]:
    """``(left, right, how)``: the lung air split into the patient's left and right lungs (working grid).

    ``how`` names the anatomical reference used: ``airway``, ``pair``, ``erosion``, ``body_midline``
    or ``body_centre`` (see the module docstring).
    """
    g = grid.geometry
    dev = grid.hu.device
    left = np.zeros_like(lung_air)
    right = np.zeros_like(lung_air)
    labels, sizes = morph.label(lung_air)
    n = sizes.size - 1
    if n == 0:
        return left, right, "none"
    order = np.argsort(sizes)[::-1][:2]
    active = sizes > 0  # regions still to assign
    x = np.broadcast_to(g.lps_coordinate(0), lung_air.shape)
    bx = x[body] if body.any() else x[lung_air]
    min_dx = PAIR_MIN_DX * float(bx.max() - bx.min())
    x_ref = airway_x
    how = "airway"
    first = labels == order[0]
    if x_ref is None and n >= 2:
        xa, xb = _centroid_x(first, g), _centroid_x(labels == order[1], g)
        if sizes[order[1]] >= PAIR_MIN_RATIO * sizes[order[0]] and abs(xa - xb) >= min_dx:
            x_ref, how = 0.5 * (xa + xb), "pair"
    if x_ref is None:
        split = _erosion_split(first, g, dev, min_dx)
        if split is not None:
            xa, xb = _centroid_x(split[0], g), _centroid_x(split[1], g)
            left |= split[0] if xa > xb else split[1]
            right |= split[1] if xa > xb else split[0]
            x_ref, how = 0.5 * (xa + xb), "erosion"
            active[order[0]] = False
        else:
            x_ref, how = _body_midline(body, lung_air, g), "body_midline"
            if x_ref is None:
                x_ref = float(np.median(x[body])) if body.any() else _centroid_x(first, g)
                how = "body_centre"
    share_left = np.bincount(labels[(x > x_ref) & (labels > 0)], minlength=n + 1) / np.maximum(sizes, 1)
    joined = (
        active
        & (sizes >= MAIN_FRACTION * float(sizes.sum()))
        & (share_left >= JUNCTION_FRACTION)
        & (share_left <= 1.0 - JUNCTION_FRACTION)
    )
    left |= morph.keep_labels(labels, np.nonzero(active & ~joined & (share_left >= 0.5))[0], n)
    right |= morph.keep_labels(labels, np.nonzero(active & ~joined & (share_left < 0.5))[0], n)
    for lab in np.nonzero(joined)[0]:
        m = labels == lab
        split = _erosion_split(m, g, dev, min_dx)
        if split is None:
            pa, pb = _cut_at(m, g, x_ref)
        else:
            pa, pb = split if _centroid_x(split[0], g) > _centroid_x(split[1], g) else split[::-1]
        left |= pa
        right |= pb
    return left, right, how


def _no_crumb_lung(left: np.ndarray, right: np.ndarray, min_vox: float) -> tuple[np.ndarray, np.ndarray]:
    """``(left, right)`` with a side of fewer than ``min_vox`` voxels (``min_lung_ml``) given to the other side.

    Taking the airway out of the lung air leaves crumbs of a lung (a few voxels) cut off beside the trachea and
    bronchi; each takes the side of the airway's x it lies on. Where one lung crosses that x (the remaining lung of
    a pneumonectomy, hyperexpanded across the midline), a crumb on the far side would be a "lung" of the other
    side, of a fraction of a mL: no lung is that small (:func:`lung_regions` counts none under ``min_lung_ml``).
    """
    n_left, n_right = int(np.count_nonzero(left)), int(np.count_nonzero(right))
    if 0 < n_left < min_vox <= n_right:
        log.debug("lungs: %d voxels of lung air on the left only, part of the right lung", n_left)
        return np.zeros_like(left), right | left
    if 0 < n_right < min_vox <= n_left:
        log.debug("lungs: %d voxels of lung air on the right only, part of the left lung", n_right)
        return left | right, np.zeros_like(right)
    return left, right


def lone_column(lung_air: np.ndarray, touches_side: bool, geometry: Geometry) -> bool:
    """Whether lung air on one side only is a column through the whole scan (see the module docstring).

    ``lung_air``: bool ``[k, j, i]``; ``touches_side``: whether it reaches the in-plane image edge.
    """
    if touches_side:
        return False
    axis = geometry.array_axis(2)
    present = np.asarray(lung_air.any(axis=tuple(a for a in range(3) if a != axis)), dtype=bool)
    return bool(present.size >= 2 and present.all())


def select_lungs(
    regions: AirRegions,
    airway: np.ndarray | None,
    airway_x: float | None,
    body: np.ndarray,
    grid: Grid,
    p: SegmentParams,
    ids: np.ndarray | None = None,
) -> Lungs:
    """The lungs on the working grid: lung regions minus the airway and bowel gas, split into left and right,
    filled (vessels and nodules inside, juxtapleural nodules) and described in ``info`` (``lungs``:
    ``found``, ``one_side`` or ``absent``; ``lung_sides_from``: the anatomical reference used).

    ``ids``: the lung regions' labels when the caller has them (:func:`lung_regions`), else found here.
    """
    if ids is None:
        ids = lung_regions(regions, airway, grid, p)
    empty = np.zeros(regions.labels.shape, dtype=bool)
    if ids.size == 0:
        return Lungs(
            empty,
            empty.copy(),
            {"lungs": "absent"},
            gas=regions.internal_mask(),
            why="no lung parenchyma and no air connected to a trachea inside the patient",
        )
    lung_air = regions.mask(ids)
    if airway is not None:
        lung_air &= ~airway
    lung_air = drop_gas_pockets(lung_air, grid.hu.cpu().numpy(), regions.air_level_hu, grid, p)
    left, right, how = assign_sides(lung_air, airway_x, body, grid)
    left, right = _no_crumb_lung(left, right, p.min_lung_ml / grid.voxel_ml)
    if (
        (airway is None or not airway.any())
        and not (left.any() and right.any())
        and lone_column(lung_air, bool(regions.touches_side[ids].any()), grid.geometry)
    ):
        log.debug("lungs: one column of lung-density air through the whole scan, no airway: not lungs")
        return Lungs(
            empty,
            empty.copy(),
            {"lungs": "absent"},
            gas=regions.internal_mask(),
            why="lung-density air on one side only, through the whole scan, with no airway (a test object's insert, not a lung)",
        )
    left = fill_lung(left, grid.geometry, grid.hu.device, other=right, close_mm=p.lung_close_mm, airway=airway)
    right = fill_lung(right, grid.geometry, grid.hu.device, other=left, close_mm=p.lung_close_mm, airway=airway)
    notches = pleural_notches(left, grid.geometry, airway, other=right)
    left |= notches
    right_notches = pleural_notches(right, grid.geometry, airway, other=left)
    right |= right_notches
    notches |= right_notches
    info: dict[str, float | str] = {"lungs": "found", "lung_sides_from": how, "lung_regions": float(ids.size)}
    if not (left.any() and right.any()):
        info["lungs"] = "one_side"
    gas = regions.internal_mask() & ~lung_air & ~left & ~right
    if airway is not None:
        gas &= ~airway
    solid = (left | right) & ~lung_air & (grid.hu.cpu().numpy() > SOLID_HU)
    return Lungs(left, right, info, gas=gas, kept=notches | solid)
