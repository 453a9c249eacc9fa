"""A nodule's edge along rays from its centre, and the star-shaped surface fitted to the rays' lengths.

Used by :mod:`pipeline.reconstruction.nodules` (steps 2 and 3 there): intensity profiles along rays
in evenly spread directions (sub-voxel, trilinear) give where the intensity first falls below a
threshold (:func:`cast_rays`, :func:`ray_crossings`); the edge width ``sigma`` is measured on the
nodule's own edge (:func:`edge_sigma`); around a ground-glass nodule, rays ending next to solid
tissue are not used (:func:`glass_edge_ok`); a smooth star-shaped surface, radius ``r(u)`` = real
spherical harmonics of degree ≤ 2 in the direction ``u``, is fitted to the ray lengths by
one-sided trimmed least squares (:func:`fit_radius`, :func:`star_radius`).

Ray origins are DICOM patient coordinates (LPS, mm), directions unit vectors in LPS, lengths
and distances along the rays in mm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from ..ingest.measured import continued_past_edge
from ..volume import Geometry

SOLID_HU = -220.0  # below: ground glass; above: solid tissue (nodule core, vessel, chest wall)
SPHERE_PRIOR = 0.1  # weight, per direction, of the surface's departure from a sphere against one ray's residual
SOLID_NEAR_MM = 1.5  # a ground-glass edge point this close to solid tissue is lifted by that tissue's blur
# A detector's box is an estimate of the nodule's extent, often a little smaller (a 12.2 mm nodule in a 9.4 mm box), and
# the rough outline's threshold lies just above the parenchyma, out in the blur. Edges are looked for inside the
# box-inscribed ellipsoid; where it holds no outline, or fewer than MIN_INSIDE_SHARE of the edges found lie in it, up to
# BOX_SLACK times as far along each ray, plus one voxel. With the ellipsoid alone, 13 of the 21 nodules (3.6-16.6 mm)
# that `ctpipe detect` found on seven phantoms got no outline; with the slack, all 21 did (diameters within 4.7 % on average). Rays that
# run on into an attachment are then dropped by the trimmed fit.
BOX_SLACK = 1.25
MIN_INSIDE_SHARE = 0.3


def ray_directions(n: int) -> np.ndarray:
    """``n`` unit vectors spread evenly over the sphere (Fibonacci lattice), ``(n, 3)``."""
    k = np.arange(n) + 0.5
    z = 1.0 - 2.0 * k / n
    phi = np.pi * (3.0 - np.sqrt(5.0)) * k
    s = np.sqrt(1.0 - z * z)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=1)


def _basis(u: np.ndarray) -> np.ndarray:
    """Real spherical-harmonic basis of degree ≤ 2 (as monomials) for unit vectors ``u`` ``(..., 3)`` → ``(..., 9)``."""
    x, y, z = u[..., 0], u[..., 1], u[..., 2]
    return np.stack([x * x, y * y, z * z, x * y, x * z, y * z, x, y, z], axis=-1)


@dataclass
class _Rays:
    """Intensity profiles (HU) along rays from ``origin`` (LPS mm): ``prof[ray, step]`` at distances ``t`` (mm)."""

    origin: np.ndarray
    dirs: np.ndarray
    t: np.ndarray
    prof: np.ndarray


def cast_rays(
    hu: np.ndarray, geom: Geometry, origin: np.ndarray, dirs: np.ndarray, r_max: float, measured: np.ndarray | None = None
) -> _Rays:
    """Profiles along ``dirs`` from ``origin`` (LPS mm) out to ``r_max`` (mm), every 0.3 voxel.

    ``measured`` (bool like ``hu``: a tilt-corrected grid's measured voxels, see
    :func:`~pipeline.ingest.measured.measured_mask`): a ray stops where it leaves them. It reads the images continued
    past their edge (never the -1024 HU fill blended into the last samples), and from its first sample outside the
    field on it holds its last sample inside: no edge is ever found on the field's edge or beyond it.
    """
    step = 0.3 * float(min(geom.spacing))
    t = np.arange(0.0, r_max + step, step)
    pts = origin[None, None, :] + dirs[:, None, :] * t[None, :, None]
    ijk = geom.lps_to_index(pts.reshape(-1, 3))[:, ::-1].T
    read = hu if measured is None else continued_past_edge(hu, measured)
    prof = ndimage.map_coordinates(read, ijk, order=1, mode="nearest").reshape(len(dirs), len(t))
    if measured is not None:
        inside = ndimage.map_coordinates(measured.astype(np.uint8), ijk, order=0, mode="nearest").reshape(prof.shape) > 0
        gone = np.maximum.accumulate(~inside, axis=1)
        held = np.maximum(np.argmax(gone, axis=1) - 1, 0)  # the last sample before the ray left the field
        rows = np.nonzero(gone.any(axis=1))[0]
        prof[rows] = np.where(gone[rows], prof[rows, held[rows]][:, None], prof[rows])
    return _Rays(origin, dirs, t, prof)


def ray_crossings(rays: _Rays, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Distance (mm) along each ray to where HU first drops below ``threshold`` (sub-sample, linear).

    Returns (lengths, found); rays that stay above the threshold to their end get its length and found False.
    """
    t, prof = rays.t, rays.prof
    below = prof < threshold
    found = below.any(axis=1)
    first = np.where(found, below.argmax(axis=1), len(t) - 1)
    prev = np.maximum(first - 1, 0)
    rows = np.arange(len(prof))
    a, b = prof[rows, prev], prof[rows, first]
    frac = np.clip((a - threshold) / np.where(a - b > 1e-6, a - b, 1.0), 0.0, 1.0)
    lengths = np.where(found, t[prev] + frac * (t[first] - t[prev]), t[-1])
    return lengths, found & (first > 0)


