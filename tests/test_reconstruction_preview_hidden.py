"""The 3-D preview's nodules behind another organ: the left lateral view drew the right lung's nodules filled over the
left lung's surface, so a reader could take them for the left lung's. A nodule hidden behind another organ in a view
is now drawn as a dashed outline, lettered with what hides it; one on the near side is drawn filled, as before."""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction import preview
from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.organs import ORGAN_COLORS
from pipeline.reconstruction.preview import image_position, preview_views, write_preview
from pipeline.reconstruction.render_layout import hex_rgb
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

SHAPE = (40, 40, 80)
GEOM = Geometry(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-40.0, -20.0, -20.0))
RIGHT, LEFT = (20, 20, 20), (20, 20, 60)  # k, j, i: x = -20 mm (the patient's right) and +20 mm (left)


def _scene():
    lungs = {"lung_left": sphere_mask(SHAPE, LEFT, 14), "lung_right": sphere_mask(SHAPE, RIGHT, 14)}
    views = preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in lungs.items()}, size=128)
    return views


def _hue(rgb: np.ndarray, colour: str) -> bool:
    ref = np.asarray(hex_rgb(colour))
    lit = np.asarray(rgb, dtype=float) / 255.0
    return bool(lit.max() > 0.2 and np.abs(lit / lit.max() - ref / ref.max()).max() < 0.08)


def _draw(tmp_path, monkeypatch, views, centre_kji, name="nodule 1"):
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    nodule = {name: mesh_from_mask(sphere_mask(SHAPE, centre_kji, 4), GEOM, name=name)}
    write_preview(views, tmp_path, stem="p", nodules=nodule)
    centre = GEOM.index_to_lps([[float(c) for c in centre_kji[::-1]]])[0]
    axes = figures[0].axes[:2]
    pixels = []
    for ax, view in zip(axes, ("anterior", "left")):
        col, row = np.round(image_position(centre[None], view=view, size=views.size, frame=views.frame)[0]).astype(int)
        pixels.append(np.asarray(ax.images[0].get_array())[row, col])
    texts = [[t.get_text() for t in ax.texts] for ax in axes]
    return pixels, texts


def test_a_right_lung_nodule_is_drawn_hidden_in_the_left_lateral_view(tmp_path, monkeypatch):
    views = _scene()
    (front, lateral), (front_texts, lateral_texts) = _draw(tmp_path, monkeypatch, views, RIGHT)
    assert _hue(front, ORGAN_COLORS["nodules"]), front  # the anterior view: nothing in front of it, filled
    assert not _hue(lateral, ORGAN_COLORS["nodules"]), lateral  # behind the left lung: not painted over it
    assert _hue(lateral, ORGAN_COLORS["lung_left"]), lateral
    assert "#1" in front_texts
    assert "#1 (behind left lung)" in lateral_texts, lateral_texts


def test_a_left_lung_nodule_is_drawn_filled_in_the_left_lateral_view(tmp_path, monkeypatch):
    views = _scene()
    (front, lateral), (_, lateral_texts) = _draw(tmp_path, monkeypatch, views, LEFT, name="nodule 2")
    assert _hue(front, ORGAN_COLORS["nodules"]) and _hue(lateral, ORGAN_COLORS["nodules"]), (front, lateral)
    assert "#2" in lateral_texts


def test_letters_moved_off_their_nodules_rows_are_joined_to_it(tmp_path, monkeypatch):
    """On the planning chest's left lateral view '#2 (behind left lung)' found no room beside #2 (the image's edge on
    one side, #6 on the other) and went a line up, over #6: read as #6's. Such letters are now joined to their
    nodule by a dotted line."""
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    views = _scene()
    crowd = {"nodule 1": (20, 20, 58), "nodule 2": (20, 20, 70)}  # side by side at the left lung's lateral edge
    nodules = {k: mesh_from_mask(sphere_mask(SHAPE, c, 4), GEOM, name=k) for k, c in crowd.items()}
    write_preview(views, tmp_path, stem="p", nodules=nodules)
    front = figures[0].axes[0]
    texts = {t.get_text(): t.get_position() for t in front.texts}
    centre = GEOM.index_to_lps([[70.0, 20.0, 20.0]])[0]
    col, row = image_position(centre[None], view="anterior", size=views.size, frame=views.frame)[0]
    assert abs(texts["#2"][1] - row) > 8, "the scene no longer crowds #2's letters off its rows"
    dotted = [line for line in front.lines if line.get_linestyle() == ":"]
    assert dotted, "no line joins #2's letters to it"
    xs, ys = dotted[-1].get_data()
    end = np.hypot(np.asarray(xs) - col, np.asarray(ys) - row).min()
    assert end < 8.5, (xs, ys, col, row)  # on #2's edge: 4 mm (7 pixels) from its centre
