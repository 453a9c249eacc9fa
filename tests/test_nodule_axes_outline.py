"""A nodule's long and short axis reach its outline as a calliper on the image does, sharp corners included.

Squares, rectangles, discs and ellipses of known size, turned in the slice's plane and placed anywhere within a pixel,
on 0.7 mm and 0.98 mm pixels (LPS mm; a pixel is in the mask when its centre lies inside the shape, as a threshold
half-way between the nodule and the lung places it). Measured between pixel centres, a square's diagonal came out
0.5 to 0.7 pixel short on average (0.5 mm on 0.98 mm pixels): its corners lie beyond the corner pixels' centres.

Tolerances: a binary mask places each end of an axis only to within its pixel (a centre inside, the next one outside),
so one shape's axis may miss by up to :data:`CASE_PX` pixel; over turns and placements the error of a shape's axes
averages out to within :data:`MEAN_PX` pixel: not biased short or long by half a pixel or more, as the squares' and
rectangles' long axes were (0.5 to 0.7 pixel short). A square's short axis is its other diagonal, corner to corner and
exactly perpendicular to the long axis only: the long axis' direction, taken from pixels, is off by a degree or two,
and a chord passing a fraction of a pixel beside a right-angled corner is shorter by twice that; it is held to
:data:`SQUARE_SHORT_CASE_PX` and :data:`SQUARE_SHORT_MEAN_PX` against the diagonal (it reads 0.4 to 0.7 pixel short on
average), and to :data:`PERPENDICULAR_CASE_PX` and :data:`PERPENDICULAR_MEAN_PX` against the square's extent across
the long axis as measured."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_nodule_axial_axes import SUPINE, _axes_of, _prism

#: the most one shape's axis may miss its true length by, in pixels (each end within its pixel)
CASE_PX = 1.3
#: the most a shape's axes may be off on average over turns and placements, in pixels
MEAN_PX = 0.5
#: the same for a square's short axis, its other diagonal (see the module's docstring)
SQUARE_SHORT_CASE_PX = 2.0
SQUARE_SHORT_MEAN_PX = 0.8
TURNS_DEG = (0.0, 10.0, 25.0, 45.0, 60.0, 80.0)


def _square(side: float):
    return lambda x, y: (np.abs(x) <= side / 2) & (np.abs(y) <= side / 2)


def _rectangle(length: float, width: float):
    return lambda x, y: (np.abs(x) <= length / 2) & (np.abs(y) <= width / 2)


def _ellipse(length: float, width: float):
    return lambda x, y: (x / (length / 2)) ** 2 + (y / (width / 2)) ** 2 <= 1


def _rectangle_axes(length: float, width: float) -> tuple[float, float]:
    """A rectangle's long axis is its diagonal; the longest chord perpendicular to it runs through its centre (a
    convex, centrally symmetric shape's chords across one direction are longest there): width·diagonal/length."""
    diagonal = float(np.hypot(length, width))
    return diagonal, width * diagonal / length


SHAPES = {
    "square 8 mm": (_square(8.0), (8.0 * np.sqrt(2), 8.0 * np.sqrt(2))),
    "square 14 mm": (_square(14.0), (14.0 * np.sqrt(2), 14.0 * np.sqrt(2))),
    "rectangle 16 x 6 mm": (_rectangle(16.0, 6.0), _rectangle_axes(16.0, 6.0)),
    "rectangle 11 x 9 mm": (_rectangle(11.0, 9.0), _rectangle_axes(11.0, 9.0)),
    "disc 6 mm": (_ellipse(6.0, 6.0), (6.0, 6.0)),
    "disc 11 mm": (_ellipse(11.0, 11.0), (11.0, 11.0)),
    "ellipse 14 x 6 mm": (_ellipse(14.0, 6.0), (14.0, 6.0)),
    "ellipse 22 x 15 mm": (_ellipse(22.0, 15.0), (22.0, 15.0)),
}


def _errors_px(inside, truth: tuple[float, float], pixel: float) -> np.ndarray:
    """(long, short) errors in pixels of the shape over :data:`TURNS_DEG` and three placements within a pixel."""
    rng = np.random.default_rng(11)
    out = []
    for turn in TURNS_DEG:
        for _ in range(3):
            shift = rng.uniform(-0.5, 0.5, 2) * pixel
            g, nodule = _prism(lambda x, y, s=shift: inside(x - s[0], y - s[1]), turn, SUPINE, (pixel, pixel, 2.0))
            axes = _axes_of(g, nodule)
            out.append(((axes.long_mm - truth[0]) / pixel, (axes.short_mm - truth[1]) / pixel))
    return np.asarray(out)


