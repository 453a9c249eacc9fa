"""Negatives for the false-positive classifier taken from a training phantom's own anatomy.

``scripts/train_fp_reducer.py --anatomy-negatives N`` adds them to the detector's candidates: vessel bifurcations,
vessel cross-sections of every calibre, vessels at the pleura, pleura beside the spine and ribs, the hila and the
bronchi, so the classifier sees every kind of vessel point, not only those the detector happens to propose.
Positions are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage
from skimage.morphology import skeletonize

#: Kinds of anatomy negatives (:func:`anatomy_negatives`), sampled in equal shares where a phantom has them.
ANATOMY_KINDS = ("bifurcation", "cross_section", "vessel_at_pleura", "pleura_by_bone", "hilum", "bronchus")
#: Vessel calibre bins (diameter, mm) sampled equally often among the cross-sections.
CALIBRE_BINS_MM = (0.0, 2.0, 3.5, 5.5, 8.0, np.inf)


def _coarse_distance(mask: np.ndarray, spacing_kji: np.ndarray) -> np.ndarray:
    """Distance (mm) of every voxel of ``mask``'s grid to the nearest ``False`` voxel, computed on every second voxel
    (a few tenths of a second on a 256² x 150 volume instead of seconds) and repeated back to full size."""
    coarse = ndimage.distance_transform_edt(mask[::2, ::2, ::2], sampling=2.0 * spacing_kji)
    full = np.repeat(np.repeat(np.repeat(coarse, 2, 0), 2, 1), 2, 2)
    return full[: mask.shape[0], : mask.shape[1], : mask.shape[2]]


def anatomy_negatives(ph, rng: np.random.Generator, count: int, *, clearance_mm: float = 6.0) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` negative positions (LPS mm) taken from a training phantom's own anatomy, not from the
    detector's candidates, with the index of their kind in :data:`ANATOMY_KINDS`: vessel bifurcations, vessel
    cross-sections (centreline points, every calibre of :data:`CALIBRE_BINS_MM` equally often), vessels within
    6 mm of the pleura (mediastinum, chest wall, spine), lung just inside the pleura where bone (spine, ribs) lies
    within 12 mm, the hila (vessels of 4 mm or more within 10 mm of the lung's surface, where the trees enter it)
    and bronchi (airway centreline points within 4 mm of the lung: the bronchus beside its artery). Centrelines are the skeleton of the phantom's vessel mask (its
    truth), calibres twice the distance to the vessel wall. Positions within ``clearance_mm`` of a nodule's surface
    are left out; each is moved by up to 1 mm at random, as a refined candidate centre would be."""
    lung = ph.masks["lung_left"] | ph.masks["lung_right"]
    vessels = ph.masks["vessels"] & lung
    if count <= 0 or not lung.any():
        return np.zeros((0, 3)), np.zeros(0, np.int8)
    spacing = np.asarray(ph.volume.spacing, dtype=np.float64)[::-1]  # k, j, i
    depth = _coarse_distance(lung, spacing)  # mm inside the lung
    skeleton = skeletonize(vessels) if vessels.any() else np.zeros_like(vessels)
    points = np.argwhere(skeleton)
    pools: list[np.ndarray] = []
    weights: list[np.ndarray | None] = []
    if len(points):
        box = tuple(slice(int(a), int(b) + 1) for a, b in zip(points.min(0), points.max(0)))
        radius = ndimage.distance_transform_edt(vessels[box], sampling=spacing)
        calibre = 2.0 * radius[tuple((points - points.min(0)).T)]
        degree = ndimage.convolve(skeleton.astype(np.uint8), np.ones((3, 3, 3), np.uint8), mode="constant")
        branching = degree[tuple(points.T)] >= 4  # itself and three or more skeleton neighbours
        pools.append(points[branching])
        weights.append(None)
        bins = np.digitize(calibre, CALIBRE_BINS_MM) - 1
        share = np.bincount(bins, minlength=len(CALIBRE_BINS_MM) - 1).astype(np.float64)
        w = 1.0 / np.maximum(share[bins], 1.0)
        pools.append(points)
        weights.append(w / w.sum())
        pools.append(points[depth[tuple(points.T)] <= 6.0])
        weights.append(None)
    else:
        pools += [np.zeros((0, 3), int)] * 3
        weights += [None] * 3
    near_bone = _coarse_distance(~ph.masks["bone"], spacing) <= 12.0
    pools.append(np.argwhere(lung & (depth >= 2.0) & (depth <= 5.0) & near_bone))
    weights.append(None)
    if len(points):
        pools.append(points[(depth[tuple(points.T)] <= 10.0) & (calibre >= 4.0)])
    else:
        pools.append(np.zeros((0, 3), int))
    weights.append(None)
    airway = ph.masks["airway"]
    bronchi = np.argwhere(skeletonize(airway)) if airway.any() else np.zeros((0, 3), int)
    if len(bronchi):
        bronchi = bronchi[_coarse_distance(~lung, spacing)[tuple(bronchi.T)] <= 4.0]
    pools.append(bronchi)
    weights.append(None)
    nodules = [(np.asarray(n.center_lps), n.diameter_mm / 2.0 + clearance_mm) for n in ph.nodules]
    centres, kinds = [], []
    per_kind = int(math.ceil(count / len(ANATOMY_KINDS)))
    for kind, (pool, w) in enumerate(zip(pools, weights)):
        if not len(pool):
            continue
        pick = pool[rng.choice(len(pool), min(per_kind, len(pool)), replace=False, p=w)]
        lps = ph.volume.index_to_lps(pick[:, ::-1].astype(np.float64)).reshape(-1, 3)
        lps = lps + rng.uniform(-1.0, 1.0, lps.shape)
        for c, r in nodules:
            lps = lps[np.linalg.norm(lps - c, axis=1) > r]
        centres.append(lps)
        kinds.append(np.full(len(lps), kind, np.int8))
    if not centres:
        return np.zeros((0, 3)), np.zeros(0, np.int8)
    return np.concatenate(centres)[:count], np.concatenate(kinds)[:count]
