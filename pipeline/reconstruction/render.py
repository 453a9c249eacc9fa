"""PNG renderings without a display: MPR slices with organ outlines, lung-window MIP slabs, a 3-D preview
(:mod:`.preview`); with segmented nodules, their outlines in the MPRs (dashed where they project onto an overview
plane that does not cut them), lung-window MPRs through each and their surfaces in the preview, each lettered #N
(its finding's number).

Display orientation is radiological and derived from the LPS geometry, never
from array order: axial and coronal images show the patient's right on the
image left; axial images have anterior at the top; coronal and sagittal
images have superior at the top; sagittal images have anterior on the left.
Every image is labelled with its orientation letters (R/L, A/P, S/I); the MPRs and MIPs carry a scale bar and their
lower letter in a band below the image, their upper letter in a band above it, on no anatomy. Organs are named as the SEG names them ("left lung").
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..atomic import atomic_write_bytes
from ..volume import CTVolume, Geometry
from .mesh import Mesh, mesh_from_mask
from .organs import organ_colours, organ_label

if TYPE_CHECKING:  # pragma: no cover
    from .nodules import NoduleResult
    from .preview import PreviewViews

log = logging.getLogger(__name__)


def _rgb(colour: str) -> tuple[float, float, float]:
    r, g, b = (int(colour[i : i + 2], 16) / 255.0 for i in (1, 3, 5))
    return (r, g, b)


LUNG_WINDOW = (-1350.0, 150.0)  # W 1500 / L -600
SOFT_WINDOW = (-160.0, 240.0)  # W 400 / L 40
WINDOWS = {"soft-tissue": SOFT_WINDOW, "lung": LUNG_WINDOW}  # the MPRs' windows, by the name their titles give


def lps_aligned(array: np.ndarray, geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """View of ``array [k, j, i]`` as ``[z, y, x]`` with LPS coordinates ascending along each axis.

    Returns ``(view, spacing_xyz, origin_xyz)`` (mm). Oblique grids use the nearest axis-aligned order
    (display only).
    """
    return geometry.to_lps_view(array), np.asarray(geometry.spacing_lps()), geometry.bounds_lps()[0]


def source_slices(volume: CTVolume, za: int, zb: int) -> str:
    """The source slices of the axial view planes ``za``..``zb`` (indices of :func:`lps_aligned`'s z) as a viewer
    numbers them (``InstanceNumber 78``, ``InstanceNumber 105-109``; see
    :func:`pipeline.detection.findings.slice_ref`), or "" for a series whose slices are not axial."""
    from ..detection.findings import slice_label, slice_number_of, slice_number_source

    k_of_z = volume.geometry.view_plane_slices()
    if k_of_z is None:
        return ""
    nk = volume.shape[0]
    numbers = sorted({slice_number_of(int(k), volume.metadata, nk) for k in k_of_z[min(za, zb) : max(za, zb) + 1]})
    label = slice_label(slice_number_source(volume.metadata, nk))
    return f"{label} {numbers[0]}" if len(numbers) == 1 else f"{label} {numbers[0]}-{numbers[-1]}"


#: Pixels above each MPR and MIP image for its title (two lines), and the least width of those PNGs, so that a narrow
#: image (the coronal plane of a long scan) still holds its title, letters and legend.
TITLE_PX = 50
MIN_WIDTH_PX = 520
#: Pixels below each MPR image (and the 3-D preview) for one row of the legend of its colours, beside the image, not
#: over it; a legend of more organs than a row holds takes more rows (:func:`_legend_layout`).
LEGEND_PX = 24
LEGEND_FONTSIZE = 7  # points, the MPRs' legends


def _legend_layout(labels: list[str], width_px: int, *, fontsize: float, dpi: float = 100.0) -> tuple[int, int]:
    """Columns and height (pixels) of a legend of ``labels`` laid out in rows under an image ``width_px`` wide:
    as many columns as the longest label allows (a generous estimate of DejaVu Sans' widths), as many rows as needed
    (at least :data:`LEGEND_PX` high); (0, 0) without labels."""
    if not labels:
        return 0, 0
    em = fontsize * dpi / 72.0  # pixels
    entry = (1.5 + 0.8 + 1.2) * em + 0.65 * em * max(len(label) for label in labels)  # handle, pad, spacing, text
    ncol = int(max(1, min(len(labels), (width_px - 2 * em) // entry)))
    rows = -(-len(labels) // ncol)
    return ncol, max(LEGEND_PX, int(np.ceil((0.5 + 0.6 + 1.5 * rows) * em)) + 4)  # offset, padding, rows (1.5 em)


def _figure(width_px: int, height_px: int):
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, facecolor="black")
    return fig


#: Pixels of the band right below each MPR and MIP image, inside its axes, that holds the scale bar and the lower
#: orientation letter (:func:`_scale_bar`): on no anatomy, wherever the body reaches the image's lower edge.
BAND_PX = 28
#: Pixels of the band right above each MPR and MIP image, inside its axes and below its title, that holds the upper
#: orientation letter: on no anatomy, wherever the body reaches the image's upper edge (the neck of a chest).
TOP_BAND_PX = 24


def _image_px(w_mm: float, h_mm: float) -> tuple[float, int]:
    """Pixels per mm and the height (pixels) of a ``w_mm`` × ``h_mm`` image drawn 640 pixels on its longer side."""
    scale = 640.0 / max(h_mm, w_mm)
    return scale, max(int(h_mm * scale), 1)


def _image_figure(w_mm: float, h_mm: float, *, legend: list[str] | None = None):
    """A figure and axes for one ``w_mm`` × ``h_mm`` image drawn 640 pixels on its longer side, with
    :data:`TITLE_PX` above it for the title, the :data:`TOP_BAND_PX` band of the upper letter between them and the
    :data:`BAND_PX` band of the scale bar under the image (both bands in the axes), the
    rows of a legend of the ``legend`` labels below that (so that the legend hides no anatomy;
    :func:`_legend_layout`), and at least :data:`MIN_WIDTH_PX` wide. Returns the figure, the axes and the legend's
    number of columns."""
    scale, h_px = _image_px(w_mm, h_mm)
    width = max(int(w_mm * scale) + 20, MIN_WIDTH_PX)
    ncol, legend_px = _legend_layout(legend or [], width, fontsize=LEGEND_FONTSIZE)
    total = h_px + BAND_PX + TOP_BAND_PX + TITLE_PX + legend_px
    fig = _figure(width, total)
    return fig, fig.add_axes((0, legend_px / total, 1, (h_px + BAND_PX + TOP_BAND_PX) / total)), ncol


def _save(fig, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor=fig.get_facecolor())
    atomic_write_bytes(path, buf.getvalue())
    return path


SCALE_BAR_MM = (200.0, 100.0, 50.0, 20.0, 10.0, 5.0)  # the lengths a scale bar may have


def _scale_bar(ax, w_mm: float, h_mm: float) -> None:
    """A bar at the left of the band below an image drawn with ``extent=(0, w_mm, h_mm, 0)`` (mm; the band is
    :data:`BAND_PX` of :func:`_image_figure`'s axes), labelled with its length: the longest of :data:`SCALE_BAR_MM` up
    to an eighth of the image's width. Below the image, it covers no anatomy. Sets the axes' limits to the image and
    its two bands (:data:`TOP_BAND_PX` above it, :data:`BAND_PX` below)."""
    length = next((mm for mm in SCALE_BAR_MM if mm <= w_mm / 8), SCALE_BAR_MM[-1])
    scale, _h_px = _image_px(w_mm, h_mm)
    band = BAND_PX / scale  # mm
    x0, y = 0.03 * w_mm, h_mm + 0.8 * band
    ax.plot([x0, x0 + length], [y, y], color="yellow", linewidth=2.0, solid_capstyle="butt")
    ax.text(
        x0 + length / 2,
        y - 0.15 * band,
        f"{length:.0f} mm",
        color="yellow",
        fontsize=8,
        ha="center",
        va="bottom",
        bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0},
    )
    ax.set_xlim(0, w_mm)
    ax.set_ylim(h_mm + band, -TOP_BAND_PX / scale)


def _labels(ax, left: str, right: str, top: str, bottom: str, title: str) -> None:
    kw = {
        "color": "yellow",
        "fontsize": 11,
        "fontweight": "bold",
        "transform": ax.transAxes,
        "bbox": {"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0},  # legible on bright tissue
    }
    ax.text(0.01, 0.5, left, ha="left", va="center", **kw)
    ax.text(0.99, 0.5, right, ha="right", va="center", **kw)
    ax.text(0.5, 1 - TOP_BAND_PX / 2 / ax.bbox.height, top, ha="center", va="center", **kw)  # the band above the image
    ax.text(0.5, 0.01, bottom, ha="center", va="bottom", **kw)
    ax.set_title(title, color="white", fontsize=9)
    ax.set_axis_off()


_PLANES = {
    # name: (fixed LPS axis, image rows axis, image cols axis, flip rows, letters L, R, T, B)
    "axial": (2, 1, 0, False, ("R", "L", "A", "P")),
    "coronal": (1, 2, 0, True, ("R", "L", "S", "I")),
    "sagittal": (0, 2, 1, True, ("A", "P", "S", "I")),
}


def _plane(view: np.ndarray, plane: str, index: int) -> np.ndarray:
    fixed, rows, _cols, flip, _ = _PLANES[plane]
    sl: list[slice | int] = [slice(None)] * 3
    sl[2 - fixed] = index
    img = view[tuple(sl)]  # remaining dims in [z, y, x] order minus the fixed one
    if 2 - rows > 2 - _cols:  # rows must come first
        img = img.T
    return img[::-1] if flip else img


def render_mpr(
    volume: CTVolume,
    masks: Mapping[str, np.ndarray],
    out: Path,
    *,
    stem: str,
    center_lps: np.ndarray | None = None,
    nodules: np.ndarray | None = None,
    field_mm: float | None = None,
    note: str = "",
    window: str = "soft-tissue",
) -> list[Path]:
    """Axial, coronal and sagittal PNGs through ``center_lps`` (DICOM patient coordinates, LPS mm; default: the lungs'
    or the volume's centre), soft-tissue window, each mask outlined in its colour (:func:`~.organs.organ_colours`:
    :data:`~.organs.OUTLINE_COLORS`), with a legend in rows below the image (:func:`_legend_layout`), never over it.

    nodules: labels ``[k, j, i]`` on the volume's grid (:func:`nodule_labels`: N is the nodule of finding #N); each
    nodule a plane cuts is outlined in the ``nodules`` colour and lettered ``#N`` beside it; on the whole plane (no
    ``field_mm``), each nodule it does not cut is drawn dashed where it projects onto the plane and lettered ``#N (d mm
    S)``: the distance from the plane to its centre and the side it lies on. field_mm: the images show this many mm
    around ``center_lps`` (a nodule's close-up), not the whole plane. note: added to each title. window: a name of
    :data:`WINDOWS` (``"lung"`` for a nodule's close-up), stated in each title."""
    from matplotlib.lines import Line2D

    view, spacing, lo = lps_aligned(np.asarray(volume.array), volume.geometry)
    mviews = {k: lps_aligned(m, volume.geometry)[0] for k, m in masks.items()}
    nview = lps_aligned(nodules, volume.geometry)[0] if nodules is not None and nodules.any() else None
    colours = organ_colours([*masks, "nodules"], outline=True)  # the same in every plane
    beside = _nodule_extents(nview) if nview is not None and field_mm is None else {}
    if center_lps is None:
        lung = [m for k, m in mviews.items() if k.startswith("lung")]
        ref = np.logical_or.reduce(lung) if lung else None
        if ref is not None and ref.any():
            zyx = np.argwhere(ref).mean(axis=0)
            center_idx = zyx[::-1]
        else:
            center_idx = (np.array(view.shape[::-1]) - 1) / 2
    else:
        center_idx = (np.asarray(center_lps) - lo) / spacing
    center_idx = np.clip(np.round(center_idx).astype(int), 0, np.array(view.shape[::-1]) - 1)
    paths = []
    for plane, (fixed, rows, cols, _flip, letters) in _PLANES.items():
        img = _plane(view, plane, int(center_idx[fixed]))
        crop = _field_window(img.shape, center_idx, plane, spacing, field_mm)
        img = img[crop]
        h_mm = img.shape[0] * spacing[rows]
        w_mm = img.shape[1] * spacing[cols]
        outlines = {organ: sl for organ, mv in mviews.items() if (sl := _plane(mv, plane, int(center_idx[fixed]))[crop]).any()}
        outlines = {organ: sl for organ, sl in outlines.items() if not sl.all()}  # an edge to draw
        cut = _plane(nview, plane, int(center_idx[fixed]))[crop] if nview is not None else None
        numbers = [int(v) for v in np.unique(cut) if v > 0] if cut is not None else []
        off = [n for n in beside if n not in numbers]
        legend = [organ_label(organ) for organ in outlines] + (["nodule #N (finding #N)"] if numbers else [])
        legend += [OFF_PLANE_LEGEND] if off else []
        fig, ax, ncol = _image_figure(w_mm, h_mm, legend=legend)
        extent = (0, w_mm, h_mm, 0)
        vmin, vmax = WINDOWS[window]
        ax.imshow(img, cmap="gray", vmin=vmin, vmax=vmax, extent=extent, interpolation="nearest")
        _scale_bar(ax, w_mm, h_mm)
        drawn = []
        for organ, sl in outlines.items():
            xs = (np.arange(sl.shape[1]) + 0.5) * spacing[cols]
            ys = (np.arange(sl.shape[0]) + 0.5) * spacing[rows]
            colour = colours[organ]
            ax.contour(xs, ys, sl.astype(np.float32), levels=[0.5], colors=[colour], linewidths=1.0)
            drawn.append(Line2D([], [], color=colour, label=organ_label(organ)))
        marks = [(n, cut == n, "solid", f"#{n}") for n in numbers if cut is not None]  # outlined where cut
        for n in off:  # each nodule the plane does not cut: dashed where it projects, with its distance and side
            assert nview is not None
            d = (beside[n].centre_xyz[fixed] - center_idx[fixed]) * spacing[fixed]
            text = f"#{n} ({abs(d):.0f} mm {_SIDE_LETTERS[fixed][int(d > 0)]})"
            marks.append((n, _plane(_projection(nview.shape, beside[n], plane), plane, 0)[crop], "dashed", text))
        _draw_marks(ax, marks, spacing[cols], spacing[rows], colour=colours["nodules"])
        if numbers:
            drawn.append(Line2D([], [], color=colours["nodules"], label="nodule #N (finding #N)"))
        if off:
            drawn.append(Line2D([], [], color=colours["nodules"], linestyle="--", label=OFF_PLANE_LEGEND))
        if drawn:  # which outline is which organ: one row in the band below the image, hiding no anatomy
            _legend(ax, drawn, ncol)
        pos = lo[fixed] + center_idx[fixed] * spacing[fixed]
        slices = source_slices(volume, int(center_idx[fixed]), int(center_idx[fixed])) if plane == "axial" else ""
        _labels(
            ax,
            *letters,
            f"{plane} at {'xyz'[fixed]}={pos:.1f} mm (LPS){', ' + slices if slices else ''}{note}\n{window} window — "
            + ("patient's right on image left" if plane != "sagittal" else "patient's anterior on image left"),
        )
        paths.append(_save(fig, out / f"{stem}_mpr_{plane}.png"))
    return paths


#: The legend's entry for a nodule a plane does not cut (:func:`render_mpr`), and the letters of the side it lies on
#: along each LPS axis (negative, positive): x right/left, y anterior/posterior, z inferior/superior.
OFF_PLANE_LEGEND = "nodule off the plane (projected)"
NODULE_FONTSIZE = 8  # points, the nodules' letters
_SIDE_LETTERS = (("R", "L"), ("A", "P"), ("I", "S"))


@dataclass(frozen=True)
class _Extent:
    """A nodule's box (slices of :func:`lps_aligned`'s ``[z, y, x]`` view), its mask there and its centre (x, y, z
    view indices)."""

    box: tuple[slice, slice, slice]
    mask: np.ndarray
    centre_xyz: np.ndarray


def _legend(ax, handles: list, ncol: int) -> None:
    """The legend of an MPR or MIP image: ``ncol`` columns in the rows below the image (:func:`_image_figure`)."""
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


def _draw_marks(ax, marks: list[tuple[int, np.ndarray, str, str]], col_mm: float, row_mm: float, *, colour: str) -> None:
    """Each nodule of ``marks`` (number, its pixels on the image, ``"solid"`` or ``"dashed"``, its letters) outlined
    in ``colour`` on an image of ``col_mm`` × ``row_mm`` pixels, its letters beside it on a dark box where they cover
    no other letters and no nodule (:func:`_free_spot`)."""
    w_mm = ax.get_xlim()[1]
    placed = [_mark_box(sl, col_mm, row_mm) for _n, sl, _s, _t in marks]  # letters cover no nodule
    y_lo, y_hi = ax.get_ylim()
    mm_per_pt = max(w_mm / ax.bbox.width, abs(y_lo - y_hi) / ax.bbox.height) * ax.figure.dpi / 72.0
    for _n, sl, style, text in marks:
        xs = (np.arange(sl.shape[1]) + 0.5) * col_mm
        ys = (np.arange(sl.shape[0]) + 0.5) * row_mm
        width = 1.2 if style == "solid" else 1.0
        ax.contour(xs, ys, sl.astype(np.float32), levels=[0.5], colors=[colour], linewidths=width, linestyles=style)
        r_px, c_px = np.nonzero(sl)
        x, y = _free_spot(
            (c_px.max() + 1.5) * col_mm + 1.0,
            (c_px.min() - 0.5) * col_mm - 1.0,
            (r_px.min() + 0.5) * row_mm,
            text,
            mm_per_pt,
            placed,
            limit=w_mm,
        )
        ax.text(
            x,
            y,
            text,
            color=colour,
            fontsize=NODULE_FONTSIZE,
            fontweight="bold",
            ha="left",
            va="bottom",
            bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.0, "linewidth": 0.0},
        )  # legible on lung or bone


LETTER_LINES = 30  # how many lines above or below its place a nodule's letters may move to cover nothing


def _mark_box(sl: np.ndarray, col_mm: float, row_mm: float) -> tuple[float, float, float, float]:
    """The box (image mm: ``x0, y0, x1, y1``, ``y`` down) of a nodule's pixels ``sl`` on an image of ``col_mm`` ×
    ``row_mm`` pixels."""
    r_px, c_px = np.nonzero(sl)
    return (c_px.min() * col_mm, r_px.min() * row_mm, (c_px.max() + 1) * col_mm, (r_px.max() + 1) * row_mm)


def _free_spot(
    right: float,
    left: float,
    y: float,
    text: str,
    mm_per_pt: float,
    placed: list[tuple[float, float, float, float]],
    *,
    limit: float,
) -> tuple[float, float]:
    """Where to put a nodule's letters (their bottom left corner, image mm; ``y`` runs down): right of the nodule
    (from ``right``) at ``y`` or, when that would cover what is ``placed`` (boxes ``x0, y0, x1, y1``: the nodules,
    letters placed before) or
    run past the image's width ``limit``, left of it (ending at ``left``), else a line higher, a line lower, and so
    on (up to :data:`LETTER_LINES` lines away); the box taken is added to ``placed``. ``mm_per_pt``: image mm per typographic point on the PNG."""
    w = (0.62 * len(text) + 0.5) * NODULE_FONTSIZE * mm_per_pt  # a generous estimate of bold DejaVu Sans' widths
    h = 1.45 * NODULE_FONTSIZE * mm_per_pt
    lines = [k * sign for k in range(LETTER_LINES) for sign in ((1,) if k == 0 else (-1, 1))]  # 0, up 1, down 1, ...
    spots = [(x, y + k * h) for k in lines for x in (right, left - w) if x >= 0 and x + w <= limit and y + k * h >= h]
    for x, yk in spots or [(right, y)]:
        box = (x, yk - h, x + w, yk)
        if not any(box[0] < p[2] and p[0] < box[2] and box[1] < p[3] and p[1] < box[3] for p in placed):
            break
    placed.append(box)
    return box[0], box[3]


def _nodule_extents(nview: np.ndarray) -> dict[int, _Extent]:
    """Each nodule of the labels ``nview`` (:func:`lps_aligned` view of :func:`nodule_labels`) by its number."""
    from scipy import ndimage

    out = {}
    for n, box in enumerate(ndimage.find_objects(nview), start=1):
        if box is None:
            continue
        mask = nview[box] == n
        zyx = np.argwhere(mask).mean(axis=0) + np.array([b.start for b in box])
        out[n] = _Extent(box=(box[0], box[1], box[2]), mask=mask, centre_xyz=zyx[::-1])
    return out


def _projection(shape: tuple[int, ...], extent: _Extent, plane: str) -> np.ndarray:
    """The nodule's shadow along ``plane``'s fixed axis: a ``[z, y, x]`` array of ``shape`` one plane thick along that
    axis (:func:`_plane` index 0 gives it as the plane's image)."""
    axis = 2 - _PLANES[plane][0]
    thin = list(shape)
    thin[axis] = 1
    out = np.zeros(thin, bool)
    box = list(extent.box)
    box[axis] = slice(0, 1)
    out[tuple(box)] = extent.mask.any(axis=axis, keepdims=True)
    return out


def _field_window(
    shape: tuple[int, ...], center_idx: np.ndarray, plane: str, spacing: np.ndarray, field_mm: float | None
) -> tuple[slice, slice]:
    """Rows and columns of a :func:`_plane` image (``shape``) within ``field_mm`` around ``center_idx`` (x, y, z indices
    of :func:`lps_aligned`'s view), kept inside the image; the whole image without ``field_mm``."""
    if field_mm is None:
        return slice(None), slice(None)
    _fixed, rows, cols, flip, _ = _PLANES[plane]
    row = shape[0] - 1 - int(center_idx[rows]) if flip else int(center_idx[rows])
    out = []
    for centre, n, axis in ((row, shape[0], rows), (int(center_idx[cols]), shape[1], cols)):
        half = int(np.ceil(field_mm / 2 / spacing[axis]))
        a = int(np.clip(centre - half, 0, max(n - 2 * half - 1, 0)))
        out.append(slice(a, min(n, a + 2 * half + 1)))
    return out[0], out[1]


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


def render_mip(
    volume: CTVolume,
    out: Path,
    *,
    stem: str,
    lung_mask: np.ndarray | None = None,
    slab_mm: float = 10.0,
    n_slabs: int = 3,
    nodules: np.ndarray | None = None,
) -> list[Path]:
    """Axial lung-window (W1500/L-600) maximum-intensity projections of ``slab_mm`` slabs across the lungs: ``n_slabs``
    evenly spaced, fewer where the lungs are too short to hold them without overlap.

    nodules: labels ``[k, j, i]`` on the volume's grid (:func:`nodule_labels`); each nodule a slab holds is outlined
    there (its shadow across the slab) in the ``nodules`` colour and lettered ``#N``."""
    from matplotlib.lines import Line2D

    view, spacing, lo = lps_aligned(np.asarray(volume.array), volume.geometry)
    nview = lps_aligned(nodules, volume.geometry)[0] if nodules is not None and nodules.any() else None
    colour = organ_colours(["nodules"], outline=True)["nodules"]
    nz = view.shape[0]
    z0, z1 = 0, nz - 1
    if lung_mask is not None and lung_mask.any():
        lv = lps_aligned(lung_mask, volume.geometry)[0]
        zs = np.nonzero(lv.any(axis=(1, 2)))[0]
        z0, z1 = int(zs[0]), int(zs[-1])
    half = max(0, int(round(slab_mm / spacing[2] / 2)))
    width, span = 2 * half + 1, z1 - z0 + 1  # planes of a slab, of the lungs
    n_slabs = max(1, min(n_slabs, span // width))  # as many as fit side by side
    gap = (span - n_slabs * width) / (n_slabs + 1)  # equal gaps between the slabs and the lungs' ends: none overlaps
    starts = np.round(z0 + gap * np.arange(1, n_slabs + 1) + width * np.arange(n_slabs)).astype(int)
    paths = []
    for n, start in enumerate(starts):
        a, b = max(0, int(start)), min(nz, int(start) + width)
        mip = view[a:b].max(axis=0)
        h_mm, w_mm = mip.shape[0] * spacing[1], mip.shape[1] * spacing[0]
        held = nview[a:b] if nview is not None else None
        marks = (
            [(int(v), (held == v).any(axis=0), "solid", f"#{v}") for v in np.unique(held) if v > 0] if held is not None else []
        )
        fig, ax, ncol = _image_figure(w_mm, h_mm, legend=["nodule #N (finding #N)"] if marks else None)
        ax.imshow(mip, cmap="gray", vmin=LUNG_WINDOW[0], vmax=LUNG_WINDOW[1], extent=(0, w_mm, h_mm, 0))
        _scale_bar(ax, w_mm, h_mm)
        if marks:  # the nodules the slab holds: their shadow across it ([y, x] as the MIP's rows and columns)
            _draw_marks(ax, marks, spacing[0], spacing[1], colour=colour)
            _legend(ax, [Line2D([], [], color=colour, label="nodule #N (finding #N)")], ncol)
        za, zb = lo[2] + a * spacing[2], lo[2] + (b - 1) * spacing[2]
        slices = source_slices(volume, a, b - 1)
        _labels(
            ax,
            "R",
            "L",
            "A",
            "P",
            f"axial MIP {za:.1f}..{zb:.1f} mm (LPS z){', ' + slices if slices else ''}\nlung window — patient's right on "
            "image left",
        )
        paths.append(_save(fig, out / f"{stem}_mip_axial_{n + 1}.png"))
    return paths


#: Nodules that get MPRs of their own (``<stem>_nodule_NN_mpr_<plane>.png``); those after are outlined in the overview
#: MPRs and the preview only. NODULE_FIELD_MM: the field of view (mm) of those MPRs.
NODULE_MPRS = 20
NODULE_FIELD_MM = 100.0


def render_all(
    volume: CTVolume,
    masks: Mapping[str, np.ndarray],
    meshes: Mapping[str, Mesh],
    out: Path,
    *,
    stem: str,
    nodules: Sequence[NoduleResult] = (),
    preview: PreviewViews | None = None,
) -> list[Path]:
    """MPRs, lung-window MIP slabs and (with meshes) the 3-D preview; returns the written PNG paths.

    nodules: the segmented findings (:func:`~.nodules.segment_findings`): see :func:`render_nodule_views`.
    preview: the preview's organ views when already made (:func:`~.preview.preview_views` of
    :func:`~.preview.preview_meshes`), else made here from ``meshes``."""
    from .preview import preview_meshes, preview_views

    if preview is None and meshes:
        preview = preview_views(preview_meshes(meshes, masks, volume.geometry))
    return render_nodule_views(volume, masks, out, stem=stem, nodules=nodules, preview=preview)


def render_nodule_views(
    volume: CTVolume,
    masks: Mapping[str, np.ndarray],
    out: Path,
    *,
    stem: str,
    nodules: Sequence[NoduleResult] = (),
    preview: PreviewViews | None = None,
) -> list[Path]:
    """Every rendering, each showing the nodules it holds: the overview MPRs, the MPRs through each nodule, the MIP
    slabs and (with ``preview``) the 3-D preview, last; returns the written PNG paths in that order.

    nodules: the segmented findings (:func:`~.nodules.segment_findings`): outlined in the overview MPRs where they
    cross them and marked where they do not (:func:`render_mpr`), each given axial, coronal and sagittal lung-window
    MPRs through its centroid (LPS mm) showing :data:`NODULE_FIELD_MM` around it (``<stem>_nodule_NN_mpr_<plane>.png``,
    NN its finding's number, up to :data:`NODULE_MPRS`), outlined in the MIP slabs that hold them
    (:func:`render_mip`) and drawn over the organs in the 3-D preview."""
    from .preview import write_preview

    out.mkdir(parents=True, exist_ok=True)
    labels = nodule_labels(nodules, volume.geometry)
    paths = render_mpr(volume, masks, out, stem=stem, nodules=labels)
    segmented = [r for r in nodules if r.error is None and r.mask is not None and r.mask.any()]
    if len(segmented) > NODULE_MPRS:
        log.info(
            "MPRs of the first %d of %d nodules written; the others are outlined in the overview", NODULE_MPRS, len(segmented)
        )
    for r in segmented[:NODULE_MPRS]:
        centre = np.asarray(r.centroid_lps if r.centroid_lps is not None else r.center_lps, dtype=np.float64)
        paths += render_mpr(
            volume,
            masks,
            out,
            stem=f"{stem}_nodule_{r.index + 1:02d}",
            center_lps=centre,
            nodules=labels,
            field_mm=NODULE_FIELD_MM,
            note=f", through nodule #{r.index + 1}",
            window="lung",
        )
    lungs = [m for k, m in masks.items() if k.startswith("lung")]
    paths += render_mip(volume, out, stem=stem, lung_mask=np.logical_or.reduce(lungs) if lungs else None, nodules=labels)
    if preview is not None:
        nodule_meshes = {}
        for r in segmented:
            assert r.mask is not None and r.geometry is not None
            nodule_meshes[f"nodule {r.index + 1}"] = mesh_from_mask(r.mask, r.geometry, name=f"nodule {r.index + 1}")
        paths.append(write_preview(preview, out, stem=stem, nodules=nodule_meshes))
    return paths
