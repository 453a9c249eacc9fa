"""``show``'s orientation letters lie beside the image, none on it: A above it, P below it, R left of it and L right
of it (the radiological convention: seen from the feet, the patient's right on the image's left, anterior up), clear
of the title and the legend; the title states the display window (width and level, HU) the image is drawn in."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from pipeline.display import show
from pipeline.volume import CTVolume, Geometry

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _filled_field() -> tuple[CTVolume, dict[str, np.ndarray]]:
    """Soft tissue to every edge of the field of view (a letter on the image lies on anatomy), a lung in it."""
    shape = (10, 48, 64)
    arr = np.full(shape, 40, np.int16)
    lung = np.zeros(shape, bool)
    lung[:, 8:40, 6:28] = True
    arr[lung] = -850
    arr[:, :4, 20:44] = 400  # the sternum against the field's anterior edge
    return CTVolume(arr, Geometry(shape=shape, spacing=(0.8, 0.8, 2.0), origin=(-25.6, -19.2, 0.0))), {"lung_right": lung}


def test_the_orientation_letters_lie_around_the_image_on_none_of_it():
    vol, masks = _filled_field()
    ax = show(vol, recon=masks)
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    image = ax.images[0].get_window_extent(renderer)
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text() in ("R", "L", "A", "P")}
    assert sorted(boxes) == ["A", "L", "P", "R"]
    assert boxes["A"].y0 >= image.y1 and boxes["P"].y1 <= image.y0, (boxes["A"], boxes["P"], image)  # above, below
    assert boxes["R"].x1 <= image.x0 and boxes["L"].x0 >= image.x1, (boxes["R"], boxes["L"], image)  # left, right
    for letter in "AP":  # over the middle of the image's width
        assert boxes[letter].x0 < (image.x0 + image.x1) / 2 < boxes[letter].x1, (letter, boxes[letter], image)
    for letter in "RL":  # level with the middle of its height
        assert boxes[letter].y0 < (image.y0 + image.y1) / 2 < boxes[letter].y1, (letter, boxes[letter], image)
    title = ax.title.get_window_extent(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not boxes["A"].overlaps(title), (boxes["A"], title)
    assert not boxes["P"].overlaps(legend), (boxes["P"], legend)
    for box in boxes.values():
        assert not box.overlaps(image), (box, image)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


@pytest.mark.parametrize(
    ("window", "note"),
    [
        (None, "lung window W1500 L-600"),
        ((-160, 240), "soft-tissue window W400 L40"),
        ((-1000, 200), "window W1200 L-400"),
    ],
)
def test_the_title_states_the_window_the_image_is_drawn_in(window, note):
    vol, _ = _filled_field()
    ax = show(vol) if window is None else show(vol, window=window)
    assert note in ax.get_title()
    assert ax.images[0].get_clim() == ((-1350.0, 150.0) if window is None else window)


def test_a_scale_bar_below_the_image_gives_its_length_in_mm():
    """``show`` had no scale: a reader could not size a nodule or an airway by eye. A bar below the image, on none of
    it, is as long as its label says (image columns times the column spacing, mm)."""
    vol, masks = _filled_field()  # 64 columns of 0.8 mm: 51.2 mm wide, a 5 mm bar (an eighth or less)
    ax = show(vol, recon=masks)
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    image = ax.images[0].get_window_extent(renderer)
    (label,) = [t for t in ax.texts if t.get_text().endswith(" mm")]
    (bar,) = [line for line in ax.lines if line.get_color() == "yellow"]
    xs = bar.get_xdata()
    assert label.get_text() == "5 mm"
    assert abs((xs[1] - xs[0]) * 0.8 - 5.0) < 1e-9  # columns × mm per column
    bar_box, label_box = bar.get_window_extent(renderer), label.get_window_extent(renderer)
    for box in (bar_box, label_box):
        assert box.y1 <= image.y0, (box, image)  # below the image
        assert not box.overlaps(ax.get_legend().get_window_extent(renderer))
    p_letter = next(t for t in ax.texts if t.get_text() == "P").get_window_extent(renderer)
    assert not label_box.overlaps(p_letter) and not bar_box.overlaps(p_letter)
