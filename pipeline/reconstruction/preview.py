"""The 3-D preview PNG: the organ surfaces seen from the front and from the patient's left, rasterised without a
display, with a legend of their colours; segmented nodules drawn over them.

The organs' views (:class:`PreviewViews`) are made once, when the organs are reconstructed; the nodules are drawn
over them when the preview is written (:func:`write_preview`), so that ``ctpipe run``, which reconstructs before it
detects, draws the nodules it finds later over the same views without meshing the organs again.

Display orientation: the anterior view has the patient's right on the image left and superior up; the left lateral
view has anterior on the image left. Each view's orientation letters lie in bands around it, on no organ. Vertices are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..volume import Geometry
from .letter_spots import free_space_spot, open_spot
from .mesh import Mesh, mesh_from_mask
from .organs import EXTRA_COLORS, ORGAN_COLORS, organ_colours, organ_label
from .preview_raster import fit_frame, rasterise, surface_depth, view_axes
from .render_layout import (
    BROKEN_LINE_PT,
    SIDE_BAND_PX,
    TITLE_LINE_PX,
    TOP_BAND_PX,
    black_figure,
    fit_title,
    legend_layout,
    legend_min_width_px,
    orientation_letters,
    outline_halo,
    pixel_scale_bar,
    save_png,
)
from .render_nodules import drawn_extent, leader_line, put_nodule_letters

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.artist import Artist

log = logging.getLogger(__name__)

PREVIEW_TRIANGLES = 150_000
#: The version of the views' drawing (projection, shading, what is kept beside the images): raised with each change,
#: so that views kept by an earlier version (a run's cache kept across an upgrade) are drawn again, not reused.
RENDERER_VERSION = 4


def views_digest() -> str:
    """What the organs' views were drawn by: a digest of :data:`RENDERER_VERSION` and the palette
    (:data:`~.organs.ORGAN_COLORS`, :data:`~.organs.EXTRA_COLORS`). Views kept with another digest are stale."""
    text = json.dumps({"renderer": RENDERER_VERSION, "colours": ORGAN_COLORS, "extra": EXTRA_COLORS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


PREVIEW_GAP_PX = 48  # between the preview's two views, so that the first's L and the second's A read apart
VIEWS = ("anterior", "left")


@dataclass(frozen=True)
class PreviewViews:
    """The organs' views of the 3-D preview, before any nodule is drawn over them.

    images: the anterior and left views, RGB uint8 ``(size, size, 3)`` each (:func:`rasterise`, quantised once so that
    views kept in a file give the same PNG). organs: the organs shown, in order (the titles); drawn: those with a
    surface (the legend). frame: the LPS box (lowest, highest corner, mm) the views are fitted to, None without a
    surface: the nodules are drawn in it. occluders: the organs that can hide a nodule (:data:`SEE_THROUGH` left out),
    far_depths: for each view, their farthest surface's depth ``(len(occluders), size, size)`` float16 (mm along the
    view's axis, growing towards the viewer; NaN off the organ: :func:`surface_depth`), so that a nodule behind one of
    them is told (:func:`hidden_by`)."""

    images: tuple[np.ndarray, np.ndarray]
    organs: tuple[str, ...]
    drawn: tuple[str, ...]
    frame: tuple[np.ndarray, np.ndarray] | None
    occluders: tuple[str, ...] = ()
    far_depths: tuple[np.ndarray, ...] = ()

    @property
    def size(self) -> int:
        return int(self.images[0].shape[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The views as plain arrays (for ``np.savez``; :meth:`from_arrays` reads them back)."""
        frame = np.stack(self.frame) if self.frame is not None else np.zeros((0, 3))
        return {
            "preview_images": np.stack(self.images),
            "preview_organs": np.array(self.organs, dtype=str),
            "preview_drawn": np.array(self.drawn, dtype=str),
            "preview_frame": frame,
            "preview_digest": np.array(views_digest()),
            "preview_occluders": np.array(self.occluders, dtype=str),
            "preview_far_depths": np.stack(self.far_depths) if self.far_depths else np.zeros((0,), np.float16),
        }

    @staticmethod
    def current(arrays: Mapping[str, np.ndarray]) -> bool:
        """Whether views kept as ``arrays`` (:meth:`to_arrays`) were drawn by this renderer and palette
        (:func:`views_digest`); those of an earlier version, with another digest or none, are not."""
        return "preview_digest" in arrays and str(arrays["preview_digest"]) == views_digest()

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> PreviewViews:
        images = np.asarray(arrays["preview_images"], dtype=np.uint8)
        frame = np.asarray(arrays["preview_frame"], dtype=np.float64)
        return cls(
            images=(images[0], images[1]),
            organs=tuple(str(x) for x in arrays["preview_organs"]),
            drawn=tuple(str(x) for x in arrays["preview_drawn"]),
            frame=(frame[0], frame[1]) if frame.shape == (2, 3) else None,
            occluders=tuple(str(x) for x in arrays["preview_occluders"]),
            far_depths=tuple(np.asarray(arrays["preview_far_depths"], dtype=np.float16)),
        )


