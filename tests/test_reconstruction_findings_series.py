"""``reconstruct(findings=...)`` segments only the volume's own findings: findings of another series (a ``Findings``,
a findings JSON, a run's findings table) are refused before any work, naming both series, instead of measuring
whatever anatomy lies at their positions in this scan; a table of several series gives the volume's rows. The
command line refuses a findings file of another series before making ``--out``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.detection.findings import Finding, Findings
from pipeline.errors import ReconstructionError
from pipeline.phantom import generate_phantom, write_phantom_series
from pipeline.reconstruction import reconstruct

OTHER = "1.2.3.4.5.999"


@pytest.fixture(scope="module")
def phantom():
    return generate_phantom(5, matrix=96, pixel_spacing=2.0, slice_spacing=3.0, n_nodules=1, nodule_diameter_mm=(10.0, 12.0))


def _finding(nodule) -> Finding:
    c = np.asarray(nodule.center_lps)
    half = 0.65 * nodule.diameter_mm
    return Finding(
        center_lps=tuple(c),
        box_min_lps=tuple(c - half),
        box_max_lps=tuple(c + half),
        diameter_mm=2 * half,
        score=0.9,
        voxel_ijk=(0, 0, 0),
        slice_number=1,
    )


def test_findings_of_another_series_are_refused_naming_both(phantom):
    vol = phantom.volume
    other = Findings([_finding(phantom.nodules[0])], series_uid=OTHER)
    with pytest.raises(ReconstructionError) as err:
        reconstruct(vol, organs="lung_left", findings=other, render=False)
    text = str(err.value)
    assert OTHER in text and vol.series_uid in text and "another scan" in text
    assert "Fix: filter the findings by series" in text


def test_a_findings_json_of_another_series_is_refused(phantom, tmp_path):
    path = Findings([_finding(phantom.nodules[0])], series_uid=OTHER).write_json(tmp_path / "findings.json")
    with pytest.raises(ReconstructionError, match=f"the findings are of series {OTHER}"):
        reconstruct(phantom.volume, organs="lung_left", findings=path, render=False)


def test_a_run_findings_table_gives_the_volume_s_rows(phantom):
    """A table as ``open_run(...).findings`` gives it (centres and boxes LPS mm, a row of another case): the volume's
    nodule is segmented at its true size, the other case's row is left out."""
    vol, nodule = phantom.volume, phantom.nodules[0]
    f = _finding(nodule)
    row = {"center_x": f.center_lps[0], "center_y": f.center_lps[1], "center_z": f.center_lps[2]}
    row |= {
        "diameter_mm": f.diameter_mm,
        "score": f.score,
        "box_min_lps": list(f.box_min_lps),
        "box_max_lps": list(f.box_max_lps),
    }
    far = {**row, "center_x": row["center_x"] + 500.0, "series_uid": OTHER}
    table = pd.DataFrame([far, {**row, "series_uid": vol.series_uid}])
    rec = reconstruct(vol, organs="lung_left,lung_right", findings=table, render=False)
    assert len(rec.nodules) == 1 and rec.nodules[0].error is None
    assert rec.nodules[0].diameter_mm == pytest.approx(nodule.diameter_mm, rel=0.15)
    assert np.linalg.norm(np.asarray(rec.nodules[0].centroid_lps) - nodule.center_lps) < 0.25 * nodule.diameter_mm


def test_an_sr_table_without_sizes_takes_them_from_the_box(phantom):
    """A table as ``read_sr_findings`` gives it: ``box_min/max_x/y/z`` columns and NaN where no size is stated."""
    vol, nodule = phantom.volume, phantom.nodules[0]
    f = _finding(nodule)
    row = {"center_x": f.center_lps[0], "center_y": f.center_lps[1], "center_z": f.center_lps[2], "diameter_mm": np.nan}
    row |= {f"box_{end}_{a}": v for end, c in (("min", f.box_min_lps), ("max", f.box_max_lps)) for a, v in zip("xyz", c)}
    rec = reconstruct(vol, organs="lung_left,lung_right", findings=pd.DataFrame([row]), render=False)
    assert len(rec.nodules) == 1 and rec.nodules[0].error is None


def test_cli_refuses_a_findings_file_of_another_series_before_making_out(phantom, tmp_path, capsys):
    case = write_phantom_series(phantom, tmp_path / "case")
    path = Findings([_finding(phantom.nodules[0])], series_uid=OTHER).write_json(tmp_path / "findings.json")
    out = tmp_path / "out"
    rc = main(["reconstruct", str(case / "dicom"), "--out", str(out), "--findings", str(path), "--no-render"])
    err = capsys.readouterr().err
    assert rc != 0 and f"the findings are of series {OTHER}" in err
    assert not out.exists()


def test_findings_that_lost_their_series_are_segmented_with_a_warning_that_says_why_and_the_fix(phantom, caplog):
    """A plain list of the Finding objects of a ``Findings`` (``list(ctp.detect(vol))``) cannot be checked against the
    volume's series: segmented, with one warning naming why and the fix, as ``show`` gives (was: no word of it, though
    findings of another series given so would measure another scan's anatomy)."""
    import logging

    vol = phantom.volume
    found = Findings([_finding(phantom.nodules[0])], series_uid=vol.series_uid)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        rec = reconstruct(vol, organs="lung_left", findings=found, render=False)
    assert len(rec.nodules) == 1 and "no series UID" not in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        rec = reconstruct(vol, organs="lung_left", findings=list(found), render=False)
    assert len(rec.nodules) == 1
    [warning] = [r.getMessage() for r in caplog.records if "no series UID" in r.getMessage()]
    assert "a Finding object does not hold its series" in warning and "pass that Findings itself" in warning, warning
    caplog.clear()
    listed = [f.to_json() for f in found]  # a findings JSON list's objects, without series_uid
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        reconstruct(vol, organs="lung_left", findings=listed, render=False)
    [warning] = [r.getMessage() for r in caplog.records if "no series UID" in r.getMessage()]
    assert "needs a series_uid key" in warning and "Finding object" not in warning, warning


def test_the_cli_warns_once_of_a_findings_list_without_series(phantom, tmp_path, capsys):
    """``ctpipe reconstruct --findings`` with a JSON list of findings (the README's other accepted form) checks them
    before making ``--out`` and again in the reconstruction: one warning on the console, not two."""
    import json

    case = write_phantom_series(phantom, tmp_path / "case")
    path = tmp_path / "findings.json"
    path.write_text(json.dumps([{k: v for k, v in _finding(phantom.nodules[0]).to_json().items() if k != "series_uid"}]))
    rc = main(["reconstruct", str(case / "dicom"), "--out", str(tmp_path / "out"), "--findings", str(path), "--no-render"])
    err = capsys.readouterr().err
    assert rc == 0, err
    warned = [line for line in err.splitlines() if "no series UID" in line]
    assert len(warned) == 1 and "needs a series_uid key" in warned[0], err
