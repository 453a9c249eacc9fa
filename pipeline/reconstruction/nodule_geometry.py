"""A segmented nodule's place and size on its volume's grid: its mask as a crop of the volume's grid, its boundary
voxels, its longest 3-D extent, its long and short axis on the slice where it is largest, the box its voxel cells fill and the lung holding it. Positions are DICOM patient coordinates
(LPS, mm); arrays are ``[k, j, i]``, index triples ``(i, j, k)``. Used by ``ctpipe reconstruct``'s nodule lines and
renderings and by the DICOM results (:mod:`pipeline.dicom_out.model`), so that both state the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CtpipeError, ReconstructionError
from ..volume import Geometry
from .nodule_corners import (
    CORNER_SIDE_PX,
    ROUND_REACH,
    _extent_step,
    _extent_steps,
    corner_tips,
    end_reach,
    reach_corners,
)

SIDES = ("left", "right")
#: search radius (mm) around a finding's centre for the nearest lung when the centre lies in neither lung
SIDE_SEARCH_MM = 15.0


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


@dataclass(frozen=True)
class NoduleMask:
    """A nodule's mask as a crop of the volume's grid: ``mask`` (bool ``[k, j, i]``) starts at voxel ``offset_kji``."""

    mask: np.ndarray
    offset_kji: tuple[int, int, int]


def nodule_mask(result: Any, geometry: Geometry, *, error: type[CtpipeError] = ReconstructionError) -> NoduleMask | None:
    """A segmented nodule (a ``NoduleResult`` or its JSON: ``mask`` on its crop ``geometry``) as a crop of the volume's
    grid ``geometry``; None without a mask. A mask on another grid raises ``error``."""
    mask, crop = _get(result, "mask"), _get(result, "geometry")
    if mask is None or crop is None:
        return None
    mask = np.asarray(mask, dtype=bool)
    off = geometry.lps_to_index(crop.origin)
    off_r = np.rint(off)
    if (
        np.abs(off - off_r).max() > 1e-3
        or not np.allclose(crop.spacing, geometry.spacing, rtol=1e-6)
        or not np.allclose(crop.direction, geometry.direction, atol=1e-6)
    ):
        raise error(
            f"nodule {_get(result, 'index')}: its mask is not a crop of the volume's grid",
            where="nodules",
            fix="pass the NoduleResult objects segment_findings() made on this volume",
        )
    i0, j0, k0 = (int(v) for v in off_r)
    lo = np.array([k0, j0, i0])
    hi = lo + np.array(mask.shape)
    if np.any(lo < 0) or np.any(hi > np.array(geometry.shape)):
        raise error(f"nodule {_get(result, 'index')}: its mask reaches outside the volume", where="nodules")
    return NoduleMask(mask, (k0, j0, i0))


def boundary_voxels(nm: NoduleMask) -> np.ndarray | None:
    """Indices ``(i, j, k)`` on the volume's grid (``[n, 3]``) of the mask's boundary voxels, whose hull is the hull of
    all its voxels; None for an empty mask. Computed once per nodule for its long axis and its SR ellipsoid."""
    from scipy import ndimage

    if not nm.mask.any():
        return None
    boundary = nm.mask & ~ndimage.binary_erosion(nm.mask)
    return (np.argwhere(boundary) + np.asarray(nm.offset_kji))[:, ::-1]


def cell_corners(ijk: np.ndarray, geometry: Geometry) -> np.ndarray:
    """The corners (LPS mm, ``[n * 8, 3]``) of the voxel cells at ``ijk`` (:func:`boundary_voxels`)."""
    corners = (ijk[:, None, :] + (np.indices((2, 2, 2)).reshape(3, -1).T - 0.5)[None]).reshape(-1, 3)
    return np.asarray(geometry.index_to_lps(corners), dtype=np.float64)


def half_axes_around(corners: np.ndarray, center: np.ndarray) -> np.ndarray:
    """Half axes (mm, along LPS x, y, z) of the box centred on ``center`` (LPS mm) that holds every voxel cell
    (``corners``: :func:`cell_corners`): the SR's ellipsoid drawn around a segmented nodule, not the detector's box."""
    return np.maximum(corners.max(axis=0) - center, center - corners.min(axis=0))


def long_axis_mm(ijk: np.ndarray, geometry: Geometry, diameter_mm: float) -> float:
    """The nodule's longest extent in 3-D (mm; the SR's "Maximum 3D extent", not the Long axis a reader measures on an
    image: :func:`axial_axes`): the longest distance between the centres of two of its voxels (``ijk``:
    :func:`boundary_voxels`; convex hull, LPS), and never less than ``diameter_mm``, the diameter of the sphere of its
    volume (no body is shorter across than the sphere of its volume).

    Across voxel centres, not the outer corners of the voxel cells: the corners' diagonal (up to 2.4 mm on a
    0.98 x 0.98 x 2 mm grid) made a sphere's long axis that much longer than its diameter; the centres' distance lies
    within half a voxel of it."""
    from scipy.spatial import ConvexHull, QhullError

    pts = np.asarray(geometry.index_to_lps(ijk.astype(np.float64)), dtype=np.float64).reshape(-1, 3)
    try:
        pts = pts[ConvexHull(pts).vertices]
    except QhullError:  # flat or tiny masks: every point is a candidate
        pts = np.unique(pts, axis=0)
    d = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1))
    return max(float(d.max()), float(diameter_mm))


def lung_side(center: np.ndarray, geometry: Geometry, lungs: Mapping[str, np.ndarray]) -> str | None:
    """The lung holding the centre, else the nearer lung within :data:`SIDE_SEARCH_MM`, else None."""
    ijk = geometry.lps_to_index(center)
    i, j, k = (int(v) for v in np.rint(ijk))
    inside = 0 <= k < geometry.shape[0] and 0 <= j < geometry.shape[1] and 0 <= i < geometry.shape[2]
    for side in SIDES:
        m = lungs.get(f"lung_{side}")
        if m is not None and inside and m[k, j, i]:
            return side
    r = np.ceil(SIDE_SEARCH_MM / np.asarray(geometry.spacing)).astype(int)  # (i, j, k)
    lo = np.maximum([k - r[2], j - r[1], i - r[0]], 0)
    hi = np.minimum([k + r[2] + 1, j + r[1] + 1, i + r[0] + 1], geometry.shape)
    if np.any(hi <= lo):
        return None
    best, best_d = None, SIDE_SEARCH_MM
    for side in SIDES:
        m = lungs.get(f"lung_{side}")
        if m is None:
            continue
        sub = np.argwhere(m[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]])
        if sub.size == 0:
            continue
        d = np.sqrt((((geometry.index_to_lps((sub + lo)[:, ::-1])) - center) ** 2).sum(-1)).min()
        if d <= best_d:
            best, best_d = side, float(d)
    return best


@dataclass(frozen=True)
class AxialAxes:
    """A nodule's long and short axis as a reader measures them (Fleischner 2017, Lung-RADS v2022): on the image (the
    volume's slice, in its plane as acquired: axial for an axial acquisition, see :func:`plane_tilt_deg`) where its mask
    is largest, the longest in-plane chord (``long_mm``) and the longest chord perpendicular to it
    (``short_mm``), both mm; ``mean_mm`` their mean (the "mean diameter" the guidelines size a nodule by, stated
    rounded to the nearest mm). ``slice_k``: that slice, an index of the volume's grid. ``long_lps`` and
    ``short_lps``: each axis' two endpoints, DICOM patient coordinates (LPS, mm); their distance is the axis' length."""

    long_mm: float
    short_mm: float
    slice_k: int
    long_lps: tuple[tuple[float, float, float], tuple[float, float, float]]
    short_lps: tuple[tuple[float, float, float], tuple[float, float, float]]

    @property
    def mean_mm(self) -> float:
        return (self.long_mm + self.short_mm) / 2


def _longest_axis(hull: np.ndarray, reach: np.ndarray, geometry: Geometry) -> tuple[int, int, float]:
    """The two hull vertices (indices into ``hull``, LPS mm) between which the nodule is longest, counting each end's
    reach (``reach``: :func:`end_reach`) beyond its pixel's centre, and that length (mm)."""
    diff = hull[None, :, :] - hull[:, None, :]
    dist = np.linalg.norm(diff, axis=-1)
    unit = diff / np.maximum(dist, 1e-12)[..., None]
    length = dist + _extent_steps(unit, geometry) * (reach[:, None] + reach[None, :])
    np.fill_diagonal(length, -1.0)
    a, b = np.unravel_index(int(np.argmax(length)), length.shape)
    return int(a), int(b), float(length[a, b])


