"""LUNA16 FROC/CPM: hand-checked cases, irrelevant findings, file formats and the CLI."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pipeline.detection.evaluate import (
    FP_RATES,
    at_score_threshold,
    evaluate_froc,
    found_by_size,
    match_predictions,
    size_band_text,
)
from pipeline.detection.evaluate_io import load_predictions, load_truth
from pipeline.detection.findings import Finding, Findings
from pipeline.errors import ConfigError

TRUTH = {
    "s1": [((0.0, 0.0, 0.0), 10.0), ((50.0, 0.0, 0.0), 6.0)],
    "s2": [((10.0, 10.0, 10.0), 8.0), ((-30.0, 5.0, 0.0), 20.0)],
}


def test_perfect_detection_gives_cpm_one():
    preds = {sid: [(c, 0.9) for c, _ in nods] for sid, nods in TRUTH.items()}
    r = evaluate_froc(preds, TRUTH, n_bootstrap=50)
    assert r.cpm == 1.0 and r.sensitivity == [1.0] * 7
    assert r.n_nodules == 4 and r.n_detected == 4


def test_hand_computed_froc():
    preds = {
        "s1": [
            ((1.0, 1.0, 1.0), 0.9),  # hit nodule 1 (within 5 mm)
            ((0.5, 0.0, 0.0), 0.95),  # second hit on nodule 1: not a FP, nodule takes 0.95
            ((54.0, 0.0, 0.0), 0.5),  # 4 mm from nodule 2 (radius 3): FP
            ((100.0, 0.0, 0.0), 0.8),
        ],  # FP
        "s2": [
            ((10.0, 12.0, 10.0), 0.7),  # hit nodule 3
            ((-30.0, 5.0, 9.0), 0.3),
        ],  # hit nodule 4 (9 mm < 10 mm)
    }
    r = evaluate_froc(preds, TRUTH, n_bootstrap=0 or 10)
    # thresholds: 0.95 TP (1/4), 0.8 FP (0.5 FP/scan), 0.7 TP (2/4), 0.5 FP (1 FP/scan), 0.3 TP (3/4)
    expected = {0.125: 0.25, 0.25: 0.25, 0.5: 0.5, 1.0: 0.75, 2.0: 0.75, 4.0: 0.75, 8.0: 0.75}
    assert r.sensitivity == [expected[x] for x in FP_RATES]
    assert r.cpm == pytest.approx(np.mean(list(expected.values())))
    assert r.n_detected == 3


def test_a_result_echoed_in_a_notebook_is_one_line_of_its_figures():
    """The dataclass repr printed every point of the curve and every nodule: 27 kB for three phantom scans."""
    preds = {"s1": [((1.0, 1.0, 1.0), 0.9), ((100.0, 0.0, 0.0), 0.8)], "s2": [((10.0, 12.0, 10.0), 0.7)]}
    preds["s1"] += [((200.0 + n, 0.0, 0.0), 0.01 * n) for n in range(300)]  # a long curve
    r = evaluate_froc(preds, TRUTH, n_bootstrap=0)
    text = repr(r)
    assert "\n" not in text and len(text) < 400, text
    assert text == (
        f"FrocResult(CPM {r.cpm:.3f}, sensitivity {', '.join(f'{s:.3f}' for s in r.sensitivity)} at 0.125..8 FPs/scan, "
        "2 scans, 4 nodules, 2 detected, 303 candidates, reading='interpolate'; .table() for the table)"
    )
    with_ci = evaluate_froc(preds, TRUTH, n_bootstrap=20)
    assert repr(with_ci).startswith(
        f"FrocResult(CPM {with_ci.cpm:.3f} [{with_ci.cpm_ci[0]:.3f}, {with_ci.cpm_ci[1]:.3f}] (95% CI), "
    )


def test_irrelevant_small_nodules_are_ignored():
    truth = {"s": [((0.0, 0.0, 0.0), 10.0), ((40.0, 0.0, 0.0), 2.0)]}
    preds = {"s": [((0.0, 0.0, 0.0), 0.9), ((40.2, 0.0, 0.0), 0.99)]}
    r = evaluate_froc(preds, truth, n_bootstrap=10)
    assert r.n_nodules == 1 and r.cpm == 1.0  # the hit on the 2 mm nodule is neither TP nor FP
    r3 = evaluate_froc(preds, truth, n_bootstrap=10, min_diameter_mm=1.0)
    assert r3.n_nodules == 2


def test_scan_without_predictions_counts_in_fp_rate_and_misses():
    preds = {"s1": [((0.0, 0.0, 0.0), 0.9), ((200.0, 0.0, 0.0), 0.95)]}
    r = evaluate_froc(preds, TRUTH, n_bootstrap=10)
    # 1 FP over 2 scans = 0.5 FP/scan before the TP can be reached
    assert r.sensitivity[FP_RATES.index(0.25)] == 0.0
    assert r.sensitivity[FP_RATES.index(0.5)] == 0.25


def test_bootstrap_interval_brackets_estimate():
    rng = np.random.default_rng(0)
    truth, preds = {}, {}
    for s in range(20):
        centres = rng.uniform(-100, 100, (3, 3))
        truth[f"s{s}"] = [(c, 10.0) for c in centres]
        preds[f"s{s}"] = [(c + rng.normal(0, 1, 3), rng.uniform(0.3, 1)) for c in centres[: rng.integers(1, 4)]]
        preds[f"s{s}"] += [(rng.uniform(-100, 100, 3) + 500, rng.uniform(0, 0.9)) for _ in range(4)]
    r = evaluate_froc(preds, truth, n_bootstrap=300, seed=1)
    assert r.cpm_ci[0] <= r.cpm <= r.cpm_ci[1]
    assert r.cpm_ci[1] - r.cpm_ci[0] > 0.01
    for s, (lo, hi) in zip(r.sensitivity, r.sensitivity_ci):
        assert lo <= s + 1e-9 and s <= hi + 1e-9


def test_without_bootstrap_the_files_are_strict_json_and_csv_and_say_so(tmp_path):
    preds = {sid: [(c, 0.9) for c, _ in nods[:1]] for sid, nods in TRUTH.items()}
    r = evaluate_froc(preds, TRUTH, n_bootstrap=0)
    paths = r.write(tmp_path)

    def no_nan(token: str) -> float:
        raise AssertionError(f"{token} in froc.json: not JSON")

    data = json.loads(paths["json"].read_text(), parse_constant=no_nan)
    assert data["cpm_ci95"] == [None, None] and all(c == [None, None] for c in data["sensitivity_ci95"])
    rows = list(csv.reader(paths["csv"].read_text().splitlines()))
    assert rows[-1][0] == "CPM" and rows[-1][2:] == ["", ""] and "nan" not in paths["csv"].read_text()
    table = r.table()
    assert "nan" not in table and "bootstrap resampling was turned off" in table


def test_empty_truth_is_an_error():
    with pytest.raises(ConfigError, match=r"holds no nodule of at least 3\.0 mm in the 1 scans evaluated") as err:
        evaluate_froc({"a": []}, {"a": [((0, 0, 0), 2.0)]}, n_bootstrap=5)
    assert err.value.fix == "check the truth file and the scan list"


def _findings(sid, centres_scores):
    fs = [
        Finding(
            center_lps=tuple(c),
            box_min_lps=tuple(np.subtract(c, 3)),
            box_max_lps=tuple(np.add(c, 3)),
            diameter_mm=6.0,
            score=s,
            voxel_ijk=(1, 2, 3),
            slice_number=4,
        )
        for c, s in centres_scores
    ]
    return Findings(fs, case_id=sid, series_uid=sid)


def test_files_and_cli(tmp_path, capsys):
    from pipeline.cli import main

    # ground truth: one phantom-style JSON and one LUNA16 CSV
    (tmp_path / "gt1").mkdir()
    (tmp_path / "gt1" / "ground_truth.json").write_text(
        json.dumps(
            {
                "seed": 1,
                "geometry": {},
                "series_uid": "s1",
                "nodules": [{"center_lps": [0, 0, 0], "diameter_mm": 10.0}, {"center_lps": [50, 0, 0], "diameter_mm": 6.0}],
            }
        )
    )
    with open(tmp_path / "annotations.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seriesuid", "coordX", "coordY", "coordZ", "diameter_mm"])
        w.writerow(["s2", 10, 10, 10, 8.0])
        w.writerow(["s2", -30, 5, 0, 20.0])
    truth = load_truth([tmp_path / "gt1", tmp_path / "annotations.csv"])
    assert sorted(truth) == ["s1", "s2"] and len(truth["s2"]) == 2
    pred_dir = tmp_path / "pred"
    _findings("s1", [((0.5, 0, 0), 0.9), ((90, 0, 0), 0.6)]).write_json(pred_dir / "s1.findings.json")
    _findings("s2", [((10, 10, 11), 0.8), ((-30, 5, 3), 0.7)]).write_json(pred_dir / "s2.findings.json")
    preds = load_predictions([pred_dir])
    assert len(preds["s1"]) == 2
    out = tmp_path / "eval"
    rc = main(
        [
            "evaluate",
            "--pred",
            str(pred_dir),
            "--truth",
            str(tmp_path / "gt1"),
            str(tmp_path / "annotations.csv"),
            "--out",
            str(out),
            "--bootstrap",
            "50",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "CPM" in text
    data = json.loads((out / "froc.json").read_text())
    # 3 of 4 found before any FP; the 6 mm nodule is never found
    assert data["sensitivity"] == [0.75] * 7 and data["cpm"] == 0.75
    assert (out / "froc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.reader(open(out / "froc.csv")))
    assert rows[0][:2] == ["fps_per_scan", "sensitivity"] and rows[-1][0] == "CPM"
    # a LUNA16 candidates CSV works as predictions too
    with open(tmp_path / "cand.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seriesuid", "coordX", "coordY", "coordZ", "probability"])
        w.writerow(["s1", 0, 0, 0, 0.9])
    assert load_predictions([tmp_path / "cand.csv"])["s1"][0][1] == 0.9
    # the same saved from a spreadsheet (byte-order mark, semicolons, CRLF)
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbfseriesuid;coordX;coordY;coordZ;probability\r\ns1;0;0;0;0.9\r\n")
    assert load_predictions([tmp_path / "excel.csv"])["s1"][0][1] == 0.9
    with pytest.raises(ConfigError, match="lack"):
        load_predictions([tmp_path / "annotations.csv"])


def test_findings_are_scored_on_all_candidates_whatever_the_threshold(tmp_path):
    from pipeline.detection.evaluate_io import load_scans

    every = _findings("s1", [((0.5, 0, 0), 0.9), ((90, 0, 0), 0.6), ((50, 0, 0), 0.2)])
    reported = every.select(0.7, "test")
    assert len(reported) == 1 and len(reported.below_threshold) == 2
    a = evaluate_froc({"s1": every}, {"s1": TRUTH["s1"]}, n_bootstrap=0)
    b = evaluate_froc({"s1": reported}, {"s1": TRUTH["s1"]}, n_bootstrap=0)
    assert a.sensitivity == b.sensitivity and b.n_detected == 2 and b.n_candidates == 3
    reported.write_json(tmp_path / "s1.findings.json")
    assert len(load_predictions([tmp_path])["s1"]) == 3
    # a mark exactly on the radius is no hit (LUNA16: distance < radius)
    edge = evaluate_froc({"s": [((5.0, 0, 0), 0.9)]}, {"s": [((0.0, 0.0, 0.0), 10.0)]}, n_bootstrap=0)
    assert edge.n_detected == 0
    (tmp_path / "ids.csv").write_text("\ufeffseriesuid\r\ns1\r\ns2\r\n\r\ns1\r\n", encoding="utf-8")
    assert load_scans(tmp_path / "ids.csv") == ["s1", "s2"]
    with pytest.raises(ConfigError, match="max_marks"):
        evaluate_froc({"s1": every}, {"s1": TRUTH["s1"]}, n_bootstrap=0, max_marks_per_scan=0)
    with pytest.raises(ConfigError, match="reading"):
        evaluate_froc({"s1": every}, {"s1": TRUTH["s1"]}, n_bootstrap=0, reading="nearest")


def test_operating_point_figures_count_as_luna16_does() -> None:
    # LPS mm; scan a: two nodules (10 mm, 6 mm), scan b: one 8 mm nodule and a 2 mm one (below LUNA16's 3 mm: its
    # hits count neither way), scan c: none
    truth = {
        "a": [((0.0, 0.0, 0.0), 10.0), ((40.0, 0.0, 0.0), 6.0)],
        "b": [((0.0, 50.0, 0.0), 8.0), ((0.0, -50.0, 0.0), 2.0)],
        "c": [],
    }
    pred = {
        "a": [((1.0, 0.0, 0.0), 0.9), ((-2.0, 1.0, 0.0), 0.95), ((40.0, 2.9, 0.0), 0.5), ((80.0, 0.0, 0.0), 0.6)],
        "b": [((0.0, 50.0, 3.0), 0.7), ((0.0, -50.0, 0.0), 0.99), ((0.0, 0.0, 90.0), 0.4)],
        "c": [((5.0, 5.0, 5.0), 0.6), ((9.0, 9.0, 9.0), 0.59)],
    }
    matched = match_predictions(pred, truth, scans=["a", "b", "c"])
    # at 0.6 (inclusive): nodules a1 (0.95; the second hit 0.9 is no false positive) and b1 (0.7) found, a2 (0.5) not;
    # false positives: a's 0.6 and c's 0.6 (b's 0.99 hits the 2 mm nodule: neither)
    op = at_score_threshold(matched, 0.6)
    assert (op["nodules_found"], op["n_nodules"]) == (2, 3)
    assert op["sensitivity"] == pytest.approx(2 / 3)
    assert op["fps_per_scan"] == pytest.approx(2 / 3)
    low = at_score_threshold(matched, 0.4)
    assert (low["nodules_found"], low["fps_per_scan"]) == (3, pytest.approx(4 / 3))
    assert at_score_threshold(matched, 1.0)["nodules_found"] == 0
    # by size: the 6 mm nodule opens the 6-10 mm band (its lower edge is inclusive), the 2 mm one is in no band
    bands = {(b["min_mm"], b["max_mm"]): (b["nodules_found"], b["n_nodules"]) for b in op["by_size"]}
    assert bands == {(0.0, 6.0): (0, 0), (6.0, 10.0): (1, 2), (10.0, 20.0): (1, 1), (20.0, None): (0, 0)}
    assert [b["sensitivity"] for b in op["by_size"]] == [None, 0.5, 1.0, None]
    assert size_band_text(op["by_size"]) == "6-10 mm 1/2, 10-20 mm 1/1"
    assert size_band_text(low["by_size"]) == "6-10 mm 2/2, 10-20 mm 1/1"
    assert size_band_text(found_by_size(matched.per_nodule, 0.6, edges_mm=(7.0,))) == "under 7 mm 0/1, 7 mm and over 2/2"
    for bad in ((10.0, 6.0), (0.0, 6.0), (6.0, 6.0)):
        with pytest.raises(ConfigError, match=r"size band edges .* not positive and increasing"):
            found_by_size(matched.per_nodule, 0.6, edges_mm=bad)
