"""PNG renderings without a display: MPR slices with organ outlines, lung-window MIP slabs, a 3-D preview
(:mod:`.preview`); with segmented nodules, their outlines in the MPRs (dashed where they project onto an overview
plane that does not cut them), lung-window MPRs through each and their surfaces in the preview, each lettered #N
(its finding's number).

Display orientation is radiological and derived from the LPS geometry, never
from array order: axial and coronal images show the patient's right on the
image left; axial images have anterior at the top; coronal and sagittal
images have superior at the top; sagittal images have anterior on the left. The MPRs and MIPs are true patient
planes: an oblique grid (a gantry-tilt corrected series) is resampled onto patient axes for them
(:func:`~.render_planes.to_patient_axes`), as their titles say.
Every image is labelled with its orientation letters (R/L, A/P, S/I); the MPRs and MIPs carry a scale bar and their
lower letter in a band below the image, their upper letter in a band above it, their side letters in bands beside
it, on no anatomy; the 3-D preview's letters lie in bands around its views as well. Organs are named as the
SEG names them ("left lung").

The figures' layout is :mod:`.render_layout`, the planes :mod:`.render_planes`, the nodules' outlines and letters
:mod:`.render_nodules`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..intensity import BODY_HU
from ..volume import CTVolume
from .mesh import Mesh, mesh_from_mask
from .organs import organ_colours, organ_label
from .render_layout import (
    LUNG_WINDOW,
    WINDOWS,
    figure_width_px,
    image_figure,
    image_units,
    legend_below,
    orientation_letters,
    outline_halo,
    outline_mask,
    save_png,
    scale_bar,
    window_note,
    wrap_title,
)
from .render_nodules import (
    OFF_PLANE_LEGEND,
    OFF_PLANE_SHOWN,
    SIDE_LETTERS,
    NoduleExtent,
    draw_marks,
    layout_letters,
    letter_margins,
    nodule_extents,
    nodule_labels,
    outline_pixels,
    projection,
)
from .render_planes import (
    OUTSIDE_SCAN,
    OUTSIDE_SCAN_LEGEND,
    OUTSIDE_SCAN_RGB,
    PLANES,
    field_window,
    lps_aligned,
    plane_image,
    resampled_note,
    source_slices,
    to_patient_axes,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.artist import Artist

    from .nodules import NoduleResult
    from .preview import PreviewViews

log = logging.getLogger(__name__)

__all__ = ["lps_aligned", "nodule_labels", "render_all", "render_mip", "render_mpr", "render_nodule_views", "source_slices"]


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
    planes: Sequence[str] = ("axial", "coronal", "sagittal"),
    suffix: str = "",
) -> list[Path]:
    """Axial, coronal and sagittal PNGs through ``center_lps`` (DICOM patient coordinates, LPS mm; default: the lungs'
    centre, and one sagittal through the middle of each lung segmented on its own (:func:`lung_sagittals`: the right
    lung's ``<stem>_mpr_sagittal.png``, the left's ``<stem>_mpr_sagittal_left.png``, each titled with its side and x),
    else through the plane holding the most lung, not the mediastinum between them; without lungs the volume's
    centre), soft-tissue window, each mask outlined in its colour (:func:`~.organs.organ_colours`:
    :data:`~.organs.ORGAN_COLORS`), with a legend in rows below the image (:func:`legend_layout`), never over it.

    nodules: labels ``[k, j, i]`` on the volume's grid (:func:`nodule_labels`: N is the nodule of finding #N); each
    nodule a plane cuts is outlined in the ``nodules`` colour and lettered ``#N`` beside it; on the whole plane (no
    ``field_mm``), each nodule it does not cut is marked beside the image at its height (an arrowhead in the side band,
    nothing over the image) and lettered ``#N (d mm S)`` in a margin: the distance from the plane to its centre and the
    side it lies on (on each lung's sagittal, only the nodules nearer it than the other lung's sagittal); only the
    :data:`~.render_nodules.OFF_PLANE_SHOWN` nearest the plane, the others counted in the legend (``+N more``). field_mm: the images show this many mm
    around ``center_lps`` (a nodule's close-up), not the whole plane. note: added to each title. window: a name of
    :data:`WINDOWS` (``"lung"`` for a nodule's close-up), stated in each title. planes: which of the planes to draw.
    suffix: added to each PNG's name (``<stem>_mpr_axial<suffix>.png``)."""
    from matplotlib.lines import Line2D

    volume, masks, nodules = to_patient_axes(volume, masks, nodules)  # true patient planes, whatever the grid
    outside = masks.pop(OUTSIDE_SCAN, None)  # voxels no image measured: painted, not outlined
    note += resampled_note(volume)
    view, spacing, lo = lps_aligned(np.asarray(volume.array), volume.geometry)
    oview = lps_aligned(outside, volume.geometry)[0] if outside is not None and outside.any() else None
    mviews = {k: lps_aligned(m, volume.geometry)[0] for k, m in masks.items()}
    nview = lps_aligned(nodules, volume.geometry)[0] if nodules is not None and nodules.any() else None
    colours = organ_colours([*masks, "nodules"])  # the same in every plane
    beside = nodule_extents(nview) if nview is not None and field_mm is None else {}
    sagittals: list[tuple[int, str, str]] = []  # x index, file suffix, title words
    if center_lps is None:
        sagittals = lung_sagittals(mviews)
        lung = [m for k, m in mviews.items() if k.startswith("lung")]
        ref = np.logical_or.reduce(lung) if lung else None
        if ref is not None and ref.any():
            zyx = np.argwhere(ref).mean(axis=0)
            center_idx = zyx[::-1]
            center_idx[0] = np.argmax(ref.sum(axis=(0, 1)))  # the sagittal of the most lung, not the mediastinum
        else:
            center_idx = (np.array(view.shape[::-1]) - 1) / 2
    else:
        center_idx = (np.asarray(center_lps) - lo) / spacing
    center_idx = np.clip(np.round(center_idx).astype(int), 0, np.array(view.shape[::-1]) - 1)
    shots = [(plane, int(center_idx[PLANES[plane][0]]), "", "") for plane in ("axial", "coronal")]
    shots += [("sagittal", x, suffix, words) for x, suffix, words in sagittals] or [("sagittal", int(center_idx[0]), "", "")]
    shots = [shot for shot in shots if shot[0] in planes]
    paths = []
    for plane, index, side, words in shots:
        fixed, rows, cols, _flip, letters = PLANES[plane]
        img = plane_image(view, plane, index)
        crop = field_window(img.shape, center_idx, plane, spacing, field_mm)
        img = img[crop]
        h_mm = img.shape[0] * spacing[rows]
        w_mm = img.shape[1] * spacing[cols]
        outlines = {organ: sl for organ, mv in mviews.items() if (sl := plane_image(mv, plane, index)[crop]).any()}
        outlines = {organ: sl for organ, sl in outlines.items() if not sl.all()}  # an edge to draw
        cut = plane_image(nview, plane, index)[crop] if nview is not None else None
        numbers = [int(v) for v in np.unique(cut) if v > 0] if cut is not None else []
        off = [n for n in beside if n not in numbers and _nearest_sagittal(beside[n], plane, index, sagittals)]
        off.sort(key=lambda n: abs(beside[n].centre_xyz[fixed] - index))  # the nearest to the plane first
        more = max(len(off) - OFF_PLANE_SHOWN, 0)
        off = off[:OFF_PLANE_SHOWN]  # the others are counted, not marked
        off_label = OFF_PLANE_LEGEND + (f", +{more} more" if more else "")
        legend = [organ_label(organ) for organ in outlines] + (["nodule #N (finding #N)"] if numbers else [])
        legend += [off_label] if off else []
        unscanned = plane_image(oview, plane, index)[crop] if oview is not None else None
        unscanned = unscanned if unscanned is not None and unscanned.any() else None
        legend += [OUTSIDE_SCAN_LEGEND] if unscanned is not None else []
        marks = [(n, cut == n, "solid", f"#{n}") for n in numbers if cut is not None]  # outlined where cut
        for n in off:  # each nodule the plane does not cut: dashed where it projects, with its distance and side
            assert nview is not None
            d = (beside[n].centre_xyz[fixed] - index) * spacing[fixed]
            text = f"#{n} ({abs(d):.0f} mm {SIDE_LETTERS[fixed][int(d > 0)]})"
            marks.append((n, plane_image(projection(nview.shape, beside[n], plane), plane, 0)[crop], "tick", text))
        # the off-plane letters' free space: air, no organ, no arm, no couch; else a margin beside the image
        anatomy = (
            np.logical_or.reduce([img > BODY_HU, *(plane_image(mv, plane, index)[crop] for mv in mviews.values())])
            if off
            else None
        )
        mm_per_pt, band_mm = image_units(w_mm, h_mm)
        edges = outline_pixels(list(outlines.values())) if outlines else None  # letters clear of every outline
        spots = layout_letters(
            marks, spacing[cols], spacing[rows], mm_per_pt=mm_per_pt, anatomy=anatomy, outlines=edges, band_mm=band_mm
        )
        margins = letter_margins(spots, w_mm, band_mm=band_mm)
        pos = lo[fixed] + index * spacing[fixed]
        slices = source_slices(volume, index, index) if plane == "axial" else ""
        title = wrap_title(
            f"{plane}{words} at {'xyz'[fixed]}={pos:.1f} mm (LPS){', ' + slices if slices else ''}{note}\n{window_note(*WINDOWS[window])} — "
            + ("patient's right on image left" if plane != "sagittal" else "patient's anterior on image left"),
            figure_width_px(w_mm, h_mm, margins_mm=margins),
        )
        fig, ax, ncol = image_figure(w_mm, h_mm, legend=legend, margins_mm=margins, title_lines=title.count("\n") + 1)
        extent = (0, w_mm, h_mm, 0)
        vmin, vmax = WINDOWS[window]
        ax.imshow(img, cmap="gray", vmin=vmin, vmax=vmax, extent=extent, interpolation="nearest")
        drawn: list[Artist] = []
        if unscanned is not None:
            drawn.append(_paint_outside(ax, unscanned, extent))
        scale_bar(ax, w_mm, h_mm, margins_mm=margins)
        for organ, sl in outlines.items():
            colour = colours[organ]
            halo = outline_halo()  # a yellow or white line on the bone and tissue the lung window draws near white
            outline_mask(ax, sl, spacing[cols], spacing[rows], colors=[colour], linewidths=1.0, path_effects=halo)
            drawn.append(Line2D([], [], color=colour, label=organ_label(organ), path_effects=halo))
        draw_marks(ax, marks, spacing[cols], spacing[rows], colour=colours["nodules"], spots=spots)
        if numbers:
            drawn.append(Line2D([], [], color=colours["nodules"], label="nodule #N (finding #N)"))
        if off:
            off_plane = Line2D([], [], color=colours["nodules"], marker=">", linestyle="none", label=off_label)
            drawn.append(off_plane)
        if drawn:  # which outline is which organ: one row in the band below the image, hiding no anatomy
            legend_below(ax, drawn, ncol)
        ticks = [spot.mark for (_n, _sl, style, _t), spot in zip(marks, spots) if style == "tick"]
        marks_y = ([t[1] for t in ticks if t[0] < 0], [t[1] for t in ticks if t[0] >= 0])  # arrowheads left, right
        orientation_letters(ax, *letters, title, side_bands=True, margins_mm=margins, marks_y=marks_y)
        paths.append(save_png(fig, out / f"{stem}_mpr_{plane}{side}{suffix}.png"))
    return paths


def _paint_outside(ax, unscanned: np.ndarray, extent: tuple[float, float, float, float]) -> Artist:
    """Paint the image pixels ``unscanned`` (bool, as the image's rows and columns; voxels no image measured) in
    :data:`OUTSIDE_SCAN_RGB`, a flat colour no window gives a CT value, over the fill value (-1024 HU) that would
    read as air; returns the legend handle."""
    from matplotlib.patches import Patch

    paint = np.zeros((*unscanned.shape, 4), dtype=np.float32)
    paint[unscanned] = (*OUTSIDE_SCAN_RGB, 1.0)
    ax.imshow(paint, extent=extent, interpolation="nearest")
    return Patch(facecolor=OUTSIDE_SCAN_RGB, label=OUTSIDE_SCAN_LEGEND)


#: The overview's sagittals of lungs segmented each on its own: the mask's name, the suffix of its PNG's name
#: (``<stem>_mpr_sagittal<suffix>.png``) and the words of its title.
LUNG_SAGITTALS = (("lung_right", "", " through the right lung"), ("lung_left", "_left", " through the left lung"))


def _nearest_sagittal(extent: NoduleExtent, plane: str, index: int, sagittals: list[tuple[int, str, str]]) -> bool:
    """Whether a nodule off the plane is marked on it: on an axial or coronal always; on one of several sagittals
    (:func:`lung_sagittals`) only the one nearest the nodule's centre, its own side's, so that no lung seems to hold
    the other lung's nodules."""
    if plane != "sagittal" or len(sagittals) < 2:
        return True
    x = extent.centre_xyz[0]
    return index == min((s[0] for s in sagittals), key=lambda sx: abs(sx - x))


def lung_sagittals(mviews: Mapping[str, np.ndarray]) -> list[tuple[int, str, str]]:
    """The overview's sagittal through the middle of each lung of :data:`LUNG_SAGITTALS` that ``mviews`` (masks as
    :func:`lps_aligned` views ``[z, y, x]``) holds: its x index (the median x of the lung's voxels, so a plane through
    the lung, not its lateral rim or the mediastinum), PNG suffix and title words; the first found takes the plain
    name ``<stem>_mpr_sagittal.png``. Empty without separate lungs."""
    out: list[tuple[int, str, str]] = []
    for organ, suffix, words in LUNG_SAGITTALS:
        lung = mviews.get(organ)
        counts = lung.sum(axis=(0, 1)) if lung is not None else np.zeros(1)
        if counts.any():
            x = int(np.searchsorted(np.cumsum(counts), counts.sum() / 2))
            out.append((x, suffix if out else "", words))
    return out


#: The MIP slabs lie across the axial planes where the lungs' cross-section is at least this share of its largest: a
#: slab through a lung base's thin rim around the diaphragm's dome showed the liver's dome, no lung.
MIP_LUNG_SHARE = 0.2


def render_mip(
    volume: CTVolume,
    out: Path,
    *,
    stem: str,
    lung_mask: np.ndarray | None = None,
    slab_mm: float = 10.0,
    n_slabs: int = 3,
    nodules: np.ndarray | None = None,
    outside_scan: np.ndarray | None = None,
) -> list[Path]:
    """Axial lung-window (W1500/L-600) maximum-intensity projections of ``slab_mm`` slabs across the lungs (the axial
    planes holding at least :data:`MIP_LUNG_SHARE` of the lungs' largest cross-section): ``n_slabs`` evenly spaced,
    fewer where the lungs are too short to hold them without overlap.

    nodules: labels ``[k, j, i]`` on the volume's grid (:func:`nodule_labels`); each nodule a slab holds is outlined
    there (its shadow across the slab) in the ``nodules`` colour and lettered ``#N``. Where no voxel of a slab was
    measured (the wedge of a tilt-corrected grid, or ``outside_scan``: bool ``[k, j, i]``, as
    :func:`~.render_planes.to_patient_axes` gives it among the masks) the MIP is painted "not scanned"."""
    from matplotlib.lines import Line2D

    lungs = {"lungs": lung_mask} if lung_mask is not None else {}
    if outside_scan is not None:
        lungs[OUTSIDE_SCAN] = outside_scan
    volume, lungs, nodules = to_patient_axes(volume, lungs, nodules)  # true axial slabs, whatever the grid
    lung_mask = lungs.get("lungs")
    outside = lungs.get(OUTSIDE_SCAN)
    oview = lps_aligned(outside, volume.geometry)[0] if outside is not None and outside.any() else None
    view, spacing, lo = lps_aligned(np.asarray(volume.array), volume.geometry)
    nview = lps_aligned(nodules, volume.geometry)[0] if nodules is not None and nodules.any() else None
    colour = organ_colours(["nodules"])["nodules"]
    nz = view.shape[0]
    z0, z1 = 0, nz - 1
    if lung_mask is not None and lung_mask.any():
        area = lps_aligned(lung_mask, volume.geometry)[0].sum(axis=(1, 2))  # voxels of lung in each axial plane
        zs = np.nonzero(area >= MIP_LUNG_SHARE * area.max())[0]  # not the thin rims of the domes and apices
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
        unscanned: np.ndarray | None = None
        if oview is not None and (slab := np.asarray(oview[a:b].all(axis=0))).any():  # no voxel of the slab measured
            unscanned = slab
        legend = (["nodule #N (finding #N)"] if marks else []) + ([OUTSIDE_SCAN_LEGEND] if unscanned is not None else [])
        za, zb = lo[2] + a * spacing[2], lo[2] + (b - 1) * spacing[2]
        slices = source_slices(volume, a, b - 1)
        title = wrap_title(
            f"axial MIP {za:.1f}..{zb:.1f} mm (LPS z){', ' + slices if slices else ''}{resampled_note(volume)}\n"
            f"{window_note(*LUNG_WINDOW)} — patient's right on image left",
            figure_width_px(w_mm, h_mm),
        )
        fig, ax, ncol = image_figure(w_mm, h_mm, legend=legend or None, title_lines=title.count("\n") + 1)
        ax.imshow(mip, cmap="gray", vmin=LUNG_WINDOW[0], vmax=LUNG_WINDOW[1], extent=(0, w_mm, h_mm, 0))
        handles = [_paint_outside(ax, unscanned, (0, w_mm, h_mm, 0))] if unscanned is not None else []
        scale_bar(ax, w_mm, h_mm)
        if marks:  # the nodules the slab holds: their shadow across it ([y, x] as the MIP's rows and columns)
            draw_marks(ax, marks, spacing[0], spacing[1], colour=colour)
            handles.append(Line2D([], [], color=colour, label="nodule #N (finding #N)"))
        if handles:
            legend_below(ax, handles, ncol)
        orientation_letters(ax, "R", "L", "A", "P", title, side_bands=True)
        paths.append(save_png(fig, out / f"{stem}_mip_axial_{n + 1}.png"))
    return paths


#: The overview's planes drawn a second time in the lung window (``<stem>_mpr_<plane>_lung.png``), beside the
#: soft-tissue ones: the axial and the coronal through the lungs' centre and the sagittal through each lung
#: (``<stem>_mpr_sagittal_lung.png``, ``<stem>_mpr_sagittal_left_lung.png``), whose lung the soft-tissue window shows
#: all black.
LUNG_OVERVIEW = ("axial", "coronal", "sagittal")


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
    """Every rendering, each showing the nodules it holds: the overview MPRs (soft-tissue window, then the
    :data:`LUNG_OVERVIEW` planes in the lung window, ``<stem>_mpr_<plane>[_left]_lung.png``), the MPRs through each nodule, the MIP
    slabs and (with ``preview``) the 3-D preview, last; returns the written PNG paths in that order.

    nodules: the segmented findings (:func:`~.nodules.segment_findings`): outlined in the overview MPRs where they
    cross them and marked where they do not (:func:`render_mpr`), each given axial, coronal and sagittal lung-window
    MPRs through its centroid (LPS mm) showing :data:`NODULE_FIELD_MM` around it (``<stem>_nodule_NN_mpr_<plane>.png``,
    NN its finding's number, up to :data:`NODULE_MPRS`; their titles name its long and short axis, mm, their mean and
    the slice they are measured on: :func:`~.nodule_geometry.axes_json`), outlined in the MIP slabs that hold them
    (:func:`render_mip`) and drawn over the organs in the 3-D preview."""
    from ..detection.findings import slice_label, slice_number_source
    from .nodule_geometry import axes_json, plane_note
    from .preview import write_preview

    out.mkdir(parents=True, exist_ok=True)
    labels = nodule_labels(nodules, volume.geometry)
    slice_name = slice_label(slice_number_source(volume.metadata, volume.shape[0]))
    sizes = {}  # each close-up names the nodule's axes as the nodule lines and the SR state them
    for r in nodules:
        axes = axes_json(r, volume.geometry, volume.metadata) if r.error is None and r.mask is not None else None
        if axes is not None and axes["long_axis_mm"] is not None:
            sizes[r.index] = (
                f" · long axis {axes['long_axis_mm']:.1f} mm, short axis {axes['short_axis_mm']:.1f} mm "
                f"(mean {axes['mean_diameter_mm']:.1f} mm) on {slice_name} {axes['axes_instance_number']}"
                f"{plane_note(axes['axes_plane_tilt_deg'])}"
            )
    volume, masks, labels = to_patient_axes(volume, masks, labels)  # once for every MPR and MIP below
    paths = render_mpr(volume, masks, out, stem=stem, nodules=labels)
    # the lungs' detail (vessels, nodules, ground glass) that the soft-tissue window shows all black
    paths += render_mpr(volume, masks, out, stem=stem, nodules=labels, window="lung", planes=LUNG_OVERVIEW, suffix="_lung")
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
            note=f", through nodule #{r.index + 1}{sizes.get(r.index, '')}",
            window="lung",
        )
    lungs = [m for k, m in masks.items() if k.startswith("lung")]
    lung_mask = np.logical_or.reduce(lungs) if lungs else None
    paths += render_mip(volume, out, stem=stem, lung_mask=lung_mask, nodules=labels, outside_scan=masks.get(OUTSIDE_SCAN))
    if preview is not None:
        nodule_meshes = {}
        for r in segmented:
            assert r.mask is not None and r.geometry is not None
            nodule_meshes[f"nodule {r.index + 1}"] = mesh_from_mask(r.mask, r.geometry, name=f"nodule {r.index + 1}")
        paths.append(write_preview(preview, out, stem=stem, nodules=nodule_meshes))
    return paths
