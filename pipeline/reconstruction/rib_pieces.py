"""Rib pieces without cortex seeds: elongated bright pieces in the chest wall, beyond a lung.

A rib's anterolateral part has a thin cortex. On slices of 2 mm or more, a rib crossing the slice
obliquely holds only part of its cortex in each voxel, so no voxel reaches the cortex seed level
(``SEED_HU``, 600 HU): such a piece is 300-500 HU and lies apart from the seeded rest of its rib,
and without a seed :func:`.bone.segment_bone` would drop it (the 3-D preview then shows no
anterior ribs over the lungs). :func:`rib_pieces` takes such a piece for bone by what a rib is:

* **elongated**: its longest principal axis (in mm) spans at least :data:`RIB_MIN_MM`, at least
  :data:`RIB_ELONGATION` times its second one (a calcified node is a compact blob);
* **across the body's axis**: that axis makes at least :data:`RIB_MIN_TILT_DEG` with the slice
  axis (a small contrast-filled vessel of the chest wall, the internal thoracic artery, runs
  along the body);
* **in the chest wall, beyond a lung**: on the in-plane line from its slice's body centre to the
  piece, at least :data:`LUNG_CROSS_MM` mm lie in aerated lung (in-plane 3x3 mean below
  :data:`LUNG_AIR_HU`; more than the width of a trachea, so that a calcified aortic arch beside it
  is not taken), the last of them within :data:`WALL_GAP_MM` mm of the piece (the pleura and the
  intercostal muscle). The heart, the aorta, calcified coronary arteries and mediastinal nodes lie
  between the lungs, not beyond one; the table lies outside the body.

Below the lungs' domes an anterolateral rib (the 7th to 10th) runs round the upper abdomen's wall with
the liver or the bowel, not a lung, between it and the body's centre, and it curves round the wall
within a few slices (its second principal span, the arc's depth, is half its length or more). Such a
piece is bone too when, instead of lying beyond a lung and being straight, it lies **in the body
wall** as a rib does: its median in-plane depth under the skin is at least :data:`WALL_MIN_MM` (skin,
fat and muscle lie over a rib; a skin marker or a superficial vein lies in them) and less than
:data:`WALL_SHARE` of the way in from the body's surface to its slice's deepest point (bowel and its
contrast lie deeper); it is **flat** (its longest span at least :data:`RIB_ELONGATION` times its
shortest: an arc lies in one plane, a calcified node or a stone is compact), **thin** (no point more
than :data:`RIB_HALF_MM` in-plane from its edge), **small** (at most
:data:`RIB_CONTINUATION_MAX_ML`) and **crosses slices**, besides spanning :data:`RIB_MIN_MM` across
the body's axis. A contrast-filled vessel of the abdominal wall (the epigastric vessels) runs along
the body.

A rib whose cortex shows only near the spine or here and there along it is seeded there, and
:func:`.bone.segment_bone` grows bone only :data:`.bone.GROW_MM` from a seed: on 3 mm pixels a lower
rib's shaft (150-300 HU, its cortex a third of each pixel) runs on beyond that reach, below the lungs
where no lung lies beside it. :func:`rib_continuations` takes such a shaft for bone by what it is:

* it **continues bone**: it touches the bone already grown;
* it is **thin**: no point of it lies more than :data:`RIB_HALF_MM` in-plane from its edge (a rib
  is at most about 12 mm across; a contrast-filled bowel loop, a kidney, a heart chamber or the
  aorta touching bone is thicker);
* it is **small**: at most :data:`RIB_CONTINUATION_MAX_ML` (a contrast-coated bowel wall or a
  layer of contrast in the rectum lying against the sacrum is thin but spreads much wider);
* it **crosses slices**: a rib runs obliquely down the body; a streak from metal (a hip
  prosthesis) is as thin and bright and touches the bone it comes from, but lies in its slice;
* it **crosses the body's axis** (its longest principal axis at least :data:`RIB_MIN_TILT_DEG`
  from the slice axis): a small vessel running on down the body past a vertebra (the azygos vein)
  touches bone too. A piece shorter than :data:`RIB_MIN_MM` in the outer body wall (less than
  :data:`WALL_SHARE` of the way in) is exempt: a lower rib's tip turns down the body over a slice or
  two, too short for its direction to be told, and the azygos vein lies deeper, beside the spine;
* it lies **in the body wall**, less than :data:`DEEP_SHARE` of the way in from the body's surface to
  its slice's deepest point: a contrast-filled vein running across the body from a vertebra towards a
  kidney (a retroaortic left renal vein) is as thin, touches bone and crosses the body's axis too.

Blood pools are left out of the candidates beforehand. Arrays are ``[k, j, i]`` on the working
grid (LPS mm geometry); spacings are mm per array axis.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import ndimage

log = logging.getLogger(__name__)

__all__ = ["beyond_lung", "depth_share", "rib_continuations", "rib_pieces"]

RIB_MIN_MM = 15.0  # a rib piece spans at least this along its longest axis (mm)
RIB_ELONGATION = 2.5  # and that span is at least this many times its span along the second axis
RIB_MIN_TILT_DEG = 30.0  # its longest axis makes at least this angle with the body's axis (degrees)
RIB_MIN_VOXELS = 4  # working voxels a piece needs for its shape to be told
LUNG_AIR_HU = -500.0  # aerated lung's in-plane 3x3 mean is below this (HU)
LUNG_CROSS_MM = 30.0  # the line from the body's centre to a rib piece crosses at least this much air (mm): more than a trachea
WALL_GAP_MM = 15.0  # a rib lies within this of the lung beside it (pleura and intercostal muscle, mm)
RIB_HALF_MM = 7.5  # no point of a rib's in-plane cross-section lies further than this from its edge (mm)
RIB_CONTINUATION_MAX_ML = 5.0  # a rib's shaft beyond the reach of growth holds at most this (mL)
DEEP_SHARE = 0.5  # deep in the body: at least this share of the way from its surface to its slice's deepest point
WALL_SHARE = 0.3  # a rib below the lungs lies less than this share of the way in from the body's surface
WALL_MIN_MM = 8.0  # and at least this deep under the skin (mm): skin, fat and muscle lie over it


def _principal_spans(points_mm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(spans along the principal axes, longest first, mm; unit vector of the longest axis) of ``(n, 3)`` points."""
    centred = points_mm - points_mm.mean(axis=0)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    vectors = vectors[:, ::-1]
    proj = centred @ vectors
    return proj.max(axis=0) - proj.min(axis=0), vectors[:, 0]


