"""A nodule's ``#N`` keeps clear of the lines around it: on the planning chest's #3 coronal close-up it lay over the
bone's outline beside the nodule, and on the COPDGene MIP its letters touched their own nodule's outline. The layout
now keeps every nodule's letters a clear margin from every nodule's box and from every organ's outline."""

from __future__ import annotations

import numpy as np

from pipeline.reconstruction.render_nodules import LETTER_CLEAR_PT, layout_letters, outline_pixels


def _gap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """The distance (mm) between two boxes ``x0, y0, x1, y1``; 0 where they touch or overlap."""
    dx = max(b[0] - a[2], a[0] - b[2], 0.0)
    dy = max(b[1] - a[3], a[1] - b[3], 0.0)
    return float(np.hypot(dx, dy))


def _outline_gap(box: tuple[float, float, float, float], edges: np.ndarray, mm: float) -> float:
    """The distance (mm) from a letters' box to the nearest outline pixel's box (pixels ``mm`` wide)."""
    return min(_gap(box, (c * mm, r * mm, (c + 1) * mm, (r + 1) * mm)) for r, c in np.argwhere(edges))


def test_a_cut_nodules_letters_keep_clear_of_an_organ_outline_beside_it():
    """The nodule's right side touches a bone (the planning chest's #3 against the chest wall): its letters, which went
    right of it over the bone's outline, now lie where no outline is within the margin."""
    shape, mm, mm_per_pt = (100, 100), 1.0, 0.4
    nodule = np.zeros(shape, bool)
    nodule[45:55, 40:50] = True
    bone = np.zeros(shape, bool)
    bone[30:60, 52:70] = True  # 2 mm right of the nodule, taller than its letters
    edges = outline_pixels([bone])
    (spot,) = layout_letters([(3, nodule, "solid", "#3")], mm, mm, mm_per_pt=mm_per_pt, anatomy=None, outlines=edges, band_mm=8.0)
    clear = LETTER_CLEAR_PT * mm_per_pt
    assert _outline_gap(spot.box, edges, mm) >= clear - 1e-6, spot
    assert _gap(spot.box, spot.mark) >= clear - 1e-6, spot


def test_a_small_nodules_letters_keep_a_clear_margin_from_its_outline():
    """A one-pixel nodule on a coarse MIP (COPDGene, 4.17 mm pixels): its letters lay some 2 mm from its outline, on a
    64-pixel image about 5 PNG pixels. They now keep the margin from its box, and from a neighbour's."""
    shape, mm, mm_per_pt = (64, 64), 4.17, 0.58
    marks = []
    for n, (r, c) in enumerate(((30, 40), (30, 44)), start=3):
        sl = np.zeros(shape, bool)
        sl[r, c] = True
        marks.append((n, sl, "solid", f"#{n}"))
    spots = layout_letters(marks, mm, mm, mm_per_pt=mm_per_pt)
    clear = LETTER_CLEAR_PT * mm_per_pt
    for spot in spots:
        for other in spots:
            assert _gap(spot.box, other.mark) >= clear - 1e-6, (spot, other.mark)
