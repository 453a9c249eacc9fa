"""Operating points: choosing the threshold on validation data, the precedence of settings, and what the outputs report."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.detection.bundle import LoadedModel, load_model
from pipeline.detection.evaluate_io import load_predictions
from pipeline.detection.infer import Detector
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.detection.operating_point import (
    BUNDLE_SCORE_THRESHOLD,
    SOURCE_ALL,
    calibrate,
    model_operating_point,
    resolve_threshold,
)
from pipeline.errors import BundleError
from tests._support.detection import chest_volume, small_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRUTH = {
    "a": [((0.0, 0.0, 0.0), 10.0), ((50.0, 0.0, 0.0), 6.0)],
    "b": [((10.0, 10.0, 10.0), 8.0)],
    "c": [],  # no nodules: its false positives count
}


def test_calibrate_picks_lowest_score_within_budget():
    preds = {
        "a": [
            ((0.0, 0.0, 1.0), 0.9),  # TP nodule 1
            ((0.0, 1.0, 0.0), 0.95),  # second hit on nodule 1: no FP
            ((100.0, 0, 0), 0.8),  # FP 1
            ((50.0, 1.0, 0.0), 0.4),
        ],  # TP nodule 2
        "b": [
            ((10.0, 10.0, 12.0), 0.6),  # TP nodule 3
            ((200.0, 0, 0), 0.6),
        ],  # FP 2, tied with the TP
        "c": [
            ((0.0, 0.0, 0.0), 0.7),  # FP 3 (nodule-free scan)
            ((5.0, 0.0, 0.0), 0.3),
        ],  # FP 4
    }
    # 1 FP/scan over 3 scans = 3 FPs: scores 0.95, 0.8, 0.7, 0.6 (tie: TP + FP) reach 3 FPs; 0.4 keeps 3; 0.3 is the 4th
    cal = calibrate(preds, TRUTH, fps_per_scan=1.0)
    assert cal.score_threshold == 0.4 and cal.n_false_positives == 3
    assert cal.sensitivity == 1.0 and cal.measured_fps_per_scan == 1.0 and cal.n_scans == 3 and cal.n_nodules == 3
    # 1/3 FP/scan = 1 FP: 0.8 is the last level within it (0.7 adds the second FP)
    cal = calibrate(preds, TRUTH, fps_per_scan=1 / 3)
    assert cal.score_threshold == 0.8 and cal.sensitivity == pytest.approx(1 / 3)
    # no FP allowed: the top level (nodule 1 at its best hit, 0.95; the 0.9 hit is a duplicate) and no further
    cal = calibrate(preds, TRUTH, fps_per_scan=0.0)
    assert cal.score_threshold == 0.95 and cal.n_false_positives == 0
    # a top-scoring FP beyond the budget: the threshold lies just above it, nothing reported
    top_fp = {**preds, "c": [((0.0, 0.0, 0.0), 0.99)]}
    t = calibrate(top_fp, TRUTH, fps_per_scan=0.0).score_threshold
    assert 0.99 < t < 0.99 + 1e-12


def _with_operating_point(tmp_path, entry) -> LoadedModel:
    small_model(tmp_path)
    data = json.loads((tmp_path / "small.json").read_text())
    data["operating_point"] = entry
    (tmp_path / "small.json").write_text(json.dumps(data))
    return load_model(tmp_path / "small.json")


def test_threshold_precedence(tmp_path, caplog):
    model = _with_operating_point(
        tmp_path,
        {
            "score_threshold": 0.42,
            "chosen_on": "validation phantoms",
            "fps_per_scan": 1.0,
            "sensitivity": 0.9,
            "network_only": {"score_threshold": 0.97, "chosen_on": "validation phantoms, network alone", "fps_per_scan": 1.0},
        },
    )
    cfg = model.config
    t, src = resolve_threshold(cfg)
    assert t == 0.42 and "operating point" in src and "1 FP/scan" in src
    assert resolve_threshold(cfg, postprocess=False)[0] == 0.97
    assert resolve_threshold(cfg, score_threshold=0.1) == (0.1, "configured: 0.1 (detector.score_threshold)")
    assert resolve_threshold(cfg, score_threshold=0.1, all_candidates=True) == (None, SOURCE_ALL)
    with pytest.raises(BundleError, match="1.5"):
        resolve_threshold(cfg, score_threshold=1.5)
    # a MONAI bundle: ctpipe's documented default
    t, src = resolve_threshold(replace(cfg, source="monai_bundle"))
    assert t == BUNDLE_SCORE_THRESHOLD and "MONAI" in src
    # a model without an operating point reports everything, and says so
    (tmp_path / "plain").mkdir()
    plain = small_model(tmp_path / "plain")
    t, src = resolve_threshold(plain.config)
    assert t is None and "no operating point" in src and "no operating point" in caplog.text


def test_invalid_operating_point_is_refused(tmp_path):
    with pytest.raises(BundleError, match=r"small.json: operating_point.score_threshold: 3.0 is not a score from 0 to 1"):
        _with_operating_point(tmp_path, {"score_threshold": 3.0})  # as the model is read, naming its file
    from dataclasses import replace

    built = replace(small_model(tmp_path).config, extra={"operating_point": {"score_threshold": 3.0}})  # not from a file
    with pytest.raises(BundleError, match="not in"):
        model_operating_point(built)
    model = _with_operating_point(tmp_path, {"chosen_on": "x"})
    with pytest.raises(BundleError, match="operating_point"):
        Detector(model=model, device="cpu")


def test_outputs_report_findings_at_or_above_threshold(tmp_path):
    import SimpleITK as sitk

    from pipeline.cli import main

    vol = chest_volume(shape_kji=(40, 80, 80))
    full = Detector(model=small_model(tmp_path), device="cpu", all_candidates=True).detect(vol, case_id="ct")
    scores = sorted(f.score for f in full)
    assert len(scores) >= 4, "the test model must return several candidates"
    t = float(np.median(scores))
    model = _with_operating_point(tmp_path, {"score_threshold": t, "chosen_on": "test", "fps_per_scan": 1.0})
    res = Detector(model=model, device="cpu").detect(vol, case_id="ct")
    assert res.score_threshold == t and "operating point" in res.threshold_source
    assert all(f.score >= t for f in res) and all(f.score < t for f in res.below_threshold)
    assert 0 < len(res) < len(full) and len(res.candidates) == len(full)
    doc = res.to_json()
    assert doc["score_threshold"] == t and doc["n_candidates"] == len(full) and len(doc["below_threshold"]) > 0

    sitk.WriteImage(vol.to_sitk(), str(tmp_path / "ct.nii.gz"))
    out = tmp_path / "out"
    assert (
        main(
            [
                "detect",
                str(tmp_path / "ct.nii.gz"),
                "--case-id",  # outputs named ct (by default: a digest of the image)
                "ct",
                "--out",
                str(out),
                "--bundle",
                str(tmp_path / "small.json"),
                "--device",
                "cpu",
                "--max-png",
                "50",
            ]
        )
        == 0
    )
    data = json.loads((out / "ct.findings.json").read_text())
    rows = list(csv.DictReader(open(out / "ct.findings.csv")))
    pngs = list((out / "ct_png").glob("*.png"))
    assert data["score_threshold"] == t and "operating point" in data["score_threshold_source"]
    assert len(rows) == len(data["findings"]) == len(pngs) > 0
    assert all(float(r["score"]) >= t - 1e-5 for r in rows)
    # evaluation reads every candidate, reported or not
    # (the CLI reads the NIfTI copy, whose float32 geometry may move the random test network's scores across its
    # box-selector cut: its candidate count is compared with its own JSON, not with the in-memory run's)
    n_json = len(data["findings"]) + len(data["below_threshold"])
    assert len(load_predictions([out])[data["series_uid"] or "ct"]) == data["n_candidates"] == n_json > len(rows)

    out2 = tmp_path / "out2"
    assert (
        main(
            [
                "detect",
                str(tmp_path / "ct.nii.gz"),
                "--case-id",  # outputs named ct (by default: a digest of the image)
                "ct",
                "--out",
                str(out2),
                "--bundle",
                str(tmp_path / "small.json"),
                "--device",
                "cpu",
                "--no-png",
                "--all-candidates",
            ]
        )
        == 0
    )
    data = json.loads((out2 / "ct.findings.json").read_text())
    assert data["score_threshold"] is None and len(data["findings"]) == n_json and data["below_threshold"] == []
    out3 = tmp_path / "out3"
    assert (
        main(
            [
                "detect",
                str(tmp_path / "ct.nii.gz"),
                "--case-id",  # outputs named ct (by default: a digest of the image)
                "ct",
                "--out",
                str(out3),
                "--bundle",
                str(tmp_path / "small.json"),
                "--device",
                "cpu",
                "--no-png",
                "--score-threshold",
                "0.999",
            ]
        )
        == 0
    )
    data = json.loads((out3 / "ct.findings.json").read_text())
    assert data["score_threshold"] == 0.999 and "configured" in data["score_threshold_source"]
    assert len(data["findings"]) + len(data["below_threshold"]) == n_json


def test_api_detect_threshold_arguments(tmp_path):
    from pipeline.detection.infer import detect

    det = Detector(model=small_model(tmp_path), device="cpu")
    vol = chest_volume(shape_kji=(40, 80, 80))
    every = detect(vol, detector=det, all_candidates=True)
    none = detect(vol, detector=det, score_threshold=1.0)
    assert len(none) == 0 and len(none.below_threshold) == len(every) > 0
    assert none.score_threshold == 1.0 and every.score_threshold is None


def test_demo_model_records_its_operating_point():
    data = json.loads(DEMO_MODEL_JSON.read_text())
    op = data["operating_point"]
    assert 0.0 < op["score_threshold"] < 1.0 and op["fps_per_scan"] == 1.0
    assert 0.0 < op["sensitivity"] <= 1.0 and op["measured_fps_per_scan"] <= 1.0
    lo, hi = op["seeds"]
    assert not set(range(lo, hi + 1)) & set(range(1, 1000)), "chosen on held-out seeds"
    first, last = data["training"]["train_seeds"]  # both ends included
    assert not set(range(lo, hi + 1)) & set(range(first, last + 1)), "chosen on training seeds"
    assert "calibrate_operating_point.py" in op["command"] and op["network_only"]["score_threshold"] > 0
    cfg = load_model(DEMO_MODEL_JSON).config
    assert resolve_threshold(cfg)[0] == op["score_threshold"]
    assert resolve_threshold(cfg, postprocess=False)[0] == op["network_only"]["score_threshold"]