def _beyond_lung(points: np.ndarray, centre: np.ndarray, air: np.ndarray, step_mm: np.ndarray, k: int) -> bool:
    """Whether the in-plane line from ``centre`` (slice ``k``) to the mean of ``points`` crosses lung, close to it.

    ``points`` and ``centre`` are in-plane array indices (two axes, in array order), ``air`` the
    slice's aerated lung (2-D), ``step_mm`` the two in-plane spacings (mm).
    """
    target = points.mean(axis=0)
    length_mm = float(np.linalg.norm((target - centre) * step_mm))
    n = max(2, int(np.ceil(length_mm / float(step_mm.min()))) + 1)
    t = np.linspace(0.0, 1.0, n)
    line = np.rint(centre[None, :] + t[:, None] * (target - centre)[None, :]).astype(np.int64)
    line = np.clip(line, 0, np.array(air.shape) - 1)
    on_air = air[line[:, 0], line[:, 1]]
    if not on_air.any():
        return False
    seg_mm = length_mm / (n - 1)
    last_air_mm = length_mm * (1.0 - t[np.nonzero(on_air)[0][-1]])
    log.debug("rib piece in slice %d: %.0f mm of lung on its line, %.0f mm from it", k, on_air.sum() * seg_mm, last_air_mm)
    return bool(on_air.sum() * seg_mm >= LUNG_CROSS_MM and last_air_mm <= WALL_GAP_MM)


def depth_share(body: np.ndarray, slices: np.ndarray, *, spacing: tuple[float, float, float], slice_axis: int) -> np.ndarray:
    """In-plane depth below the body's surface over the depth of the slice's deepest point (0..1), in ``slices`` only.

    Where the body reaches the image's edge (a small field of view), the edge counts as its surface.
    """
    out = np.zeros(body.shape, dtype=np.float32)
    step_mm = [spacing[d] for d in range(3) if d != slice_axis]
    for k in slices:
        plane = np.take(body, k, axis=slice_axis)
        if not plane.any():
            continue
        depth = ndimage.distance_transform_edt(np.pad(plane, 1), sampling=step_mm)[1:-1, 1:-1]
        index = [slice(None)] * 3
        index[slice_axis] = slice(int(k), int(k) + 1)
        out[tuple(index)] = np.expand_dims(depth / float(depth.max()), slice_axis)
    return out