#: sampling step along a chord and between neighbouring chords, as a share of the pixel's smaller side
CHORD_STEP = 0.1
#: the most lines across a nodule, and samples along each, of its short axis' search
MAX_CHORD_SAMPLES = 1000


def _perpendicular_chord(
    pixels: np.ndarray,
    offset_kji: tuple[int, int, int],
    k: int,
    geometry: Geometry,
    p: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    tips: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The longest chord of the slice's mask (``pixels``, bool ``[j, i]`` of the crop starting at ``offset_kji``, on
    slice ``k`` of ``geometry``) along a line exactly perpendicular to the long axis (through ``p``, along the unit
    vector ``u``; ``v``: the in-plane unit vector perpendicular to it, LPS): its two endpoints (LPS mm).

    Lines across the nodule, every :data:`CHORD_STEP` pixel along ``u``, each sampled every :data:`CHORD_STEP` pixel;
    the nodule's outline on a line is where the mask, interpolated bilinearly between pixel centres, crosses 0.5 (a
    pixel edge between a pixel inside and one outside; on a digitised disc or ellipse within a fraction of a pixel of
    the true outline). A chord runs from the line's first crossing into the nodule to its last one out of it: across
    a notch of a lobulated nodule, as a reader's calliper is drawn, but never beside the nodule, as the width across
    ``u`` of a crescent or an L-shaped nodule is. That crossing cuts a sharp corner: across a right-angled corner pixel
    it lies 0.29 pixel beyond the pixel's centre along the diagonal, where the corner lies 0.5 pixel beyond it on both
    axes, so a square's short axis, its other diagonal, came out 0.6 pixel short (a pixel, across the flat tip of
    two pixels that a square turned 45° ends in). ``tips`` (:func:`.nodule_corners.corner_tips`: triangles beyond the
    hull of the slice's pixel centres, LPS mm) carries the long axis' outline model over: a chord reaching into one
    runs on to where it leaves it, out to a corner's tip where a calliper ends. Of the chords within a sampling step
    of the longest, the one nearest their middle (an ellipse's short axis through its centre)."""
    from scipy import ndimage

    d = np.asarray(geometry.direction, dtype=np.float64).reshape(3, 3)
    sx, sy = float(geometry.spacing[0]), float(geometry.spacing[1])
    pad = 2
    grid = np.pad(pixels.astype(np.float64), pad)
    j0, i0 = offset_kji[1] - pad, offset_kji[2] - pad
    ji = np.argwhere(pixels) + np.asarray(offset_kji[1:])
    ijk = np.column_stack([ji[:, 1], ji[:, 0], np.full(len(ji), k)]).astype(np.float64)
    pts = np.asarray(geometry.index_to_lps(ijk), dtype=np.float64).reshape(-1, 3)
    su, sv = (pts - p) @ u, (pts - p) @ v
    reach = max(sx, sy)
    # a tenth of a pixel; for a mass over 100 pixels across, coarser: at most MAX_CHORD_SAMPLES lines and samples
    extent = float(max(np.ptp(su), np.ptp(sv))) + 2 * reach
    step = max(CHORD_STEP * min(sx, sy), extent / MAX_CHORD_SAMPLES)
    ts = np.arange(su.min() - reach, su.max() + reach + step, step)
    ss = np.arange(sv.min() - reach, sv.max() + reach + step, step)
    # in-plane index coordinates (i, j) of p and of a mm along u and v
    p_ij = np.asarray(geometry.lps_to_index(p), dtype=np.float64)[:2]
    du = np.array([u @ d[:, 0] / sx, u @ d[:, 1] / sy])
    dv = np.array([v @ d[:, 0] / sx, v @ d[:, 1] / sy])
    ii = p_ij[0] + ts[:, None] * du[0] + ss[None, :] * dv[0] - i0
    jj = p_ij[1] + ts[:, None] * du[1] + ss[None, :] * dv[1] - j0
    inside = ndimage.map_coordinates(grid, [jj.ravel(), ii.ravel()], order=1, mode="constant", cval=0.0)
    inside = inside.reshape(ii.shape)
    hit = inside >= 0.5
    rows = np.flatnonzero(hit.any(axis=1))
    if rows.size == 0:  # no line crosses the pixels' middle: a chord no longer than a pixel, drawn through p
        return p - reach / 2 * v, p + reach / 2 * v
    first = np.argmax(hit[rows], axis=1)
    last = hit.shape[1] - 1 - np.argmax(hit[rows, ::-1], axis=1)

    def crossing(r: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # the position (mm along v) where the interpolated mask crosses 0.5 between samples a (out) and b (in)
        va, vb = inside[r, a], inside[r, b]
        share = np.where(vb > va, (0.5 - va) / np.where(vb > va, vb - va, 1.0), 0.0)
        return ss[a] + share * (ss[b] - ss[a])

    lo = crossing(rows, np.maximum(first - 1, 0), first)
    hi = crossing(rows, np.minimum(last + 1, len(ss) - 1), last)
    if tips is not None and len(tips):
        tips_ij = np.asarray(geometry.lps_to_index(tips.reshape(-1, 3)), dtype=np.float64).reshape(-1, 3, 3)[..., :2]
        lo, hi = reach_corners(lo, hi, p_ij + ts[rows, None] * du, dv, tips_ij)
    # of the chords within a sampling step of the longest (on a round outline, many), the one nearest their middle
    length = hi - lo
    near = np.flatnonzero(length >= length.max() - step)
    best = int(near[np.argmin(np.abs(ts[rows[near]] - ts[rows[near]].mean()))])
    t = ts[rows[best]]
    return p + t * u + lo[best] * v, p + t * u + hi[best] * v


def axial_axes(nm: NoduleMask, geometry: Geometry) -> AxialAxes | None:
    """The long and short axis of a nodule's mask (``nm``, on the volume's grid ``geometry``) on the slice where the
    mask is largest (the most pixels; of equal ones, the one nearest the mask's middle): see :class:`AxialAxes`.

    Both axes run from edge to edge of the nodule's outline as a calliper on the image does, not between pixel
    centres. The long axis is the longest distance across that slice between two pixels at the hull of its pixel
    centres, each end reaching beyond its pixel's centre as far as the outline does there (:func:`end_reach`: to the
    corner pixel's outer edge at a sharp corner, less along a rounded outline). The short axis is the longest chord of
    the nodule on a line exactly perpendicular to it (:func:`_perpendicular_chord`: as Fleischner, Lung-RADS and RECIST
    define it; not the mask's width across the long axis, which for a crescent or a lobulated nodule spans air beside
    it), each end on the outline where the mask, interpolated between pixel centres, crosses 0.5, or, where that cuts a
    corner, at the corner as the long axis reaches it (:func:`.nodule_corners.corner_tips`); never longer than the
    long axis. On digitised shapes of known size (tests/test_nodule_axes_outline.py) each axis lies within about
    a pixel of the true length and, over turns and placements, within half a pixel on average (a square's short axis,
    its other diagonal, within 0.4 pixel of the square's extent across the long axis as measured: see there).
    Distances are in the slice's plane, in LPS mm (anisotropic pixels and any orientation). None for an empty mask."""
    from scipy.spatial import ConvexHull, QhullError

    counts = nm.mask.reshape(nm.mask.shape[0], -1).sum(axis=1)
    if counts.max(initial=0) == 0:
        return None
    best = np.flatnonzero(counts == counts.max())
    kc = best[np.argmin(np.abs(best - (nm.mask.shape[0] - 1) / 2))]
    k = int(kc) + nm.offset_kji[0]
    ji = np.argwhere(nm.mask[kc]) + np.asarray(nm.offset_kji[1:])
    ijk = np.column_stack([ji[:, 1], ji[:, 0], np.full(len(ji), k)]).astype(np.float64)
    pts = np.asarray(geometry.index_to_lps(ijk), dtype=np.float64).reshape(-1, 3)
    try:
        hull = pts[ConvexHull(ijk[:, :2]).vertices]  # in order around the hull
        pixel = max(float(geometry.spacing[0]), float(geometry.spacing[1]))
        reach = end_reach(hull, side_mm=CORNER_SIDE_PX * pixel)
    except QhullError:  # a row or a single pixel: its ends reach a quarter pixel beyond their centres
        hull = pts
        reach = np.full(len(hull), ROUND_REACH)
    d = np.asarray(geometry.direction, dtype=np.float64).reshape(3, 3)
    if len(hull) == 1:  # one pixel: its row direction
        a = b = 0
        u = d[:, 0].copy()
    else:
        a, b, _ = _longest_axis(hull, reach, geometry)
        u = (hull[b] - hull[a]) / np.linalg.norm(hull[b] - hull[a])
    p, q = hull[a], hull[b]
    n = np.cross(d[:, 0], d[:, 1])
    v = np.cross(n / np.linalg.norm(n), u)
    step = _extent_step(u, geometry)
    long_ends = (p - reach[a] * step * u, q + reach[b] * step * u)
    # the short axis: the longest chord of the nodule on a line exactly perpendicular to u, not the mask's width
    # across u (a caliper), which for a crescent or an L-shaped nodule spans air no one line across it crosses

    tips = corner_tips(hull, reach, geometry)
    short_ends = _perpendicular_chord(nm.mask[kc], nm.offset_kji, k, geometry, p, u, v, tips=tips)
    short_len = float(np.linalg.norm(short_ends[1] - short_ends[0]))
    long_len = float(np.linalg.norm(long_ends[1] - long_ends[0]))
    if short_len > long_len:  # a round nodule: the two, counted differently, may differ by a fraction of a pixel
        mid = (short_ends[0] + short_ends[1]) / 2
        short_ends = (mid - long_len / 2 * v, mid + long_len / 2 * v)

    def pair(e: tuple[np.ndarray, np.ndarray]) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        x, y = (tuple(float(c) for c in point) for point in e)
        return (x[0], x[1], x[2]), (y[0], y[1], y[2])

    return AxialAxes(
        long_mm=float(np.linalg.norm(long_ends[1] - long_ends[0])),
        short_mm=float(np.linalg.norm(short_ends[1] - short_ends[0])),
        slice_k=k,
        long_lps=pair(long_ends),
        short_lps=pair(short_ends),
    )


#: an image plane that leans at most this many degrees off the true axial plane (LPS z constant) is stated as axial
#: (the renderings' threshold for drawing a grid as it is: :data:`.render_planes.OBLIQUE_DEG`)
AXIAL_TOLERANCE_DEG = 1.0


def plane_tilt_deg(geometry: Geometry) -> float:
    """The angle (degrees, 0-90) between the plane of the volume's slices (its images as acquired: the plane of the
    index axes i and j) and the true axial plane (LPS z constant): 0 for an axial acquisition, in any storage order
    and patient position; that of an oblique acquisition's images."""
    d = np.asarray(geometry.direction, dtype=np.float64).reshape(3, 3)
    n = np.cross(d[:, 0], d[:, 1])
    return float(np.degrees(np.arccos(np.clip(abs(n[2]) / np.linalg.norm(n), 0.0, 1.0))))


def plane_note(tilt_deg: float | None) -> str:
    """What a nodule line or a title adds after the slice the axes are measured on: nothing for an axial image, else
    that they lie in that image's plane and how far it leans off the true axial plane (``tilt_deg``:
    :func:`plane_tilt_deg`), as a reader measuring on that image finds them."""
    if tilt_deg is None or tilt_deg <= AXIAL_TOLERANCE_DEG:
        return ""
    return f" (in its image plane, {tilt_deg:.1f}° from axial)"


AXES_KEYS = (
    "long_axis_mm",
    "short_axis_mm",
    "mean_diameter_mm",
    "axes_slice_k",
    "axes_instance_number",
    "axes_plane_tilt_deg",
    "long_axis_lps_mm",
    "short_axis_lps_mm",
)


def axes_json(result: Any, geometry: Geometry, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The nodule results' axes of a segmented nodule (``result``: a ``NoduleResult`` or its JSON with ``mask`` and
    ``geometry``) on the volume's grid ``geometry``: ``long_axis_mm``, ``short_axis_mm``, ``mean_diameter_mm`` (mm, to
    0.001), the slice they are measured on (``axes_slice_k``, and ``axes_instance_number``: its InstanceNumber as the
    series ``metadata`` lists it, else its FrameNumber, else ``k + 1``), how far that image's plane, in which both axes
    lie, leans off the true axial plane (``axes_plane_tilt_deg``, degrees to 0.1: 0 for an axial acquisition; an
    oblique acquisition's axes are measured on its images, as a reader measures them, not on a resampled axial plane)
    and each axis' endpoints (``long_axis_lps_mm``, ``short_axis_lps_mm``: two points, DICOM patient coordinates LPS,
    mm). All None without a mask (see :func:`axial_axes`)."""
    from ..detection.findings import slice_number_of

    nm = nodule_mask(result, geometry)
    axes = axial_axes(nm, geometry) if nm is not None else None
    if axes is None:
        return dict.fromkeys(AXES_KEYS)

    def points(ends: tuple[tuple[float, float, float], ...]) -> list[list[float]]:
        return [[round(c, 3) for c in p] for p in ends]

    return {
        "long_axis_mm": round(axes.long_mm, 3),
        "short_axis_mm": round(axes.short_mm, 3),
        "mean_diameter_mm": round(axes.mean_mm, 3),
        "axes_slice_k": axes.slice_k,
        "axes_instance_number": slice_number_of(axes.slice_k, metadata, geometry.shape[0]),
        "axes_plane_tilt_deg": round(plane_tilt_deg(geometry), 1),
        "long_axis_lps_mm": points(axes.long_lps),
        "short_axis_lps_mm": points(axes.short_lps),
    }
