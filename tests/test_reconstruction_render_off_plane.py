"""The nodules an overview MPR's plane does not cut: on the COPDGene axial overview some ten dashed shadows and dotted
lines to their letters crossed both lungs, read as vessels and fissures. They are now marked beside the image, a
small arrowhead at the nodule's height pointing into the image with its letters in the margin, nothing drawn over
the image; only the nearest few to the plane, the others counted ("+N more")."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np

from pipeline.volume import CTVolume, Geometry
from tests._support.shapes import lps_grids


def _chest_with_nodules_off_the_axial(n: int):
    """A body (40 HU) with two lungs (-850 HU) and ``n`` 6 mm nodules in them, none within 8 mm of the axial z=0."""
    geom = Geometry(shape=(40, 100, 100), spacing=(2.0, 2.0, 2.5), origin=(-100.0, -100.0, -50.0))
    x, y, z = lps_grids(geom)
    body = (x / 80.0) ** 2 + (y / 60.0) ** 2 <= 1.0
    right = body & (((x + 40.0) / 30.0) ** 2 + (y / 40.0) ** 2 + (z / 40.0) ** 2 <= 1.0)
    left = body & (((x - 40.0) / 30.0) ** 2 + (y / 40.0) ** 2 + (z / 40.0) ** 2 <= 1.0)
    arr = np.where(body, 40.0, -1000.0).astype(np.float32)
    arr[right | left] = -850.0
    labels = np.zeros(geom.shape, np.uint16)
    for k in range(n):
        cx, cy, cz = (-40.0 if k % 2 else 40.0), -25.0 + 7.0 * k, (10.0 + 3.0 * k) * (1 if k % 3 else -1)
        labels[(x - cx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2 <= 3.0**2] = k + 1
    return CTVolume(arr, geom), {"body": body, "lung_left": left, "lung_right": right}, labels


def test_off_plane_nodules_are_marked_beside_the_image_not_over_the_lungs(tmp_path, monkeypatch):
    from pipeline.reconstruction import render
    from pipeline.reconstruction.render_nodules import OFF_PLANE_SHOWN

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    n = OFF_PLANE_SHOWN + 3
    vol, masks, labels = _chest_with_nodules_off_the_axial(n)
    (path,) = render.render_mpr(vol, masks, tmp_path, stem="o", nodules=labels, center_lps=np.zeros(3), planes=("axial",))
    ax = figures[0].axes[0]
    letters = [t.get_text() for t in ax.texts if t.get_text().startswith("#")]
    assert len(letters) == OFF_PLANE_SHOWN, letters
    nearest = sorted(range(n), key=lambda k: 10.0 + 3.0 * k)[:OFF_PLANE_SHOWN]
    assert sorted(int(t.split()[0][1:]) for t in letters) == [k + 1 for k in nearest], letters
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("off the plane" in t and "+3 more" in t for t in legend), legend
    # nothing magenta over the image itself: no shadow, no line across the lungs
    png = mpimg.imread(path)[..., :3]
    height = png.shape[0]
    (x0, y0), (x1, y1) = ax.transData.transform([[0.0, 0.0], [200.0, 200.0]])  # image mm to display pixels
    c0, c1 = sorted((int(np.ceil(x0)) + 1, int(np.floor(x1)) - 1))
    r0, r1 = sorted((height - int(np.floor(y0)) + 1, height - int(np.ceil(y1)) - 1))
    image = png[r0:r1, c0:c1]
    magenta = (image[..., 0] > 0.9) & (image[..., 1] < 0.45) & (image[..., 2] > 0.85)
    assert magenta.sum() == 0, magenta.sum()
    everywhere = (png[..., 0] > 0.9) & (png[..., 1] < 0.45) & (png[..., 2] > 0.85)
    assert everywhere.sum() > 50  # the marks and letters beside the image


def test_a_side_letter_moves_off_an_arrowhead_at_the_images_mid_height(tmp_path, monkeypatch):
    """On the planning chest's axial overview a nodule off the plane at the image's mid-height had its arrowhead
    drawn over the R (and on the COPDGene axial over the L): the side letter and the mark read as one. The letter now
    lies at the height nearest the middle clear of every arrowhead in its band, still beside the image."""
    from pipeline.reconstruction import render
    from tests._support.shapes import lps_grids

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    vol, masks, _ = _chest_with_nodules_off_the_axial(0)
    x, y, z = lps_grids(vol.geometry)
    labels = np.zeros(vol.geometry.shape, np.uint16)
    middle_y = -1.0  # the axial image's rows run y -100..98 mm: its middle
    labels[(x + 40.0) ** 2 + (y - middle_y) ** 2 + (z - 15.0) ** 2 <= 3.0**2] = 1  # the right lung, 15 mm above
    labels[(x - 40.0) ** 2 + (y - middle_y - 4.0) ** 2 + (z + 20.0) ** 2 <= 3.0**2] = 2  # the left lung, 20 mm below
    render.render_mpr(vol, masks, tmp_path, stem="o", nodules=labels, center_lps=np.zeros(3), planes=("axial",))
    ax = figures[0].axes[0]
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    image = ax.images[0].get_window_extent(renderer)
    heads = {
        line.get_marker(): line.get_window_extent(renderer)
        for line in ax.lines
        if line.get_marker() in (">", "<") and len(line.get_xdata()) == 1
    }
    assert sorted(heads) == ["<", ">"], heads  # one arrowhead each side: > on the left, < on the right
    letters = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text() in ("R", "L")}
    for letter, head in (("R", heads[">"]), ("L", heads["<"])):
        box = letters[letter]
        assert not box.overlaps(head), (letter, box, head)
        assert not box.overlaps(image), (letter, box, image)  # beside the image, in its band
        assert image.y0 < box.y0 and box.y1 < image.y1, (letter, box, image)  # within the image's height
    assert letters["R"].x1 <= image.x0 and letters["L"].x0 >= image.x1