def beyond_lung(
    pts: np.ndarray, body: np.ndarray, air: np.ndarray, *, spacing: tuple[float, float, float], slice_axis: int
) -> bool:
    """Whether the piece at array indices ``pts`` (``(n, 3)``, ``(k, j, i)``) lies in the chest wall beyond a lung.

    Judged in the piece's median slice, on the in-plane line from that slice's body centre (see the module
    docstring); ``body`` the body mask, ``air`` its aerated lung (in-plane 3x3 mean below :data:`LUNG_AIR_HU`),
    ``spacing`` the voxel size (mm) per array axis, ``slice_axis`` the array axis across the slices.
    """
    inplane = [d for d in range(3) if d != slice_axis]
    k = int(np.median(pts[:, slice_axis]))
    body_k = np.argwhere(np.take(body, k, axis=slice_axis))
    if body_k.size == 0:
        return False
    in_k = pts[pts[:, slice_axis] == k][:, inplane]
    step_mm = np.array([spacing[d] for d in inplane])
    return _beyond_lung(in_k, body_k.mean(axis=0), np.take(air, k, axis=slice_axis), step_mm, k)


def _in_body_wall(
    piece: np.ndarray, body: np.ndarray, box: tuple[slice, ...], *, spacing: tuple[float, float, float], slice_axis: int
) -> bool:
    """Whether ``piece`` (bool, the extent of ``box`` in ``body``) lies in the body wall as a rib below the lungs does.

    It crosses slices, is thin (in-plane distance to its edge at most :data:`RIB_HALF_MM`) and small (at most
    :data:`RIB_CONTINUATION_MAX_ML`), and its median in-plane depth under the skin is at least
    :data:`WALL_MIN_MM` mm and less than :data:`WALL_SHARE` of its slice's deepest point (the whole slices of
    ``body``). ``spacing`` the voxel size (mm) per array axis, ``slice_axis`` the array axis across the slices.
    """
    if box[slice_axis].stop - box[slice_axis].start < 2:
        return False
    if float(piece.sum()) * float(np.prod(spacing)) / 1000.0 > RIB_CONTINUATION_MAX_ML:
        return False
    step_mm = [spacing[d] for d in range(3) if d != slice_axis]
    depths: list[np.ndarray] = []
    shares: list[np.ndarray] = []
    for n, k in enumerate(range(box[slice_axis].start, box[slice_axis].stop)):
        plane = np.take(piece, n, axis=slice_axis)
        if not plane.any():
            continue
        if float(ndimage.distance_transform_edt(plane, sampling=step_mm).max()) > RIB_HALF_MM:
            return False
        whole = np.take(body, k, axis=slice_axis)
        depth = ndimage.distance_transform_edt(np.pad(whole, 1), sampling=step_mm)[1:-1, 1:-1]
        inplane_box = tuple(b for d, b in enumerate(box) if d != slice_axis)
        depths.append(depth[inplane_box][plane])
        shares.append(depth[inplane_box][plane] / float(depth.max()))
    depth_mm, share = float(np.median(np.concatenate(depths))), float(np.median(np.concatenate(shares)))
    log.debug("rib piece below the lungs? %.0f mm under the skin, %.2f of the way in", depth_mm, share)
    return depth_mm >= WALL_MIN_MM and share < WALL_SHARE


def rib_pieces(
    bright: np.ndarray,
    bone: np.ndarray,
    body: np.ndarray,
    smooth_hu: np.ndarray,
    *,
    spacing: tuple[float, float, float],
    slice_axis: int,
) -> np.ndarray:
    """The components of ``bright`` that hold no ``bone`` and are rib pieces (bool ``[k, j, i]``, like ``bright``).

    ``bright``: voxels above the bone threshold, blood pools left out (26-connected components);
    ``bone``: the bone found otherwise (seeded cortex, thick bone regions); ``body`` the body mask;
    ``smooth_hu`` the in-plane 3x3 mean HU; ``spacing`` the voxel size (mm) per array axis
    ``(k, j, i)``; ``slice_axis`` the array axis across the slices. See the module docstring.
    """
    labels, n = ndimage.label(bright, structure=np.ones((3, 3, 3), dtype=bool))
    keep = np.zeros(n + 1, dtype=bool)
    if n == 0:
        return keep[labels]
    has_bone = np.zeros(n + 1, dtype=bool)
    has_bone[labels[bone & bright]] = True
    inplane = [d for d in range(3) if d != slice_axis]
    spacing_arr = np.asarray(spacing, dtype=float)
    air = body & (smooth_hu < LUNG_AIR_HU)
    max_axial = np.cos(np.radians(RIB_MIN_TILT_DEG))
    for idx, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is None or has_bone[idx]:
            continue
        pts = np.argwhere(labels[box] == idx) + np.array([s.start for s in box])
        if len(pts) < RIB_MIN_VOXELS:
            continue
        spans, axis = _principal_spans(pts * spacing_arr)
        if spans[0] < RIB_MIN_MM or abs(float(axis[slice_axis])) > max_axial:
            continue
        if spans[0] >= RIB_ELONGATION * max(spans[1], float(spacing_arr[inplane].min())) and beyond_lung(
            pts, body, air, spacing=spacing, slice_axis=slice_axis
        ):
            keep[idx] = True
        elif spans[0] >= RIB_ELONGATION * max(spans[2], float(spacing_arr[inplane].min())):
            keep[idx] = _in_body_wall(labels[box] == idx, body, box, spacing=spacing, slice_axis=slice_axis)
    keep[0] = False
    log.debug("bone: %d rib pieces without cortex seeds", int(keep.sum()))
    return keep[labels]