def glass_edge_ok(rays: _Rays, lengths: np.ndarray, found: np.ndarray, solid_dist: np.ndarray, geom: Geometry) -> np.ndarray:
    """Rays whose crossing is a ground-glass edge into lung, not one lifted by a solid neighbour's blur.

    ``solid_dist`` (mm, on ``geom``) is the distance to the nearest solid voxel (> ``SOLID_HU``). A ray is refused
    when its crossing lies within ``SOLID_NEAR_MM`` of solid tissue (less for a small nodule, whose solid core may lie
    that close), or when it runs into solid tissue again after clear ground glass (an attached vessel).
    """
    t, prof = rays.t, rays.prof
    before = t[None, :] <= lengths[:, None]
    glass = np.maximum.accumulate(before & (prof < SOLID_HU - 80.0), axis=1)
    reentry = np.any(before & glass & (prof > SOLID_HU), axis=1)
    end = rays.origin[None, :] + rays.dirs * lengths[:, None]
    d_end = ndimage.map_coordinates(solid_dist, geom.lps_to_index(end)[:, ::-1].T, order=1, mode="nearest")
    near = min(SOLID_NEAR_MM, 0.4 * float(np.median(lengths[found]))) if found.any() else SOLID_NEAR_MM
    return ~reentry & (d_end >= near)


