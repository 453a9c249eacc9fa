"""A bad value in a ctpipe model JSON: refused when the file is read, naming the file, the key path, the value and
the form allowed, with an example, as the model JSON's other errors give their fix."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.detection.model_config import DEMO_MODEL_JSON, load_model_config
from pipeline.errors import BundleError

DEMO = json.loads(DEMO_MODEL_JSON.read_text(encoding="utf-8"))

#: (key path, a value it does not take, words of the form the error gives)
BAD = [
    ("format", "ctpipe-detector/2", '"ctpipe-detector/1"'),
    ("name", 5, "a string"),
    ("spacing_mm_ras", [1.0, -1.0, 1.25], "three positive numbers in mm (x, y, z), e.g. [1.0, 1.0, 1.25]"),
    ("spacing_mm_ras", ["a", 1.0, 1.25], "three positive numbers in mm"),
    ("spacing_mm_ras", [1.0, 1.0], "three positive numbers in mm"),
    ("spacing_mm_ras", "1,1,1.25", "three positive numbers in mm"),
    ("spacing_mm_ras", [1.0, float("nan"), 1.25], "three positive numbers in mm"),
    ("size_divisible", [16, 16, 8.5], "three positive integers in voxels (x, y, z), e.g. [192, 192, 160]"),
    ("intensity_window", [-1024, 300], "a JSON object"),
    ("intensity_window.a_min", "-1024", "a number of HU, e.g. -1024.0"),
    ("intensity_window.a_max", -2000.0, "a number of HU above a_min (-1024.0)"),
    ("intensity_window.clip", "yes", "true or false"),
    ("anchors.feature_map_scales", [1, 0, 4], "a list of positive integers, e.g. [1, 2, 4]"),
    ("anchors.base_anchor_shapes", [[4, 4], [6, 6, 5]], "a list of anchor sizes, each three positive numbers in voxels"),
    ("box_selector.score_thresh", 1.5, "a number from 0 to 1"),
    ("box_selector.nms_thresh", -0.1, "a number from 0 to 1"),
    ("box_selector.detections_per_img", 0, "a positive integer"),
    ("box_selector.topk_candidates_per_level", True, "a positive integer"),
    ("sliding_window.roi_size", [448, 448], "three positive integers in voxels"),
    ("sliding_window.overlap", 1.0, "a number from 0 to under 1"),
    ("sliding_window.mode", "median", '"constant" or "gaussian"'),
    ("lung_crop_margin_mm", -5, "a number of mm, 0 or more"),
    ("lung_filter_margin_mm", "8", "a number of mm, 0 or more"),
    ("weights", 3, "a file name or null"),
    ("fp_reduction", ["demo_phantom_fpr.pt"], "a JSON object"),
    ("fp_reduction.patch", 20, "a positive multiple of 8 (voxels), e.g. 24"),
    ("fp_reduction.spacing_mm", 0, "a positive number of mm"),
    ("fp_reduction.channels", [8, 16], "three positive integers, e.g. [8, 16, 32]"),
    ("fp_reduction.detector_weight", 2, "a number from 0 to 1"),
    ("fp_reduction.context_spacing_mm", -2.5, "a positive number of mm or null"),
    ("fp_reduction.flip_views", 3, "one of 1, 4, 8"),
    ("fp_reduction.box_merge", "true", "true or false"),
    ("operating_point.score_threshold", 1.2, "a score from 0 to 1"),
    ("operating_point.network_only.score_threshold", "high", "a score from 0 to 1"),
    ("operating_point.thick_slice_calibration", "2.5 mm", "a JSON object"),
    ("operating_point.thick_slice_calibration.min_slice_thickness_mm", 0, "a positive number of mm"),
]


@pytest.mark.parametrize(("key", "bad", "form"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_names_the_file_the_key_the_value_and_the_form(tmp_path, key, bad, form):
    data = copy.deepcopy(DEMO)
    *parents, last = key.split(".")
    place = data
    for part in parents:
        place = place[part]
    place[last] = bad
    path = tmp_path / "my_model.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError) as err:  # was: no error (the detector failing later), or one without the fix
        load_model_config(path)
    text = str(err.value)
    assert text.startswith(f"{path}: {key}: {bad!r} is not "), text
    assert f"Fix: mend {key} in my_model.json: " in text and form in text, text
    assert "scripts/train_detector.py --out" in text, text  # and where to get a good file


def test_the_demo_model_and_its_values_read_as_before():
    cfg = load_model_config()
    assert cfg.spacing == tuple(DEMO["spacing_mm_ras"]) and cfg.size_divisible == tuple(DEMO["size_divisible"])
    assert cfg.window.to_json() == DEMO["intensity_window"] and dict(cfg.sliding_window) == DEMO["sliding_window"]
    assert dict(cfg.anchors) == DEMO["anchors"] and dict(cfg.selector) == DEMO["box_selector"]
    assert cfg.lung_crop_margin_mm == DEMO["lung_crop_margin_mm"] and cfg.weights is not None


def test_the_flip_view_counts_allowed_are_the_reducers():
    from pipeline.detection.fp_classifier import FLIP_VIEWS
    from pipeline.detection.model_values import FLIP_VIEW_COUNTS

    assert sorted(FLIP_VIEW_COUNTS) == sorted(FLIP_VIEWS)


@pytest.mark.parametrize(
    "key", ["weights", "fp_reduction.context_spacing_mm", "operating_point.fps_per_scan", "operating_point.sensitivity"]
)
def test_a_null_where_the_form_allows_it_is_read(tmp_path, key):
    data = copy.deepcopy(DEMO)
    *parents, last = key.split(".")
    place = data
    for part in parents:
        place = place[part]
    place[last] = None  # was: "None is not a positive number of mm or null", the form's own words refusing it
    path = tmp_path / "my_model.json"
    path.write_text(json.dumps(data))
    cfg = load_model_config(path)
    value = cfg.weights if key == "weights" else cfg.extra[parents[0]][last]
    assert value is None


def test_the_keys_that_take_null_are_those_whose_form_says_so():
    from pipeline.detection.model_values import FORMS, NULLABLE

    assert NULLABLE == {key for key, (_, words, _) in FORMS.items() if words.endswith("or null")}
