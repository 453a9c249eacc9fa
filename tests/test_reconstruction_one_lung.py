"""One lung: after a pneumonectomy the lung segmentation finds the remaining lung, whole, under its own side (also
where it crosses the midline), and says one side (``lungs = "one_side"``), never "absent"; a lung collapsed under
a large effusion is still found, small, on its side."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.phantom import Confounders, generate_phantom
from pipeline.reconstruction.segment import segment_organs
from tests._support.shapes import dice

GRID = dict(matrix=128, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0)
OTHER = {"left": "right", "right": "left"}
MIN_DICE = 0.95


def _ml(ph, mask) -> float:
    return float(np.count_nonzero(mask)) * float(np.prod(ph.volume.geometry.spacing)) / 1000.0


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("side", ["left", "right"])
def test_pneumonectomy_gives_one_whole_lung_on_its_own_side(side, seed):
    ph = generate_phantom(seed, confounders=Confounders(table="curved", pneumonectomy=side), **GRID)
    seg = segment_organs(ph.volume, organs=("lung_left", "lung_right", "airway"), device="cpu")
    kept, gone = f"lung_{OTHER[side]}", f"lung_{side}"
    assert seg.info["lungs"] == "one_side", seg.info
    assert gone not in seg.masks, f"{_ml(ph, seg.masks[gone]):.2f} mL labelled the removed {side} lung"
    assert dice(seg.masks[kept], ph.masks[kept]) >= MIN_DICE
    x = np.broadcast_to(ph.volume.geometry.lps_coordinate(0), ph.volume.shape)
    across = ph.masks[kept] & ((x > 0) if side == "left" else (x < 0))
    assert _ml(ph, seg.masks[kept] & across) >= 0.9 * _ml(ph, across)  # the part across the midline stays with it
    assert "no lung" not in str(seg.errors.get(kept, ""))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_lung_collapsed_under_an_effusion_is_found_small_on_its_side(side):
    ph = generate_phantom(21, confounders=Confounders(table="curved", collapsed_lung=side), **GRID)
    seg = segment_organs(ph.volume, organs=("lung_left", "lung_right", "airway"), device="cpu")
    assert seg.info["lungs"] == "found", seg.info
    for name in ("lung_left", "lung_right"):
        assert dice(seg.masks[name], ph.masks[name]) >= MIN_DICE, name
    assert not (seg.masks[f"lung_{side}"] & ph.masks["effusion"]).any()


def shrunk_remnant(ph, side: str, keep: float):
    """``ph``'s volume with its collapsed ``side`` lung cut to the ``keep`` share of it nearest its centre (the rest
    fluid, 10 HU), and the remnant's mask: a lung collapsed further than the phantom draws it."""
    from pipeline.volume import CTVolume

    small = ph.masks[f"lung_{side}"]
    k, j, i = np.nonzero(small)
    spacing_kji = np.asarray(ph.volume.geometry.spacing)[::-1]
    d = np.linalg.norm((np.stack([k, j, i], 1) - [k.mean(), j.mean(), i.mean()]) * spacing_kji, axis=1)
    cut = d > np.quantile(d, keep)
    hu = ph.volume.array.copy()
    hu[k[cut], j[cut], i[cut]] = 10.0
    remnant = small.copy()
    remnant[k[cut], j[cut], i[cut]] = False
    return CTVolume(hu, ph.volume.geometry, metadata=ph.volume.metadata), remnant


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_lung_collapsed_to_a_few_percent_of_the_other_is_still_a_lung(side):
    """A remnant of about 5 % of the other lung's volume, level with the hilum, is that side's lung, not nothing."""
    ph = generate_phantom(21, confounders=Confounders(table="curved", bowel_gas=True, collapsed_lung=side), **GRID)
    volume, remnant = shrunk_remnant(ph, side, 0.25)
    other = ph.masks[f"lung_{OTHER[side]}"]
    assert 0.03 < remnant.sum() / other.sum() < 0.08
    seg = segment_organs(volume, organs=("lung_left", "lung_right", "airway"), device="cpu")
    assert seg.info["lungs"] == "found", seg.info
    assert dice(seg.masks[f"lung_{side}"], remnant) >= 0.85
    assert dice(seg.masks[f"lung_{OTHER[side]}"], other) >= MIN_DICE
    assert not ((seg.masks[f"lung_{side}"] | seg.masks[f"lung_{OTHER[side]}"]) & ph.masks["bowel_gas"]).any()
