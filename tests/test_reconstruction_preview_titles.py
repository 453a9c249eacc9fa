"""The 3-D preview's view titles ('anterior view: left lung, right lung, ...'): on a 128 pixel preview the two titles,
each wider than its view, ran into each other and past the PNG's edges. Each title now lies above its own view
(wrapped, or in smaller type where a word is wider than the view), whatever the preview's size."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from pipeline.reconstruction import preview
from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.preview import preview_views, write_preview
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

SHAPE = (40, 40, 80)
GEOM = Geometry(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-40.0, -20.0, -20.0))
ORGANS = {  # k, j, i centres and radii (voxels): the title names each organ
    "lung_left": ((20, 20, 60), 14),
    "lung_right": ((20, 20, 20), 14),
    "heart": ((20, 20, 40), 5),
    "bone": ((10, 20, 40), 3),
    "airways": ((30, 20, 40), 3),
}


def _preview_figure(tmp_path, monkeypatch, size: int):
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    meshes = {k: mesh_from_mask(sphere_mask(SHAPE, c, r), GEOM, name=k) for k, (c, r) in ORGANS.items()}
    write_preview(preview_views(meshes, size=size), tmp_path, stem="p")
    fig = figures[0]
    FigureCanvasAgg(fig).draw()  # lays the text out as the PNG draws it
    return fig


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("size", [24, 64, 128, 256, 512])
def test_each_view_title_lies_above_its_own_view_on_the_png(tmp_path, monkeypatch, size):
    fig = _preview_figure(tmp_path, monkeypatch, size)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    width, height = fig.bbox.width, fig.bbox.height
    views = fig.axes[:2]
    titles = [ax.title.get_window_extent(renderer) for ax in views]
    for ax, title in zip(views, titles):
        view = ax.get_window_extent(renderer)  # the view and the bands of its letters
        text = ax.title.get_text()
        assert "lung" in text and "heart" in text, text  # the organs still named
        assert title.x0 >= view.x0 - 0.5 and title.x1 <= view.x1 + 0.5, (
            f"{size} px preview: title {text!r} spans x {title.x0:.0f}..{title.x1:.0f}, its view {view.x0:.0f}..{view.x1:.0f}"
        )
        assert title.y0 >= view.y1 - 0.5 and title.y1 <= height + 0.5, (
            f"{size} px preview: title {text!r} spans y {title.y0:.0f}..{title.y1:.0f}: on its view (top {view.y1:.0f}) "
            f"or off the {height:.0f} pixel PNG"
        )
        assert title.x0 >= -0.5 and title.x1 <= width + 0.5
        for t in ax.texts:  # the orientation letters
            assert not _overlap(title, t.get_window_extent(renderer)), f"{text!r} covers the letter {t.get_text()!r}"
    assert not _overlap(*titles), f"{size} px preview: the titles {titles[0]} and {titles[1]} run into each other"


def test_a_title_that_fits_is_drawn_on_one_line_in_the_usual_type(tmp_path, monkeypatch):
    fig = _preview_figure(tmp_path, monkeypatch, 512)
    for ax in fig.axes[:2]:
        assert "\n" not in ax.title.get_text()
        assert ax.title.get_fontsize() == pytest.approx(9.0)
