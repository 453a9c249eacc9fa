"""The layout of the MPR and MIP PNGs (:mod:`.render`) and the 3-D preview's (:mod:`.preview`): the figure and its
axes (a title above each image, a band above the image for its upper orientation letter, a band below it for the
scale bar and the lower letter, bands beside it for the side letters, the legend's rows below that), the letters, the scale bar, the legend, the display
windows (HU) and the PNG's writing. Image coordinates are mm from the image's upper left corner (``extent=(0, w_mm,
h_mm, 0)``), y running down.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes


def hex_rgb(colour: str) -> tuple[float, float, float]:
    """``"#rrggbb"`` as red, green, blue fractions (0..1)."""
    r, g, b = (int(colour[i : i + 2], 16) / 255.0 for i in (1, 3, 5))
    return (r, g, b)


LUNG_WINDOW = (-1350.0, 150.0)  # W 1500 / L -600


SOFT_WINDOW = (-160.0, 240.0)  # W 400 / L 40


WINDOWS = {"soft-tissue": SOFT_WINDOW, "lung": LUNG_WINDOW}  # the MPRs' windows, by the name their titles give


def window_note(low: float, high: float) -> str:
    """The display window (``low``, ``high``: the HU shown black and white) as a reader states it, width and level in
    HU, named when it is one of :data:`WINDOWS`: ``lung window W1500 L-600``, ``window W600 L-200``."""
    name = next((f"{n} " for n, w in WINDOWS.items() if np.allclose(w, (low, high))), "")
    return f"{name}window W{high - low:.0f} L{(low + high) / 2:.0f}"


#: Pixels above each MPR and MIP image for its title (two lines), and the least width of those PNGs, so that a narrow
#: image (the coronal plane of a long scan) still holds its title, letters and legend.
TITLE_PX = 50


MIN_WIDTH_PX = 520


#: Pixels below each MPR image (and the 3-D preview) for one row of the legend of its colours, beside the image, not
#: over it; a legend of more organs than a row holds takes more rows (:func:`legend_layout`).
LEGEND_PX = 24


LEGEND_FONTSIZE = 7  # points, the MPRs' legends


def legend_layout(labels: list[str], width_px: int, *, fontsize: float, dpi: float = 100.0) -> tuple[int, int]:
    """Columns and height (pixels) of a legend of ``labels`` laid out in rows under an image ``width_px`` wide:
    as many columns as the longest label allows (a generous estimate of DejaVu Sans' widths), as many rows as needed
    (at least :data:`LEGEND_PX` high); (0, 0) without labels."""
    if not labels:
        return 0, 0
    em = fontsize * dpi / 72.0  # pixels
    entry = _legend_entry_px(labels, fontsize=fontsize, dpi=dpi)
    ncol = int(max(1, min(len(labels), (width_px - 2 * em) // entry)))
    rows = -(-len(labels) // ncol)
    return ncol, max(LEGEND_PX, int(np.ceil((0.5 + 0.6 + 1.5 * rows) * em)) + 4)  # offset, padding, rows (1.5 em)


def _legend_entry_px(labels: list[str], *, fontsize: float, dpi: float = 100.0) -> float:
    """The width (pixels) of the widest entry of a legend of ``labels``: handle, pad, spacing and text (a generous
    estimate of DejaVu Sans' widths)."""
    em = fontsize * dpi / 72.0
    return (1.5 + 0.8 + 1.2) * em + 0.65 * em * max(len(label) for label in labels)


def legend_min_width_px(labels: list[str], *, fontsize: float, dpi: float = 100.0) -> int:
    """The least width (pixels) of a PNG whose legend of ``labels`` (:func:`legend_layout`, one column at the least)
    lies whole on it: its widest entry and the legend's border; 0 without labels."""
    if not labels:
        return 0
    return int(np.ceil(_legend_entry_px(labels, fontsize=fontsize, dpi=dpi) + 2 * fontsize * dpi / 72.0))


FIGURE_DPI = 100.0  # pixels per inch of the PNGs (:func:`black_figure`)


def black_figure(width_px: int, height_px: int):
    """A matplotlib Figure of ``width_px`` × ``height_px`` pixels (100 dpi) on black, without a display."""
    from matplotlib.figure import Figure

    dpi = FIGURE_DPI
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, facecolor="black")
    return fig


#: Pixels of the band right below each MPR and MIP image, inside its axes, that holds the scale bar and the lower
#: orientation letter (:func:`scale_bar`): on no anatomy, wherever the body reaches the image's lower edge.
BAND_PX = 28


#: Pixels of the band right above each MPR and MIP image, inside its axes and below its title, that holds the upper
#: orientation letter: on no anatomy, wherever the body reaches the image's upper edge (the neck of a chest).
TOP_BAND_PX = 24


#: Pixels of the bands left and right of each MPR and MIP image, inside its axes, that hold the side orientation
#: letters (R/L, A/P): on no anatomy, wherever the body reaches the image's sides (a coronal chest wall, a flank).
SIDE_BAND_PX = 22


def _image_px(w_mm: float, h_mm: float) -> tuple[float, int]:
    """Pixels per mm and the height (pixels) of a ``w_mm`` × ``h_mm`` image drawn 640 pixels on its longer side."""
    scale = 640.0 / max(h_mm, w_mm)
    return scale, max(int(h_mm * scale), 1)


def image_units(w_mm: float, h_mm: float) -> tuple[float, float]:
    """Image mm per typographic point, and the width (mm) of each side letters' band (:data:`SIDE_BAND_PX`), on the
    PNG of a ``w_mm`` × ``h_mm`` image (:func:`image_figure`): to lay letters out before the figure is made."""
    scale, _h_px = _image_px(w_mm, h_mm)
    return FIGURE_DPI / 72.0 / scale, SIDE_BAND_PX / scale


def figure_width_px(w_mm: float, h_mm: float, *, margins_mm: tuple[float, float] = (0.0, 0.0)) -> int:
    """The width (pixels) of :func:`image_figure`'s PNG of a ``w_mm`` × ``h_mm`` image with ``margins_mm`` beside it."""
    scale, _h_px = _image_px(w_mm, h_mm)
    margin_px = sum(int(np.ceil(m * scale)) for m in margins_mm)
    return max(int(w_mm * scale) + 2 * SIDE_BAND_PX + margin_px, MIN_WIDTH_PX)


TITLE_FONTSIZE = 9  # points, the MPRs' and MIPs' titles


TITLE_LINE_PX = 15  # pixels a title's line takes (9 points, 100 dpi, with its spacing)


def wrap_title(title: str, width_px: int) -> str:
    """``title`` with each of its lines wrapped at spaces so that it fits a PNG ``width_px`` wide (a generous
    estimate of DejaVu Sans' widths at :data:`TITLE_FONTSIZE`), so that no line runs past the PNG's edges."""
    chars = max(20, int((width_px - 16) / (0.62 * TITLE_FONTSIZE * FIGURE_DPI / 72.0)))
    return "\n".join(textwrap.fill(line, chars, break_long_words=False, break_on_hyphens=False) for line in title.split("\n"))


def fit_title(title: str, width_px: float, *, fontsize: float = TITLE_FONTSIZE) -> tuple[str, float]:
    """``title`` wrapped at spaces so that each line fits ``width_px`` pixels, measured as the PNG's renderer draws
    the glyphs (not estimated), and the font size (points) to draw it in: ``fontsize``, or smaller where one word is
    wider than ``width_px`` (a very small 3-D preview), so that no title runs past its image into the next one."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer = RendererAgg(1, 1, FIGURE_DPI)

    def width(text: str, size: float) -> float:
        return float(renderer.get_text_width_height_descent(text, FontProperties(size=size), ismath=False)[0])

    usable = max(width_px - 2.0, 1.0)  # a pixel clear of each edge
    words = title.split()
    widest = max((width(w, fontsize) for w in words), default=0.0)
    if widest > usable:  # glyph widths scale with the size; the floor keeps any rounding inside
        fontsize = np.floor(10.0 * fontsize * usable / widest) / 10.0
    lines: list[str] = []
    for word in words:
        if lines and width(f"{lines[-1]} {word}", fontsize) <= usable:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines), float(fontsize)


def image_figure(
    w_mm: float,
    h_mm: float,
    *,
    legend: list[str] | None = None,
    margins_mm: tuple[float, float] = (0.0, 0.0),
    title_lines: int = 2,
):
    """A figure and axes for one ``w_mm`` × ``h_mm`` image drawn 640 pixels on its longer side, with
    :data:`TITLE_PX` above it for a title of two lines (:data:`TITLE_LINE_PX` more for each of ``title_lines`` past
    two: :func:`wrap_title`), the :data:`TOP_BAND_PX` band of the upper letter between them, the
    :data:`BAND_PX` band of the scale bar under the image and the :data:`SIDE_BAND_PX` bands of the side letters
    beside it (all bands in the axes), beyond those ``margins_mm`` (image mm, left and right: the nodules' letters
    that find no free space on the image, :func:`~.render_nodules.letter_margins`), the
    rows of a legend of the ``legend`` labels below that (so that the legend hides no anatomy;
    :func:`legend_layout`), and at least :data:`MIN_WIDTH_PX` wide. Returns the figure, the axes and the legend's
    number of columns."""
    _scale, h_px = _image_px(w_mm, h_mm)
    width = figure_width_px(w_mm, h_mm, margins_mm=margins_mm)
    ncol, legend_px = legend_layout(legend or [], width, fontsize=LEGEND_FONTSIZE)
    total = h_px + BAND_PX + TOP_BAND_PX + TITLE_PX + TITLE_LINE_PX * max(title_lines - 2, 0) + legend_px
    fig = black_figure(width, total)
    return fig, fig.add_axes((0, legend_px / total, 1, (h_px + BAND_PX + TOP_BAND_PX) / total)), ncol


def save_png(fig, path: Path) -> Path:
    """``fig`` written to ``path`` as a PNG (atomically: a reader never sees half a file); returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # zlib level 3: the same pixels as the default 6 in two thirds of the time, some 4 % more bytes
    fig.savefig(buf, format="png", facecolor=fig.get_facecolor(), pil_kwargs={"compress_level": 3})
    atomic_write_bytes(path, buf.getvalue())
    return path


SCALE_BAR_MM = (200.0, 100.0, 50.0, 20.0, 10.0, 5.0)  # the lengths a scale bar may have


def scale_bar_mm(w_mm: float) -> float:
    """A scale bar's length (mm) for an image ``w_mm`` wide: the longest of :data:`SCALE_BAR_MM` up to an eighth of
    it."""
    return next((mm for mm in SCALE_BAR_MM if mm <= w_mm / 8), SCALE_BAR_MM[-1])


#: The dark box under a scale bar's label.
BAR_LABEL_BOX = {"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0}


def side_labelled_bar(
    ax,
    x0: float,
    y: float,
    length_mm: float,
    col_mm: float,
    *,
    label_offset_pt: tuple[float, float],
    transform=None,
    clip: bool = True,
) -> None:
    """A yellow bar from ``(x0, y)`` (``ax``'s data units: image columns of ``col_mm`` mm, rows) ``length_mm`` long,
    labelled ``<length> mm`` right of its end, ``label_offset_pt`` (points) from it, on a dark box: the finding PNGs'
    and ``show()``'s bar. ``transform``: the bar's own (e.g. the data moved down by some points), else the data's;
    ``clip=False`` draws bar and label also outside the axes."""
    x1 = x0 + length_mm / col_mm
    more = {} if transform is None else {"transform": transform}
    if not clip:
        more["clip_on"] = False
    ax.plot([x0, x1], [y, y], color="yellow", linewidth=2.0, solid_capstyle="butt", **more)
    ax.annotate(
        f"{length_mm:.0f} mm",
        xy=(x1, y),
        xytext=label_offset_pt,
        textcoords="offset points",
        color="yellow",
        fontsize=7,
        ha="left",
        va="center",
        bbox=BAR_LABEL_BOX,
        **({} if clip else {"annotation_clip": False}),
    )


def _labelled_bar(ax, x0: float, y: float, length: float, *, mm: float, lift: float) -> None:
    """A yellow bar from ``(x0, y)`` ``length`` long (in ``ax``'s data units, ``y`` down), labelled ``<mm> mm`` on a
    dark box ``lift`` above it."""
    ax.plot([x0, x0 + length], [y, y], color="yellow", linewidth=2.0, solid_capstyle="butt")
    ax.text(
        x0 + length / 2,
        y - lift,
        f"{mm:.0f} mm",
        color="yellow",
        fontsize=8,
        ha="center",
        va="bottom",
        bbox=BAR_LABEL_BOX,
    )


def pixel_scale_bar(ax, *, px_per_mm: float, size_px: int, band_px: float) -> float:
    """A scale bar in the band (``band_px`` high) below a square image of ``size_px`` pixels drawn at ``px_per_mm``
    (``imshow``'s pixel coordinates, rows down, as the 3-D preview's views), at its left, on no organ and clear of the
    lower orientation letter in the band's middle: :func:`scale_bar_mm` of the image's width, labelled with its
    length. Returns the length (mm)."""
    length = scale_bar_mm(size_px / px_per_mm)
    _labelled_bar(ax, 0.03 * size_px, size_px - 0.5 + 0.8 * band_px, length * px_per_mm, mm=length, lift=0.15 * band_px)
    return length


def scale_bar(ax, w_mm: float, h_mm: float, *, margins_mm: tuple[float, float] = (0.0, 0.0)) -> None:
    """A bar at the left of the band below an image drawn with ``extent=(0, w_mm, h_mm, 0)`` (mm; the band is
    :data:`BAND_PX` of :func:`image_figure`'s axes), labelled with its length: the longest of :data:`SCALE_BAR_MM` up
    to an eighth of the image's width. Below the image, it covers no anatomy. Sets the axes' limits to the image and
    its bands (:data:`TOP_BAND_PX` above it, :data:`BAND_PX` below, :data:`SIDE_BAND_PX` on either side) and the
    ``margins_mm`` beyond those (:func:`image_figure`)."""
    length = scale_bar_mm(w_mm)
    scale, _h_px = _image_px(w_mm, h_mm)
    band = BAND_PX / scale  # mm
    _labelled_bar(ax, 0.03 * w_mm, h_mm + 0.8 * band, length, mm=length, lift=0.15 * band)
    side = SIDE_BAND_PX / scale  # mm
    ax.set_xlim(-side - margins_mm[0], w_mm + side + margins_mm[1])
    ax.set_ylim(h_mm + band, -TOP_BAND_PX / scale)


ORIENTATION_FONTSIZE = 11  # points, the orientation letters


def orientation_letters(
    ax,
    left: str,
    right: str,
    top: str,
    bottom: str,
    title: str,
    *,
    side_bands: bool = False,
    margins_mm: tuple[float, float] = (0.0, 0.0),
    title_fontsize: float = TITLE_FONTSIZE,
    marks_y: tuple[Sequence[float], Sequence[float]] = ((), ()),
) -> None:
    """The image's orientation letters at its left and right edges (with ``side_bands``, in the bands beside it that
    :func:`scale_bar` leaves, :data:`SIDE_BAND_PX`, between the image and the ``margins_mm`` beyond them), in the band
    above it (:data:`TOP_BAND_PX`) and at the foot of its
    axes (the band below it), yellow on a dark box; ``title`` above (``title_fontsize`` points); the axes hidden.
    ``marks_y``: the heights (image mm, ``y`` down) of the marks in the left and right bands (an off-plane nodule's
    arrowhead): a side letter lies at the image's mid-height, or the height nearest it clear of those marks."""
    kw = {
        "color": "yellow",
        "fontsize": ORIENTATION_FONTSIZE,
        "fontweight": "bold",
        "transform": ax.transAxes,
        "bbox": {"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0},  # legible on bright tissue
    }
    if side_bands:  # at the middle of the bands beside the image, in the image's units (x right, y down)
        x_lo, x_hi = ax.get_xlim()
        x0, x1, y_bottom, y_top = ax.images[0].get_extent()
        side = {k: v for k, v in kw.items() if k != "transform"}
        x_lo, x_hi = x_lo + margins_mm[0], x_hi - margins_mm[1]
        mm_per_pt = (x_hi - x_lo + sum(margins_mm)) / ax.bbox.width * ax.figure.dpi / 72.0
        clear = (0.8 * ORIENTATION_FONTSIZE + MARK_HALF_PT) * mm_per_pt  # the letter's half box and a mark's half
        top_y, bottom_y = sorted((y_bottom, y_top))
        for text, x, ys in ((left, (x_lo + x0) / 2, marks_y[0]), (right, (x1 + x_hi) / 2, marks_y[1])):
            y = _clear_height((top_y + bottom_y) / 2, ys, clear=clear, lo=top_y + clear / 2, hi=bottom_y - clear / 2)
            ax.text(x, y, text, ha="center", va="center", **side)
    else:
        ax.text(0.01, 0.5, left, ha="left", va="center", **kw)
        ax.text(0.99, 0.5, right, ha="right", va="center", **kw)
    ax.text(0.5, 1 - TOP_BAND_PX / 2 / ax.bbox.height, top, ha="center", va="center", **kw)  # the band above the image
    ax.text(0.5, 0.01, bottom, ha="center", va="bottom", **kw)
    # y fixed at the axes' top, where the hidden axes leave it: matplotlib then skips measuring their tick labels to
    # place it, a third of a PNG's drawing time
    ax.set_title(title, color="white", fontsize=title_fontsize, y=1.0)
    ax.set_axis_off()


#: Half the height (points) of a mark in a side letters' band (an off-plane nodule's arrowhead, 7 points) and a gap.
MARK_HALF_PT = 4.5


def _clear_height(middle: float, ys: Sequence[float], *, clear: float, lo: float, hi: float) -> float:
    """The height nearest ``middle`` at least ``clear`` from each of ``ys`` (image mm), within ``lo``..``hi``;
    ``middle`` where there is none."""
    options = [middle, *(y + side * clear for y in ys for side in (-1.0, 1.0))]
    for y in sorted(options, key=lambda y: abs(y - middle)):
        if lo <= y <= hi and all(abs(y - m) >= clear - 1e-9 for m in ys):
            return y
    return middle


def legend_below(ax, handles: list, ncol: int) -> None:
    """The legend of an MPR or MIP image: ``ncol`` columns in the rows below the image (:func:`image_figure`)."""
    ax.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0),
        bbox_transform=ax.figure.transFigure,
        ncol=ncol,
        fontsize=LEGEND_FONTSIZE,
        facecolor="black",
        edgecolor="none",
        labelcolor="white",
        borderpad=0.3,
        handlelength=1.5,
        columnspacing=1.2,
    )


#: How far (points) the dark halo under every outline reaches beyond the line on each side (:func:`outline_halo`).
HALO_PT = 0.75


#: The width (points) of the nodules' dashed outlines and of the dotted lines joining letters to their nodule: wider
#: than a solid outline, whose dashes and dots would otherwise be lost on the lung (both on :func:`outline_halo`).
BROKEN_LINE_PT = 1.5


def outline_halo(linewidth: float = 1.0) -> list:
    """Matplotlib path effects that draw a line ``linewidth`` points wide on a black halo (a stroke :data:`HALO_PT`
    wider on each side under it, dashed as the line is). Every outline of the renderings has it (the organs', the
    nodules' dashed ones, the dotted lines to their letters, ``show()``'s finding circles and scores; the MPRs, the
    MIPs, the 3-D preview and ``show()``), but a nodule's solid outline, whose halo would cover its edge: the lung window
    draws bone and soft tissue near white, on which a yellow or white line barely reads, and the halo sets a line off
    from bright tissue as from the air or the blue lung."""
    from matplotlib import patheffects

    return [patheffects.withStroke(linewidth=linewidth + 2 * HALO_PT, foreground="black")]


def outline_mask(ax, mask: np.ndarray, col_mm: float, row_mm: float, **style) -> None:
    """The edge of ``mask`` (an image's pixels, ``[row, column]``) on an image of ``col_mm`` × ``row_mm`` pixels
    (image mm), drawn with ``style`` (matplotlib ``contour``'s ``colors``, ``linewidths``, ``linestyles``). Only the
    box around the mask, a pixel beyond it, is traced: the same line as over the whole image, in a fraction of the
    time on a large plane."""
    rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
    r0, r1 = max(int(rows[0]) - 1, 0), min(int(rows[-1]) + 2, mask.shape[0])
    c0, c1 = max(int(cols[0]) - 1, 0), min(int(cols[-1]) + 2, mask.shape[1])
    xs = (np.arange(c0, c1) + 0.5) * col_mm
    ys = (np.arange(r0, r1) + 0.5) * row_mm
    ax.contour(xs, ys, mask[r0:r1, c0:c1].astype(np.float32), levels=[0.5], **style)
