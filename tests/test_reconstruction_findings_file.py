"""The findings file of ``ctpipe reconstruct --findings`` and ``reconstruct(findings=path)``: read and checked once,
before any work; a bad finding is refused naming the file, the finding's index, the field and the value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.detection.findings import Finding, Findings
from pipeline.errors import ReconstructionError
from pipeline.reconstruction import reconstruct
from pipeline.reconstruction.findings_in import read_findings
from tests._support.shapes import synthetic_chest

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"
FIX = "Fix: give a findings JSON written by `ctpipe detect`"


def _finding(score: float = 0.9, centre=(-12.0, 3.0, -240.0), half: float = 3.0) -> Finding:
    c = np.asarray(centre, dtype=float)
    return Finding(
        center_lps=(float(c[0]), float(c[1]), float(c[2])),
        box_min_lps=(float(c[0] - half), float(c[1] - half), float(c[2] - half)),
        box_max_lps=(float(c[0] + half), float(c[1] + half), float(c[2] + half)),
        diameter_mm=2 * half,
        score=score,
        voxel_ijk=(27, 50, 23),
        slice_number=24,
    )


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _detect_doc(**changes) -> dict:
    doc = Findings([_finding(0.9)], series_uid="1.2.3", model="demo", score_threshold=0.5, below_threshold=[_finding(0.2)])
    data = doc.to_json()
    for key, value in changes.items():
        data[key] = value
    return data


def test_the_detect_document_and_a_list_are_read(tmp_path):
    items, reported = read_findings(Findings([_finding()], score_threshold=0.5, model="demo").write_json(tmp_path / "d.json"))
    assert items == [_finding()] and isinstance(reported, Findings) and reported.score_threshold == 0.5
    listed = [{"center_lps": [1.0, 2.0, 3.0], "diameter_mm": 6.0}]
    items, reported = read_findings(_write(tmp_path / "l.json", listed))
    assert items == listed and reported is items
    # a box alone gets its centre and equivalent diameter (LPS mm), as the SR reports them
    box = [{"box_min_lps": [0, 0, 0], "box_max_lps": [2, 4, 8], "score": 0.7}]
    items, _ = read_findings(_write(tmp_path / "b.json", box))
    assert items[0]["center_lps"] == [1.0, 2.0, 4.0] and items[0]["diameter_mm"] == pytest.approx(4.0)
    assert items[0]["score"] == 0.7


@pytest.mark.parametrize(
    ("data", "where", "problem"),
    [
        ([{"foo": 1}], "finding 0", "has no box: neither center_lps with diameter_mm nor box_min_lps/box_max_lps"),
        (
            [{"center_lps": [1, 2], "diameter_mm": "x"}],
            "finding 0",
            "center_lps must be 3 finite numbers (x, y, z in LPS mm), got [1, 2]",
        ),
        ([{"center_lps": [1, 2, 3], "diameter_mm": "x"}], "finding 0", "diameter_mm must be a positive size in mm, got 'x'"),
        (
            [{"center_lps": [1, 2, 3], "diameter_mm": 5}, {"center_lps": [1, 2, 3], "diameter_mm": 0}],
            "finding 1",
            "diameter_mm must be a positive size in mm, got 0",
        ),
        ([{"center_lps": [1, "2", 3], "diameter_mm": 5}], "finding 0", "center_lps must be 3 finite numbers"),
        ([{"center_lps": [1, 2, float("nan")], "diameter_mm": 5}], "finding 0", "got [1, 2, nan]"),
        ([{"center_lps": [1, 2, 3]}], "finding 0", "has no box: center_lps is given without diameter_mm"),
        ([{"box_min_lps": [0, 0, 0]}], "finding 0", "box_min_lps is given without box_max_lps"),
        ([{"box_min_lps": [0, 0, 0], "box_max_lps": [1, 1, 0]}], "finding 0", "has no extent along S"),
        ([{"center_lps": [1, 2, 3], "diameter_mm": 5, "score": 2}], "finding 0", "score must be a number from 0 to 1, got 2"),
        ([[1, 2, 3]], "", "finding 0 is not an object with center_lps"),
        (_detect_doc(findings=[{**_finding().to_json(), "diameter_mm": -3}]), "finding 0", "got -3"),
        (_detect_doc(findings=[{**_finding().to_json(), "score": "high"}]), "finding 0", "score must be a number"),
        (
            _detect_doc(findings=[{k: v for k, v in _finding().to_json().items() if k != "slice_number"}]),
            "finding 0",
            "slice_number is missing",
        ),
        (_detect_doc(below_threshold=[{"center_lps": [1, 2, None]}]), "below_threshold, finding 0", "got [1, 2, None]"),
        (_detect_doc(findings={"a": 1}), "", "'findings' must be a list of findings"),
        ({"foo": 1}, "", "not a ctpipe findings JSON (format None)"),
        ("findings", "", "not a ctpipe findings JSON (a JSON str)"),
    ],
)
def test_a_bad_finding_is_refused_naming_the_file_the_finding_the_field_and_the_value(tmp_path, data, where, problem):
    path = _write(tmp_path / "f.json", data)
    with pytest.raises(ReconstructionError) as err:
        read_findings(path)
    assert err.value.where == (f"{path}, {where}" if where else str(path))
    assert problem in err.value.problem and err.value.fix


def test_a_list_needs_scores_for_the_dicom_results(tmp_path):
    path = _write(tmp_path / "f.json", [{"center_lps": [1, 2, 3], "diameter_mm": 5}])
    assert read_findings(path)[0][0]["diameter_mm"] == 5
    with pytest.raises(ReconstructionError) as err:
        read_findings(path, need_score=True)
    assert err.value.where == f"{path}, finding 0" and "has no score" in err.value.problem and "--no-dicom" in str(err.value.fix)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # was: 7 files written, then a TypeError traceback from the SR (no score), the folder left behind
        ([{"foo": 1}], "finding 0: finding {'foo': 1} has no box"),
        # was: a ValueError traceback from the nodule segmentation
        (
            [{"center_lps": [1, 2], "diameter_mm": "x"}],
            "finding 0: center_lps must be 3 finite numbers (x, y, z in LPS mm), got [1, 2]",
        ),
        ([{"center_lps": [1, 2, 3], "diameter_mm": 5}], "finding 0: the finding has no score"),
    ],
)
def test_cli_refuses_bad_findings_before_writing_anything(tmp_path, capsys, data, message):
    path = _write(tmp_path / "f.json", data)
    out = tmp_path / "out"
    rc = main(["reconstruct", str(SAMPLE / "dicom"), "--out", str(out), "--findings", str(path), "--no-render"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert f"ctpipe reconstruct: error: {path}, {message}" in err and FIX in err
    assert not out.exists()


def test_cli_takes_a_list_without_scores_when_it_writes_no_dicom_results(tmp_path, capsys):
    path = _write(tmp_path / "f.json", [{"center_lps": [500.0, 500.0, 500.0], "diameter_mm": 5}])
    argv = ["reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "o"), "--findings", str(path)]
    assert main([*argv, "--organs", "body", "--no-render", "--no-dicom"]) == 0
    meas = json.loads(next((tmp_path / "o").glob("*_measurements.json")).read_text())
    assert "outside the volume" in meas["nodules"][0]["error"]  # a finding of another series: its own error


def test_reconstruct_reads_and_checks_a_findings_path_before_any_work(tmp_path, monkeypatch):
    import pipeline.reconstruction.stage as stage

    vol, _ = synthetic_chest(n=32, slices=16)
    path = _write(tmp_path / "f.json", [{"center_lps": [1, 2, 3], "diameter_mm": "x"}])
    real = stage.segment_organs
    monkeypatch.setattr(stage, "segment_organs", lambda *a, **k: pytest.fail("segmented before the findings were read"))
    with pytest.raises(ReconstructionError, match="diameter_mm must be a positive size in mm, got 'x'") as err:
        reconstruct(vol, organs=("body",), findings=path, device="cpu", out_dir=tmp_path / "out")
    assert err.value.where == f"{path}, finding 0"
    with pytest.raises(ReconstructionError) as err:  # findings given as objects are checked alike
        reconstruct(vol, organs=("body",), findings=[{"center_lps": (1, 2, 3), "diameter_mm": 5}, {"score": 1}], device="cpu")
    assert err.value.where == "findings, finding 1" and "has no box" in err.value.problem
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(stage, "segment_organs", real)
    _write(path, [{"center_lps": [500.0, 500.0, 500.0], "diameter_mm": 5.0}])
    rec = reconstruct(vol, organs=("body",), findings=str(path), device="cpu", render=False)
    assert len(rec.nodules) == 1 and "outside the volume" in str(rec.nodules[0].error)


def test_cli_prints_a_line_per_nodule_with_its_side_centre_size_and_volume_or_why_not(tmp_path, capsys):
    """A user reads each finding's nodule from the terminal: which finding, the lung holding it, its centre (LPS mm),
    long and short axis on the image where it is largest (mm), their mean and that image's InstanceNumber, its 3-D
    extent, equivalent-sphere diameter (mm) and volume (mL), or why it was not segmented."""
    truth = json.loads((SAMPLE / "ground_truth.json").read_text())
    nodule = next(n for n in truth["nodules"] if n["kind"] == "solid" and n["attached_to"] is None)
    findings = [
        {"center_lps": nodule["center_lps"], "diameter_mm": 1.3 * nodule["diameter_mm"]},
        {"center_lps": [500.0, 500.0, 500.0], "diameter_mm": 5.0},
    ]
    path = _write(tmp_path / "f.json", findings)
    argv = ["reconstruct", str(SAMPLE / "dicom"), "--out", str(tmp_path / "o"), "--findings", str(path)]
    assert main([*argv, "--organs", "lung_left,lung_right", "--no-render", "--no-dicom"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nodule")]
    assert len(lines) == 2, lines
    side = nodule["lung"].removeprefix("lung_")
    assert lines[0].startswith(f"nodule of finding #1: {side} lung, centre LPS (") and "not segmented" not in lines[0]
    names = ("diameter", "long axis", "short axis", "mean diameter", "3-D extent", "volume")
    figures = {name: float(lines[0].split(f", {name} ", 1)[1].split(" ", 1)[0]) for name in names}
    centre = [float(v) for v in lines[0].split("centre LPS (", 1)[1].split(")", 1)[0].split(", ")]
    assert np.allclose(centre, nodule["center_lps"], atol=1.5)
    assert abs(figures["volume"] * 1000.0 - nodule["volume_mm3"]) < 0.25 * nodule["volume_mm3"]  # mL
    assert abs(figures["diameter"] - nodule["diameter_mm"]) < 0.15 * nodule["diameter_mm"]
    assert figures["3-D extent"] >= figures["diameter"]
    assert 0 < figures["short axis"] <= figures["long axis"] <= figures["3-D extent"]
    assert figures["mean diameter"] == pytest.approx((figures["long axis"] + figures["short axis"]) / 2, abs=0.06)
    assert " on InstanceNumber " in lines[0]
    rounded = int(lines[0].split("mean diameter ", 1)[1].split("(", 1)[1].split(" mm)", 1)[0])
    assert rounded == int(np.floor(figures["mean diameter"] + 0.5))  # to the nearest mm, as the figure beside it reads
    assert lines[1].startswith("nodule of finding #2: not segmented: ") and "outside the volume" in lines[1]
    other = "lung_right" if side == "left" else "lung_left"  # the nodule's lung alone, then the other lung alone
    for organs, said in ((nodule["lung"], "lung side unknown (no "), (other, "lung side unknown (no ")):
        argv[3] = str(tmp_path / organs)
        assert main([*argv, "--organs", organs, "--no-render", "--no-dicom"]) == 0
        first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("nodule"))
        assert first.startswith(f"nodule of finding #1: {said}"), first  # never "outside the lungs" for want of a mask