def image_position(points_lps: np.ndarray, *, view: str, size: int, frame: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Where LPS points (mm, ``[n, 3]``) fall on a :func:`rasterise` image of ``size`` pixels fitted to ``frame``:
    ``[n, 2]`` (column, row) pixel coordinates (rows run downwards)."""
    axes = view_axes(view)[0]
    scale, centre = fit_frame(frame, size)
    pts = np.asarray(points_lps, dtype=np.float64).reshape(-1, 3)
    u = (pts[:, axes[0]] - centre[axes[0]]) * scale + size / 2
    v = size / 2 - (pts[:, axes[1]] - centre[axes[1]]) * scale
    return np.stack([u, v], axis=1)


def _quantised(img: np.ndarray) -> np.ndarray:
    return np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8)


def preview_meshes(meshes: Mapping[str, Mesh], masks: Mapping[str, np.ndarray], geometry: Geometry) -> dict[str, Mesh]:
    """The meshes the preview draws: each organ's, or for one of more than :data:`PREVIEW_TRIANGLES` triangles a
    lighter copy made from its mask (``[k, j, i]`` on ``geometry``): enough for a picture."""
    shown = {}
    for organ, mesh in meshes.items():
        if mesh.n_triangles > PREVIEW_TRIANGLES and organ in masks:
            mesh = mesh_from_mask(
                masks[organ],
                geometry,
                name=organ,
                target_triangles=PREVIEW_TRIANGLES,
                smoothing_iterations=10,
                preserve_volume=False,
            )
        shown[organ] = mesh
    return shown


def preview_views(meshes: Mapping[str, Mesh], *, size: int = 512) -> PreviewViews:
    """The anterior and left views of the organ meshes (LPS mm), the body surface left out (:class:`PreviewViews`)."""
    shown = {k: m for k, m in meshes.items() if k != "body"} or dict(meshes)
    drawn = tuple(k for k, m in shown.items() if m.n_triangles)
    frame = None
    if drawn:
        allv = np.concatenate([shown[k].vertices for k in drawn])
        frame = (allv.min(axis=0), allv.max(axis=0))
    images = tuple(_quantised(rasterise(shown, view=view, size=size, frame=frame)) for view in VIEWS)
    occluders = tuple(k for k in drawn if k not in SEE_THROUGH)
    far_depths: tuple[np.ndarray, ...] = ()
    if frame is not None:
        far_depths = tuple(
            np.stack(
                [surface_depth(shown[k], view=view, size=size, frame=frame, farthest=True) for k in occluders]
                or [np.full((size, size), np.nan, np.float32)]
            )[: len(occluders)].astype(np.float16)
            for view in VIEWS
        )
    return PreviewViews(
        images=(images[0], images[1]),
        organs=tuple(shown),
        drawn=drawn,
        frame=frame,
        occluders=occluders,
        far_depths=far_depths,
    )


#: Organs a nodule is seen through in the preview, never said to hide it: the ribs, between which the lungs show.
SEE_THROUGH = ("bone",)
#: A nodule is hidden in a view when at least this share of its pixels lies behind another organ.
HIDDEN_SHARE = 0.5


def hidden_by(views: PreviewViews, nodule: Mesh, *, view: str) -> str | None:
    """The organ that hides the ``nodule`` (surface in LPS mm) in ``view`` of ``views``: the organ lying wholly in
    front of it (its farthest surface nearer the viewer than the nodule's nearest) over most of its pixels, when at
    least :data:`HIDDEN_SHARE` of them are so covered; None when it is on the near side (the organ holding it, a lung,
    never hides it: the nodule lies inside it)."""
    if views.frame is None or not views.occluders:
        return None
    near = surface_depth(nodule, view=view, size=views.size, frame=views.frame)
    seen = ~np.isnan(near)
    if not seen.any():
        return None
    far = views.far_depths[VIEWS.index(view)][:, seen].astype(np.float32)
    with np.errstate(invalid="ignore"):
        in_front = far > near[seen][None, :]  # NaN (no organ there) compares False
    if in_front.any(axis=0).mean() < HIDDEN_SHARE:
        return None
    return views.occluders[int(np.argmax(in_front.sum(axis=1)))]


def preview_from_masks(
    masks: Mapping[str, np.ndarray], geometry: Geometry, *, size: int = 512, smoothing_iterations: int = 20
) -> PreviewViews:
    """The organs' views made from their masks alone (organ → bool ``[k, j, i]`` on ``geometry``), each meshed as
    :func:`preview_meshes` meshes a large organ, with the run's Taubin ``smoothing_iterations`` (its
    ``reconstruct.smoothing_iterations``): for views kept by an earlier version (:meth:`PreviewViews.current`)."""
    from .render_planes import OUTSIDE_SCAN

    meshes = {
        organ: mesh_from_mask(
            mask, geometry, name=organ, target_triangles=PREVIEW_TRIANGLES, smoothing_iterations=smoothing_iterations
        )
        for organ, mask in masks.items()
        if organ not in ("body", OUTSIDE_SCAN) and mask.any()
    }
    return preview_views(meshes, size=size)


def render_preview(
    meshes: Mapping[str, Mesh], out: Path, *, stem: str, size: int = 512, nodules: Mapping[str, Mesh] | None = None
) -> Path:
    """A PNG with the anterior and left views of the organ meshes (the body surface is left out), and under them a
    legend naming each organ shown in its colour (:func:`~.organs.organ_colours`): :func:`preview_views` and
    :func:`write_preview`.

    nodules: the nodules' surfaces (LPS mm), drawn in the ``nodules`` colour over the organs (they lie inside the
    lungs, whose surfaces would hide them), in the organs' frame; a name ``nodule N`` letters it ``#N``."""
    return write_preview(preview_views(meshes, size=size), out, stem=stem, nodules=nodules)


