"""The runner's ``detect`` stage times each of its steps, also when the worker no longer holds the case's model
input and loads it again (the load stage ran on another worker, or the held inputs overflowed): the lung mask
and the load are then part of the detect stage's breakdown (s), as its wall time counts them."""

from __future__ import annotations

import pytest

from pipeline.volume import CTVolume
from tests.test_detection_lungmask import _chest


def _context(tmp_path, vol: CTVolume):
    from pipeline.cache import CaseCache
    from pipeline.config import load_config
    from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

    cfg = load_config(overrides={"loader.roi": "lungs", "detector.postprocess": False}, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=tmp_path)
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(tmp_path))
    CaseCache(worker.cache_dir).write("c1", vol)
    return CaseContext(case=spec, attempt=0, workdir=tmp_path / "work", worker=worker)


@pytest.mark.parametrize("held", [True, False], ids=["held", "loaded-again"])
def test_detect_stage_timings_hold_the_lung_mask_and_load_when_it_loads_the_input_again(tmp_path, held):
    from pipeline.runner.model_stages import _HELD, DetectStage, LoadStage

    vol, _ = _chest()
    ctx = _context(tmp_path, vol)
    detect = DetectStage()
    detect.setup(ctx.worker)
    _HELD.clear()
    loaded = LoadStage().process(ctx)
    assert {"lung_mask", "load"} <= set(loaded["timings"])
    if not held:  # the worker running detect does not hold the input the load stage made
        _HELD.clear()
    out = detect.process(ctx)
    timings = out["timings"]
    assert "model" in timings, timings
    if held:  # the load stage's steps are the load stage's: not counted twice
        assert not {"lung_mask", "load"} & set(timings), timings
    else:
        assert timings["lung_mask"] > 0.0 and timings["load"] > 0.0, timings
    assert not _HELD
