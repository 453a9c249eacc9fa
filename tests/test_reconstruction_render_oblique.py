"""Renderings of an oblique grid (a gantry-tilt corrected series, an oblique acquisition): true patient-axis planes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import ndimage

from pipeline.reconstruction.render import render_mip, render_mpr
from pipeline.volume import CTVolume
from tests._support.shapes import lps_grids, tilted_volume

#: Markers (LPS mm): M1 and M2 share z (one axial plane), M1 and M3 share x (one sagittal), M2 and M3 share y (one
#: coronal); each pair lies far apart along the other two axes, so a plane turned 15° misses one of them.
M1, M2, M3 = np.array([-20.0, -25.0, 20.0]), np.array([25.0, 30.0, 20.0]), np.array([-20.0, 30.0, -25.0])
#: Image mm per mm of LPS x, y, z along an image's (columns, rows): right on the image left, superior at the top.
IMAGE_AXES = {"axial": ((0, 1), (1, 1)), "coronal": ((0, 1), (2, -1)), "sagittal": ((1, 1), (2, -1))}


def _tilted_volume(tilt_deg: float) -> CTVolume:
    """Soft tissue on a grid turned ``tilt_deg`` about L-R (a gantry tilt), with bone balls (r 5 mm) at M1, M2, M3."""
    return tilted_volume(tilt_deg, [M1, M2, M3])


def _saved_figures(monkeypatch) -> list:
    from pipeline.reconstruction import render

    figures: list = []
    save = render.save_png
    monkeypatch.setattr(render, "save_png", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    return figures


def _markers_mm(ax) -> list[np.ndarray]:
    """The bright balls' centres on the image of ``ax`` (image mm: column, row), left to right."""
    image = ax.images[0]
    arr = np.asarray(image.get_array())
    x0, x1, y1, y0 = image.get_extent()
    labels, n = ndimage.label(arr > 600)
    centres = ndimage.center_of_mass(arr > 600, labels, range(1, n + 1))
    sizes = ndimage.sum(arr > 600, labels, range(1, n + 1))
    px = ((x1 - x0) / arr.shape[1], (y1 - y0) / arr.shape[0])
    out = [np.array([(c + 0.5) * px[0], (r + 0.5) * px[1]]) for (r, c), s in zip(centres, sizes) if s >= 4]
    return sorted(out, key=lambda p: p[0])


def _check(ax, plane: str, a: np.ndarray, b: np.ndarray) -> None:
    """Both markers ``a`` and ``b`` (LPS mm) on ``plane``'s image, as far apart and on the sides its letters say, and
    the plane where its title says."""
    found = _markers_mm(ax)
    assert len(found) == 2, (ax.get_title(), found)
    (cx, csign), (rx, rsign) = IMAGE_AXES[plane]
    want = np.array([(b - a)[cx] * csign, (b - a)[rx] * rsign])
    first, second = (found[0], found[1]) if want[0] > 0 else (found[1], found[0])
    np.testing.assert_allclose(second - first, want, atol=3.0, err_msg=ax.get_title())
    fixed = {"axial": 2, "coronal": 1, "sagittal": 0}[plane]
    at = re.search(r"at ([xyz])=(-?[\d.]+) mm", ax.get_title())
    assert at and at.group(1) == "xyz"[fixed] and float(at.group(2)) == pytest.approx(a[fixed], abs=1.0), ax.get_title()


@pytest.mark.parametrize("tilt_deg", [15.0, -20.0])
def test_oblique_grids_mprs_show_true_patient_planes_where_their_letters_say(tmp_path, monkeypatch, tilt_deg):
    """A gantry-tilt corrected series' grid is turned 15° about L-R: its MPRs were drawn in the grid's frame, yet
    labelled "axial at z=..." and lettered S/I/A/P, the spine leaning 15° on a sagittal labelled superior-up. The
    MPRs and MIPs are now resampled to patient axes (LPS): each marker lies where the letters and the title say."""
    figures = _saved_figures(monkeypatch)
    vol = _tilted_volume(tilt_deg)
    render_mpr(vol, {}, tmp_path, stem="a", center_lps=M1)  # axial z=20 (M1, M2), sagittal x=-20 (M1, M3)
    render_mpr(vol, {}, tmp_path, stem="b", center_lps=M2)  # coronal y=30 (M2, M3)
    axial, _coronal, sagittal, _axial, coronal, _sagittal = (fig.axes[0] for fig in figures)
    _check(axial, "axial", M1, M2)
    _check(sagittal, "sagittal", M1, M3)
    _check(coronal, "coronal", M3, M2)
    for ax in (axial, sagittal, coronal):
        assert "resampled to patient axes" in ax.get_title(), ax.get_title()
    lungs = np.zeros(vol.shape, bool)
    x, y, z = lps_grids(vol.geometry)
    lungs[(z > 12) & (z < 28)] = True
    figures.clear()
    render_mip(vol, tmp_path, stem="m", lung_mask=lungs, n_slabs=1, slab_mm=6.0)  # the slab z 17..23 holds M1, M2
    (mip,) = (fig.axes[0] for fig in figures)
    found = _markers_mm(mip)
    assert len(found) == 2, (mip.get_title(), found)
    np.testing.assert_allclose(found[1] - found[0], (M2 - M1)[:2], atol=3.0, err_msg=mip.get_title())
