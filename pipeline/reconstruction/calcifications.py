"""Calcifications and dense contrast deep in the body: small bright components apart from bone, not bone.

A kidney stone, excreted contrast in a calyx or a ureter, a calcified plaque of the aorta or an iliac
artery, a calcified lymph node, a tablet or oral contrast in the bowel: each is as bright as cortical
bone and its voxels cluster as a cortex's do, so :func:`.bone.segment_bone` seeds it like bone. Each
is small, apart from every bone, and deep in the body. The bone that lies apart from the rest of the
skeleton in a scan (a rib's piece, a costal cartilage, the tip of a spinous process, of the xiphoid
or of a scapula) lies in the body wall, near the surface.

:func:`deep_calcifications` takes a component of the bone mask (26-connected) for a calcification
when it is

* **small**: at most :data:`CALCIFICATION_MAX_ML` (excreted contrast filling a whole renal pelvis
  is more, and stays bone);
* **deep**: the median of its voxels' in-plane depth below the body's surface is at least
  :data:`DEEP_SHARE` of the depth of its slice's deepest point;
* **not in the chest wall beyond a lung** (:func:`.rib_pieces.beyond_lung`): a rib in pieces under
  an arm held at the side lies deep below the arm's skin;
* **apart**: no bone within :data:`APART_MM` but other such components (the stones of one kidney
  lie side by side); a piece of a vertebra split off by partial volume, or a rib in pieces, lies
  beside the rest of its bone or beside a piece that does (a plaque on the aorta's back wall within
  that of a vertebra stays bone).

Arrays are ``[k, j, i]`` on the working grid (LPS mm geometry); spacings are mm per array axis.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import ndimage

from .rib_pieces import DEEP_SHARE, LUNG_AIR_HU, beyond_lung, depth_share

log = logging.getLogger(__name__)

__all__ = ["deep_calcifications"]

CALCIFICATION_MAX_ML = 1.0  # a calcification or a pocket of dense contrast (a calyx) holds at most this (mL)
APART_MM = 8.0  # and no other bone lies within this (mm)


def deep_calcifications(
    bone: np.ndarray, body: np.ndarray, smooth_hu: np.ndarray, *, spacing: tuple[float, float, float], slice_axis: int
) -> np.ndarray:
    """The voxels of ``bone`` in components that are calcifications or dense contrast (bool, like ``bone``).

    ``bone``: the bone mask; ``body``: the body mask (same grid); ``smooth_hu``: the in-plane 3x3 mean
    HU; ``spacing``: the voxel size (mm) per array axis ``(k, j, i)``; ``slice_axis``: the array axis
    across the slices. See the module docstring.
    """
    labels, n = ndimage.label(bone, structure=np.ones((3, 3, 3), dtype=bool))
    out = np.zeros_like(bone)
    if n == 0:
        return out
    size_ml = np.bincount(labels.ravel(), minlength=n + 1) * float(np.prod(spacing)) / 1000.0
    small = np.nonzero(size_ml <= CALCIFICATION_MAX_ML)[0]
    small = small[small > 0]
    if small.size == 0:
        return out
    boxes = ndimage.find_objects(labels)
    slices = np.unique(np.concatenate([np.arange(boxes[i - 1][slice_axis].start, boxes[i - 1][slice_axis].stop) for i in small]))
    share = depth_share(body, slices, spacing=spacing, slice_axis=slice_axis)
    air = body & (smooth_hu < LUNG_AIR_HU)
    deep = []
    for idx in small:
        box = boxes[idx - 1]
        here = labels[box] == idx
        if float(np.median(share[box][here])) < DEEP_SHARE:
            continue
        pts = np.argwhere(here) + np.array([b.start for b in box])
        if not beyond_lung(pts, body, air, spacing=spacing, slice_axis=slice_axis):
            deep.append(idx)
    if not deep:
        return out
    apart = np.zeros(n + 1, dtype=bool)
    apart[deep] = True
    reach = [int(np.ceil(APART_MM / s)) for s in spacing]
    changed = True
    while changed:  # a component beside bone is bone, and so is one beside that: a rib in pieces
        changed = False
        rest = bone & ~apart[labels]
        for idx in np.nonzero(apart)[0]:
            box = boxes[idx - 1]
            around = tuple(slice(max(0, b.start - r), min(size, b.stop + r)) for b, r, size in zip(box, reach, bone.shape))
            other = rest[around]
            if other.any():
                here = labels[around] == idx
                if float(ndimage.distance_transform_edt(~other, sampling=spacing)[here].min()) <= APART_MM:
                    apart[idx] = False
                    changed = True
    out = apart[labels]
    log.debug("bone: %d calcifications deep in the body left out", int(apart.sum()))
    return out
