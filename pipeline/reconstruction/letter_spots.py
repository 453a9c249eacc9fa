"""Free places for a nodule's ``#N`` letters on an MPR, a MIP or the 3-D preview (image mm, ``y`` down).

Beside the nodule's box where they cover no other letters and nothing a test refuses (:func:`open_spot`,
:func:`free_spot`), in free space away from every organ (:func:`free_space_spot`), or in a margin beside the image
(:func:`margin_spot`). Each takes the boxes already ``placed`` and adds the one it takes. Used by
:mod:`.render_nodules` (MPRs and MIPs) and :mod:`.preview` (the 3-D preview).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .render_layout import ORIENTATION_FONTSIZE

#: A test of a letters' box (image mm ``x0, y0, x1, y1``, ``y`` down): True where they may not lie there.
BoxTest = Callable[[tuple[float, float, float, float]], bool]
NODULE_FONTSIZE = 8  # points, the nodules' letters
FREE_MARGIN_MM = 2.0  # the least distance (image mm) from a nodule's letters placed in free space to any organ
#: The farthest (image mm) from its mark that a nodule's letters go to free space; farther, they stay beside it, so
#: that no long line crosses the chest.
FREE_REACH_MM = 150.0


def free_space_spot(
    mark: tuple[float, float, float, float],
    text: str,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    anatomy: np.ndarray,
    col_mm: float,
    row_mm: float,
) -> tuple[float, float] | None:
    """The bottom left corner (image mm, ``y`` down) of the place nearest the nodule's box ``mark`` where its letters
    ``text`` cover no pixel of ``anatomy`` (bool ``[row, column]`` of an image of ``col_mm`` × ``row_mm`` pixels), none
    within :data:`FREE_MARGIN_MM`, and nothing ``placed`` (the box taken is added to it); None where none is free
    within :data:`FREE_REACH_MM` of the mark."""
    w = (0.62 * len(text) + 0.5) * NODULE_FONTSIZE * mm_per_pt  # as free_spot measures the letters
    h = 1.45 * NODULE_FONTSIZE * mm_per_pt
    rows, cols = anatomy.shape
    w_mm, h_mm = cols * col_mm, rows * row_mm
    if w + 2 * FREE_MARGIN_MM > w_mm or h + 2 * FREE_MARGIN_MM > h_mm:
        return None
    sat = np.zeros((rows + 1, cols + 1), np.int64)  # summed-area table: the organ pixels of any box in O(1)
    sat[1:, 1:] = anatomy.astype(np.int64).cumsum(axis=0).cumsum(axis=1)
    xs = np.arange(0.0, w_mm - w, min(col_mm, w / 4))
    ys = np.arange(h, h_mm, min(row_mm, h / 2))  # the letters' bottom edges
    x0, y1 = (a.ravel() for a in np.meshgrid(xs, ys))
    c0 = np.clip(np.floor((x0 - FREE_MARGIN_MM) / col_mm), 0, cols).astype(int)
    c1 = np.clip(np.ceil((x0 + w + FREE_MARGIN_MM) / col_mm), 0, cols).astype(int)
    r0 = np.clip(np.floor((y1 - h - FREE_MARGIN_MM) / row_mm), 0, rows).astype(int)
    r1 = np.clip(np.ceil((y1 + FREE_MARGIN_MM) / row_mm), 0, rows).astype(int)
    covered = sat[r1, c1] - sat[r0, c1] - sat[r1, c0] + sat[r0, c0]
    free = covered == 0
    mx, my = (mark[0] + mark[2]) / 2, (mark[1] + mark[3]) / 2
    dx = np.maximum(np.maximum(x0 - mx, mx - (x0 + w)), 0.0)  # from the mark's centre to the letters' box
    dy = np.maximum(np.maximum((y1 - h) - my, my - y1), 0.0)
    free &= np.hypot(dx, dy) <= FREE_REACH_MM
    for i in np.flatnonzero(free)[np.argsort(np.hypot(dx, dy)[free], kind="stable")]:
        box = (float(x0[i]), float(y1[i] - h), float(x0[i] + w), float(y1[i]))
        if not any(box[0] < p[2] and p[0] < box[2] and box[1] < p[3] and p[1] < box[3] for p in placed):
            placed.append(box)
            return box[0], box[3]
    return None


MARGIN_PAD_MM = 2.0  # between a margin's letters and the side letters' band, and beyond them


def margin_spot(
    mark: tuple[float, float, float, float],
    text: str,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    w_mm: float,
    h_mm: float,
    band_mm: float,
) -> tuple[float, float] | None:
    """The bottom left corner (image mm, ``y`` down; ``x`` off the image) of a place for a nodule's letters ``text`` in
    a margin beside a ``w_mm`` × ``h_mm`` image, beyond the ``band_mm`` wide band of its side letters: on the side of
    the image nearer the nodule's box ``mark``, at its height or the nearest line up or down where they cover nothing
    ``placed`` (the box taken is added to it), else on the other side, never level with the side letters at the
    image's mid-height; None where both margins are full."""
    w = (0.62 * len(text) + 0.5) * NODULE_FONTSIZE * mm_per_pt  # as free_spot measures the letters
    h = 1.45 * NODULE_FONTSIZE * mm_per_pt
    half = 0.8 * ORIENTATION_FONTSIZE * mm_per_pt  # half the side letters' box: "#3 (30 mm P) R" read as one text
    side_letters = (-np.inf, h_mm / 2 - half, np.inf, h_mm / 2 + half)
    mx, my = (mark[0] + mark[2]) / 2, (mark[1] + mark[3]) / 2
    left_x, right_x = -band_mm - MARGIN_PAD_MM - w, w_mm + band_mm + MARGIN_PAD_MM
    y0 = min(max(my + h / 2, h), h_mm)  # the letters' bottom edge, level with the mark's centre
    for x in (left_x, right_x) if mx < w_mm / 2 else (right_x, left_x):
        taken = [p for p in [*placed, side_letters] if p[0] < x + w and x < p[2]]  # what lies in this margin
        ys = [y0, *(p[3] + h + 1e-6 for p in taken), *(p[1] - 1e-6 for p in taken)]  # level with the mark, or by a neighbour
        for y in sorted((y for y in ys if h <= y <= h_mm), key=lambda y: abs(y - y0)):
            box = (x, y - h, x + w, y)
            if not any(box[0] < p[2] and p[0] < box[2] and box[1] < p[3] and p[1] < box[3] for p in taken):
                placed.append(box)
                return box[0], box[3]
    return None


