"""How far a nodule's outline reaches beyond the hull of its pixel centres on a slice: at each hull vertex
(:func:`end_reach`, the model of the long axis' ends) and at corners, as regions that a short axis' chord may run
into, so that both axes end at a sharp corner where a calliper does, not where the mask, interpolated between pixel
centres, crosses 0.5 (which cuts every corner). Positions are DICOM patient coordinates (LPS, mm) unless named index
coordinates.
"""

from __future__ import annotations

import numpy as np

from ..volume import Geometry

#: how far a nodule's outline reaches beyond the centre of the pixel at an end of its long axis, as a share of that
#: pixel's width along the axis (:func:`end_reach`): a quarter pixel where the outline is rounded; half a pixel, to the
#: pixel's outer edge, at a corner (the outline turns by :data:`CORNER_ANGLE_DEG` or more there, between straight
#: sides of which one is at least :data:`CORNER_SIDE_PX` pixels long); between, in proportion
ROUND_REACH = 0.25
CORNER_REACH = 0.5
CORNER_ANGLE_DEG = 90.0
#: a turn this wide or wider (interior angle, degrees) is a rounded outline's
ROUND_ANGLE_DEG = 135.0
#: a corner with no straight side beside it longer than this many pixels reads as rounded (a disc of a few pixels, an
#: ellipse's end drawn in pixels); with one of 1.5 times this or longer, as a corner in full; between, in proportion
CORNER_SIDE_PX = 4.0


def _extent_step(u: np.ndarray, geometry: Geometry) -> float:
    """The width (mm) of a pixel (``sx`` by ``sy`` mm) projected on the in-plane unit direction ``u`` (LPS):
    ``sx·|u·row| + sy·|u·column|``."""
    d = np.asarray(geometry.direction, dtype=np.float64).reshape(3, 3)
    sx, sy = float(geometry.spacing[0]), float(geometry.spacing[1])
    a, b = abs(float(u @ d[:, 0])), abs(float(u @ d[:, 1]))
    return sx * a + sy * b


def end_reach(hull: np.ndarray, *, side_mm: float) -> np.ndarray:
    """For each vertex of the convex hull of a slice's pixel centres (``hull``: ``[n, 3]`` LPS mm, in order around the
    hull), how far the nodule's outline reaches beyond that pixel's centre, as a share of the pixel's width along an
    axis ending there: :data:`ROUND_REACH` where the hull turns gently (:data:`ROUND_ANGLE_DEG` or wider),
    :data:`CORNER_REACH` at a corner (:data:`CORNER_ANGLE_DEG` or sharper, beside a straight side of at least 1.5 times
    ``side_mm``, mm); in proportion between.

    A pixel is in the mask when the nodule covers its centre, so the outline lies between the outermost pixel centre
    and the next one out. At a sharp corner (a square's, a rectangle's, a wedge-shaped nodule's) the tip lies anywhere
    in the corner pixel, half a pixel beyond its centre on average: the calliper reaches the corner pixel's outer edge.
    Along a rounded outline (a disc, an ellipse's end) the axis picks, of the many pixels along the curve, the pair
    lying farthest out, already nearest the outline: a quarter pixel is their reach (digitised ellipses of 4-26 mm on
    0.7 mm pixels at any angle: within -0.05 to +0.2 pixel on average). A nodule of a few pixels has corners at every
    vertex and no straight side; a corner between short sides (an ellipse's end drawn in pixels at 45°) reads as
    rounded. Measured so, squares and rectangles of 8-16 mm on 0.7 and 0.98 mm pixels at any turn and placement have
    their diagonal within a third of a pixel on average (between pixel centres plus a quarter pixel at each end, the
    earlier rule: 0.35 to 0.7 pixel short); discs and ellipses measure as before. Neither outline a viewer could trace from
    the mask does better: the pixels' outer corners make a disc a pixel too long, and the line where the mask,
    interpolated between pixel centres, crosses 0.5 cuts each corner by a third of a pixel and still makes a disc 0.7
    pixel too long."""
    n = len(hull)
    if n < 3:
        return np.full(n, ROUND_REACH)
    before, after = np.roll(hull, 1, axis=0) - hull, np.roll(hull, -1, axis=0) - hull
    side = np.maximum(np.linalg.norm(before, axis=1), np.linalg.norm(after, axis=1))
    cos = (before * after).sum(-1) / np.maximum(np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1), 1e-12)
    angle = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    turn = np.clip((ROUND_ANGLE_DEG - angle) / (ROUND_ANGLE_DEG - CORNER_ANGLE_DEG), 0.0, 1.0)
    straight = np.clip((side - side_mm) / (0.5 * side_mm), 0.0, 1.0)
    return ROUND_REACH + (CORNER_REACH - ROUND_REACH) * turn * straight


