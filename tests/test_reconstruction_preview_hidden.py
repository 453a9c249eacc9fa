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


def _drawn_boxes(ax) -> list[tuple[str, float, float, float, float]]:
    """Each nodule's letters as drawn (the renderer's extent of the text), in the view's pixels: x0, y0, x1, y1."""
    renderer = ax.figure._get_renderer()
    to_data = ax.transData.inverted()
    boxes = []
    for t in ax.texts:
        if t.get_text().startswith("#"):
            bb = t.get_window_extent(renderer)
            (a, b), (c, d) = to_data.transform([[bb.x0, bb.y0], [bb.x1, bb.y1]])
            boxes.append((t.get_text(), min(a, c), min(b, d), max(a, c), max(b, d)))
    return boxes


def test_the_dotted_line_starts_at_the_drawn_letters_of_the_lateral_view(tmp_path, monkeypatch):
    """On the planning chest's left lateral view #2's dotted line started at the edge of an estimated box around
    '#2 (behind left lung)', wider than the drawn text: the line began some 19 pixels beyond the visible letters. It
    now starts on the text as drawn."""
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    lungs = {"lung_left": sphere_mask(SHAPE, LEFT, 14), "lung_right": sphere_mask(SHAPE, RIGHT, 14)}
    views = preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in lungs.items()}, size=256)
    crowd = {"nodule 6": (20, 20, 20), "nodule 2": (20, 28, 20)}  # the right lung's, side by side from the left
    nodules = {k: mesh_from_mask(sphere_mask(SHAPE, c, 3), GEOM, name=k) for k, c in crowd.items()}
    write_preview(views, tmp_path, stem="p", nodules=nodules)
    lateral = figures[0].axes[1]
    boxes = _drawn_boxes(lateral)
    assert {b[0] for b in boxes} == {"#6 (behind left lung)", "#2 (behind left lung)"}, boxes
    dotted = [line for line in lateral.lines if line.get_linestyle() == ":"]
    assert dotted, "the scene no longer crowds a nodule's letters off its rows"
    for line in dotted:
        xs, ys = line.get_data()
        x, y = float(xs[0]), float(ys[0])  # where the line leaves the letters
        gap = min(np.hypot(max(x0 - x, 0.0, x - x1), max(y0 - y, 0.0, y - y1)) for _, x0, y0, x1, y1 in boxes)
        assert gap < 1.0, (f"the line starts {gap:.1f} pixels from the drawn letters", (x, y), boxes)
