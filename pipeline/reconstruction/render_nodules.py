"""The nodules on the MPRs and MIPs (:mod:`.render`): the segmented nodules as labels on the volume's grid, their
boxes and projections onto a plane, their outlines and their ``#N`` letters, placed where they cover no other letters
and no nodule (image mm, y down; the 3-D preview places its letters the same way): a nodule the plane cuts has them
beside it, one off the plane (an overview's ``"tick"`` mark: an arrowhead at its height beside the image) in a margin
beside the image (:func:`layout_letters`, before the figure is made, so that it is widened by the margin its letters need).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..volume import Geometry
from .letter_spots import MARGIN_PAD_MM, NODULE_FONTSIZE, BoxTest, free_space_spot, free_spot, margin_spot, open_spot
from .render_layout import BROKEN_LINE_PT, ORIENTATION_FONTSIZE, outline_halo, outline_mask
from .render_planes import PLANES

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.text import Text

    from .nodules import NoduleResult

log = logging.getLogger(__name__)


#: The legend's entry for a nodule a plane does not cut (:func:`render_mpr`), and the letters of the side it lies on
#: along each LPS axis (negative, positive): x right/left, y anterior/posterior, z inferior/superior.
OFF_PLANE_LEGEND = "nodule off the plane (at its height beside the image)"


#: How many nodules off its plane an overview MPR marks, the nearest to it; the others are counted in its legend.
OFF_PLANE_SHOWN = 5


SIDE_LETTERS = (("R", "L"), ("A", "P"), ("I", "S"))


@dataclass(frozen=True)
class NoduleExtent:
    """A nodule's box (slices of :func:`lps_aligned`'s ``[z, y, x]`` view), its mask there and its centre (x, y, z
    view indices)."""

    box: tuple[slice, slice, slice]
    mask: np.ndarray
    centre_xyz: np.ndarray


@dataclass(frozen=True)
class LetterSpot:
    """Where a nodule's letters go on an image (image mm from its upper left corner, ``y`` down): their bottom left
    corner ``x, y``, the ``box`` they take (``x0, y0, x1, y1``), their nodule's mark's box ``mark``, and whether a
    dotted line joins them to it (``leader``: letters in free space or in a margin beside the image, away from it)."""

    x: float
    y: float
    box: tuple[float, float, float, float]
    mark: tuple[float, float, float, float]
    leader: bool


def layout_letters(
    marks: list[tuple[int, np.ndarray, str, str]],
    col_mm: float,
    row_mm: float,
    *,
    mm_per_pt: float,
    anatomy: np.ndarray | None = None,
    outlines: np.ndarray | None = None,
    band_mm: float = 0.0,
) -> list[LetterSpot]:
    """Where to put the letters of each nodule of ``marks`` (number, its pixels on an image of ``col_mm`` ×
    ``row_mm`` pixels, ``"solid"``, ``"dashed"`` or ``"tick"``, its letters), in their order; ``mm_per_pt``: image mm per
    typographic point on the PNG. The letters cover no nodule and no other letters.

    A solid mark (a nodule the plane cuts) has its letters beside it (:func:`open_spot`) or, with no room there, in a
    margin (with ``anatomy``) or at the nearest free place on the image (without), joined by a dotted line; never
    below or beside the image. With ``anatomy`` (the image's pixels, bool ``[row, column]``, that hold an organ, the body, an arm or the couch), a dashed mark's (a
    nodule off the plane) go to the nearest free space (:func:`free_space_spot`) or, where none is near, to a margin
    beside the image, beyond the ``band_mm`` wide band of its side letters (:func:`margin_spot`; the figure adds the
    margin, :func:`letter_margins`), never over the lungs or another nodule's letters; both are joined to their mark by
    a dotted line. Without ``anatomy`` they lie beside it as a solid mark's do. A tick mark's (an overview's nodule off
    the plane, :func:`tick_box`) go to the margin beside its tick, joined to it by a dotted line.

    Letters on the image keep :data:`LETTER_CLEAR_PT` clear of every nodule's box, their own included, and, with
    ``outlines`` (bool ``[row, column]``: the pixels an organ's outline runs along, :func:`outline_pixels`), of every
    organ's outline: where no place beside a cut nodule is that clear, they go as where none is free."""
    rows, cols = marks[0][1].shape if marks else (0, 0)
    w_mm, h_mm = cols * col_mm, rows * row_mm
    clear = LETTER_CLEAR_PT * mm_per_pt
    # letters cover no nodule, and keep clear of it
    # (a tick mark's nodule is not drawn on the image: its box takes no room there)
    nowhere = (np.inf, np.inf, -np.inf, -np.inf)
    placed = [nowhere if st == "tick" else _grown(_mark_box(sl, col_mm, row_mm), clear) for _n, sl, st, _t in marks]
    avoid = _outline_test(outlines, col_mm, row_mm, clear) if outlines is not None else None
    free_of = outlines if outlines is not None else np.zeros((rows, cols), bool)  # where _anywhere's letters may lie
    spots: dict[int, LetterSpot] = {}
    crowded = []  # the marks with no free space near: their letters go to a margin, top to bottom
    ticks: dict[int, tuple[float, float, float, float]] = {}  # the off-plane marks beside the image
    for i, (_n, sl, style, text) in enumerate(marks):
        mark = _mark_box(sl, col_mm, row_mm)
        if style == "tick":  # a nodule off the plane: a mark at its height beside the image, its letters beyond
            ticks[i] = tick_box(mark, w_mm=w_mm, band_mm=band_mm)
            crowded.append(i)
            continue
        if style == "dashed" and anatomy is not None:
            spot = free_space_spot(mark, text, mm_per_pt, placed, anatomy, col_mm, row_mm)
            if spot is None:
                crowded.append(i)
                continue
            spots[i] = LetterSpot(*spot, box=placed[-1], mark=mark, leader=True)
            continue
        beside = _beside(sl, text, col_mm, row_mm, mm_per_pt, placed, w_mm=w_mm, h_mm=h_mm, clear=clear, avoid=avoid)
        if beside is None and anatomy is not None:  # no room beside a cut nodule: a margin, as an off-plane one's
            crowded.append(i)
            continue
        spots[i] = beside or _anywhere(mark, text, col_mm, row_mm, mm_per_pt, placed, free_of=free_of)
    for i in sorted(crowded, key=lambda i: sum(ticks.get(i, placed[i])[1::2])):  # in the order of the marks' heights
        _n, sl, _style, text = marks[i]
        target = ticks.get(i, placed[i])
        spot = margin_spot(target, text, mm_per_pt, placed, w_mm=w_mm, h_mm=h_mm, band_mm=band_mm)
        if spot is not None:
            spots[i] = LetterSpot(*spot, box=placed[-1], mark=ticks.get(i, _mark_box(sl, col_mm, row_mm)), leader=True)
            continue
        beside = _beside(sl, text, col_mm, row_mm, mm_per_pt, placed, w_mm=w_mm, h_mm=h_mm, clear=clear, avoid=avoid)
        spots[i] = beside or _anywhere(_mark_box(sl, col_mm, row_mm), text, col_mm, row_mm, mm_per_pt, placed, free_of=free_of)
    return [spots[i] for i in range(len(marks))]


def tick_box(mark: tuple[float, float, float, float], *, w_mm: float, band_mm: float) -> tuple[float, float, float, float]:
    """Where an off-plane nodule of box ``mark`` (image mm, ``y`` down) is marked beside a ``w_mm`` wide image: the
    ``band_mm`` wide band of the side letters nearer it, a line at the height of its centre."""
    y = (mark[1] + mark[3]) / 2
    if (mark[0] + mark[2]) / 2 < w_mm / 2:
        return -band_mm, y, 0.0, y
    return w_mm, y, w_mm + band_mm, y


TICK_PT = 7.0  # points, the arrowhead marking an off-plane nodule's height at the image's edge


#: The least distance (typographic points on the PNG) from a nodule's letters, as laid out, to any nodule's box and
#: any organ's outline: their dark box never touches the line it names or another.
LETTER_CLEAR_PT = 8.0


def _grown(box: tuple[float, float, float, float], by: float) -> tuple[float, float, float, float]:
    """``box`` (``x0, y0, x1, y1``) grown by ``by`` on every side."""
    return box[0] - by, box[1] - by, box[2] + by, box[3] + by


def outline_pixels(masks: Sequence[np.ndarray]) -> np.ndarray:
    """The pixels (bool ``[row, column]``) each outline of ``masks`` (bool images of one shape) runs between: a
    mask's edge pixels and the pixels just outside them, where :func:`~.render_layout.outline_mask` draws it."""
    from scipy import ndimage

    edges = np.zeros(masks[0].shape, bool) if masks else np.zeros((0, 0), bool)
    for m in masks:
        edges |= ndimage.binary_dilation(m) & ~ndimage.binary_erosion(m, border_value=1)
    return edges


def _outline_test(outlines: np.ndarray, col_mm: float, row_mm: float, clear: float) -> BoxTest:
    """A test of a letters' box (image mm, ``y`` down): True where it comes within ``clear`` mm of a pixel of
    ``outlines`` (bool ``[row, column]`` of pixels ``col_mm`` × ``row_mm``)."""
    rows, cols = outlines.shape
    sat = np.zeros((rows + 1, cols + 1), np.int64)  # summed-area table: the outline pixels of any box in O(1)
    sat[1:, 1:] = outlines.astype(np.int64).cumsum(axis=0).cumsum(axis=1)

    def covers(box: tuple[float, float, float, float]) -> bool:
        c0 = int(np.clip(np.floor((box[0] - clear) / col_mm), 0, cols))
        c1 = int(np.clip(np.ceil((box[2] + clear) / col_mm), 0, cols))
        r0 = int(np.clip(np.floor((box[1] - clear) / row_mm), 0, rows))
        r1 = int(np.clip(np.ceil((box[3] + clear) / row_mm), 0, rows))
        return bool(sat[r1, c1] - sat[r0, c1] - sat[r1, c0] + sat[r0, c0])

    return covers


def _beside(
    sl: np.ndarray,
    text: str,
    col_mm: float,
    row_mm: float,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    w_mm: float,
    h_mm: float,
    clear: float = 0.0,
    avoid: BoxTest | None = None,
) -> LetterSpot | None:
    """The letters ``text`` of the mark of pixels ``sl`` beside it on the ``w_mm`` × ``h_mm`` image
    (:func:`open_spot`), at least ``clear`` mm from its box and where ``avoid`` (a test of a box) allows, without a
    line; None where no place beside it is free."""
    r_px, c_px = np.nonzero(sl)
    gap = max(0.5 * col_mm + 1.0, clear + 1e-6)  # from the mark's box to the letters'
    level = (r_px.min() + r_px.max() + 1) / 2 * row_mm + 0.725 * NODULE_FONTSIZE * mm_per_pt  # level with its middle
    spot = open_spot(
        (c_px.max() + 1) * col_mm + gap,
        c_px.min() * col_mm - gap,
        level,
        text,
        mm_per_pt,
        placed,
        limit=w_mm,
        bottom=h_mm,
        avoid=avoid,
    )
    if spot is None:
        return None
    moved = abs(spot[1] - level) > 1.5 * NODULE_FONTSIZE * mm_per_pt  # more than a line up or down: a line to it
    return LetterSpot(*spot, box=placed[-1], mark=_mark_box(sl, col_mm, row_mm), leader=moved)


def _anywhere(
    mark: tuple[float, float, float, float],
    text: str,
    col_mm: float,
    row_mm: float,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    free_of: np.ndarray,
) -> LetterSpot:
    """The letters ``text`` of the nodule of box ``mark`` at the nearest place free of letters, nodules and the
    pixels ``free_of`` (bool ``[row, column]``: the organs' outlines; the organs themselves allowed) on the image
    (:func:`free_space_spot`), joined to it by a dotted line; none free, beside it whatever they cover
    (:func:`free_spot`'s last resort), with a warning."""
    shape = free_of.shape
    spot = free_space_spot(mark, text, mm_per_pt, placed, free_of, col_mm, row_mm)
    if spot is not None:
        return LetterSpot(*spot, box=placed[-1], mark=mark, leader=True)
    log.warning("no free place for the letters %r on a %d x %d pixel image: drawn over others", text, *shape)
    x, y = free_spot(mark[2] + 1.0, mark[0] - 1.0, mark[1], text, mm_per_pt, placed, limit=shape[1] * col_mm)
    return LetterSpot(x, y, box=placed[-1], mark=mark, leader=False)


def letter_margins(spots: Sequence[LetterSpot], w_mm: float, *, band_mm: float) -> tuple[float, float]:
    """The margins (mm, left and right) a figure adds beyond the side letters' ``band_mm`` bands of a ``w_mm`` wide
    image to hold the letters of ``spots`` placed there (:func:`margin_spot`); (0, 0) when all lie on the image."""
    left = max((-s.box[0] - band_mm for s in spots if s.box[0] < -band_mm), default=0.0)
    right = max((s.box[2] - w_mm - band_mm for s in spots if s.box[2] > w_mm + band_mm), default=0.0)
    return (left + MARGIN_PAD_MM if left else 0.0, right + MARGIN_PAD_MM if right else 0.0)


def draw_marks(
    ax,
    marks: list[tuple[int, np.ndarray, str, str]],
    col_mm: float,
    row_mm: float,
    *,
    colour: str,
    spots: Sequence[LetterSpot] | None = None,
) -> None:
    """Each nodule of ``marks`` (number, its pixels on the image, ``"solid"`` or ``"dashed"``, its letters) outlined
    in ``colour`` on an image of ``col_mm`` × ``row_mm`` pixels, its letters on a dark box where ``spots`` puts them
    (:func:`layout_letters`; default: beside each mark, where they cover no other letters and no nodule), joined to
    the mark by a dotted line where the spot asks for one."""
    if spots is None:
        spots = layout_letters(marks, col_mm, row_mm, mm_per_pt=_mm_per_pt(ax))
    for (_n, sl, style, text), spot in zip(marks, spots):
        if style == "tick":  # off the plane: an arrowhead at its height beside the image, nothing over the image
            _draw_tick(ax, spot.mark, colour=colour)
            letters = put_nodule_letters(ax, spot.x, spot.y, text, colour=colour)
            if spot.leader:
                _leader(ax, drawn_extent(ax, letters), spot.mark, colour=colour)
            continue
        width = 1.2 if style == "solid" else BROKEN_LINE_PT
        # no halo on a solid outline: it would cover the nodule's own edge; its magenta reads on the lung as it is
        halo = outline_halo(width) if style != "solid" else []
        outline_mask(ax, sl, col_mm, row_mm, colors=[colour], linewidths=width, linestyles=style, path_effects=halo)
        letters = put_nodule_letters(ax, spot.x, spot.y, text, colour=colour)
        if spot.leader:  # from the text as drawn, not the wider box laid out
            _leader(ax, drawn_extent(ax, letters), spot.mark, colour=colour)


def _draw_tick(ax, tick: tuple[float, float, float, float], *, colour: str) -> None:
    """The mark of an off-plane nodule in the side band ``tick`` (:func:`tick_box`): a short line across the band and
    an arrowhead whose tip touches the image's edge, pointing into the image at the nodule's height."""
    from matplotlib.transforms import offset_copy

    left = tick[0] < 0
    edge, y = (tick[2] if left else tick[0]), tick[1]
    shift = offset_copy(ax.transData, fig=ax.figure, x=(-TICK_PT / 2 if left else TICK_PT / 2), units="points")
    h_mm = abs(ax.images[0].get_extent()[2]) if ax.images else np.inf
    half = 0.8 * ORIENTATION_FONTSIZE * _mm_per_pt(ax)  # the side letters' half height, as margin_spot keeps clear
    if abs(y - h_mm / 2) > half:  # the line across the band, but not through the R or L at the image's middle
        ax.plot([tick[0], tick[2]], [y, y], color=colour, linewidth=1.0, path_effects=outline_halo(1.0))
    marker = ">" if left else "<"
    ax.plot([edge], [y], marker=marker, markersize=TICK_PT, color=colour, transform=shift, linestyle="none")


def _mm_per_pt(ax) -> float:
    """The axes' data units (image mm) per typographic point on the PNG."""
    (x_lo, x_hi), (y_lo, y_hi) = ax.get_xlim(), ax.get_ylim()
    return max((x_hi - x_lo) / ax.bbox.width, abs(y_lo - y_hi) / ax.bbox.height) * ax.figure.dpi / 72.0


def put_nodule_letters(ax, x: float, y: float, text: str, *, colour: str) -> Text:
    """A nodule's letters ``text`` (``#N``) with their lower left corner at ``(x, y)`` (the axes' units), bold, on a
    dark box that keeps them legible on lung or bone; returns the text drawn."""
    return ax.text(
        x,
        y,
        text,
        color=colour,
        fontsize=NODULE_FONTSIZE,
        fontweight="bold",
        ha="left",
        va="bottom",
        bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0},
    )


def drawn_extent(ax, text: Text) -> tuple[float, float, float, float]:
    """The box ``x0, y0, x1, y1`` (the axes' data units, lowest first whichever way the axis runs) that ``text`` covers
    as the renderer draws it: the glyphs' real width, not an estimate from the number of letters."""
    box = text.get_window_extent()  # before the first draw, matplotlib asks the figure for a renderer itself
    (a, b), (c, d) = ax.transData.inverted().transform([[box.x0, box.y0], [box.x1, box.y1]])
    return min(a, c), min(b, d), max(a, c), max(b, d)


def _leader(ax, letters: tuple[float, float, float, float], mark: tuple[float, float, float, float], *, colour: str) -> None:
    """A dotted line from the box of a nodule's letters to the nearest point of its mark's box (image mm)."""
    mx, my = (mark[0] + mark[2]) / 2, (mark[1] + mark[3]) / 2
    lx, ly = min(max(mx, letters[0]), letters[2]), min(max(my, letters[1]), letters[3])  # the letters' nearest point
    ex, ey = min(max(lx, mark[0]), mark[2]), min(max(ly, mark[1]), mark[3])  # and the mark's
    leader_line(ax, (lx, ly), (ex, ey), colour=colour)


def leader_line(ax, start: tuple[float, float], end: tuple[float, float], *, colour: str) -> None:
    """The dotted line joining a nodule's letters at ``start`` to the nodule at ``end`` (the axes' data units: image
    mm in the MPRs and MIPs, pixels in the 3-D preview), :data:`~.render_layout.BROKEN_LINE_PT` wide on a dark halo,
    legible on the lung as on the air."""
    ax.plot(
        [start[0], end[0]],
        [start[1], end[1]],
        color=colour,
        linewidth=BROKEN_LINE_PT,
        linestyle=":",
        path_effects=outline_halo(BROKEN_LINE_PT),
    )


def _mark_box(sl: np.ndarray, col_mm: float, row_mm: float) -> tuple[float, float, float, float]:
    """The box (image mm: ``x0, y0, x1, y1``, ``y`` down) of a nodule's pixels ``sl`` on an image of ``col_mm`` ×
    ``row_mm`` pixels."""
    r_px, c_px = np.nonzero(sl)
    return (c_px.min() * col_mm, r_px.min() * row_mm, (c_px.max() + 1) * col_mm, (r_px.max() + 1) * row_mm)


def nodule_extents(nview: np.ndarray) -> dict[int, NoduleExtent]:
    """Each nodule of the labels ``nview`` (:func:`lps_aligned` view of :func:`nodule_labels`) by its number."""
    from scipy import ndimage

    out = {}
    for n, box in enumerate(ndimage.find_objects(nview), start=1):
        if box is None:
            continue
        mask = nview[box] == n
        zyx = np.argwhere(mask).mean(axis=0) + np.array([b.start for b in box])
        out[n] = NoduleExtent(box=(box[0], box[1], box[2]), mask=mask, centre_xyz=zyx[::-1])
    return out


def projection(shape: tuple[int, ...], extent: NoduleExtent, plane: str) -> np.ndarray:
    """The nodule's shadow along ``plane``'s fixed axis: a ``[z, y, x]`` array of ``shape`` one plane thick along that
    axis (:func:`plane_image` index 0 gives it as the plane's image)."""
    axis = 2 - PLANES[plane][0]
    thin = list(shape)
    thin[axis] = 1
    out = np.zeros(thin, bool)
    box = list(extent.box)
    box[axis] = slice(0, 1)
    out[tuple(box)] = extent.mask.any(axis=axis, keepdims=True)
    return out


def nodule_labels(nodules: Sequence[NoduleResult], geometry: Geometry) -> np.ndarray | None:
    """The segmented ``nodules`` as labels ``[k, j, i]`` (uint16) on ``geometry`` (the volume's grid): 0 no nodule, N
    the nodule of finding #N (its ``index`` + 1: ``ctpipe detect``'s rank in a findings file); None when none was
    segmented. Each mask is a crop of the volume's grid (:class:`NoduleResult`)."""
    from .nodule_geometry import nodule_mask

    labels: np.ndarray | None = None
    for r in nodules:
        nm = nodule_mask(r, geometry) if r.error is None else None
        if nm is None or not nm.mask.any():
            continue
        if labels is None:
            labels = np.zeros(geometry.shape, np.uint16)
        k0, j0, i0 = nm.offset_kji
        nk, nj, ni = nm.mask.shape
        labels[k0 : k0 + nk, j0 : j0 + nj, i0 : i0 + ni][nm.mask] = r.index + 1
    return labels