def _extent_steps(u: np.ndarray, geometry: Geometry) -> np.ndarray:
    """:func:`_extent_step` of each of many unit vectors ``u`` (``[..., 3]``)."""
    d = np.asarray(geometry.direction, dtype=np.float64).reshape(3, 3)
    sx, sy = float(geometry.spacing[0]), float(geometry.spacing[1])
    return sx * np.abs(u @ d[:, 0]) + sy * np.abs(u @ d[:, 1])


#: the most pixels of short hull sides between two straight ones that still make a corner the grid cuts off
#: (:func:`_cut_corners`): the flat tip of two pixels of a square turned 45°, of a few pixels at other turns
CUT_CORNER_PX = 2.5


def corner_tips(hull: np.ndarray, reach: np.ndarray, geometry: Geometry) -> np.ndarray:
    """The outline's reach beyond the hull of a slice's pixel centres (``hull``: ``[n, 3]`` LPS mm, in order around it;
    ``reach``: :func:`~.end_reach`'s) as triangles (``[m, 3, 3]``, LPS mm) that lie inside the nodule as a calliper finds
    it: each hull vertex's tip, reaching beyond it along the bisector of its turn as the long axis' end does
    (:func:`~.end_reach`), joined to the hull's sides a pixel from it; and each corner the pixel grid
    cuts off (:func:`_cut_corners`), its tip beyond the point where the two straight sides beside it cross, joined to
    the sides a pixel beyond the short sides between them."""
    n = len(hull)
    if n < 3:
        return np.empty((0, 3, 3))
    pixel = max(float(geometry.spacing[0]), float(geometry.spacing[1]))

    def back(corner: np.ndarray, towards: np.ndarray, most: np.ndarray | float) -> np.ndarray:
        # the point ``most`` mm from ``corner`` towards ``towards``, or that point itself if nearer (a hull side of a
        # lobulated or curved nodule may span air beyond its ends)
        d = towards - corner
        length = np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-12)
        return corner + d * np.minimum(1.0, np.reshape(most, (-1, 1)) / length)

    before, after = np.roll(hull, 1, axis=0), np.roll(hull, -1, axis=0)
    tips = _tips(hull, hull - before, after - hull, reach, geometry)
    triangles = [np.stack([tips, back(hull, before, pixel), back(hull, after, pixel)], axis=1)]
    cut = _cut_corners(hull, side_mm=CORNER_SIDE_PX * pixel)
    if cut is not None:
        corner, start, end, into, out, cut_reach, cut_mm = cut
        base = cut_mm + pixel
        tip = _tips(corner, into, out, cut_reach, geometry)
        triangles.append(np.stack([tip, back(corner, start, base), back(corner, end, base)], axis=1))
    return np.concatenate(triangles)