def rib_continuations(
    rest: np.ndarray, bone: np.ndarray, body: np.ndarray, *, spacing: tuple[float, float, float], slice_axis: int
) -> np.ndarray:
    """The components of ``rest`` that continue ``bone`` as a rib's shaft does (bool ``[k, j, i]``, like ``rest``).

    ``rest``: voxels above :data:`.blood_pools.LOW_HU` in the body, blood pools and ``bone`` left out
    (26-connected components); ``bone``: the bone grown so far; ``body`` the body mask (the whole
    slice's, for its surface); ``spacing`` the voxel size (mm) per
    array axis ``(k, j, i)``; ``slice_axis`` the array axis across the slices. A component is kept
    when it touches ``bone``, lies in more than one slice, crosses the body's axis, is thin (in-plane
    distance to its edge at most :data:`RIB_HALF_MM`), holds at most :data:`RIB_CONTINUATION_MAX_ML`
    and lies in the body wall (less than :data:`DEEP_SHARE` of the way in from the body's surface).
    See the module docstring.
    """
    cube = np.ones((3, 3, 3), dtype=bool)
    labels, n = ndimage.label(rest, structure=cube)
    if n == 0:
        return np.zeros_like(rest)
    touches = np.zeros(n + 1, dtype=bool)
    touches[labels[ndimage.binary_dilation(bone, structure=cube) & rest]] = True
    inplane = [d for d in range(3) if d != slice_axis]
    step_mm = [spacing[d] for d in inplane]
    depth = np.zeros(rest.shape, dtype=np.float32)  # in-plane distance to the piece's edge (mm)
    for k in range(rest.shape[slice_axis]):
        plane = np.take(rest, k, axis=slice_axis)
        if plane.any():
            index = [slice(None)] * 3
            index[slice_axis] = slice(k, k + 1)
            depth[tuple(index)] = np.expand_dims(ndimage.distance_transform_edt(plane, sampling=step_mm), slice_axis)
    ids = np.arange(n + 1)
    thickness = np.asarray(ndimage.maximum(depth, labels, ids))
    size_ml = np.bincount(labels.ravel(), minlength=n + 1) * float(np.prod(spacing)) / 1000.0
    keep = touches & (thickness <= RIB_HALF_MM) & (size_ml <= RIB_CONTINUATION_MAX_ML)
    spacing_arr = np.asarray(spacing, dtype=float)
    max_axial = np.cos(np.radians(RIB_MIN_TILT_DEG))
    boxes = ndimage.find_objects(labels)
    candidates = [i for i in np.nonzero(keep)[0] if i > 0 and boxes[i - 1] is not None]
    if not candidates:
        return np.zeros_like(rest)
    slices = np.unique(
        np.concatenate([np.arange(boxes[i - 1][slice_axis].start, boxes[i - 1][slice_axis].stop) for i in candidates])
    )
    share = depth_share(body, slices, spacing=spacing, slice_axis=slice_axis)
    for idx, box in enumerate(boxes, start=1):
        if not keep[idx] or box is None:
            continue
        depth_in = float(np.median(share[box][labels[box] == idx]))
        if depth_in >= DEEP_SHARE:  # deep in the body, not in its wall
            keep[idx] = False
            continue
        if box[slice_axis].stop - box[slice_axis].start < 2:  # in one slice: a streak, not a rib running down
            keep[idx] = False
            continue
        pts = np.argwhere(labels[box] == idx) + np.array([s.start for s in box])
        spans, axis = _principal_spans(pts * spacing_arr)
        if float(spans[0]) < RIB_MIN_MM and depth_in < WALL_SHARE:  # a rib's tip turning down: too short to tell
            continue
        keep[idx] = abs(float(axis[slice_axis])) <= max_axial  # across the body's axis, as a rib runs
    keep[0] = False
    log.debug("bone: %d rib shafts continued beyond the reach of growth", int(keep.sum()))
    return keep[labels]
