"""The nodules' dashed outlines (off the plane in the MPRs, behind an organ in the 3-D preview) and the dotted lines
joining letters to their nodule were 0.8-1.2 points wide with nothing under them: faint against the blue lung of the
preview and the grey lung of the lung window. They are now at least 1.5 points wide, on a dark halo."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import patheffects

from pipeline.reconstruction import preview
from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.preview import preview_views, write_preview
from pipeline.reconstruction.render_nodules import LetterSpot, draw_marks, drawn_extent
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask


def _haloed(artist) -> bool:
    return any(isinstance(e, patheffects.Stroke) for e in artist.get_path_effects())


def _widths(artist) -> list[float]:
    w = artist.get_linewidth()
    return [float(x) for x in np.atleast_1d(w)]


def _broken(artist) -> bool:
    """Whether the artist is drawn dashed or dotted."""
    style = artist.get_linestyle()
    styles = style if isinstance(style, list) else [style]
    return any(s not in ("-", "solid", (0, None), (0.0, None)) for s in styles)


def test_dashed_outlines_and_dotted_leaders_of_the_mprs_are_wide_and_haloed():
    fig, ax = plt.subplots()
    try:
        ax.imshow(np.full((60, 60), 0.5), cmap="gray", extent=(0, 60, 60, 0))
        mark = np.zeros((60, 60), bool)
        mark[25:35, 25:35] = True
        spot = LetterSpot(x=45.0, y=10.0, box=(45.0, 5.0, 55.0, 10.0), mark=(25.0, 25.0, 35.0, 35.0), leader=True)
        draw_marks(ax, [(1, mark, "dashed", "#1 (12 mm R)")], 1.0, 1.0, colour="#ff3df5", spots=[spot])
        lines = [a for a in [*ax.lines, *ax.collections] if _broken(a)]
        assert len(lines) >= 2, "a dashed outline and a dotted leader"
        for a in lines:
            assert min(_widths(a)) >= 1.5, (a, _widths(a))
            assert _haloed(a), a
    finally:
        plt.close(fig)


def test_the_previews_dashed_outline_of_a_hidden_nodule_is_wide_and_haloed(tmp_path, monkeypatch):
    shape = (40, 40, 80)
    geom = Geometry(shape=shape, spacing=(1.0, 1.0, 1.0), origin=(-40.0, -20.0, -20.0))
    lungs = {"lung_left": sphere_mask(shape, (20, 20, 60), 14), "lung_right": sphere_mask(shape, (20, 20, 20), 14)}
    views = preview_views({k: mesh_from_mask(m, geom, name=k) for k, m in lungs.items()}, size=128)
    figures: list = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    nodule = {"nodule 1": mesh_from_mask(sphere_mask(shape, (20, 20, 20), 4), geom, name="nodule 1")}
    write_preview(views, tmp_path, stem="p", nodules=nodule)  # the right lung's: hidden in the left lateral view
    lateral = figures[0].axes[1]
    dashed = [a for a in [*lateral.lines, *lateral.collections] if _broken(a)]
    assert dashed, "the hidden nodule's dashed outline"
    for a in dashed:
        assert min(_widths(a)) >= 1.5, (a, _widths(a))
        assert _haloed(a), a
    plt.close(figures[0])


def test_the_mprs_dotted_leader_starts_at_the_drawn_letters():
    """The dotted line started on the box laid out for the letters, wider than the text drawn: away from the letters."""
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    try:
        ax.imshow(np.full((60, 60), 0.5), cmap="gray", extent=(0, 60, 60, 0))
        mark = np.zeros((60, 60), bool)
        mark[25:35, 45:55] = True
        spot = LetterSpot(x=5.0, y=10.0, box=(5.0, 5.0, 60.0, 10.0), mark=(45.0, 25.0, 55.0, 35.0), leader=True)
        draw_marks(ax, [(1, mark, "solid", "#1")], 1.0, 1.0, colour="#ff3df5", spots=[spot])
        (text,) = ax.texts
        x0, y0, x1, y1 = drawn_extent(ax, text)
        (dotted,) = [line for line in ax.lines if line.get_linestyle() == ":"]
        xs, ys = dotted.get_data()
        assert x0 - 0.5 <= float(xs[0]) <= x1 + 0.5, ((x0, x1), xs)
        assert y0 - 0.5 <= float(ys[0]) <= y1 + 0.5, ((y0, y1), ys)
    finally:
        plt.close(fig)


def test_a_solid_nodule_outline_leaves_the_nodules_edge_uncovered():
    """The dark halo of a solid nodule outline covered about a pixel of the nodule's edge in the MPRs and MIPs (most of
    a small nodule's rim in an overview MIP), hiding its margin: the solid outline is drawn without it, its magenta
    legible on the grey lung and the white nodule as it is. The dashed outlines keep their halo."""
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    try:
        image = np.full((60, 60), 0.35)  # grey lung
        image[20:40, 20:40] = 0.9  # a bright nodule
        ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, extent=(0, 60, 60, 0), interpolation="nearest")
        ax.set_axis_off()
        spot = LetterSpot(x=45.0, y=10.0, box=(45.0, 5.0, 55.0, 10.0), mark=(20.0, 20.0, 40.0, 40.0), leader=False)
        draw_marks(ax, [(1, image > 0.5, "solid", "#1")], 1.0, 1.0, colour="#ff3df5", spots=[spot])
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255.0
        x, y = ax.transData.transform((30.0, 30.0))  # the nodule's centre, in the figure's pixels
        r, c = int(round(img.shape[0] - y)), int(round(x))
        row = img[r, c : c + int(ax.bbox.width) // 3]  # rightwards, across the nodule's edge
        magenta = np.array([1.0, 0x3D / 255, 0xF5 / 255])
        hits = np.nonzero(np.abs(row - magenta).max(axis=-1) < 0.15)[0]
        assert hits.size, "the outline crosses the row"
        inside = row[: int(hits[0])].mean(axis=-1)
        assert inside.min() > 0.8, ("the nodule's pixels up to its outline keep their grey", inside[-6:])
        solid = [a for a in ax.collections if not _broken(a)]
        assert solid and not any(_haloed(a) for a in solid), [a.get_path_effects() for a in solid]
    finally:
        plt.close(fig)