def _tips(corner: np.ndarray, into: np.ndarray, out: np.ndarray, reach: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Points ``reach`` pixel widths (:func:`~._extent_steps`) beyond ``corner`` (LPS mm) along the outward bisector of
    the turn from the side running ``into`` it to the side running ``out`` of it."""
    into = into / np.maximum(np.linalg.norm(into, axis=-1, keepdims=True), 1e-12)
    out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    w = into - out
    w = w / np.maximum(np.linalg.norm(w, axis=-1, keepdims=True), 1e-12)
    return corner + (reach * _extent_steps(w, geometry))[:, None] * w


def _cut_corners(hull: np.ndarray, *, side_mm: float) -> tuple[np.ndarray, ...] | None:
    """Where two straight sides of a slice's pixel-centre hull (``hull``: LPS mm; at least ``side_mm`` long) meet
    across short sides of at most :data:`CUT_CORNER_PX` pixels in all (the flat tip of two pixels that a square
    turned 45° ends in): the point where the straight sides' lines cross, the far end of the side into it and of the
    side out of it, both sides' directions, that corner's reach (:func:`~.end_reach`'s rule, from the angle between
    the sides and the shorter one's length) and the short sides' length; each ``[m, 3]`` (reach and length ``[m]``),
    LPS mm. None where there is none."""
    n = len(hull)
    if n < 4:
        return None
    edge = np.roll(hull, -1, axis=0) - hull  # edge i runs from vertex i to vertex i + 1
    length = np.linalg.norm(edge, axis=1)
    straight = length >= side_mm
    most = CUT_CORNER_PX * side_mm / CORNER_SIDE_PX
    rows: list[tuple[np.ndarray, ...]] = []
    for i in np.flatnonzero(straight):
        j, cut = (i + 1) % n, 0.0
        while not straight[j] and cut <= most:
            cut += length[j]
            j = (j + 1) % n
        if j == (i + 1) % n or j == i or cut > most:
            continue
        a, b = edge[i] / length[i], edge[j] / length[j]
        t = np.linalg.lstsq(np.column_stack([a, -b]), hull[j] - hull[i], rcond=None)[0]
        angle = float(np.degrees(np.arccos(np.clip(-(a @ b), -1.0, 1.0))))
        turn = np.clip((ROUND_ANGLE_DEG - angle) / (ROUND_ANGLE_DEG - CORNER_ANGLE_DEG), 0.0, 1.0)
        sides = np.clip((min(length[i], length[j]) - side_mm) / (0.5 * side_mm), 0.0, 1.0)
        reach = ROUND_REACH + (CORNER_REACH - ROUND_REACH) * turn * sides
        rows.append((hull[i] + t[0] * a, hull[i], hull[(j + 1) % n], a, b, np.asarray(reach), np.asarray(cut)))
    if not rows:
        return None
    return tuple(np.stack(column) for column in zip(*rows))


def reach_corners(
    lo: np.ndarray, hi: np.ndarray, start_ij: np.ndarray, dv: np.ndarray, triangles_ij: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Chord ends ``lo``, ``hi`` (mm along the lines ``start_ij + s·dv``: in-plane index coordinates (i, j), ``dv``
    index units per mm) carried on to where each line leaves the triangles of :func:`corner_tips` (``[m, 3, 2]``, in
    index coordinates): an end moves only outwards, and only across a triangle its chord already reaches (not across
    air to another part of the nodule)."""
    lower = np.full((len(lo), len(triangles_ij)), -np.inf)
    upper = np.full((len(lo), len(triangles_ij)), np.inf)
    for e in range(3):
        pa, pb, pc = (triangles_ij[:, (e + f) % 3] for f in range(3))
        normal = np.stack([pa[:, 1] - pb[:, 1], pb[:, 0] - pa[:, 0]], axis=1)  # across edge pa-pb, towards pc
        normal *= np.where(((pc - pa) * normal).sum(1) < 0, -1.0, 1.0)[:, None]
        # normal·(start + s·dv - pa) >= 0 along each line (rows) for each triangle (columns)
        c0 = ((start_ij[:, None, :] - pa[None]) * normal[None]).sum(-1)
        c1 = (normal @ dv)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = -c0 / c1
        lower = np.where(c1 > 1e-12, np.maximum(lower, bound), lower)
        upper = np.where(c1 < -1e-12, np.minimum(upper, bound), upper)
        outside = (np.abs(c1) <= 1e-12) & (c0 < 0)
        lower = np.where(outside, np.inf, lower)
    crossed = lower <= upper
    high = np.where(crossed & (lower <= hi[:, None]), upper, -np.inf).max(axis=1, initial=-np.inf)
    low = np.where(crossed & (upper >= lo[:, None]), lower, np.inf).min(axis=1, initial=np.inf)
    return np.minimum(lo, low), np.maximum(hi, high)