@pytest.mark.parametrize("pixel", [0.7, 0.98], ids=["0.7mm", "0.98mm"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_axes_reach_the_outline_of_shapes_with_and_without_corners(name: str, pixel: float) -> None:
    inside, truth = SHAPES[name]
    errors = _errors_px(inside, truth, pixel)
    worst = np.abs(errors).max(axis=0)
    mean = errors.mean(axis=0)
    square = name.startswith("square")
    short_case, short_mean = (SQUARE_SHORT_CASE_PX, SQUARE_SHORT_MEAN_PX) if square else (CASE_PX, MEAN_PX)
    assert worst[0] <= CASE_PX, f"{name}: long axis off by up to {worst[0]:.2f} px"
    assert worst[1] <= short_case, f"{name}: short axis off by up to {worst[1]:.2f} px"
    assert abs(mean[0]) <= MEAN_PX, f"{name}: long axis off by {mean[0]:+.2f} px on average"
    assert abs(mean[1]) <= short_mean, f"{name}: short axis off by {mean[1]:+.2f} px on average"


def test_a_squares_diagonal_runs_corner_to_corner() -> None:
    """A 10 mm square on 1 mm pixels, not turned (10 x 10 pixels): the calliper spans its diagonal, 14.14 mm, from the
    outer corner of one corner pixel to that of the other; between the pixels' centres it is 12.73 mm."""
    g, nodule = _prism(_square(10.0), 0.0, SUPINE, (1.0, 1.0, 2.0))
    nodule_mask = nodule["mask"]
    assert nodule_mask.sum() == 3 * 100
    axes = _axes_of(g, nodule)
    assert axes.long_mm == pytest.approx(10 * np.sqrt(2), abs=0.05)
    # the other diagonal ends at two corners too, which the outline interpolated between pixel centres cuts (see the
    # module's docstring); the short axis is never longer than the long axis
    assert 10 * np.sqrt(2) - SQUARE_SHORT_MEAN_PX <= axes.short_mm <= axes.long_mm
    ends = np.asarray(axes.long_lps)
    centres = np.asarray(nodule["geometry"].index_to_lps(np.argwhere(nodule_mask)[:, ::-1].astype(float)))
    assert np.linalg.norm(ends[1] - ends[0]) == pytest.approx(axes.long_mm)
    # each end at a corner pixel's outer corner: half a pixel beyond its centre on both in-plane axes
    for end in ends:
        nearest = np.abs(centres[:, :2] - end[:2]).sum(axis=1).min()
        assert nearest == pytest.approx(1.0, abs=0.05)


#: squares' short axes against their extent across the long axis: the most one may miss it by, and on average, pixels
PERPENDICULAR_CASE_PX = 1.0
PERPENDICULAR_MEAN_PX = 0.4


@pytest.mark.parametrize("pixel", [0.7, 0.98], ids=["0.7mm", "0.98mm"])
def test_a_squares_short_axis_spans_the_square_across_the_long_axis(pixel: float) -> None:
    """Squares of 8, 10 and 14 mm, turned 0°, 30° and 45° and placed four ways within a pixel: the short axis (its two
    endpoints, as the SR's polyline draws it) spans the square along the line through its centre perpendicular to the
    long axis as measured, corner to corner where that line meets corners. The line where the mask, interpolated
    between pixel centres, crosses 0.5 cuts each corner (0.3 pixel along a diagonal; a pixel at the flat tip of two
    pixels a square turned 45° ends in), which left the short axis 0.6 to 1.4 pixels short."""
    errors = []
    for side in (8.0, 10.0, 14.0):
        for turn in (0.0, 30.0, 45.0):
            for placement in np.linspace(-0.45, 0.45, 4):
                shift = np.array([placement, -0.7 * placement]) * pixel
                inside = _square(side)
                g, nodule = _prism(lambda x, y, s=shift, q=inside: q(x - s[0], y - s[1]), turn, SUPINE, (pixel, pixel, 2.0))
                axes = _axes_of(g, nodule)
                ends = np.asarray(axes.short_lps)
                v = (ends[1] - ends[0])[:2] / np.linalg.norm((ends[1] - ends[0])[:2])
                a = np.radians(turn)  # v in the square's own frame: its chord through the centre is side / max(|vx|, |vy|)
                v_square = np.array([np.cos(a) * v[0] + np.sin(a) * v[1], -np.sin(a) * v[0] + np.cos(a) * v[1]])
                across = side / np.abs(v_square).max()
                errors.append((float(np.linalg.norm(ends[1] - ends[0])) - across) / pixel)
    errors_px = np.asarray(errors)
    assert np.abs(errors_px).max() <= PERPENDICULAR_CASE_PX, f"short axis off by up to {np.abs(errors_px).max():.2f} px"
    assert abs(errors_px.mean()) <= PERPENDICULAR_MEAN_PX, f"short axis off by {errors_px.mean():+.2f} px on average"
