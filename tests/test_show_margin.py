"""``show``'s texts lie beside the image, not on it: on the planning chest the score "0.999" sat over the bronchus
beside the nodule, and the legend covered the lower right of the chest. The score now lies in a margin beside the
image at its finding's height, joined to its circle by a thin line, and the legend below the image."""

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


def _body_everywhere() -> tuple[CTVolume, dict[str, np.ndarray]]:
    """Soft tissue filling every plane (anything drawn on the image lies on anatomy), a lung and a nodule in it."""
    shape = (12, 64, 64)
    arr = np.full(shape, 40, np.int16)
    lung = np.zeros(shape, bool)
    lung[:, 10:54, 8:30] = True
    arr[lung] = -850
    return CTVolume(arr, Geometry(shape=shape, spacing=(1.0, 1.0, 2.0), origin=(-32.0, -32.0, 0.0))), {"lung_right": lung}


@pytest.mark.parametrize("column", [20.0, 44.0])  # a finding on the image's left and on its right
def test_the_score_and_the_legend_lie_beside_the_image(column):
    vol, masks = _body_everywhere()
    centre = vol.index_to_lps([column, 18.0, 6.0])  # above the R and L letters
    ax = show(vol, findings=[{"center_lps": centre.tolist(), "diameter_mm": 6.0, "score": 0.99996}], recon=masks)
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    image = ax.images[0].get_window_extent(renderer)
    (score,) = [t for t in ax.texts if t.get_text() == "0.999"]
    box = score.get_window_extent(renderer)
    assert not box.overlaps(image), (box, image)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, box  # on the figure, not cut at its edge
    # at the finding's height: its row (display y) lies within the score's box
    _, y = ax.transData.transform(vol.geometry.lps_view_index(vol.lps_to_index(centre[None]))[0][:2])
    assert box.y0 - 2 <= y <= box.y1 + 2, (box, y)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(image), (legend, image)
    assert fig.bbox.y0 <= legend.y0, legend  # on the figure
    assert any(line.get_linestyle() in (":", "-") and len(line.get_xdata()) == 2 for line in ax.lines)  # score to circle
