"""The finding PNG of a tilt-corrected series: its slice and MIP are the scanner's tilted image planes, and its MIP
slab is as thick in mm as the untilted scan's.

The slice was titled and lettered as a straight axial plane, though it leans 15° off it; and the ±5 mm slab, rounded
on the tilted grid's 1.93 mm slice spacing, held 7 slices (13.5 mm) where the untilted scan's 2 mm slices gave 5
(10 mm).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.detection.figures import axial_view, finding_png
from pipeline.detection.findings import Finding
from pipeline.ingest import load_series
from tests.test_detection_figures import _texts_outside_the_figure
from tests.test_gantry_tilt_detector_lungs import _write


def _finding(vol) -> Finding:
    ijk = (vol.shape[2] // 2, vol.shape[1] // 2, vol.shape[0] // 2)
    c = vol.geometry.index_to_lps(np.array([ijk], dtype=np.float64))[0]
    return Finding(
        center_lps=tuple(c),
        box_min_lps=tuple(c - 3.0),
        box_max_lps=tuple(c + 3.0),
        diameter_mm=6.0,
        score=0.9,
        voxel_ijk=ijk,
        slice_number=ijk[2] + 1,
    )


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tilt_png")
    straight = load_series(_write(tmp / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    return straight, tilted


def _titles(monkeypatch, vol) -> list[str]:
    import matplotlib.figure

    titles: list[str] = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        titles.extend(ax.get_title() for ax in fig.axes[:2])  # the slice and the MIP
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    finding_png(vol, _finding(vol))
    return titles


def test_the_mip_slab_is_as_thick_in_mm_as_the_untilted_scans(series):
    straight, tilted = series
    assert tilted.geometry.spacing_lps()[2] == pytest.approx(2.0 * np.cos(np.radians(15.0)), abs=1e-3)
    thickness = []
    for vol in (straight, tilted):
        _, _, n_slab, _ = axial_view(vol, _finding(vol))
        thickness.append(n_slab * vol.geometry.spacing_lps()[2])
    assert thickness[0] == pytest.approx(10.0)  # the untilted scan's: 5 slices of 2 mm, as before
    assert thickness[1] == pytest.approx(thickness[0], abs=0.5), thickness


def test_the_slice_of_a_tilted_series_is_titled_as_the_scanners_tilted_plane(series, monkeypatch):
    straight, tilted = series
    plain = _titles(monkeypatch, straight)
    f = _finding(straight)
    assert plain[0] == f"slice {f.slice_number} (k={f.voxel_ijk[2]}), lung window W1500 L-600"
    assert plain[1] == "MIP 5 slices (10 mm), lung window W1500 L-600"
    assert "tilt" not in " ".join(plain)
    slice_title, mip_title = _titles(monkeypatch, tilted)[-2:]
    assert "image plane" in slice_title and "tilted 15.0°" in slice_title, slice_title
    assert "tilted" in mip_title and "mm" in mip_title, mip_title


def test_the_tilted_planes_titles_fit_the_png(series, monkeypatch):
    _, tilted = series
    outside = _texts_outside_the_figure(monkeypatch, lambda: finding_png(tilted, _finding(tilted), footer="model m"))
    assert outside == [], outside