def write_preview(views: PreviewViews, out: Path, *, stem: str, nodules: Mapping[str, Mesh] | None = None) -> Path:
    """``<stem>_preview3d.png`` of the organs' ``views`` with the ``nodules``' surfaces (LPS mm) drawn over them in
    the ``nodules`` colour, in the organs' frame, each lettered ``#N`` beside it (``nodule N``: the nodule of finding
    #N, as the MPRs and ``ctpipe reconstruct``'s nodule lines number it), and a legend of the colours under the
    views. A nodule hidden in a view behind another organ (:func:`hidden_by`: the right lung's behind the left lung
    in the left lateral view) is drawn there as a dashed outline, not over that organ, and lettered ``#N (behind left
    lung)``, so that no nodule seems to lie in the organ in front of it. Each view's title (the view and the organs
    shown) lies above that view alone: wrapped to its width (:func:`~.render_layout.fit_title`, the PNG made taller by
    the lines added), in smaller type only where one word is wider than a very small view. Below each view, at its
    left, a scale bar labelled with its length in mm, the same in both views, which share one scale."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    size = views.size
    images = [img.copy() for img in views.images]
    drawn = list(views.drawn)
    colours = organ_colours([*views.organs, "nodules"])  # as rasterise colours the surfaces
    nods = {k: m for k, m in (nodules or {}).items() if m.n_triangles}
    hidden: list[dict[str, str]] = [{}, {}]  # per view: nodule → the organ hiding it
    if nods and views.frame is not None:
        for n, view in enumerate(VIEWS):
            hidden[n] = {k: o for k, m in nods.items() if (o := hidden_by(views, m, view=view)) is not None}
            shown = {k: m for k, m in nods.items() if k not in hidden[n]}
            over = rasterise(shown, view=view, size=size, frame=views.frame, colours=dict.fromkeys(shown, colours["nodules"]))
            hit = over.any(axis=-1)
            images[n][hit] = _quantised(over[hit])
        drawn.append("nodules")
    labels = [_preview_label(k) for k in drawn] + ([HIDDEN_LEGEND] if any(hidden) else [])
    side, band = SIDE_BAND_PX, TOP_BAND_PX  # pixels beside, above and below each view for its letters
    view_w, view_h = size + 2 * side, size + 2 * band
    views_w = 2 * view_w + PREVIEW_GAP_PX
    width = max(views_w, legend_min_width_px(labels, fontsize=8))  # a small preview: as wide as its legend
    left = (width - views_w) // 2  # the views centred above the legend
    ncol, legend_px = legend_layout(labels, width, fontsize=8)
    named = ", ".join(organ_label(k) for k in views.organs)
    # each title within its own view's width, wrapped (or smaller) where it is wider, never into the other view
    titles = [fit_title(f"{name}: {named}", view_w) for name in ("anterior view", "left lateral view")]
    lines = max(text.count("\n") + 1 for text, _ in titles)
    total = view_h + TITLE_ROOM_PX + TITLE_LINE_PX * (lines - 1) + legend_px
    fig = black_figure(width, total)
    for n, (img, (title, fontsize), letters) in enumerate(zip(images, titles, (("R", "L", "S", "I"), ("A", "P", "S", "I")))):
        ax = fig.add_axes(
            (
                (left + n * (view_w + PREVIEW_GAP_PX)) / width,
                legend_px / total,
                view_w / width,
                view_h / total,
            )
        )
        ax.imshow(img, interpolation="nearest")
        ax.set_xlim(-0.5 - side, size - 0.5 + side)  # the letters' bands around the view, on no organ
        ax.set_ylim(size - 0.5 + band, -0.5 - band)
        orientation_letters(ax, *letters, title, side_bands=True, title_fontsize=fontsize)
        if views.frame is not None:  # one scale for both views (:func:`fit_frame`): the same bar below each
            pixel_scale_bar(ax, px_per_mm=fit_frame(views.frame, size)[0], size_px=size, band_px=band)
            for name in hidden[n]:  # its silhouette, dashed: behind the organ, not on it
                sil = ~np.isnan(surface_depth(nods[name], view=VIEWS[n], size=size, frame=views.frame))
                ax.contour(
                    np.arange(size),
                    np.arange(size),
                    sil.astype(np.float32),
                    levels=[0.5],
                    colors=[colours["nodules"]],
                    linestyles="dashed",
                    linewidths=BROKEN_LINE_PT,
                    path_effects=outline_halo(BROKEN_LINE_PT),  # legible on the blue lung
                )
            _letter_nodules(ax, nods, view=VIEWS[n], size=size, frame=views.frame, colour=colours["nodules"], hidden=hidden[n])
    if drawn:  # which colour is which organ
        handles: list[Artist] = [Patch(facecolor=colours[k], label=_preview_label(k)) for k in drawn]
        if any(hidden):
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colours["nodules"],
                    linestyle="--",
                    linewidth=BROKEN_LINE_PT,
                    path_effects=outline_halo(BROKEN_LINE_PT),
                    label=HIDDEN_LEGEND,
                )
            )
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=ncol,
            fontsize=8,
            facecolor="black",
            edgecolor="none",
            labelcolor="white",
            borderpad=0.3,
            columnspacing=1.5,
        )
    return save_png(fig, out / f"{stem}_preview3d.png")


def _letter_nodules(
    ax,
    nodules: Mapping[str, Mesh],
    *,
    view: str,
    size: int,
    frame: tuple[np.ndarray, np.ndarray],
    colour: str,
    hidden: Mapping[str, str],
) -> None:
    """``#N`` beside each nodule ``nodule N`` of a preview view (right or left of its surface, at its top), on a dark
    box, where no other nodule's letters are (:func:`~.letter_spots.open_spot`; long letters may reach into the
    bands beside the view, never over its orientation letters); ``#N (behind left lung)`` for one ``hidden`` behind
    an organ. In a crowd the letters never cover each other nor run past the view and its bands: where the full
    form finds no room beside the nodule a shorter one is tried (``#N (behind)``, then ``#N``: the legend and the
    dashed outline say what it means), then the nearest free place on the view
    (:func:`~.letter_spots.free_space_spot`); none free, the nodule is left unlettered and a warning logged. Letters
    moved away from the nodule are joined to it by a dotted line, so that they are not read as another nodule's."""
    where = {name: image_position(mesh.vertices, view=view, size=size, frame=frame) for name, mesh in nodules.items()}
    placed = [(*uv.min(axis=0), *uv.max(axis=0)) for uv in where.values()]  # the letters cover no nodule
    placed += [drawn_extent(ax, t) for t in ax.texts]  # nor the orientation letters (in the bands beside the view)
    x_lo, x_hi = sorted(ax.get_xlim())  # the view and its side bands: wide letters may reach into the bands
    empty = np.zeros((size, size), bool)  # free_space_spot's "anatomy": the letters may lie on the organs
    for name, uv in where.items():
        forms = _letter_forms(name, hidden.get(name))
        right, left, top = float(uv[:, 0].max()) + 3.0, float(uv[:, 0].min()) - 3.0, float(uv[:, 1].min()) + 4.0
        spot, text = None, forms[-1]
        for text in forms:
            spot = open_spot(right, left, top, text, PX_PER_PT, placed, start=x_lo, limit=x_hi, bottom=size - 0.5)
            if spot is not None:
                break
        if spot is None:
            (m0, m1), (m2, m3) = uv.min(axis=0), uv.max(axis=0)
            mark = (float(m0), float(m1), float(m2), float(m3))
            spot = free_space_spot(mark, text, PX_PER_PT, placed, empty, 1.0, 1.0)
        if spot is None:
            log.warning(
                "%s in the preview's %s view is left unlettered: no free place for %r on the %d pixel view; "
                "a larger preview size gives its letters room",
                name,
                view,
                text,
                size,
            )
            continue
        letters = put_nodule_letters(ax, spot[0], spot[1], text, colour=colour)
        x0, y0, x1, y1 = placed[-1]  # the letters' box as laid out (pixels, rows down)
        (u0, v0), (u1, v1) = uv.min(axis=0), uv.max(axis=0)
        if y1 < v0 or y0 > v1 or x0 > u1 + LEADER_GAP_PX or x1 < u0 - LEADER_GAP_PX:  # away: a dotted line to it
            x0, y0, x1, y1 = drawn_extent(ax, letters)  # from the text as drawn, not the wider box laid out
            cu, cv = float(np.clip((u0 + u1) / 2, x0, x1)), float(np.clip((v0 + v1) / 2, y0, y1))
            eu, ev = uv[int(np.argmin(np.hypot(uv[:, 0] - cu, uv[:, 1] - cv)))]  # to the nodule's nearest point
            leader_line(ax, (cu, cv), (float(eu), float(ev)), colour=colour)


TITLE_ROOM_PX = 40  # pixels above the views for a title of one line; TITLE_LINE_PX more for each further line
PX_PER_PT = 100.0 / 72.0  # the preview's pixels per typographic point (render_layout.FIGURE_DPI)
LEADER_GAP_PX = 6.0  # letters farther than this beside their nodule (a crowd moved them) get a dotted line to it


def _letter_forms(name: str, organ: str | None) -> list[str]:
    """The letters of ``nodule N``, longest first: ``#N`` or, hidden behind ``organ``, ``#N (behind left lung)``,
    ``#N (behind)`` and ``#N`` for a view too crowded for the longer forms."""
    short = f"#{name.removeprefix('nodule ').strip()}"
    return [short] if organ is None else [f"{short} (behind {organ_label(organ)})", f"{short} (behind)", short]


#: The legend's entry for a nodule drawn as a dashed outline: behind another organ in that view.
HIDDEN_LEGEND = "nodule behind an organ in that view (dashed)"


def _preview_label(name: str) -> str:
    return "nodules (drawn over the organs)" if name == "nodules" else organ_label(name)
