"""``ctpipe evaluate`` against LUNA16's own evaluation algorithm on a recorded set (tests/data/luna16_froc).

The reference numbers below are literal: they were computed by :func:`official_froc`, a plain
re-implementation of LUNA16's ``noduleCADEvaluationLUNA16.py`` written here independently of ctpipe
(the CSVs read line by line; per scan, each included annotation takes the highest-probability mark
strictly within its radius, marks on excluded annotations are dropped, every other mark is a false
positive; missed nodules enter as excluded positives; the FROC curve is the ROC curve over the remaining
marks (one point per distinct probability, from (0, 0)) scaled to false positives per scan and
sensitivity over all included nodules; sensitivity read with ``np.interp`` at 1/8..8 FPs/scan; optional
``maxNumberOfCADMarks`` cap keeping the marks above the (N+1)-th highest probability). The test checks
the re-implementation against the literals too, so a change on either side shows.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.detection.evaluate import FP_RATES, evaluate_froc
from pipeline.detection.evaluate_io import load_predictions, load_scans, load_truth

DATA = Path(__file__).parent / "data" / "luna16_froc"
RATES = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0]

# official reading (linear interpolation from (0, 0)), all 7 scans of seriesuids.csv, no cap
EXPECTED_OFFICIAL = [0.145833333333, 0.166666666667, 0.25, 0.5, 0.833333333333, 0.833333333333, 0.833333333333]
# the same curve read as a step (best operating point at or below each rate)
EXPECTED_STEP = [0.0, 0.166666666667, 0.166666666667, 0.5, 0.833333333333, 0.833333333333, 0.833333333333]
# official reading with at most 3 marks per scan (LUNA16's script uses 100)
EXPECTED_CAP3 = [0.145833333333, 0.166666666667, 0.25, 0.666666666667, 0.666666666667, 0.666666666667, 0.666666666667]
# official reading over the scans named by the predictions and the truth only (no seriesuids.csv: 6 scans)
EXPECTED_NO_SCAN_LIST = [0.125, 0.166666666667, 0.166666666667, 0.444444444444, 0.833333333333, 0.833333333333, 0.833333333333]


def _rows(name: str) -> list[list[str]]:
    with open(DATA / name, newline="") as fh:
        return [row for row in csv.reader(fh) if row]


def official_froc(series_uids: list[str], max_marks: int = -1, rates: list[float] = RATES, step: bool = False) -> list[float]:
    """Sensitivity at ``rates`` as LUNA16's evaluation script computes it (see the module docstring); ``step``: the
    same curve read as the best point at or below each rate instead."""
    ann, exc, cand = _rows("annotations.csv")[1:], _rows("annotations_excluded.csv")[1:], _rows("candidates.csv")[1:]
    gt_list, prob_list, exclude_list = [], [], []
    for uid in series_uids:
        marks = {i: (float(r[1]), float(r[2]), float(r[3]), float(r[4])) for i, r in enumerate(r for r in cand if r[0] == uid)}
        if 0 < max_marks < len(marks):
            probs = sorted((m[3] for m in marks.values()), reverse=True)
            limit = probs[max_marks]
            kept = {}
            for key, m in marks.items():
                if len(kept) >= max_marks:
                    break
                if m[3] > limit:
                    kept[key] = m
            marks = kept
        remaining = dict(marks)
        nodules = [(r, "Included") for r in ann if r[0] == uid] + [(r, "Excluded") for r in exc if r[0] == uid]
        for r, state in nodules:
            x, y, z, d = float(r[1]), float(r[2]), float(r[3]), float(r[4])
            if d < 0.0:
                d = 10.0
            matches = []
            for key, (x2, y2, z2, p) in marks.items():
                if (x - x2) ** 2 + (y - y2) ** 2 + (z - z2) ** 2 < (d / 2.0) ** 2:
                    if state == "Included":
                        matches.append(p)
                        remaining.pop(key, None)
                    else:
                        remaining.pop(key, None)
            if state == "Included":
                gt_list.append(1.0)
                prob_list.append(max(matches) if matches else -1e9)
                exclude_list.append(not matches)
        for _, _, _, p in remaining.values():
            gt_list.append(0.0)
            prob_list.append(p)
            exclude_list.append(False)
    n_lesions = sum(gt_list)
    kept = [(g, p) for g, p, e in zip(gt_list, prob_list, exclude_list) if not e]
    n_detected = sum(g for g, _ in kept)
    # ROC over the kept marks: one point per distinct probability, highest first, from (0, 0)
    fps, sens = [0.0], [0.0]
    for t in sorted({p for _, p in kept}, reverse=True):
        tp = sum(1 for g, p in kept if p >= t and g == 1.0)
        fp = sum(1 for g, p in kept if p >= t and g == 0.0)
        fps.append(fp / len(series_uids))
        sens.append(tp / n_lesions)
    assert math.isclose(sens[-1], n_detected / n_lesions)
    if step:
        return [max(s for f, s in zip(fps, sens) if f <= r) for r in rates]
    return [float(v) for v in np.interp(rates, fps, sens)]


@pytest.fixture(scope="module")
def recorded():
    return {
        "truth": load_truth([DATA / "annotations.csv"]),
        "irrelevant": load_truth([DATA / "annotations_excluded.csv"], what="--irrelevant"),
        "preds": load_predictions([DATA / "candidates.csv"]),
        "scans": load_scans(DATA / "seriesuids.csv"),
    }


def test_reference_implementation_gives_the_recorded_numbers():
    uids = [r[0] for r in _rows("seriesuids.csv")]
    assert official_froc(uids) == pytest.approx(EXPECTED_OFFICIAL, abs=1e-9)
    assert official_froc(uids, step=True) == pytest.approx(EXPECTED_STEP, abs=1e-9)
    assert official_froc(uids, max_marks=3) == pytest.approx(EXPECTED_CAP3, abs=1e-9)
    named = sorted({r[0] for r in _rows("annotations.csv")[1:]} | {r[0] for r in _rows("candidates.csv")[1:]})
    assert official_froc(named) == pytest.approx(EXPECTED_NO_SCAN_LIST, abs=1e-9)


def test_ctpipe_reproduces_luna16_numbers(recorded):
    assert list(FP_RATES) == RATES
    r = evaluate_froc(
        recorded["preds"], recorded["truth"], scans=recorded["scans"], irrelevant=recorded["irrelevant"], n_bootstrap=0
    )
    assert r.reading == "interpolate" and r.n_scans == 7 and r.n_nodules == 6
    assert r.sensitivity == pytest.approx(EXPECTED_OFFICIAL, abs=1e-9)
    assert r.cpm == pytest.approx(np.mean(EXPECTED_OFFICIAL), abs=1e-9)
    step = evaluate_froc(
        recorded["preds"],
        recorded["truth"],
        scans=recorded["scans"],
        irrelevant=recorded["irrelevant"],
        n_bootstrap=0,
        reading="step",
    )
    assert step.sensitivity == pytest.approx(EXPECTED_STEP, abs=1e-9)
    assert step.sensitivity != pytest.approx(r.sensitivity, abs=1e-3)  # the two readings differ on this set
    cap = evaluate_froc(
        recorded["preds"],
        recorded["truth"],
        scans=recorded["scans"],
        irrelevant=recorded["irrelevant"],
        n_bootstrap=0,
        max_marks_per_scan=3,
    )
    assert cap.sensitivity == pytest.approx(EXPECTED_CAP3, abs=1e-9)


def test_scan_list_counts_scans_without_nodules_or_marks(recorded):
    # without the list: the scans named by the predictions or the truth (6); the 7th scan, named only in
    # seriesuids.csv, adds no marks but lowers the false positives per scan
    r = evaluate_froc(recorded["preds"], recorded["truth"], irrelevant=recorded["irrelevant"], n_bootstrap=0)
    assert r.n_scans == 6
    assert r.sensitivity == pytest.approx(EXPECTED_NO_SCAN_LIST, abs=1e-9)
    assert EXPECTED_NO_SCAN_LIST != EXPECTED_OFFICIAL


def test_cli_reads_luna16_files(tmp_path, capsys):
    from pipeline.cli import main

    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--pred",
                str(DATA / "candidates.csv"),
                "--truth",
                str(DATA / "annotations.csv"),
                "--irrelevant",
                str(DATA / "annotations_excluded.csv"),
                "--scans",
                str(DATA / "seriesuids.csv"),
                "--bootstrap",
                "20",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "froc.json").read_text())
    assert data["reading"] == "interpolate" and data["n_scans"] == 7
    assert data["sensitivity"] == pytest.approx(EXPECTED_OFFICIAL, abs=1e-9)
    assert len(data["operating_points"]) == 7 and data["operating_points"][3]["measured_fps_per_scan"] <= 1.0
    assert (
        main(
            [
                "evaluate",
                "--pred",
                str(DATA / "candidates.csv"),
                "--truth",
                str(DATA / "annotations.csv"),
                "--irrelevant",
                str(DATA / "annotations_excluded.csv"),
                "--scans",
                str(DATA / "seriesuids.csv"),
                "--bootstrap",
                "0",
                "--reading",
                "step",
                "--max-marks",
                "100",
                "--out",
                str(tmp_path / "step"),
            ]
        )
        == 0
    )
    step = json.loads((tmp_path / "step" / "froc.json").read_text())
    assert step["sensitivity"] == pytest.approx(EXPECTED_STEP, abs=1e-9) and step["max_marks_per_scan"] == 100
    assert "CPM" in capsys.readouterr().out
