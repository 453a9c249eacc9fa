"""scripts/bench_detect.py's peer: MONAI's pipeline with its detector built once, outside the timed calls."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.detection.reference import monai_detect, monai_detector
from tests._support.detection import chest_volume, small_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_detector_built_once_gives_what_one_built_per_call_gives(tmp_path):
    model = small_model(tmp_path, roi=(32, 32, 16))
    vol = chest_volume(shape_kji=(30, 56, 56), spacing=(1.4, 1.4, 2.5), seed=1)
    det = monai_detector(model, device="cpu")
    once = [monai_detect(model, volume=vol, detector=det) for _ in range(2)]
    per_call = monai_detect(model, volume=vol)
    assert len(per_call["score"]) > 0
    for out in once:
        for key, value in per_call.items():
            np.testing.assert_array_equal(out[key], value)


def test_time_case_times_a_same_job_run_that_gives_monais_boxes(tmp_path):
    """The "same job" figure is ctpipe doing MONAI's work (whole volume, no post-processing, MONAI's precision): the
    same candidates as MONAI's pipeline, timed in the same rounds."""
    from pipeline.cache import CaseCache
    from tests._support.scripts import import_script

    bench_detect = import_script("bench_detect")
    model = small_model(tmp_path, roi=(32, 32, 16))
    cache = CaseCache(tmp_path / "cache")
    cache.write("c", chest_volume(shape_kji=(30, 56, 56), spacing=(1.4, 1.4, 2.5), seed=1))
    res = bench_detect.time_case(cache, "c", model, "cpu", 1)
    assert res["ctpipe_same_job_precision"] == res["monai_precision"] == "float32"
    assert res["ctpipe_same_job_findings"] == res["monai_findings"] > 0
    assert len(res["ctpipe_same_job_runs_s"]) == 1 and res["ratio_same_job"] == res["monai_s"] / res["ctpipe_same_job_s"]
