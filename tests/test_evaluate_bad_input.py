"""`ctpipe evaluate` bad input: a truth row without a positive diameter and a scan list with a stray header line are
refused when read, naming the file, the line and the value; no relevant nodule is said in the options' terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.detection.evaluate_io import load_scans, load_truth
from pipeline.errors import ConfigError
from tests._support.cli import cli_error as _err

HEADER = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "pred.csv").write_text("seriesuid,coordX,coordY,coordZ,probability\n1.2.3.1,0,0,0,0.9\n1.2.3.2,10,10,10,0.8\n")
    (tmp_path / "truth.csv").write_text(HEADER + "1.2.3.1,0,0,0,5\n1.2.3.2,10,10,10,2\n")
    return {"pred": tmp_path / "pred.csv", "truth": tmp_path / "truth.csv", "out": tmp_path / "eval"}


def _evaluate(capsys, files, *extra: str) -> tuple[int, str]:
    return _err(
        capsys, "evaluate", "--pred", str(files["pred"]), "--truth", str(files["truth"]), "--out", str(files["out"]), *extra
    )


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_a_truth_row_without_a_positive_finite_diameter_is_refused_by_file_and_row(tmp_path, capsys, files, value):
    # was: "match_predictions(truth, scans=..., min_diameter_mm=...): the ground truth holds no nodule ..."
    files["truth"].write_text(HEADER + "1.2.3.1,0,0,0,5\n" + f"1.2.3.2,10,10,10,{value}\n")
    rc, err = _evaluate(capsys, files)
    assert rc == 1 and f"{files['truth']}: row 3: diameter_mm '{value}' is not" in err and "Fix:" in err
    assert "match_predictions" not in err


def test_irrelevant_findings_keep_luna16s_minus_one_and_a_phantom_json_needs_positive_diameters(tmp_path, files):
    excluded = tmp_path / "annotations_excluded.csv"
    excluded.write_text(HEADER + "1.2.3.1,40,40,40,-1.0\n")
    assert load_truth([excluded], what="--irrelevant")["1.2.3.1"][0][1] == -1.0
    with pytest.raises(ConfigError, match=r"row 2: diameter_mm '-1.0' is not positive.*go to --irrelevant"):
        load_truth([excluded])
    case = tmp_path / "case"
    case.mkdir()
    gt = {"series_uid": "1.2.3.1", "nodules": [{"center_lps": [0, 0, 0], "diameter_mm": -5.0}]}
    (case / "ground_truth.json").write_text(json.dumps(gt))
    with pytest.raises(ConfigError, match=r"ground_truth.json: nodule 0 \(counting from 0\): diameter_mm -5.0 is not"):
        load_truth([case])


def test_a_scan_list_whose_first_line_is_no_series_uid_is_refused_not_taken_as_a_scan(tmp_path, capsys, files):
    # was: the line 'foo' counted as a scan without nodules, then the same match_predictions(...) message
    scans = tmp_path / "scans.csv"
    scans.write_text("foo\n1.2.3.1\n1.2.3.2\n")
    rc, err = _evaluate(capsys, files, "--scans", str(scans))
    assert rc == 1 and f"{scans}: line 1: 'foo' is neither a SeriesInstanceUID nor a scan of --pred or --truth" in err
    assert "no seriesuid header column" in err and "name its scan column seriesuid" in err
    scans.write_text("1.2.3.1\nbar\n")
    with pytest.raises(ConfigError, match=r"line 2: 'bar' is neither"):
        load_scans(scans)
    # LUNA16's seriesuids.csv has no header; a seriesuid header column (any position) takes any scan names
    scans.write_text("1.2.3.1\n1.2.3.2\n")
    assert load_scans(scans) == ["1.2.3.1", "1.2.3.2"]
    scans.write_text("subset,SeriesUID\n0,case-a\n1,case-b\n")
    assert load_scans(scans) == ["case-a", "case-b"]
    scans.write_text("case-a\ncase-b\n")
    assert load_scans(scans, known={"case-a", "case-b"}) == ["case-a", "case-b"]
    rc, err = _evaluate(capsys, files, "--scans", str(scans))
    assert rc == 1 and "line 1: 'case-a' is neither" in err


def test_no_relevant_nodule_is_said_with_the_files_and_options(tmp_path, capsys, files):
    rc, err = _evaluate(capsys, files, "--min-diameter", "8")
    assert rc == 1 and "match_predictions" not in err
    assert (
        f"--truth {files['truth']}: the ground truth holds no nodule of at least 8 mm (--min-diameter) in the 2 scan(s) "
        "named by --pred and --truth: its 2 nodule(s) there measure 2 to 5 mm. Fix: pass --min-diameter 5 or less" in err
    )
    scans = tmp_path / "scans.csv"
    scans.write_text("1.2.3.9\n")
    rc, err = _evaluate(capsys, files, "--scans", str(scans))
    assert rc == 1 and f"no nodule in the 1 scan(s) of --scans {scans} (its 2 nodule(s) are in 2 other scan(s))" in err
    assert "Fix: pass --scans listing the scans of --truth" in err
    rc, _ = _evaluate(capsys, files, "--bootstrap", "0")
    assert rc == 0 and (files["out"] / "froc.json").exists()
