"""The runner's load stage: the loader of pipeline.load makes the detector's input, chosen and cropped by the config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.runner import open_run, run_batch
from pipeline.runner.stages import build_stages

pytest_plugins = ["tests._support.runner"]
pytestmark = pytest.mark.slow

QUICK = {"reconstruct.enabled": False, "report.enabled": False, "detector.write_png": False, "detector.postprocess": False}


def _input_shapes(out) -> dict[str, list[int]]:
    return {d.name: json.loads((d / "findings.json").read_text())["input_shape_xyz"] for d in (out / "cases").iterdir()}


def test_stage_order_puts_the_lungs_first_and_load_right_before_detect():
    from pipeline.config import load_config

    names = lambda **o: [s.name for s in build_stages(load_config(overrides=o, environ={}))]  # noqa: E731
    # the lungs are segmented (with every organ) before the search, the findings measured in them after it
    assert names() == ["ingest", "reconstruct", "load", "detect", "nodules", "write", "dicom"]
    # without reconstruction, or without both lungs among its organs, a lungs-only step comes first
    assert names(**{"reconstruct.enabled": False}) == ["ingest", "lungs", "load", "detect", "write", "dicom"]
    assert names(**{"reconstruct.organs": ["body", "bone"]}) == [
        "ingest",
        "lungs",
        "load",
        "detect",
        "reconstruct",
        "write",
        "dicom",
    ]
    # the DICOM results (SR, SEG) come last, and not at all when none is asked for
    assert names(**{"outputs.dicom": []}) == ["ingest", "reconstruct", "load", "detect", "nodules", "write"]


def test_loader_backend_and_lung_roi_are_respected(dicom_data, tmp_path):
    one = dicom_data["good"] / "case11"  # one case: the crop is per case
    whole = run_batch(
        [one],
        out=tmp_path / "whole",
        workers=0,
        **QUICK,
        **{"loader.backend": "torch", "loader.roi": "none", "detector.lung_restriction": False},
    )
    lungs = run_batch(
        [one],
        out=tmp_path / "lungs",
        workers=0,
        **QUICK,
        **{"loader.backend": "torch", "loader.roi": "lungs", "loader.roi_margin_mm": 2.0, "detector.lung_restriction": False},
    )
    assert whole.exit_code == 0 and lungs.exit_code == 0 and whole.done == lungs.done == 1
    log = (tmp_path / "lungs" / "run.log").read_text()
    assert "loader: torch on CPU (asked for with loader='torch')" in log
    big, small = _input_shapes(tmp_path / "whole"), _input_shapes(tmp_path / "lungs")
    assert big.keys() == small.keys()
    for case in big:  # the crop to the lungs' box shrinks the model input
        assert np.prod(small[case]) < 0.9 * np.prod(big[case]), (case, small[case], big[case])
    run = open_run(tmp_path / "lungs")
    load = run.stages[run.stages.stage == "load"]
    assert len(load) == 1 and (load.status == "ok").all()
    details = [json.loads(d) for d in load.detail]
    assert all(d["lung_mask"] > 0 and d["load"] > 0 for d in details)  # per-step times (s) of the load stage
    whole_load = open_run(tmp_path / "whole").stages.query("stage == 'load'")
    assert all("lung_mask" not in json.loads(d) for d in whole_load.detail)  # no crop asked: no lung mask made
