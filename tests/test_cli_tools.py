"""Mistakes made with ``ctpipe phantom``, ``ctpipe evaluate`` and ``ctpipe ingest``: refused once, with the value,
where it is and the fix, or warned about; never a silent wrong result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
HEADER = "seriesuid,coordX,coordY,coordZ,"


def _usage_error(capsys, *argv: str) -> str:
    """argparse's refusal: exit status 2 and one error line, before any work."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


def _csv(path: Path, value: str, rows: list[tuple]) -> Path:
    path.write_text(HEADER + value + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


# --- ctpipe phantom ---------------------------------------------------------------------------------------------------
def test_phantom_out_of_range_option_is_one_usage_error_not_one_failure_per_case(tmp_path, capsys):
    line = _usage_error(capsys, "phantom", str(tmp_path), "--seed", "1", "--count", "3", "--pixel-spacing", "50")
    assert line == "ctpipe phantom: error: argument --pixel-spacing: 50 is out of range (0.3..2.0)"
    assert "--matrix: 8 is out of range" in _usage_error(capsys, "phantom", str(tmp_path), "--seed", "1", "--matrix", "8")
    assert "--nodules: 50 is out of range" in _usage_error(capsys, "phantom", str(tmp_path), "--seed", "1", "--nodules", "50")
    assert not any(tmp_path.iterdir())
    line = _usage_error(capsys, "phantom", str(tmp_path), "--seed", "1", "--patient-position", "HSF")
    assert "argument --patient-position: invalid choice: 'HSF'" in line and "'FFS'" in line


def test_nan_is_refused_where_a_number_in_a_range_is_expected(tmp_path, capsys):
    line = _usage_error(capsys, "phantom", str(tmp_path), "--seed", "1", "--slice-spacing", "nan")
    assert "argument --slice-spacing: 'nan' is not a finite number" in line
    line = _usage_error(capsys, "ingest", str(tmp_path), "--out", str(tmp_path / "c"), "--axial-tolerance", "nan")
    assert "--axial-tolerance: 'nan' is not a finite number" in line


def test_phantom_option_errors_name_the_command_once(tmp_path, capsys):
    # was: "ctpipe phantom: error: ctpipe phantom: --seed is required without --scenario"
    for argv, expected in (
        ([], "ctpipe phantom: error: --seed is required without --scenario. Fix: pass --seed N"),
        (["--seed", "1", "--seed-offset", "5"], "ctpipe phantom: error: --seed-offset moves the scenarios' own seeds. Fix: use"),
        (["--seed", "1", "--fine-vessels"], "ctpipe phantom: error: --fine-vessels adds to the confounders of real scans"),
        (["--scenario", "all", "--seed", "1"], "ctpipe phantom: error: --seed/--count: --scenario all uses each scenario's own"),
        # was: each case generated, then refused by the writer ("with enhanced=True use only ..."), exit status 1
        (
            ["--seed", "1", "--count", "2", "--enhanced", "--quirk", "missing_slice", "--quirk", "localizer"],
            "ctpipe phantom: error: --quirk missing_slice cannot be written into the one multi-frame file of --enhanced. "
            "Fix: with --enhanced use only --quirk shuffled_names, localizer, second_series, or drop --enhanced",
        ),
    ):
        assert main(["phantom", str(tmp_path), *argv]) == 2, argv  # flags that do not go together: a bad argument
        err = capsys.readouterr().err
        assert err.startswith(expected) and err.count("ctpipe phantom") == 1, err
    assert not any(tmp_path.iterdir())


def test_phantom_nodule_diameters_in_the_wrong_order(tmp_path, capsys):
    assert main(["phantom", str(tmp_path), "--seed", "1", "--count", "2", "--nodule-diameter", "30", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "minimum is larger than the maximum" in err and "--nodule-diameter 3 30" in err


def test_phantom_rewritten_with_other_options_leaves_no_slice_of_the_earlier_series(tmp_path, capsys):
    small = ["phantom", str(tmp_path), "--seed", "1", "--matrix", "64", "--pixel-spacing", "2", "--nodules", "0"]
    assert main([*small, "--slices", "12"]) == 0
    assert main([*small, "--slices", "8"]) == 0
    assert "replaced the earlier case" in capsys.readouterr().out
    case = tmp_path / "phantom_00001"
    assert len(list((case / "dicom").iterdir())) == 8
    # a folder of the same name that is not a phantom case is left alone
    other = tmp_path / "other" / "phantom_00001"
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("mine")
    assert main(["phantom", str(tmp_path / "other"), *small[2:], "--slices", "8"]) == 1
    assert "no phantom ground_truth.json" in capsys.readouterr().err and (other / "notes.txt").is_file()


# --- ctpipe evaluate --------------------------------------------------------------------------------------------------
TRUTH_ROWS = [("s1", 10.0, -20.0, -100.0, 10.0), ("s1", -40.0, 30.0, -150.0, 8.0), ("s2", 20.0, 25.0, -120.0, 12.0)]


def _evaluate(capsys, tmp_path, *pred: Path) -> tuple[int, str, str]:
    truth = _csv(tmp_path / "annotations.csv", "diameter_mm", TRUTH_ROWS)
    argv = ["evaluate", "--pred", *map(str, pred), "--truth", str(truth), "--out", str(tmp_path / "eval"), "--bootstrap", "5"]
    rc = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out, out.err


def test_evaluate_refuses_nan_probabilities_and_decimal_commas(tmp_path, capsys):
    pred = _csv(tmp_path / "c.csv", "probability", [("s1", 10, -20, -100, 0.9), ("s1", 0, 0, 0, "nan")])
    rc, _, err = _evaluate(capsys, tmp_path, pred)
    assert rc == 1 and "row 3: probability 'nan' is not a finite number" in err
    (tmp_path / "semi.csv").write_text("seriesuid;coordX;coordY;coordZ;probability\ns1;10,5;-20;-100;0,9\n")
    rc, _, err = _evaluate(capsys, tmp_path, tmp_path / "semi.csv")
    assert rc == 1 and "coordX '10,5'" in err and "decimal point" in err


def test_evaluate_counts_a_file_named_twice_once(tmp_path):
    from pipeline.detection.evaluate_io import load_predictions, load_truth

    pred = _csv(tmp_path / "c.csv", "probability", [("s1", 10, -20, -100, 0.9)])
    truth = _csv(tmp_path / "annotations.csv", "diameter_mm", TRUTH_ROWS)
    assert len(load_predictions([pred, tmp_path / "." / "c.csv"])["s1"]) == 1
    assert len(load_truth([truth, truth])["s1"]) == 2
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "ground_truth.json").write_text(
        json.dumps({"series_uid": "s9", "nodules": [{"center_lps": [0, 0, 0], "diameter_mm": 6.0}]})
    )
    assert len(load_truth([tmp_path / "case", tmp_path / "case" / "ground_truth.json"])["s9"]) == 1


def test_evaluate_refuses_two_findings_files_of_one_scan(tmp_path, capsys):
    from pipeline.detection.findings import Finding, Findings

    box = {"box_min_lps": (7.0, -23.0, -103.0), "box_max_lps": (13.0, -17.0, -97.0), "diameter_mm": 6.0}
    finding = Finding(center_lps=(10.0, -20.0, -100.0), score=0.9, voxel_ijk=(1, 2, 3), slice_number=4, **box)
    findings = Findings(case_id="s1", series_uid="s1", findings=[finding])
    findings.write_json(tmp_path / "run1" / "s1.findings.json")
    findings.write_json(tmp_path / "run2" / "s1.findings.json")
    rc, _, err = _evaluate(capsys, tmp_path, tmp_path / "run1", tmp_path / "run2")
    assert rc == 1 and "scan s1 has findings here and in" in err and "count twice" in err
    rc, _, _ = _evaluate(capsys, tmp_path, tmp_path / "run1", tmp_path / "run1" / "s1.findings.json")
    assert rc == 0


def test_evaluate_warns_of_voxel_indices_and_ras_coordinates(tmp_path, capsys):
    voxel = _csv(tmp_path / "v.csv", "probability", [("s1", 120, 88, 40, 0.9), ("s2", 100, 100, 30, 0.8)])
    rc, out, err = _evaluate(capsys, tmp_path, voxel)
    assert rc == 0 and "look like voxel indices" in err and "CPM" in out
    ras = [(s, -x, -y, z, 0.9) for s, x, y, z, _ in TRUTH_ROWS]
    rc, _, err = _evaluate(capsys, tmp_path, _csv(tmp_path / "r.csv", "probability", ras))
    assert rc == 0 and "look like RAS" in err and "negate coordX and coordY" in err
    lps = [(s, x, y, z, 0.9) for s, x, y, z, _ in TRUTH_ROWS]
    rc, _, err = _evaluate(capsys, tmp_path, _csv(tmp_path / "l.csv", "probability", lps))
    assert rc == 0 and "warning" not in err


def test_evaluate_warns_of_prediction_scans_without_truth(tmp_path, capsys):
    rows = [("s1", 10, -20, -100, 0.9), ("s1x", 0, 0, 0, 0.5)]
    rc, _, err = _evaluate(capsys, tmp_path, _csv(tmp_path / "c.csv", "probability", rows))
    assert rc == 0 and "1 scan(s) of the predictions have no ground truth" in err and "s1x" in err and "--scans" in err


def test_evaluate_points_from_ctpipe_findings_csv_to_its_json(tmp_path, capsys):
    (tmp_path / "a.findings.csv").write_text("case_id,series_uid,rank,score,center_x_lps,center_y_lps,center_z_lps\n")
    rc, _, err = _evaluate(capsys, tmp_path, tmp_path / "a.findings.csv")
    assert rc == 1 and "pass the .findings.json beside it" in err


# --- ctpipe ingest ----------------------------------------------------------------------------------------------------
def test_ingest_refuses_a_spacing_tolerance_out_of_range(tmp_path, capsys):
    line = _usage_error(capsys, "ingest", str(tmp_path), "--out", str(tmp_path / "c"), "--spacing-tolerance", "-1")
    assert "argument --spacing-tolerance: -1 is out of range (0.0..1.0)" in line
    assert "--axial-tolerance: 500 is out of range" in _usage_error(
        capsys, "ingest", str(tmp_path), "--out", str(tmp_path / "c"), "--axial-tolerance", "500"
    )


def test_ingest_of_a_rejected_series_does_not_say_nothing_matched(tmp_path, capsys):
    src = tmp_path / "src"
    for f in sorted((SAMPLES / "phantom_00003" / "dicom").rglob("*")):
        if f.is_file():
            (src / f.relative_to(SAMPLES / "phantom_00003" / "dicom")).parent.mkdir(parents=True, exist_ok=True)
            (src / f.relative_to(SAMPLES / "phantom_00003" / "dicom")).write_bytes(f.read_bytes())
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache")]) == 0  # cached while the series was whole
    capsys.readouterr()
    victim = sorted(p for p in src.rglob("*") if p.is_file())[5]
    victim.write_bytes(victim.read_bytes()[:-100])  # a transfer cut short
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache")]) == 1
    out = capsys.readouterr().out
    assert "no series was cached: 1 rejected" in out and "nothing matched" not in out
    assert "still holds case" in out and "from an earlier ingest of this series; it was not replaced" in out


def test_ingest_twice_into_the_same_cache_gives_the_same_entries(tmp_path, capsys):
    argv = ["ingest", str(SAMPLES / "phantom_00001" / "dicom"), "--out", str(tmp_path)]
    assert main(argv) == 0
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(argv) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["format"]


def test_evaluate_refuses_two_ground_truths_of_one_scan(tmp_path):
    from pipeline.detection.evaluate_io import load_truth
    from pipeline.errors import ConfigError

    gt = {"series_uid": "s1", "nodules": [{"center_lps": [10.0, -20.0, -100.0], "diameter_mm": 6.0}]}
    for copy in ("phantom", "phantom copy"):
        (tmp_path / copy).mkdir()
        (tmp_path / copy / "ground_truth.json").write_text(json.dumps(gt))
    with pytest.raises(ConfigError, match="scan s1 has a ground truth here and in .*count twice"):
        load_truth([tmp_path / "phantom", tmp_path / "phantom copy"])
    assert len(load_truth([tmp_path / "phantom", tmp_path / "phantom" / "ground_truth.json"])["s1"]) == 1


def test_evaluate_reports_the_figures_at_a_score_threshold(tmp_path, capsys):
    # s1's first nodule hit at 0.9 and again at 0.3 (no false positive), s2's nodule at 0.5; false positives 0.7, 0.2
    rows = [
        ("s1", 10, -20, -100, 0.9),
        ("s1", 11, -20, -100, 0.3),
        ("s1", 80, 80, -100, 0.7),
        ("s2", 20, 25, -120, 0.5),
        ("s2", -60, 0, -120, 0.2),
    ]
    truth = _csv(tmp_path / "annotations.csv", "diameter_mm", TRUTH_ROWS)
    pred = _csv(tmp_path / "c.csv", "probability", rows)
    argv = ["evaluate", "--pred", str(pred), "--truth", str(truth), "--out", str(tmp_path / "eval"), "--bootstrap", "0"]
    assert main([*argv, "--at-score", "0.5", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "at score >= 0.5: sensitivity 0.667 (2/3) at 0.50 FPs/scan" in out
    assert "at score >= 0.95: sensitivity 0.000 (0/3) at 0.00 FPs/scan" in out
    assert "nodules found by size: 6-10 mm 0/1, 10-20 mm 2/2" in out  # the 8 mm nodule missed at 0.5
    saved = json.loads((tmp_path / "eval" / "at_score.json").read_text())
    assert [(f["nodules_found"], f["fps_per_scan"]) for f in saved] == [(2, 0.5), (0, 0.0)]
    assert [(b["min_mm"], b["nodules_found"], b["n_nodules"]) for b in saved[0]["by_size"]] == [
        (0.0, 0, 0),
        (6.0, 0, 1),
        (10.0, 2, 2),
        (20.0, 0, 0),
    ]
    assert "--at-score: 1.5 is out of range" in _usage_error(capsys, *argv, "--at-score", "1.5")


def _findings_file(path: Path, scan: str, rows: list[tuple[tuple[float, float, float], float]], threshold: float | None):
    from pipeline.detection.findings import Finding, Findings

    items = [
        Finding(
            center_lps=c,
            score=s,
            voxel_ijk=(1, 2, 3),
            slice_number=4,
            box_min_lps=tuple(v - 3.0 for v in c),
            box_max_lps=tuple(v + 3.0 for v in c),
            diameter_mm=6.0,
        )
        for c, s in rows
    ]
    Findings(case_id=scan, series_uid=scan, findings=items).select(threshold, "test").write_json(path)


def test_evaluate_reports_the_threshold_the_findings_were_reported_at(tmp_path, capsys):
    # LPS mm; the truth of TRUTH_ROWS: s1 two nodules (10 and 8 mm), s2 one (12 mm)
    s1 = [((10.0, -20.0, -100.0), 0.9), ((-40.0, 30.0, -150.0), 0.4), ((80.0, 80.0, -100.0), 0.7)]
    s2 = [((20.0, 25.0, -120.0), 0.6), ((-60.0, 0.0, -120.0), 0.3)]
    for threshold in (0.5, 0.35):
        run = tmp_path / f"run{threshold}"
        _findings_file(run / "s1.findings.json", "s1", s1, threshold)
        _findings_file(run / "s2.findings.json", "s2", s2, threshold)
    rc, out, _ = _evaluate(capsys, tmp_path, tmp_path / "run0.5")
    assert rc == 0 and "at score >= 0.5: sensitivity 0.667 (2/3) at 0.50 FPs/scan (the threshold the findings" in out
    rc, out, _ = _evaluate(capsys, tmp_path, tmp_path / "run0.35" / "s1.findings.json", tmp_path / "run0.35" / "s2.findings.json")
    assert rc == 0 and "at score >= 0.35: sensitivity 1.000 (3/3) at 0.50 FPs/scan" in out
    # reported at different thresholds (or every candidate, or a CSV): no single operating point to report
    rc, out, _ = _evaluate(capsys, tmp_path, tmp_path / "run0.5" / "s1.findings.json", tmp_path / "run0.35" / "s2.findings.json")
    assert rc == 0 and "CPM" in out and "at score >=" not in out
    _findings_file(tmp_path / "all" / "s1.findings.json", "s1", s1, None)
    rc, out, _ = _evaluate(capsys, tmp_path, tmp_path / "all")
    assert rc == 0 and "at score >=" not in out
