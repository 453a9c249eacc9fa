"""Errors of the model loader, the FROC evaluation and the reconstruction name where the problem is and the fix;
options that follow the data are keyword-only."""

from __future__ import annotations

import inspect
import json
import logging

import numpy as np
import pytest

from pipeline.detection.bundle import load_ctpipe_model
from pipeline.detection.evaluate import evaluate_froc, sensitivity_at
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.errors import BundleError, ConfigError, ReconstructionError
from pipeline.reconstruction.measure import organ_measurements
from pipeline.reconstruction.nodules import segment_findings, segment_nodule
from pipeline.reconstruction.segment import segment_organs
from pipeline.runner.results import RunResults
from pipeline.volume import CTVolume, Geometry


def _model_json(tmp_path, **changes):
    doc = json.loads(DEMO_MODEL_JSON.read_text())
    network = changes.pop("network", {})
    doc["network"].update(network)
    doc.update(changes)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "network,words",
    [
        ({"conv1_t_stride": [2, 2]}, "conv1_t_stride must have 3 values"),
        ({"kind": "monai_resnet_fpn", "depth": 42}, "ResNet depth 42"),
        ({"kind": "transformer"}, "network kind 'transformer' is not supported"),
        ({"layers": None}, "invalid network options"),
    ],
)
def test_bad_network_options_name_the_model_json_and_the_fix(tmp_path, network, words):
    path = _model_json(tmp_path, network=network)
    with pytest.raises(BundleError) as err:
        load_ctpipe_model(path)
    assert err.value.where == str(path) and words in err.value.problem and err.value.fix


def test_a_model_json_without_weights_says_how_to_name_them(tmp_path):
    path = _model_json(tmp_path, weights=None)
    with pytest.raises(BundleError, match="names no weights file") as err:
        load_ctpipe_model(path)
    assert err.value.where == str(path) and "weights" in (err.value.fix or "")


@pytest.mark.parametrize(
    "call,where",
    [
        (lambda: evaluate_froc({}, {}), "match_predictions(predictions, truth, scans=...)"),
        (
            lambda: evaluate_froc({"a": []}, {"a": [((0.0, 0.0, 0.0), 2.0)]}),
            "match_predictions(truth, scans=..., min_diameter_mm=...)",
        ),
        (lambda: evaluate_froc({}, {}, reading="nearest"), "evaluate_froc(reading=...)"),
        (lambda: evaluate_froc({}, {}, max_marks_per_scan=0), "evaluate_froc(max_marks_per_scan=...)"),
        (lambda: sensitivity_at(np.zeros(2), np.zeros(2), [1.0], reading="nearest"), "sensitivity_at(reading=...)"),
    ],
)
def test_froc_evaluation_errors_name_the_argument_and_the_fix(call, where):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.where == where and err.value.fix


def _volume(uid: str | None = "1.2.3.4") -> CTVolume:
    geom = Geometry(shape=(12, 24, 24), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0))
    return CTVolume(np.full(geom.shape, -1000.0, np.float32), geom, metadata={"SeriesInstanceUID": uid} if uid else {})


def test_unknown_organ_error_names_the_argument():
    with pytest.raises(ReconstructionError) as err:
        segment_organs(_volume(), organs=["lungz"], device="cpu")
    assert err.value.where == "segment_organs(organs=...)" and "lung_left" in (err.value.fix or "")


def test_nodule_errors_and_their_log_name_the_case_or_series_and_the_finding(caplog):
    vol = _volume()
    outside = {"center_lps": (500.0, 500.0, 500.0), "diameter_mm": 6.0}
    no_lung = {"center_lps": (12.0, 12.0, 6.0), "diameter_mm": 6.0}  # all air: no nodule level above the lung
    with caplog.at_level(logging.WARNING, logger="pipeline.reconstruction.nodules"):
        res = segment_findings(vol, [outside, no_lung, {"center_lps": (1.0, 2.0, 3.0)}], case_id="c7")
    assert res[0].error is not None and res[0].error.startswith("case c7, finding 0: ") and "outside the volume" in res[0].error
    assert res[1].error is not None and res[1].error.startswith("case c7, finding 1: ")
    assert res[2].error is not None and res[2].error.startswith("case c7, finding 2: ") and "has no box" in res[2].error
    logged = [r.getMessage() for r in caplog.records]
    assert all(any(f"case c7, finding {n}:" in m for m in logged) for n in range(3)), logged
    with pytest.raises(ReconstructionError) as err:
        segment_nodule(vol, outside, index=3)
    assert err.value.where == "series 1.2.3.4, finding 3" and err.value.fix
    with pytest.raises(ReconstructionError) as err:
        segment_nodule(_volume(None), outside)
    assert err.value.where == "finding 0"


@pytest.mark.parametrize("func,name", [(organ_measurements, "mesh"), (RunResults.report, "out")])
def test_optional_arguments_are_keyword_only(func, name):
    assert inspect.signature(func).parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
