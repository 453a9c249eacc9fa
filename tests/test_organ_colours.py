"""The organs' colours on the PNGs (and the SEG's recommended display colours, which are the same): any two organs
whose outlines can touch on a grey CT slice are told apart at a glance."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

#: Least CIEDE2000 difference between the outline colours of two organs that can touch (lungs at the anterior
#: junction line, a lung on a rib, a bronchus beside its artery, a nodule on any of them): a thin line of one beside a
#: thin line of the other must not read as the same organ.
MIN_DELTA_E = 30.0


def _lab(colour: str) -> np.ndarray:
    from skimage.color import rgb2lab

    from pipeline.reconstruction.render_layout import hex_rgb

    return rgb2lab(np.array([[hex_rgb(colour)]]))[0, 0]


def _delta_e(a: str, b: str) -> float:
    from skimage.color import deltaE_ciede2000

    return float(deltaE_ciede2000(_lab(a), _lab(b)))


def test_outline_colours_of_organs_that_touch_differ_at_a_glance():
    from pipeline.reconstruction.organs import OUTLINE_COLORS

    close = [
        (a, b, round(_delta_e(OUTLINE_COLORS[a], OUTLINE_COLORS[b]), 1))
        for a, b in itertools.combinations(OUTLINE_COLORS, 2)
        if _delta_e(OUTLINE_COLORS[a], OUTLINE_COLORS[b]) < MIN_DELTA_E
    ]
    assert not close, close


@pytest.mark.parametrize("organ", ["bone", "lung_left", "lung_right", "airway", "vessels"])
def test_an_outline_is_not_drawn_in_the_colour_of_what_it_outlines(organ):
    """Bone is white and aerated lung black on the soft-tissue window: an outline in a grey the CT shows is lost on
    it (CIEDE2000 to the nearest grey)."""
    from pipeline.reconstruction.organs import OUTLINE_COLORS

    greys = [f"#{v:02x}{v:02x}{v:02x}" for v in range(0, 256, 5)]
    assert min(_delta_e(OUTLINE_COLORS[organ], g) for g in greys) >= 20.0


def test_colours_of_other_organs_are_not_those_of_the_named_ones():
    """A segmentation bundle's heart or liver (:data:`EXTRA_COLORS`) is not drawn in a colour the legend already
    gives the vessels, bone, airway or nodules."""
    from pipeline.reconstruction.organs import EXTRA_COLORS, OUTLINE_COLORS

    close = [
        (extra, organ, round(_delta_e(extra, colour), 1))
        for extra in EXTRA_COLORS
        for organ, colour in OUTLINE_COLORS.items()
        if _delta_e(extra, colour) < 15.0
    ]
    assert not close, close


def test_seg_display_colours_are_the_pngs_outline_colours():
    from pipeline.dicom_out.codes import ORGAN_COLOURS
    from pipeline.reconstruction.organs import OUTLINE_COLORS

    for organ in ("body", "lung_left", "lung_right", "airway", "bone"):
        assert ORGAN_COLOURS[organ] == tuple(int(OUTLINE_COLORS[organ][i : i + 2], 16) for i in (1, 3, 5))
    assert ORGAN_COLOURS["nodule"] == tuple(int(OUTLINE_COLORS["nodules"][i : i + 2], 16) for i in (1, 3, 5))
