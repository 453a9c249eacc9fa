"""The 3-D preview's legend on a small preview: 'nodule behind an organ in that view (dashed)' is some 300 pixels wide
at 8 points, and on a 64 pixel preview (a PNG 264 pixels wide) the legend ran past both edges of the PNG, cutting off
the colour samples and the end of the entry. The PNG is now at least as wide as its legend."""

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


@pytest.mark.parametrize("size", [24, 64, 128, 512])
def test_the_legend_lies_whole_on_the_png(tmp_path, monkeypatch, size):
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    lungs = {"lung_left": sphere_mask(SHAPE, (20, 20, 60), 14), "lung_right": sphere_mask(SHAPE, (20, 20, 20), 14)}
    views = preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in lungs.items()}, size=size)
    hidden = {"nodule 1": mesh_from_mask(sphere_mask(SHAPE, (20, 20, 20), 3), GEOM, name="nodule 1")}  # behind, laterally
    write_preview(views, tmp_path, stem="p", nodules=hidden)
    fig = figures[0]
    FigureCanvasAgg(fig).draw()
    legend = fig.legends[0].get_window_extent()
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("behind" in t for t in texts), texts
    assert legend.x0 >= -0.5 and legend.x1 <= fig.bbox.width + 0.5, (
        f"{size} px preview: the legend spans x {legend.x0:.0f}..{legend.x1:.0f} of a {fig.bbox.width:.0f} pixel PNG"
    )
    views_box = [ax.get_window_extent() for ax in fig.axes[:2]]
    assert all(b.x0 >= -0.5 and b.x1 <= fig.bbox.width + 0.5 for b in views_box)
    assert views_box[0].x1 <= views_box[1].x0  # side by side, apart
    assert abs(views_box[0].x0 - (fig.bbox.width - views_box[1].x1)) <= 1.0, "the views are not centred on the PNG"
