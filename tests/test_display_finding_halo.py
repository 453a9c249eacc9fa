"""``show()`` drew a finding's red circle and its red score with nothing under them: on the grey lung and the
near-white soft tissue of the lung window the score was hard to read. Both are drawn on the dark halo of every
outline (:func:`~pipeline.reconstruction.render_layout.outline_halo`)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import patheffects
from matplotlib.patches import Ellipse

from pipeline.display import show
from pipeline.volume import CTVolume, Geometry

RED = np.array([1.0, 0x30 / 255, 0x30 / 255])


def _tissue_with_finding() -> tuple[CTVolume, dict]:
    """Soft tissue (40 HU: near white in the lung window) filling the plane, one finding in its middle."""
    geom = Geometry(shape=(20, 120, 120), spacing=(1.0, 1.0, 2.0), origin=(-60.0, -60.0, -20.0))
    arr = np.full(geom.shape, 40.0, np.float32)
    centre = geom.index_to_lps([[60.0, 60.0, 10.0]])[0]
    finding = {"center_lps": [float(v) for v in centre], "diameter_mm": 20.0, "score": 0.875}
    return CTVolume(arr, geom), finding


def _haloed(artist) -> bool:
    return any(isinstance(e, patheffects.Stroke) for e in artist.get_path_effects())


def test_shows_finding_circle_and_score_are_drawn_on_a_dark_halo():
    vol, finding = _tissue_with_finding()
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    try:
        show(vol, findings=[finding], ax=ax, k=10)
        circles = [p for p in ax.patches if isinstance(p, Ellipse)]
        scores = [t for t in ax.texts if t.get_text() == "0.875"]
        assert len(circles) == 1 and len(scores) == 1

        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255.0
        x, y = ax.transData.transform((59.5, 59.5))  # the finding's centre, in the figure's pixels
        r, c = int(round(img.shape[0] - y)), int(round(x))
        row = img[r, c : c + int(ax.bbox.width) // 3]  # rightwards from the centre, across the circle
        tissue = float(row[0].mean())
        assert tissue > 0.85, "the finding lies on soft tissue, near white in the lung window"
        red = np.nonzero(np.abs(row - RED).max(axis=-1) < 0.15)[0]
        assert red.size, "the red circle crosses the row"
        before = row[: int(red[0])].mean(axis=-1)
        assert before.min() < tissue - 0.4, ("a dark edge between the tissue and the red circle", before[-6:])

        # the score's letters: a dark rim around the red glyphs, within the text's drawn extent
        box = scores[0].get_window_extent(fig.canvas.get_renderer())
        r0, r1 = int(img.shape[0] - box.y1), int(img.shape[0] - box.y0)
        patch = img[r0 : r1 + 1, int(box.x0) : int(box.x1) + 1]
        assert (np.abs(patch - RED).max(axis=-1) < 0.15).any(), "the red score is drawn"
        assert (patch.mean(axis=-1) < 0.2).mean() > 0.1, "the score's glyphs are set off by a dark halo"
        assert _haloed(circles[0]), circles[0].get_path_effects()
        assert _haloed(scores[0]), scores[0].get_path_effects()
    finally:
        plt.close(fig)
