"""Every organ's outline in the lung-window renderings is drawn on a dark halo: the yellow bone outline on bone,
which the lung window draws near white, barely showed; the body's outline had the halo, the others not. The
MPRs and ``show()`` draw it with one helper (:func:`~pipeline.reconstruction.render_layout.outline_halo`)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest

from pipeline.display import show
from pipeline.reconstruction.organs import ORGAN_COLORS
from pipeline.reconstruction.render import render_mpr
from pipeline.volume import CTVolume, Geometry


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=float) / 255.0


def _profile_to_outline(rgb_row: np.ndarray, colour: str) -> np.ndarray:
    """The grey values along ``rgb_row`` (``[n, 3]``, from inside the organ outwards) up to the first pixel of the
    outline drawn in ``colour``."""
    near = np.abs(rgb_row - _rgb(colour)).max(axis=-1) < 0.12
    hits = np.nonzero(near)[0]
    assert hits.size, f"no {colour} outline on the row"
    return rgb_row[: int(hits[0]) + 1].mean(axis=-1)


def _bone_volume() -> tuple[CTVolume, np.ndarray]:
    """Soft tissue with a square of bone (600 HU: white in the lung window) in the middle, air around."""
    geom = Geometry(shape=(20, 120, 120), spacing=(1.0, 1.0, 2.0), origin=(-60.0, -60.0, -20.0))
    body = np.zeros(geom.shape, bool)
    body[:, 10:110, 10:110] = True
    bone = np.zeros(geom.shape, bool)
    bone[:, 35:85, 35:85] = True
    arr = np.where(bone, 600.0, np.where(body, 40.0, -1000.0)).astype(np.float32)
    return CTVolume(arr, geom), bone


def _assert_dark_edge(profile: np.ndarray) -> None:
    bone = float(profile[0])
    assert bone > 0.9, bone  # the case of the defect: bone drawn near white
    # between the white bone and the yellow line a dark edge sets the line off
    assert profile[1:-1].min() < bone - 0.4, (bone, profile[-8:])


@pytest.mark.parametrize("plane", ["axial", "coronal"])
def test_the_bone_outline_stands_out_on_white_bone_in_a_lung_window_mpr(tmp_path, plane):
    vol, bone = _bone_volume()
    centre = vol.geometry.index_to_lps([[60.0, 60.0, 10.0]])[0]
    (path,) = render_mpr(vol, {"bone": bone}, tmp_path, stem="c", center_lps=centre, window="lung", planes=(plane,))
    png = mpimg.imread(path)[..., :3]
    # the image's centre lies in the bone; leftwards from it to the bone's yellow outline
    row = png[png.shape[0] // 2, : png.shape[1] // 2 + 1][::-1]
    _assert_dark_edge(_profile_to_outline(row, ORGAN_COLORS["bone"]))


def test_show_draws_the_bone_outline_on_a_dark_halo():
    vol, bone = _bone_volume()
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    try:
        show(vol, recon={"bone": bone}, ax=ax, k=10)
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255.0
        # the data's centre (the bone's) in the figure's pixels, rows down
        x, y = ax.transData.transform((59.5, 59.5))
        r, c = int(round(img.shape[0] - y)), int(round(x))
        assert img[r, c].mean() > 0.9, "the image's centre is bone, white in the lung window"
        _assert_dark_edge(_profile_to_outline(img[r, : c + 1][::-1], ORGAN_COLORS["bone"]))
    finally:
        plt.close(fig)
