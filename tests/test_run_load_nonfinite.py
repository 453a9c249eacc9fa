"""The run's load stage on cached volumes with NaN or infinite voxels: which loader prepares them, what it records.

Hospital IT reads each case's load record (``loader``, per-step times) to see where the time goes; a case cleaned of
NaN voxels was prepared by the torch route and recorded as ``loader: torch`` while the run was configured for DALI.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.cache import CaseCache
from pipeline.load import dali_available
from pipeline.volume import CTVolume
from tests.test_run_detect_parity import _chest, _loading

needs_dali = pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed (CPU mode runs this test)")


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


def _dirty(n_bad: int = 10) -> CTVolume:
    """The test chest (float32 HU, LPS) with ``n_bad`` NaN voxels in its right lung."""
    vol = _chest()
    arr = vol.array.copy()
    arr[10, 20 : 20 + n_bad, 10] = np.nan
    return CTVolume(arr, vol.geometry)


def _as_written_by_an_earlier_version(cache: CaseCache, case_id: str, volume: CTVolume) -> None:
    """Make ``case_id``'s entry what an earlier version wrote: ``volume``'s voxels as they are (NaN included), and no
    record of a check in its sidecar."""
    entry = cache.entry(case_id)
    np.save(entry.array_path, volume.array)
    sidecar = json.loads(entry.sidecar_path.read_text())
    sidecar.pop("nonfinite", None)
    entry.sidecar_path.write_text(json.dumps(sidecar))


def _load_record(ctx: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The load stage's record of case ``c1`` and the item it held for detect."""
    from pipeline.runner.model_stages import _HELD, LoadStage

    out = LoadStage().process(ctx)
    return out, _HELD.pop((ctx.case.case_key, ctx.attempt))


@needs_dali
@pytest.mark.parametrize("restrict", [True, False])
def test_a_case_cleaned_of_nan_voxels_is_prepared_by_the_configured_dali_loader(tmp_path, detector, caplog, restrict):
    from pipeline.detection.infer_input import clean_volume
    from pipeline.load import preprocess_volume

    dirty = _dirty()
    loading, ctx = _loading(tmp_path, dirty, **{"loader.backend": "dali", "detector.lung_restriction": restrict})
    _as_written_by_an_earlier_version(CaseCache(ctx.cache_dir), "c1", dirty)
    with caplog.at_level(logging.WARNING):
        out, item = _load_record(ctx)
    assert out["model_input"]["loader"] == "dali"  # the loader the run was configured with did the work
    assert item["case"].loader == "dali"
    assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air)" in caplog.text
    got = item["case"].unwrap()
    clean = clean_volume(dirty, "case c1")
    roi = detector.lung_roi(clean)[1] if restrict else None
    want = preprocess_volume(clean, detector.spec, device="cpu", roi=roi, case_id="c1").unwrap()
    assert torch.isfinite(got).all()
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("name", ["torch", pytest.param("dali", marks=needs_dali)])
def test_voxels_handed_to_a_loader_must_lie_on_the_cached_grid(tmp_path, detector, name):
    from pipeline.errors import LoaderError
    from pipeline.load import make_loader

    cache = CaseCache(tmp_path)
    cache.write("c1", _chest())
    loader = make_loader(cache, detector.spec, loader=name, device="cpu")
    case = loader.load_one("c1", array=np.zeros((4, 4, 4), np.float32))
    with pytest.raises(LoaderError, match=r"case c1: the voxels given are \(4, 4, 4\) but the cached case is"):
        case.unwrap()


@pytest.fixture()
def checks(monkeypatch) -> list[str]:
    """The places the load stage read a cached volume for NaN or infinite voxels (the detector's own check)."""
    from pipeline.detection import infer_input

    seen: list[str] = []
    real = infer_input.clean_volume

    def counted(volume: CTVolume, where: str) -> CTVolume:
        seen.append(where)
        return real(volume, where)

    monkeypatch.setattr(infer_input, "clean_volume", counted)
    return seen


@pytest.mark.parametrize("n_bad", [0, 10])
def test_the_load_stage_trusts_the_caches_record_and_reads_no_volume_for_it(tmp_path, detector, caplog, checks, n_bad):
    """An entry this version wrote was checked once, at write: finite, or its few NaN voxels already air in the file."""
    from pipeline.detection.infer_input import clean_volume
    from pipeline.load import preprocess_volume

    dirty = _dirty(n_bad)
    loading, ctx = _loading(tmp_path, dirty, **{"detector.lung_restriction": False})
    with caplog.at_level(logging.WARNING):
        out, item = _load_record(ctx)
    assert checks == []  # the volume was not read for the check
    assert "finite_check" not in out["timings"]
    assert item["volume"] is None  # the cached file is clean: detect's post-processing reads it
    if n_bad:  # the run's case log still says what was set to air, as `ctpipe detect` does
        assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air) when the case was cached" in caplog.text
    else:
        assert "NaN" not in caplog.text
    want = preprocess_volume(clean_volume(dirty, "case c1"), detector.spec, device="cpu", case_id="c1").unwrap()
    assert torch.equal(item["case"].unwrap(), want)


def test_an_entry_an_earlier_version_wrote_is_checked_as_before(tmp_path, caplog, checks):
    """No record of a check (an earlier version's entry): the stage reads the volume once, cleans it and times it."""
    dirty = _dirty()
    loading, ctx = _loading(tmp_path, dirty, **{"detector.lung_restriction": False})
    cache = CaseCache(ctx.cache_dir)
    _as_written_by_an_earlier_version(cache, "c1", dirty)
    assert cache.entry("c1").nonfinite is None
    with caplog.at_level(logging.WARNING):
        out, item = _load_record(ctx)
    assert checks == ["case c1"]
    assert out["timings"]["finite_check"] > 0  # the pass the stage made, in its record
    assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air)" in caplog.text
    assert torch.isfinite(item["case"].unwrap()).all()
    assert np.isfinite(item["volume"].array).all()  # held for detect's post-processing