LETTER_LINES = 30  # how many lines above or below its place a nodule's letters may move to cover nothing


def open_spot(
    right: float,
    left: float,
    y: float,
    text: str,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    limit: float,
    start: float = 0.0,
    bottom: float = np.inf,
    avoid: BoxTest | None = None,
) -> tuple[float, float] | None:
    """Where a nodule's letters fit beside it (their bottom left corner, image mm; ``y`` runs down): right of the
    nodule (from ``right``) at ``y`` or, when that would cover what is ``placed`` (boxes ``x0, y0, x1, y1``: the
    nodules, letters placed before) or run out of ``start`` .. ``limit`` (the image's width), left of it (ending at
    ``left``), or right of it moved in from the image's edge (letters wider than the room either side), else a line
    higher, a line lower, and so on (up to :data:`LETTER_LINES` lines away), never above the
    image nor below ``bottom``, nor where ``avoid`` (a test of a box, e.g. near an organ's outline) is true; the box
    taken is added to ``placed``. None, ``placed`` unchanged, where no such place is free.
    ``mm_per_pt``: image mm per typographic point on the PNG."""
    w = (0.62 * len(text) + 0.5) * NODULE_FONTSIZE * mm_per_pt  # a generous estimate of bold DejaVu Sans' widths
    h = 1.45 * NODULE_FONTSIZE * mm_per_pt
    lines = [k * sign for k in range(LETTER_LINES) for sign in ((1,) if k == 0 else (-1, 1))]  # 0, up 1, down 1, ...
    for k in lines:
        yk = y + k * h
        if not h <= yk <= bottom:
            continue
        for x in (right, left - w, max(start, min(right, limit - w))):  # the last: pushed off the image's edge
            box = (x, yk - h, x + w, yk)
            inside = x >= start and x + w <= limit
            if not inside or (avoid is not None and avoid(box)):
                continue
            if not any(box[0] < p[2] and p[0] < box[2] and box[1] < p[3] and p[1] < box[3] for p in placed):
                placed.append(box)
                return box[0], box[3]
    return None


def free_spot(
    right: float,
    left: float,
    y: float,
    text: str,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    limit: float,
) -> tuple[float, float]:
    """Where to put a nodule's letters (their bottom left corner, image mm; ``y`` runs down): the first free place
    beside the nodule (:func:`open_spot`), else right of it at ``y`` whatever they cover (the MPRs' letters of a
    nodule the plane cuts); the box taken is added to ``placed``. ``mm_per_pt``: image mm per typographic point on
    the PNG."""
    spot = open_spot(right, left, y, text, mm_per_pt, placed, limit=limit)
    if spot is not None:
        return spot
    w = (0.62 * len(text) + 0.5) * NODULE_FONTSIZE * mm_per_pt
    h = 1.45 * NODULE_FONTSIZE * mm_per_pt
    placed.append((right, y - h, right + w, y))
    return right, y
