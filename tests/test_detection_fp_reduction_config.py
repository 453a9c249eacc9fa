"""A bad value of a model JSON's ``fp_reduction`` entry read by :meth:`FPReductionConfig.from_json`: refused naming
the file, the key path, the value and the form allowed, with an example and where to get a good entry, as the model
JSON's other values are (:mod:`pipeline.detection.model_values`)."""

from __future__ import annotations

import pytest

from pipeline.detection.fp_reduction import FPReductionConfig
from pipeline.errors import BundleError

#: (key of the entry, a value it does not take, words of the form the error gives)
BAD = [
    ("patch", 20, "a positive multiple of 8 (voxels), e.g. 24"),
    ("spacing_mm", 0, "a positive number of mm, e.g. 1.0"),
    ("detector_weight", 2, "a number from 0 to 1, e.g. 0.5"),
    ("duplicate_radius_factor", -1.0, "a positive number"),
    ("context_spacing_mm", -1, "a positive number of mm or null, e.g. 2.5"),
    ("flip_views", 3, "one of 1, 4, 8, e.g. 4"),
    ("flip_min_probability", 1.0, "a number from 0 to under 1"),
    ("members", 0, "a positive integer"),
    ("box_merge", "yes", "true or false"),
]


@pytest.mark.parametrize(("key", "bad", "form"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_value_out_of_range_names_the_file_the_key_and_the_fix(tmp_path, key, bad, form):
    model = tmp_path / "my_model.json"
    with pytest.raises(BundleError) as err:
        FPReductionConfig.from_json({"weights": "w.pt", key: bad}, weights_dir=tmp_path, source=model)
    text = str(err.value)  # was: "<folder>/fp_reduction: fp_reduction entry out of range: patch 20 (multiple of 8), ..."
    assert text.startswith(f"{model}: fp_reduction.{key}: {bad!r} is not "), text
    assert f"Fix: mend fp_reduction.{key} in my_model.json: " in text and form in text, text
    assert "scripts/train_fp_reducer.py" in text, text
    assert "spacing_mm 1.0 (> 0)" not in text  # the other values, good, are not listed


def test_without_the_file_the_entry_is_named_by_its_folder(tmp_path):
    with pytest.raises(BundleError) as err:
        FPReductionConfig.from_json({"weights": "w.pt", "patch": 20}, weights_dir=tmp_path)
    text = str(err.value)
    assert text.startswith(f"the model JSON in {tmp_path}: fp_reduction.patch: 20 is not a positive multiple of 8"), text
    assert "Fix: mend fp_reduction.patch in the model JSON: " in text, text


def test_an_entry_without_weights_names_the_key(tmp_path):
    model = tmp_path / "my_model.json"
    with pytest.raises(BundleError) as err:
        FPReductionConfig.from_json({"patch": 24}, weights_dir=tmp_path, source=model)
    text = str(err.value)
    assert text.startswith(f"{model}: fp_reduction.weights: "), text
    assert 'Fix: mend fp_reduction.weights in my_model.json: a file name, e.g. "fpr.pt"' in text, text


def test_good_values_read_as_before(tmp_path):
    cfg = FPReductionConfig.from_json(
        {"weights": "w.pt", "patch": 16, "flip_views": 4.0, "context_spacing_mm": None, "members": 3}, weights_dir=tmp_path
    )
    assert (cfg.patch, cfg.flip_views, cfg.context_spacing_mm, cfg.members) == (16, 4, None, 3)
    assert cfg.weights == tmp_path / "w.pt" and FPReductionConfig.from_json(cfg.to_json(), weights_dir=tmp_path) == cfg
