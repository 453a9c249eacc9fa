"""The finding PNG's three close-ups were one image with white columns between them and white beyond the series:
bilinear smoothing spread the white some 4 pixels into each close-up's neighbouring edge, a bright band a reader takes
for pleura or chest wall, and the rows beyond the series' first or last slice were white as bone. The close-ups are
now drawn apart on dark gaps, their edges as the CT shows them, and what lies beyond the series in the flat blue-grey
of the other renderings' unscanned voxels."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.detection.figures import LUNG_WINDOW, finding_png
from pipeline.detection.findings import Finding
from pipeline.reconstruction.render_planes import OUTSIDE_SCAN_RGB
from pipeline.volume import CTVolume, Geometry

LUNG_HU = -800.0
GREY = (LUNG_HU - LUNG_WINDOW[0]) / (LUNG_WINDOW[1] - LUNG_WINDOW[0])  # its grey in the lung window


def _uniform_lung(shape=(64, 80, 80)) -> CTVolume:
    return CTVolume(np.full(shape, LUNG_HU, np.float32), Geometry(shape=shape, spacing=(0.8, 0.8, 1.0), origin=(0.0, 0.0, 0.0)))


def _finding(vol: CTVolume, ijk: tuple[int, int, int]) -> Finding:
    c = vol.geometry.index_to_lps(np.array([ijk], float))[0]
    return Finding(
        center_lps=tuple(c),
        box_min_lps=tuple(c - 2.0),
        box_max_lps=tuple(c + 2.0),
        diameter_mm=4.0,
        score=0.9,
        voxel_ijk=ijk,
        slice_number=ijk[2] + 1,
    )


def _close_up_pixels(monkeypatch, vol: CTVolume, f: Finding) -> np.ndarray:
    """The PNG's pixels (RGB, 0..1) over the close-ups' axes, as drawn."""
    import matplotlib.figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    found: list[np.ndarray] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        rgb = np.asarray(canvas.buffer_rgba())[:, :, :3] / 255.0
        box = fig.axes[2].get_window_extent()  # the close-ups, pixels from the lower left
        height = rgb.shape[0]
        found.append(rgb[int(height - box.y1) + 1 : int(height - box.y0) - 1, int(box.x0) + 1 : int(box.x1) - 1])
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    finding_png(vol, f)
    return found[0]


def test_no_bright_band_at_the_close_ups_edges(monkeypatch):
    vol = _uniform_lung()
    pixels = _close_up_pixels(monkeypatch, vol, _finding(vol, (40, 40, 32)))
    rows = pixels.shape[0]
    for r in (rows // 4, 3 * rows // 4):  # above and below the side letters, across the three close-ups and the gaps
        grey = pixels[r].mean(axis=1)
        drawn = np.nonzero(np.abs(grey - GREY) < 0.02)[0]
        assert drawn.size > pixels.shape[1] // 2, "the close-ups are not drawn in the lung window's grey"
        between = grey[drawn[0] : drawn[-1] + 1]
        assert between.max() < GREY + 0.05, (
            f"row {r}: a band up to grey {between.max():.2f} where the lung is {GREY:.2f}, "
            f"at columns {np.nonzero(between > GREY + 0.05)[0][:12].tolist()}"
        )


def test_what_lies_beyond_the_series_is_drawn_as_not_scanned_not_white(monkeypatch):
    vol = _uniform_lung()
    top = vol.geometry.size_ijk[2] - 1
    pixels = _close_up_pixels(monkeypatch, vol, _finding(vol, (40, 40, top - 5)))  # 5 mm below the top slice
    upper = pixels[: pixels.shape[0] // 5].reshape(-1, 3)  # the coronal's and sagittal's rows above the series
    white = np.all(upper > 0.9, axis=1).mean()
    unscanned = np.all(np.abs(upper - np.array(OUTSIDE_SCAN_RGB)) < 0.03, axis=1).mean()
    assert white < 0.01, f"{white:.0%} of the close-ups' upper rows are white, as bone is in the lung window"
    assert unscanned > 0.3, f"only {unscanned:.0%} of the upper rows are drawn as not scanned {OUTSIDE_SCAN_RGB}"


@pytest.mark.parametrize("plane", [0, 1, 2])
def test_each_close_up_keeps_its_place_in_the_strip(monkeypatch, plane):
    """Each image spans its own columns of the strip (the close-ups' pixels, side by side, the letters' bands
    between them)."""
    import matplotlib.figure

    from pipeline.detection.figures import CLOSE_UP_BAND_PX, CLOSE_UP_PIXELS

    spans: list[list[tuple[float, float, float, float]]] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        spans.append([tuple(im.get_extent()) for im in fig.axes[2].images])
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _uniform_lung()
    finding_png(vol, _finding(vol, (40, 40, 32)))
    x0 = plane * (CLOSE_UP_PIXELS + 2 * CLOSE_UP_BAND_PX)  # each with the bands of its letters beside it
    assert spans[0][plane] == pytest.approx((x0 - 0.5, x0 + CLOSE_UP_PIXELS - 0.5, CLOSE_UP_PIXELS - 0.5, -0.5))


def test_the_close_ups_letters_lie_beside_them_not_on_the_lung(monkeypatch):
    """Each close-up's R/L, A/P, S/I letters lay on its image's edges, over the lung, pleura and vessels a reader looks
    at there: they now lie in the bands beside, above and below it, on no close-up, facing their own image's edge."""
    import matplotlib.figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    found: list[tuple[list, list]] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        FigureCanvasAgg(fig).draw()
        strip = fig.axes[2]
        letters = [(t.get_text(), t.get_window_extent()) for t in strip.texts if len(t.get_text()) == 1]
        found.append((letters, [im.get_window_extent() for im in strip.images]))
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _uniform_lung()
    finding_png(vol, _finding(vol, (40, 40, 32)))
    ((letters, images),) = found
    assert len(letters) == 12 and len(images) == 3
    for text, box in letters:
        for n, im in enumerate(images):
            on = box.x0 < im.x1 and im.x0 < box.x1 and box.y0 < im.y1 and im.y0 < box.y1
            assert not on, f"the letter {text!r} ({box}) lies on close-up {n} ({im})"
    for n, im in enumerate(images):  # four letters face each close-up's edges, within a letter's width of them
        near = [
            t for t, b in letters if im.x0 - 20 < (b.x0 + b.x1) / 2 < im.x1 + 20 and im.y0 - 20 < (b.y0 + b.y1) / 2 < im.y1 + 20
        ]
        assert len(near) >= 4, (n, near)


