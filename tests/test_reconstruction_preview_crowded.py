"""The 3-D preview's letters in a crowd of nodules: on a 128 pixel preview two '#N (behind left lung)' labels found
no free place beside their nodules and were drawn at the default spot anyway, on top of each other and running past
the image's right edge. Crowded letters now take a shorter form or another free place: never over each other, never
past the image."""

from __future__ import annotations

from itertools import combinations

from pipeline.reconstruction import preview
from pipeline.reconstruction.mesh import mesh_from_mask
from pipeline.reconstruction.preview import preview_views, write_preview
from pipeline.reconstruction.render_nodules import drawn_extent
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

SHAPE = (40, 40, 80)
GEOM = Geometry(shape=SHAPE, spacing=(1.0, 1.0, 1.0), origin=(-40.0, -20.0, -20.0))
RIGHT, LEFT = (20, 20, 20), (20, 20, 60)  # k, j, i: the patient's right and left lung


def _crowded_preview(tmp_path, monkeypatch, crowd: dict[str, tuple[int, int, int]], *, size: int = 128):
    figures = []
    monkeypatch.setattr(preview, "save_png", lambda fig, path: figures.append(fig) or path)
    lungs = {"lung_left": sphere_mask(SHAPE, LEFT, 14), "lung_right": sphere_mask(SHAPE, RIGHT, 14)}
    views = preview_views({k: mesh_from_mask(m, GEOM, name=k) for k, m in lungs.items()}, size=size)
    nodules = {k: mesh_from_mask(sphere_mask(SHAPE, c, 3), GEOM, name=k) for k, c in crowd.items()}
    write_preview(views, tmp_path, stem="p", nodules=nodules)
    return figures[0].axes[:2]


def _letters(ax) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Each nodule's letters and their extent as drawn (the view's pixels, rows down)."""
    return [(t.get_text(), drawn_extent(ax, t)) for t in ax.texts if t.get_text().startswith("#")]


def _assert_apart_and_inside(ax, size: int, count: int) -> list[str]:
    """The nodules' letters lie on the view or the bands beside it (never past them, into the other view or off the
    PNG), below its top and above its foot, over no other letters (the orientation letters included)."""
    letters = _letters(ax)
    assert len(letters) == count, letters
    x_lo, x_hi = sorted(ax.get_xlim())
    for text, (x0, y0, x1, y1) in letters:
        assert x0 >= x_lo and x1 <= x_hi, f"{text!r} runs past the view: x {x0:.1f}..{x1:.1f}, view {x_lo}..{x_hi}"
        assert y0 >= -0.5 and y1 <= size - 0.5, f"{text!r} runs past the image: y {y0:.1f}..{y1:.1f} of {size}"
    every = [(t.get_text(), drawn_extent(ax, t)) for t in ax.texts]
    for (ta, a), (tb, b) in combinations(every, 2):
        overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
        assert not overlap, f"{ta!r} {a} and {tb!r} {b} are drawn over each other"
    return [t for t, _ in letters]


def test_crowded_hidden_letters_neither_overlap_nor_run_past_the_image(tmp_path, monkeypatch):
    crowd = {"nodule 1": (20, 20, 20), "nodule 2": (20, 27, 20)}  # the right lung's, behind the left lung laterally
    _front, lateral = _crowded_preview(tmp_path, monkeypatch, crowd)
    texts = _assert_apart_and_inside(lateral, 128, 2)
    assert all(t.startswith(("#1", "#2")) and "behind" in t for t in texts), texts


def test_many_crowded_nodules_keep_their_letters_apart(tmp_path, monkeypatch):
    crowd = {f"nodule {n}": (12 + 4 * (n % 4), 14 + 4 * (n // 4), 20) for n in range(1, 9)}
    front, lateral = _crowded_preview(tmp_path, monkeypatch, crowd)
    _assert_apart_and_inside(front, 128, 8)
    _assert_apart_and_inside(lateral, 128, 8)
