"""Streaks from metal in the bone mask: thin bright lines running out from an implant between dark ones.

An implant (a hip prosthesis, a spinal rod: above ``METAL_HU``) starves the beams that cross it, and
the filtered back-projection draws their error as lines radiating from it across its slice: bright
bands (500-1500 HU in soft tissue, as bright as cortex) alternating with dark ones (far below fat).
The bright bands cluster as cortex does and were seeded as bone. They run along the ray from the
metal and are narrow across it, with a dark band on either side; the bone around an implant (a
femur around a stem, the acetabulum around a cup) runs across those rays, so along the direction
across the ray it is bone on both sides.

:func:`metal_streaks` takes, in each slice holding metal, a voxel of the mask within ``STREAK_REACH_MM``
of the metal as a streak when, along the in-plane direction across the ray from the nearest metal
component's centre, it falls below ``LOW_HU`` within ``STREAK_HALF_WIDTH_MM`` on both sides (it is narrow)
and below ``DARK_HU`` within ``STREAK_SIDE_MM`` (or ``STREAK_SIDE_DEG`` seen from the metal, further out,
where the bands fan apart) on both sides (dark bands flank it; fat beside real bone, about -100 HU, is above). Arrays are ``[k, j, i]`` on the grid's geometry (LPS mm).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from .blood_pools import LOW_HU

STREAK_REACH_MM = 80.0  # streaks are looked for this far (mm) from the metal's centre
STREAK_HALF_WIDTH_MM = 4.0  # a streak falls below LOW_HU within this (mm) on either side across its ray
STREAK_SIDE_MM = 12.0  # ... and below DARK_HU within this (mm) on either side: the dark bands beside it,
STREAK_SIDE_DEG = 20.0  # or within this angle seen from the metal, further out, where the bands fan apart
DARK_HU = -150.0  # a dark band from metal is below this (HU); fat (about -100 HU) beside real bone is above
METAL_MIN_MM2 = 20.0  # metal of at least this area in a slice (mm²: a 5 mm rod, a hip stem) draws streaks worth a look


def _falls_below(
    hu: np.ndarray, pts: np.ndarray, step: np.ndarray, n_steps: np.ndarray, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per point (``pts``: ``(2, m)`` pixel coordinates ``j, i``), whether the HU falls below ``level`` within
    its ``n_steps`` (``(m,)``) steps of ``step`` (``(2, m)`` pixels) on the one side and on the other."""
    sides = []
    for sign in (1.0, -1.0):
        below = np.zeros(pts.shape[1], dtype=bool)
        for s in range(1, int(n_steps.max()) + 1):
            at = pts + sign * s * step
            below |= (ndimage.map_coordinates(hu, at, order=1, mode="nearest") < level) & (s <= n_steps)
        sides.append(below)
    return sides[0], sides[1]


def metal_streaks(
    mask: np.ndarray,
    hu: np.ndarray,
    metal: np.ndarray,
    body: np.ndarray,
    *,
    spacing: tuple[float, float, float],
    slice_axis: int,
) -> np.ndarray:
    """The voxels of ``mask`` that are streaks from ``metal`` (bool, like ``mask``; see the module docstring).

    ``hu``: the HU of every voxel; ``metal``: the metal voxels (with or without their partial-volume rim);
    ``body``: the body (air outside it is no dark band; nor are a slice's pieces of metal under
    :data:`METAL_MIN_MM2`, a sternal wire or a clip, whose faint streaks cortex running out from it would pass for);
    ``spacing``: the voxel spacing (mm) along the array axes ``[k, j, i]``; ``slice_axis``: the array axis
    across the slices.
    """
    out = np.zeros(mask.shape, dtype=bool)
    if not metal.any():
        return out
    dark_ok = np.where(body, hu.astype(np.float64), np.inf)  # outside the body: never a dark band
    m_s, h_s, t_s, d_s = (np.moveaxis(a, slice_axis, 0) for a in (mask, hu, metal, dark_ok))
    o_s = np.moveaxis(out, slice_axis, 0)  # a view: writing it writes ``out``
    sp = np.array([spacing[a] for a in range(3) if a != slice_axis], dtype=np.float64)  # mm per pixel, in-plane
    step_mm = float(sp.min())
    for k in np.nonzero(t_s.any(axis=(1, 2)))[0]:
        cand = m_s[k] & ~t_s[k] & (h_s[k] > LOW_HU)  # a streak is bright; a dark band across bone is not one
        labels, n = ndimage.label(t_s[k])
        big = np.nonzero(np.bincount(labels.ravel(), minlength=n + 1)[1:] * float(sp.prod()) >= METAL_MIN_MM2)[0] + 1
        if not cand.any() or big.size == 0:
            continue
        centres = np.array(ndimage.center_of_mass(t_s[k], labels, big)) * sp  # (n, 2) mm
        pts = np.array(np.nonzero(cand), dtype=np.float64)  # (2, m) pixels
        rel = pts.T[:, None, :] * sp - centres[None]  # (m, n, 2) mm from each metal centre
        dist = np.hypot(rel[..., 0], rel[..., 1])
        near = np.argmin(dist, axis=1)
        ray = rel[np.arange(rel.shape[0]), near]  # (m, 2) mm
        length = dist[np.arange(rel.shape[0]), near]
        ok = (length > 0.0) & (length <= STREAK_REACH_MM)
        if not ok.any():
            continue
        pts, ray, length = pts[:, ok], ray[ok], length[ok]
        across = np.stack([-ray[:, 1], ray[:, 0]]) / length  # unit vector across the ray (mm), (2, m)
        step = across * step_mm / sp[:, None]  # one step of step_mm, in pixels
        plane = h_s[k].astype(np.float64)
        narrow = np.full(length.shape, max(1, int(round(STREAK_HALF_WIDTH_MM / step_mm))))
        a1, a2 = _falls_below(plane, pts, step, narrow, LOW_HU)
        side_mm = np.maximum(STREAK_SIDE_MM, length * np.tan(np.radians(STREAK_SIDE_DEG)))  # the bands fan out
        d1, d2 = _falls_below(d_s[k], pts, step, np.maximum(1, np.round(side_mm / step_mm)).astype(np.int64), DARK_HU)
        streak = a1 & a2 & d1 & d2
        jj, ii = pts[:, streak].astype(np.int64)
        o_s[k][jj, ii] = True
    return out
