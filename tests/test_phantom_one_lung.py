"""Phantoms with one lung: a pneumonectomy (either side, fluid or soft tissue in the empty hemithorax) and a lung
collapsed under a large effusion. The truth keeps each lung on its own side wherever in x it lies."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import PhantomError
from pipeline.phantom import Confounders, generate_phantom

SMALL = dict(matrix=112, pixel_spacing=2.0, slice_spacing=4.0, noise_hu=10.0)
OTHER = {"left": "right", "right": "left"}


def _x(ph):
    """LPS x (mm) of every voxel ``[k, j, i]``."""
    return np.broadcast_to(ph.volume.geometry.lps_coordinate(0), ph.volume.shape)


def _ml(ph, mask) -> float:
    return float(np.count_nonzero(mask)) * float(np.prod(ph.volume.geometry.spacing)) / 1000.0


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("fill", ["fluid", "soft_tissue"])
def test_pneumonectomy_leaves_one_lung_across_the_midline_and_fills_the_other_side(side, fill):
    plain = generate_phantom(21, confounders=Confounders(table="curved"), n_nodules=0, **SMALL)
    ph = generate_phantom(
        21, confounders=Confounders(table="curved", pneumonectomy=side, pneumonectomy_fill=fill), n_nodules=0, **SMALL
    )
    kept, gone = f"lung_{OTHER[side]}", f"lung_{side}"
    assert not ph.masks[gone].any()
    assert ph.truth["lung_status"][gone] == "absent" and ph.truth["lung_status"][kept] == "complete"
    # the remaining lung is hyperexpanded: larger than it was, and part of it lies across the midline
    assert _ml(ph, ph.masks[kept]) > 1.15 * _ml(plain, plain.masks[kept])
    x = _x(ph)
    across = ph.masks[kept] & ((x > 0) if side == "left" else (x < 0))
    assert _ml(ph, across) >= 10.0
    assert ph.truth["lung_across_midline_ml"] == pytest.approx(_ml(ph, across), abs=0.5)
    # the empty hemithorax holds fluid (0..30 HU) or soft tissue, not air
    t = ph.truth["pneumonectomy"]
    assert t["side"] == side and t["fill"] == fill and t["space_ml"] > 100.0
    assert (0.0 <= t["fill_hu"] <= 30.0) if fill == "fluid" else (30.0 < t["fill_hu"] <= 60.0)
    hu = ph.volume.array
    sgn = 1.0 if side == "left" else -1.0
    region = ph.masks["body"] & (sgn * x > 60.0) & (np.abs(hu - t["fill_hu"]) < 40.0)
    assert _ml(ph, region) > 0.5 * t["space_ml"]
    # the mediastinum moved towards the empty side: the heart's soft tissue lies there, the trachea bends there
    air = ph.masks["airway"]
    trachea_x = [float(x[k][air[k]].mean()) for k in range(air.shape[0]) if air[k].any()]
    assert max(sgn * v for v in trachea_x) > 5.0, trachea_x
    # no airway or vessel of the removed lung stays on its side beyond the mediastinum
    assert not (ph.masks["vessels"] & (sgn * x > 60.0)).any()


@pytest.mark.parametrize("side", ["left", "right"])
def test_nodules_of_the_remaining_lung_keep_its_side_across_the_midline(side):
    ph = generate_phantom(23, confounders=Confounders(pneumonectomy=side), n_nodules=8, nodule_diameter_mm=(6.0, 10.0), **SMALL)
    kept = f"lung_{OTHER[side]}"
    assert all(n.lung == kept for n in ph.nodules), [(n.lung, n.center_lps) for n in ph.nodules]
    assert ph.nodules and not ph.masks[f"lung_{side}"].any()
    for n in range(1, len(ph.nodules) + 1):
        assert ph.masks[kept][ph.nodule_labels == n].any()


def test_a_nodule_across_the_midline_is_labelled_with_its_lung_not_its_x():
    """Many seeds: at least one nodule lands in the part of the remaining right lung that crosses to x > 0."""
    crossing = []
    for seed in range(30, 36):
        ph = generate_phantom(
            seed, confounders=Confounders(pneumonectomy="left"), n_nodules=6, nodule_diameter_mm=(5.0, 8.0), **SMALL
        )
        crossing += [n for n in ph.nodules if n.center_lps[0] > 0]
        if crossing:
            break
    assert crossing, "no nodule placed across the midline in six seeds"
    assert all(n.lung == "lung_right" for n in crossing)


@pytest.mark.parametrize("side", ["left", "right"])
def test_collapsed_lung_is_small_and_beside_a_large_effusion(side):
    plain = generate_phantom(21, confounders=Confounders(), n_nodules=0, **SMALL)
    ph = generate_phantom(21, confounders=Confounders(collapsed_lung=side), n_nodules=0, **SMALL)
    small, other = f"lung_{side}", f"lung_{OTHER[side]}"
    small_ml, before = _ml(ph, ph.masks[small]), _ml(plain, plain.masks[small])
    assert 0.1 * before < small_ml < 0.35 * before
    assert _ml(ph, ph.masks[other]) > 0.75 * _ml(plain, plain.masks[other])  # pushed on by the mediastinum
    t = ph.truth["collapsed_lung"]
    assert t["side"] == side and t["effusion_ml"] > 2.0 * small_ml
    assert t["aerated_ml"] == pytest.approx(small_ml, abs=0.5)
    eff = ph.masks["effusion"]
    x = _x(ph)
    assert not (eff & ((x > 0) if side == "right" else (x < 0)) & (np.abs(x) > 40.0)).any()
    assert not (eff & (ph.masks[small] | ph.masks[other])).any()
    assert ph.masks["atelectasis"].any() and not (ph.masks["atelectasis"] & ph.masks[small]).any()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(pneumonectomy="both"), ["pneumonectomy", "left", "right"]),
        (dict(pneumonectomy_fill="air"), ["pneumonectomy_fill", "fluid", "soft_tissue"]),
        (dict(collapsed_lung="yes"), ["collapsed_lung", "left"]),
        (dict(pneumonectomy="left", effusion="left"), ["effusion", "pneumonectomy", "remaining"]),
        (dict(pneumonectomy="left", collapsed_lung="right"), ["collapsed_lung", "pneumonectomy"]),
    ],
)
def test_bad_one_lung_options_are_refused(kwargs, words):
    with pytest.raises(PhantomError) as info:
        Confounders(**kwargs)
    text = str(info.value)
    assert "Fix:" in text
    for w in words:
        assert w in text, (w, text)


def test_one_lung_options_round_trip_and_leave_other_phantoms_alone():
    c = Confounders(pneumonectomy="right", pneumonectomy_fill="soft_tissue")
    assert Confounders.from_json(c.to_json()) == c
    a = generate_phantom(5, confounders=Confounders(effusion="left"), n_nodules=2, **SMALL)
    b = generate_phantom(5, confounders=Confounders(effusion="left", pneumonectomy="none"), n_nodules=2, **SMALL)
    assert np.array_equal(a.volume.array, b.volume.array)