def test_the_slice_and_mip_letters_lie_beside_the_images(monkeypatch):
    """The slice's and the MIP's R, L, A and P lay on the images' edges: on a chest the image is filled by (the
    COPDGene chest, 64 pixels across) over the arms and the chest wall. They now lie in bands around each image."""
    import matplotlib.figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    found: list[list[tuple[str, object, object]]] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        FigureCanvasAgg(fig).draw()
        for ax in fig.axes[:2]:  # the slice and the MIP
            image = ax.images[0].get_window_extent()
            found.append([(t.get_text(), t.get_window_extent(), image) for t in ax.texts])
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    vol = _uniform_lung((48, 40, 64))  # wider than deep, as a chest: bands of one width on every side
    finding_png(vol, _finding(vol, (32, 20, 24)))
    assert len(found) == 2
    for letters in found:
        assert sorted(t for t, _, _ in letters if not t.endswith(" mm")) == ["A", "L", "P", "R"]  # and the scale's
        for text, box, im in letters:
            on = box.x0 < im.x1 and im.x0 < box.x1 and box.y0 < im.y1 and im.y0 < box.y1
            assert not on, f"the letter {text!r} ({box}) lies on the image ({im})"
            assert im.x0 - 25 < (box.x0 + box.x1) / 2 < im.x1 + 25 and im.y0 - 25 < (box.y0 + box.y1) / 2 < im.y1 + 25
