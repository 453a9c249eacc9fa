"""The 3-D preview's two views at one scale: each view was fitted to its own extent, so on a chest wider than it is
tall (the planning chest: some 40 cm across, 28 cm head to foot) the lateral view was drawn larger than the anterior
one, a nodule lay on different rows of the two views and looked bigger beside than from the front. Both views now
draw a millimetre as the same number of pixels, the patient's head-foot axis on the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.preview import VIEWS, image_position, preview_views
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

SHAPE = (30, 40, 100)  # k, j, i: 100 mm across, 40 mm front to back, 30 mm head to foot
GEOM = Geometry(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-50.0, -20.0, -15.0))


def _views(size: int = 128):
    lungs = {"lung_right": sphere_mask(SHAPE, (15, 20, 20), 12), "lung_left": sphere_mask(SHAPE, (15, 20, 80), 12)}
    return preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in lungs.items()}, size=size)


def test_both_views_share_one_scale_and_the_head_foot_rows():
    views = _views()
    assert views.frame is not None
    points = np.array([[0.0, 0.0, -10.0], [0.0, 0.0, 10.0]])  # 20 mm apart, head to foot
    rows = [image_position(points, view=view, size=views.size, frame=views.frame)[:, 1] for view in VIEWS]
    front, side = (float(r[0] - r[1]) for r in rows)
    assert side == pytest.approx(front), f"20 mm head to foot is {front:.1f} px from the front, {side:.1f} px beside"
    assert rows[1] == pytest.approx(rows[0]), "a point lies on different rows of the two views"


def test_the_drawn_organs_are_as_tall_in_both_views():
    views = _views()
    heights = [int(np.ptp(np.nonzero(img.any(axis=(1, 2)))[0])) for img in views.images]
    assert abs(heights[0] - heights[1]) <= 1, f"the lungs are {heights[0]} px tall from the front, {heights[1]} beside"


def test_each_view_has_a_scale_bar_in_mm_on_the_views_scale_clear_of_the_organs_and_letters(tmp_path, monkeypatch):
    # was: no scale bar: nothing on the preview said how large the organs or a nodule are
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import pipeline.reconstruction.preview as preview

    figures: list = []
    save = preview.save_png
    monkeypatch.setattr(preview, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    views = _views(size=256)
    assert views.frame is not None
    preview.write_preview(views, tmp_path, stem="case")
    (fig,) = figures
    renderer = FigureCanvasAgg(fig).get_renderer()
    size = views.size
    px_per_mm = (
        image_position(np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]]), view="anterior", size=size, frame=views.frame)[:, 0]
        @ [-1, 1]
    ) / 10
    lengths = []
    for ax in [a for a in fig.axes if a.images]:
        bars = [line for line in ax.lines if len(line.get_xdata()) == 2 and np.ptp(line.get_ydata()) == 0]
        labels = [t for t in ax.texts if t.get_text().endswith(" mm")]
        assert len(bars) == 1 and len(labels) == 1, ([b.get_xydata() for b in bars], [t.get_text() for t in labels])
        mm = float(labels[0].get_text().removesuffix(" mm"))
        x, y = bars[0].get_xdata(), bars[0].get_ydata()
        assert float(np.ptp(x)) / px_per_mm == pytest.approx(mm), f"a bar labelled {mm:g} mm is {np.ptp(x) / px_per_mm:.1f} mm"
        assert y[0] > size - 0.5 and y[0] < max(ax.get_ylim()), "the bar lies in the band below the view"
        assert 0 <= min(x) and max(x) <= size, "the bar lies under the view"
        box = bars[0].get_window_extent(renderer)
        others = [t for t in ax.texts if t is not labels[0]]
        for other in others:  # the orientation letters
            assert not box.overlaps(other.get_window_extent(renderer)), other.get_text()
            assert not labels[0].get_window_extent(renderer).overlaps(other.get_window_extent(renderer)), other.get_text()
        lengths.append(mm)
    assert len(lengths) == 2 and lengths[0] == lengths[1], lengths
