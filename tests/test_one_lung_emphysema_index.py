"""The emphysema index (LAA-950, %) of a one-lung patient is that of the lung tissue present: the remaining lung's,
as the lungs' total volume is, and the measurements and the one_lung flag say which lung both figures cover. It was
null for these patients while the total already was the remaining lung's volume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.cli import main as ctpipe_main
from pipeline.phantom import Confounders, generate_phantom
from pipeline.reconstruction.measure import lung_measurements
from pipeline.volume import Geometry

OTHER = {"left": "right", "right": "left"}


def _plain(figure: Any) -> Any:
    """A figure's value, whether stated plainly or marked unreliable (``{"value", "reliable", "reason"}``)."""
    return figure["value"] if isinstance(figure, dict) else figure


def _lungs() -> tuple[np.ndarray, dict[str, np.ndarray], Geometry]:
    """Two 1000-voxel lungs of 1 mm voxels: the left one 10 % below -950 HU, the right one 30 %."""
    hu = np.full((10, 10, 40), 40.0, np.float32)
    left, right = np.zeros(hu.shape, bool), np.zeros(hu.shape, bool)
    left[:, :, 20:30], right[:, :, 5:15] = True, True
    hu[left], hu[right] = -850.0, -850.0
    hu[:, :1, 20:30] = -980.0  # 100 of the left lung's voxels
    hu[:, :3, 5:15] = -980.0  # 300 of the right lung's
    return hu, {"lung_left": left, "lung_right": right}, Geometry(hu.shape, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_one_lung_emphysema_index_is_the_remaining_lungs(side):
    hu, masks, geom = _lungs()
    kept = f"lung_{OTHER[side]}"
    one = lung_measurements(hu, {kept: masks[kept]}, geom, one_lung=True)
    assert one["lungs_total_volume_ml"] == one[f"{kept}_volume_ml"] == 1.0
    assert one["emphysema_index_pct"] == one[f"{kept}_emphysema_index_pct"] == {"left": 10.0, "right": 30.0}[OTHER[side]]
    assert one["lungs_total_covers"] == OTHER[side]


def test_two_lungs_and_one_lung_asked_for_keep_their_figures():
    hu, masks, geom = _lungs()
    both = lung_measurements(hu, masks, geom)
    assert both["emphysema_index_pct"] == 20.0 and both["lungs_total_volume_ml"] == 2.0
    assert both["lungs_total_covers"] == "both"
    asked = lung_measurements(hu, {"lung_left": masks["lung_left"]}, geom)  # --organs lung_left: not the lungs
    assert asked["emphysema_index_pct"] is None and asked["lungs_total_volume_ml"] is None
    assert asked["lungs_total_covers"] is None


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
def test_reconstruction_of_a_pneumonectomy_states_the_remaining_lungs_emphysema_index(side, tmp_path, capsys):
    ph = generate_phantom(
        12,
        confounders=Confounders(pneumonectomy=side, emphysema=0.2),
        n_nodules=0,
        matrix=128,
        pixel_spacing=2.0,
        slice_spacing=4.0,
    )
    CaseCache(tmp_path / "cache").write("one", ph.volume)
    args = ["reconstruct", str(tmp_path / "cache" / "one.json"), "--out", str(tmp_path / "out"), "--no-render"]
    assert ctpipe_main([*args, "--no-dicom", "--formats", "stl"]) == 0
    (path,) = (tmp_path / "out").glob("*measurements*.json")
    meas = json.loads(path.read_text())
    lungs, kept = meas["lungs"], f"lung_{OTHER[side]}"
    index = _plain(lungs["emphysema_index_pct"])
    assert index is not None and index == _plain(lungs[f"{kept}_emphysema_index_pct"]) and index > 5.0
    assert lungs["lungs_total_covers"] == OTHER[side]
    (flag,) = [f for f in meas["quality"]["flags"] if f["code"] == "one_lung"]
    assert f"total volume and emphysema index are the {OTHER[side]} lung's" in flag["message"], flag["message"]
    assert f"lungs total ({OTHER[side]} lung only) " in capsys.readouterr().out