def fit_radius(
    dirs: np.ndarray, lengths: np.ndarray, found: np.ndarray, tol_mm: float, reach: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """Coefficients of ``r(u) = basis(u) @ coef`` fitted to the ray lengths, dropping rays that run on too far.

    Rays longer than ``reach`` (mm, per ray: the ellipsoid inscribed in the finding's box, with :data:`BOX_SLACK`) ran
    into an attachment and are never used. The surface's departure from a sphere (the same space, split into a constant and its eight other
    harmonics) is penalised with weight ``SPHERE_PRIOR`` per direction, so that directions without kept rays follow
    the sphere of the others. Returns (coef or None, the rays kept).
    """
    found = found & (lengths <= reach)
    if found.sum() < 30:
        return None, found
    basis = _basis(dirs)
    x, y, z = dirs[:, 0], dirs[:, 1], dirs[:, 2]
    harm = np.stack([np.ones_like(x), x * x - y * y, 2 * z * z - x * x - y * y, x * y, x * z, y * z, x, y, z], axis=1)
    to_mono = np.linalg.lstsq(basis, harm, rcond=None)[0]  # harm == basis @ to_mono (x² + y² + z² = 1)
    prior = np.sqrt(SPHERE_PRIOR) * harm
    prior[:, 0] = 0.0
    zeros = np.zeros(len(dirs))
    keep = found & (lengths <= 1.25 * np.median(lengths[found]))
    coef = None
    for _ in range(8):
        if keep.sum() < 30:
            break
        a, *_ = np.linalg.lstsq(np.vstack([harm[keep], prior]), np.concatenate([lengths[keep], zeros]), rcond=None)
        coef = to_mono @ a
        res = lengths - basis @ coef
        spread = 1.4826 * float(np.median(np.abs(res[keep])))
        tol = max(tol_mm, 2.5 * spread)
        new = found & (res <= tol) & (res >= -3.0 * tol)
        if np.array_equal(new, keep):
            break
        keep = new
    return coef, keep


def edge_sigma(rays: _Rays, lengths: np.ndarray, keep: np.ndarray, bg: float, level: float) -> float | None:
    """Width (mm, as a Gaussian sigma) of the nodule's edge: distance from its 75% to its 25% point / 1.349.

    Measured on the kept rays, outwards from the last sample above 75% of the step before each crossing.
    """
    c = level - bg
    t, p = rays.t, rays.prof[keep]
    if len(p) < 10 or c <= 0:
        return None
    hi_v, lo_v = bg + 0.75 * c, bg + 0.25 * c
    cols = np.arange(p.shape[1])[None, :]
    hi = (p > hi_v) & (t[None, :] <= lengths[keep][:, None])
    last_hi = p.shape[1] - 1 - np.argmax(hi[:, ::-1], axis=1)
    lo = (p < lo_v) & (cols > last_hi[:, None])
    first_lo = np.argmax(lo, axis=1)
    ok = hi.any(axis=1) & lo.any(axis=1) & (last_hi + 1 < p.shape[1])
    if ok.sum() < 10:
        return None
    rows, i, j = np.nonzero(ok)[0], last_hi[ok], first_lo[ok]
    step = float(t[1] - t[0])
    a, b = p[rows, i], p[rows, i + 1]
    t_hi = t[i] + np.clip((a - hi_v) / np.where(a - b > 1e-6, a - b, 1.0), 0.0, 1.0) * step
    a, b = p[rows, j - 1], p[rows, j]
    t_lo = t[j - 1] + np.clip((a - lo_v) / np.where(a - b > 1e-6, a - b, 1.0), 0.0, 1.0) * step
    return float(np.median(t_lo - t_hi)) / 1.349


def star_radius(geom: Geometry, origin: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distance from ``origin``, fitted surface radius in that direction) for every voxel of ``geom`` (mm).

    A voxel whose centre is ``origin`` (within rounding) has no direction: its distance is 0 and its radius the
    surface's mean radius, so that it counts as inside whatever the order in which the grid's voxels are stored.
    """
    k, j, i = np.indices(geom.shape, dtype=np.float64)
    lps = geom.index_to_lps(np.stack([i, j, k], axis=-1)) - origin
    dist = np.linalg.norm(lps, axis=-1)
    at_origin = dist <= 1e-6 * float(min(geom.spacing))
    dist[at_origin] = 0.0
    u = lps / np.where(at_origin, 1.0, dist)[..., None]
    radius = _basis(u) @ coef
    radius[at_origin] = float(np.sum(coef[:3])) / 3.0  # mean over the sphere: x², y², z² average 1/3, the rest 0
    return dist, radius
