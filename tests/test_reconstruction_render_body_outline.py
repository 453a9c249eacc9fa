"""The body's outline in the lung-window PNGs: white on the skin's edge, it barely showed against the soft tissue the
lung window draws near white. It now has a dark halo, so it reads against bright tissue as against the air."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np

from pipeline.reconstruction.render import render_mpr
from pipeline.volume import CTVolume, Geometry


def _profile_to_outline(png: np.ndarray) -> np.ndarray:
    """The grey values from the PNG's centre (inside the body) leftwards up to the first pixel of the white outline."""
    row = png[png.shape[0] // 2, : png.shape[1] // 2 + 1, :3].mean(axis=-1)[::-1]
    white = np.nonzero(row >= 0.97)[0]
    assert white.size, "no white outline on the row"
    return row[: int(white[0]) + 1]


def test_the_body_outline_stands_out_on_bright_soft_tissue_in_the_lung_window(tmp_path):
    geom = Geometry(shape=(20, 120, 120), spacing=(1.0, 1.0, 2.0), origin=(-60.0, -60.0, -20.0))
    body = np.zeros(geom.shape, bool)
    body[:, 20:100, 20:100] = True
    arr = np.where(body, 40.0, -1000.0).astype(np.float32)  # soft tissue: near white in the lung window
    vol = CTVolume(arr, geom)
    centre = geom.index_to_lps([[60.0, 60.0, 10.0]])[0]
    for window in ("lung", "soft-tissue"):
        (path,) = render_mpr(vol, {"body": body}, tmp_path, stem=window, center_lps=centre, window=window, planes=("axial",))
        profile = _profile_to_outline(mpimg.imread(path))  # the outline is white in either window
        tissue = float(profile[0])
        if window == "lung":
            assert tissue > 0.85, tissue  # the case of the defect: tissue near white
            # between the bright tissue and the white line a dark edge sets the line off
            assert profile[1:].min() < tissue - 0.4, (tissue, profile[-8:])
        else:
            assert profile[1:].min() < tissue, (tissue, profile[-8:])
