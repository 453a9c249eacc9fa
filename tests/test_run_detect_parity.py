"""``ctpipe run``'s load stage prepares the network input as ``ctpipe detect`` does, whatever the settings.

Hospital IT compares a batch run with ``ctpipe detect`` on the same series. Two settings made the network inputs
differ: a cached volume holding NaN or infinite voxels (a NIfTI/NRRD input, a cache written by an older version),
which ``ctpipe detect`` sets to air with a warning and the run passed on as they were, and ``loader.roi: lungs``, whose
crop the run grew by ``loader.roi_margin_mm`` and ``ctpipe detect`` by the model's crop margin.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.volume import CTVolume, Geometry


def _chest(dtype: Any = np.float32) -> CTVolume:
    """A 40 x 64 x 64 volume (2.5 x 2 x 2 mm, LPS): soft-tissue body, two air-filled lungs (HU)."""
    hu = np.full((40, 64, 64), -1000.0, np.float32)
    hu[2:38, 8:56, 4:60] = 40.0  # body
    hu[6:34, 16:48, 8:28] = -850.0  # right lung
    hu[6:34, 16:48, 36:56] = -850.0  # left lung
    return CTVolume(hu.astype(dtype), Geometry(hu.shape, (2.0, 2.0, 2.5), (-64.0, -64.0, -50.0)))


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


def _loading(tmp_path: Path, volume: CTVolume, **overrides: Any) -> tuple[Any, Any]:
    """The run's loading of ``volume`` (cached as case ``c1``) under the config ``overrides``, and its context."""
    from pipeline.cache import CaseCache
    from pipeline.config import load_config
    from pipeline.runner.model_stages import _Loading
    from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

    cfg = load_config(overrides={"loader.backend": "torch", **overrides}, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=tmp_path)
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(tmp_path))
    ctx = CaseContext(case=spec, attempt=0, workdir=tmp_path / "work", worker=worker)
    CaseCache(worker.cache_dir).write("c1", volume)
    return _Loading(worker), ctx


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("restrict", [True, False])
def test_the_run_sets_nan_and_infinite_voxels_to_air_as_detect_does(tmp_path, detector, caplog, bad, restrict):
    from pipeline.detection.infer_input import clean_volume
    from pipeline.load import preprocess_volume

    vol = _chest()
    dirty = vol.array.copy()
    dirty[10, 20:30, 10] = bad  # 10 bad voxels in the right lung
    dirty = CTVolume(dirty, vol.geometry)
    loading, ctx = _loading(tmp_path, dirty, **{"detector.lung_restriction": restrict})
    with caplog.at_level(logging.WARNING):
        item = loading(ctx)
    got = item["case"].unwrap()
    assert torch.isfinite(got).all()
    assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air)" in caplog.text
    # the network input `ctpipe detect` makes from the same series
    clean = clean_volume(dirty, "case c1")
    roi = detector.lung_roi(clean)[1] if restrict else None
    want = preprocess_volume(clean, detector.spec, device="cpu", roi=roi, case_id="c1").unwrap()
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


def test_the_run_refuses_a_volume_mostly_nan_by_name(tmp_path):
    from pipeline.errors import InvalidVolumeError

    vol = _chest()
    dirty = vol.array.copy()
    dirty[:5] = np.nan
    loading, ctx = _loading(tmp_path, CTVolume(dirty, vol.geometry))
    with pytest.raises(InvalidVolumeError, match="NaN or infinite") as info:
        loading(ctx)
    assert "case c1" in str(info.value)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """The demo model with a 16 mm crop margin (the default ``loader.roi_margin_mm`` was 10 mm), as a model JSON."""
    from pipeline.detection.model_config import DEMO_MODEL_JSON

    data = json.loads(Path(DEMO_MODEL_JSON).read_text())
    data["lung_crop_margin_mm"] = 16.0
    data["weights"] = str(Path(DEMO_MODEL_JSON).parent / data["weights"])  # the fp reduction's weights lie beside it
    path = tmp_path_factory.mktemp("model") / "wide.json"
    path.write_text(json.dumps(data))
    return path


def _input(detector: Any, volume: CTVolume, roi: Any) -> torch.Tensor:
    from pipeline.load import preprocess_volume

    return preprocess_volume(volume, detector.spec, device="cpu", roi=roi, case_id="c1").unwrap()


@pytest.mark.parametrize("restrict", [True, False])
def test_loader_roi_lungs_crops_with_the_models_margin_as_detect_does(tmp_path, wide_model, restrict):
    """Unset, ``loader.roi_margin_mm`` is the model's crop margin: the run's crop is ``ctpipe detect``'s."""
    from pipeline.detection import Detector

    detector = Detector(bundle=wide_model, device="cpu")
    vol = _chest(np.int16)
    overrides = {"loader.roi": "lungs", "detector.lung_restriction": restrict, "detector.bundle": str(wide_model)}
    loading, ctx = _loading(tmp_path, vol, **overrides)
    got = loading(ctx)["case"].unwrap()
    roi = detector.lung_roi(vol)[1]  # the crop of `ctpipe detect` (and detect(vol))
    assert roi is not None
    want = _input(detector, vol, roi)
    assert got.shape == want.shape and torch.equal(got, want)


def test_loader_roi_lungs_with_a_margin_set_crops_with_it(tmp_path, detector):
    """A ``loader.roi_margin_mm`` set explicitly is the run's crop margin (its findings may then differ from detect's)."""
    vol = _chest(np.int16)
    loading, ctx = _loading(tmp_path, vol, **{"loader.roi": "lungs", "loader.roi_margin_mm": 2.0})
    got = loading(ctx)["case"].unwrap()
    narrow = _input(detector, vol, detector.lung_roi(vol, margin_mm=2.0)[1])
    assert got.shape == narrow.shape and torch.equal(got, narrow)
    assert got.shape != _input(detector, vol, detector.lung_roi(vol)[1]).shape


@pytest.mark.slow
def test_the_run_and_detect_list_the_same_candidates_of_a_series_with_nan_voxels(tmp_path, detector):
    """The load and detect stages on a cached volume with NaN voxels: the candidates of ``detect(vol)`` (the run
    used to fail in the network's box decoding: ``ValueError: pred_whd_axis is NaN or Inf.``)."""
    from pipeline.runner.model_stages import DetectStage, LoadStage
    from tests._support.detection import chest_volume

    vol = chest_volume(shape_kji=(48, 96, 96), spacing=(1.0, 1.0, 1.25), dtype=np.float32)
    dirty = vol.array.copy()
    dirty[20, 40:60, 30] = np.nan  # 20 NaN voxels in a lung
    dirty = CTVolume(dirty, vol.geometry, metadata=vol.metadata)
    _, ctx = _loading(tmp_path, dirty)
    detect = DetectStage()
    detect.setup(ctx.worker)
    LoadStage().process(ctx)
    doc = detect.process(ctx)["findings_doc"]
    want = detector.detect(dirty, case_id="c1").to_json()

    def every(d: dict) -> list[tuple[float, tuple[float, ...]]]:
        found = [*d["findings"], *d.get("below_threshold", [])]
        return sorted(((round(f["score"], 4), tuple(round(x, 1) for x in f["center_lps"])) for f in found), reverse=True)

    assert every(want)  # a search that found something to compare
    assert every(doc) == every(want)
