"""``ctpipe run`` and ``ctpipe detect`` on one series: the same candidates, scored the same.

Hospital IT checks a batch run against ``ctpipe detect`` on the same series. The run limited its candidates to the
reconstruction's full-resolution lungs, ``ctpipe detect`` to the lungs the detector segments on its coarse grid: on a
chest whose lungs a tilted image's edge cuts, the run kept 9 more low-scoring candidates (254 against 245). Both now
limit them to the detector's own lung segmentation and crop the network input to the same box.
"""

from __future__ import annotations

import json

import pytest

from tests.test_gantry_tilt_detector_lungs import _write

pytestmark = pytest.mark.slow


def _candidates(doc: dict) -> list[tuple[float, tuple[float, ...]]]:
    """(score, centre LPS mm) of every candidate of a findings JSON, reported or below the threshold, best first."""
    every = [*doc["findings"], *doc.get("below_threshold", [])]
    return sorted(((round(f["score"], 4), tuple(round(x, 1) for x in f["center_lps"])) for f in every), reverse=True)


@pytest.mark.parametrize("tilt_deg", [15.0])
def test_run_and_detect_keep_the_same_candidates_of_a_chest_cut_at_a_tilted_edge(tmp_path, tilt_deg):
    from pipeline.cli import main

    src = _write(tmp_path / "src" / "dicom", tilt_deg=tilt_deg).parent
    det_out, run_out = tmp_path / "det", tmp_path / "run"
    tilt = ["--allow-gantry-tilt"] if tilt_deg else []
    assert (
        main(
            [
                "detect",
                str(src),
                "--out",
                str(det_out),
                "--device",
                "cpu",
                "--all-candidates",
                "--no-png",
                "--no-dicom",
                "--fp32",
                *tilt,
            ]
        )
        == 0
    )
    run = ["run", str(src), "--out", str(run_out), "--device", "cpu", "--quiet", "--no-dicom"]
    run += [
        "--set",
        "report.enabled=false",  # the throughput report: not compared
        "--set",
        "detector.amp=false",
        "--set",
        "reconstruct.renderings=false",
        "--set",
        f"ingest.allow_gantry_tilt={'true' if tilt_deg else 'false'}",
    ]
    assert main(run) == 0
    (det_json,) = det_out.glob("*.findings.json")
    (run_json,) = (run_out / "cases").glob("*/findings.json")
    by_detect, by_run = _candidates(json.loads(det_json.read_text())), _candidates(json.loads(run_json.read_text()))
    assert len(by_detect) > 20  # a search that found something to compare
    assert by_run == by_detect, (len(by_run), len(by_detect), sorted(set(by_run) ^ set(by_detect))[-5:])
