"""``scripts/eval_real_ct.py --bone``: bone against TotalSegmentator's labels (skipped without ``../shared/real_ct``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests._support.real_ct import TS_ALL_BONE, TS_RIBS, require_real_ct, totalseg_abdomen_sm, totalseg_labels

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "eval_real_ct.py"


def _script():
    spec = importlib.util.spec_from_file_location("eval_real_ct", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bone_row_measures_the_labels_themselves_as_perfect_and_strays_in_organs_by_the_ml():
    root = require_real_ct()
    case = totalseg_abdomen_sm(root)
    labels = totalseg_labels(case, root)
    assert labels is not None
    ev = _script()
    perfect = ev.bone_row(case, np.isin(labels, TS_ALL_BONE), root)
    assert perfect["dice_bone"] == 1.0 and perfect["precision"] == 1.0 and perfect["recall_ribs"] == 1.0
    assert perfect["recall_sacrum"] is None  # the 30-slice crop holds no sacrum
    # the ribs alone, and a liver taken for bone
    ribs_and_liver = np.isin(labels, TS_RIBS) | (labels == 5)
    row = ev.bone_row(case, ribs_and_liver, root)
    voxel_ml = float(np.prod(case.volume.geometry.spacing)) / 1000.0
    assert row["recall_ribs"] == 1.0 and row["recall_vertebrae"] == 0.0
    assert 0.0 < row["precision"] < 0.5 and row["liver_spleen_ml"] > 100 * voxel_ml
    assert row["kidneys_ml"] == 0.0
    other = ev.bone_row(ev.CASES["rt_planning_chest"](root), np.ones((2, 2, 2), dtype=bool), root)
    assert set(other) == {"scan", "bone_ml"}  # no labels: bone mL only
