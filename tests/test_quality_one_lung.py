"""Quality flags of a case with one lung: ``one_lung`` (naming the lung there and the one missing), never "no lungs"
nor an imbalance of two lungs; a lung collapsed under an effusion is an imbalance of two lungs."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeline.phantom import Confounders, generate_phantom
from pipeline.reconstruction import reconstruct
from pipeline.reconstruction.quality import FLAGS, QualityReport, assess_quality

GRID = dict(matrix=128, pixel_spacing=2.0, slice_spacing=4.0)
OTHER = {"left": "right", "right": "left"}


def _quality(ph):
    return assess_quality(ph.volume.array, ph.volume.geometry, ph.masks, metadata=ph.volume.metadata)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("coverage", ["full", "apices_cut"])
def test_a_pneumonectomy_is_one_lung_not_absent_lungs_nor_an_imbalance(side, coverage):
    ph = generate_phantom(11, confounders=Confounders(pneumonectomy=side, coverage=coverage), n_nodules=0, **GRID)
    q = _quality(ph)
    assert q.has("one_lung") and not q.has("lungs_absent") and not q.has("lung_imbalance"), q.codes
    assert q.lung_coverage == ("complete" if coverage == "full" else "partial")
    (flag,) = [f for f in q.flags if f.code == "one_lung"]
    assert flag.severity == "warning"
    assert f"{OTHER[side]} lung" in flag.message and f"no {side} lung" in flag.message
    assert f"{side} pneumonectomy" in flag.message
    assert flag.side == side  # the side missing, for the SR and the report to name
    assert not flag.beyond_view  # the body is whole on that side: the lung is absent from the images, not cut off
    assert flag.to_json()["side"] == side and QualityReport.from_json(q.to_json()).flags == q.flags
    assert len(FLAGS["one_lung"][1]) <= 64  # the SR codes the fixed sentence


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_lung_the_field_of_view_cuts_off_is_one_lung_beyond_the_field_of_view(side):
    """Both lungs in the patient, the images cut off at the midline: the lung on the cut side is not in the images, and
    the body meets the image edge on that side, so the flag says that side lies beyond the field of view (the SR then
    states no "Absent" lung) and its sentence says so."""
    ph = generate_phantom(11, n_nodules=0, **GRID)
    g = ph.volume.geometry
    other = ph.masks[f"lung_{OTHER[side]}"]
    columns = np.flatnonzero(other.any(axis=(0, 1)))
    lung = np.flatnonzero(ph.masks[f"lung_{side}"].any(axis=(0, 1)))
    # keep the columns of the other lung and the mediastinum, up to (not into) the cut side's lung
    lo, hi = (
        (int(columns.min()) - 4, int(lung.min())) if lung.min() > columns.max() else (int(lung.max()) + 1, int(columns.max()) + 5)
    )
    crop = (slice(None), slice(None), slice(max(lo, 0), min(hi, g.shape[2])))
    cropped = g.cropped([crop[2].start, 0, 0], [crop[2].stop, g.shape[1], g.shape[0]])
    masks = {name: np.ascontiguousarray(m[crop]) for name, m in ph.masks.items()}
    assert not masks[f"lung_{side}"].any() and masks[f"lung_{OTHER[side]}"].any()
    q = assess_quality(np.ascontiguousarray(ph.volume.array[crop]), cropped, masks, metadata=ph.volume.metadata)
    (flag,) = [f for f in q.flags if f.code == "one_lung"]
    assert flag.side == side and flag.beyond_view, flag
    assert "field of view" in flag.message and "pneumonectomy" not in flag.message
    assert flag.sentence == f"one lung in the field of view: the {side} side is cut off" and len(flag.sentence) <= 64
    assert flag.to_json()["beyond_field_of_view"] is True and QualityReport.from_json(q.to_json()).flags == q.flags


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_collapsed_lung_is_an_imbalance_of_two_lungs(side):
    ph = generate_phantom(21, confounders=Confounders(collapsed_lung=side), n_nodules=0, **GRID)
    q = _quality(ph)
    assert q.has("lung_imbalance") and not q.has("one_lung"), q.codes


@pytest.mark.parametrize("side", ["left", "right"])
def test_reconstruction_of_a_pneumonectomy_states_one_lung_and_its_volume(side, tmp_path, caplog):
    """One fact, one place: the missing lung is the one_lung flag (a warning naming the side), not also an error entry
    of the measurements JSON nor a WARNING in the log."""
    ph = generate_phantom(12, confounders=Confounders(table="curved", pneumonectomy=side), n_nodules=0, **GRID)
    with caplog.at_level(logging.INFO):
        rec = reconstruct(ph.volume, out_dir=tmp_path, device="cpu", render=False, mesh_formats=())
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "lung" in r.getMessage()]
    assert not warned, warned
    assert f"lung_{side}" not in rec.errors, rec.errors
    kept = f"lung_{OTHER[side]}"
    assert rec.quality is not None and rec.quality.has("one_lung") and not rec.quality.has("lungs_absent")
    (path,) = rec.files["measurements"]
    meas = json.loads(path.read_text())
    (flag,) = [f for f in meas["quality"]["flags"] if f["code"] == "one_lung"]
    assert flag["severity"] == "warning" and flag["side"] == side
    assert not any("lung" in key for key in meas.get("errors", {})), meas.get("errors")
    lungs = meas["lungs"]
    truth_ml = float(np.count_nonzero(ph.masks[kept])) * float(np.prod(ph.volume.geometry.spacing)) / 1000.0
    assert lungs[f"{kept}_volume_ml"] == pytest.approx(truth_ml, rel=0.05)
    assert not lungs[f"lung_{side}_volume_ml"]
    # the patient's lung volume is the remaining lung's: the report's "lungs mL" column is not blank for this patient
    assert lungs["lungs_total_volume_ml"] == lungs[f"{kept}_volume_ml"]
