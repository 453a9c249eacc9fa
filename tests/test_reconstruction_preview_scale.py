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
