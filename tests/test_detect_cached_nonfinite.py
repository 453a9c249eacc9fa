"""``ctpipe detect`` and the notebook API on a cache entry whose NaN voxels the cache set to air when it wrote it.

The case cache sets a float volume's few NaN or infinite voxels to -1024 HU (air) once, when it writes it, and keeps
the count in the sidecar (``"nonfinite": {"voxels": N, "set_to_air": true}``). ``ctpipe detect`` and
``Detector.detect`` run on such an entry then found a finite volume: the findings came from a volume with N voxels
set to air and nothing said so, where the same series read from its NIfTI file was reported with a warning. They now
read the record: a warning names the case and the count, and the findings JSON keeps it
(``nonfinite_voxels_set_to_air``).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.volume import CTVolume
from tests.test_run_detect_parity import _chest

pytestmark = pytest.mark.slow  # the detector runs on the CPU (about 25 s a test)


@pytest.fixture(scope="module")
def detector():
    from pipeline.detection import Detector

    return Detector(device="cpu")


def _dirty(n_bad: int = 10) -> CTVolume:
    """The test chest (float32 HU, LPS) with ``n_bad`` NaN voxels in its right lung."""
    vol = _chest()
    arr = vol.array.copy()
    arr[10, 20 : 20 + n_bad, 10] = np.nan
    return CTVolume(arr, vol.geometry, metadata={"SeriesInstanceUID": "1.2.3"})


@pytest.mark.parametrize("n_bad", [0, 10])
def test_the_notebook_api_reports_the_voxels_the_cache_set_to_air(tmp_path, detector, caplog, n_bad):
    cache = CaseCache(tmp_path)
    cache.write("c1", _dirty(n_bad))
    volume = cache.read("c1")
    assert np.isfinite(volume.array).all()  # cleaned at write: nothing left for the detector to find
    with caplog.at_level(logging.WARNING):
        findings = detector.detect(volume, case_id="c1")
    assert findings.to_json()["nonfinite_voxels_set_to_air"] == n_bad
    if n_bad:
        assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air) when the case was cached" in caplog.text
    else:
        assert "NaN" not in caplog.text


def test_a_volume_cleaned_by_the_detector_reports_its_count_too(detector):
    """The same series read from an image file: the detector sets the voxels to air itself, and says so alike."""
    findings = detector.detect(_dirty(10), case_id="c1")
    assert findings.nonfinite_voxels_set_to_air == 10
    assert findings.to_json()["nonfinite_voxels_set_to_air"] == 10


def test_ctpipe_detect_on_a_cleaned_cache_entry_warns_and_records_the_count(tmp_path, capsys):
    from pipeline.cli import main

    cache = CaseCache(tmp_path / "cache")
    cache.write("c1", _dirty(10))
    out = tmp_path / "out"
    code = main(
        ["detect", str(cache.entry("c1").array_path), "--out", str(out), "--device", "cpu", "--no-png", "--dicom", "none"]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "case c1: 10 NaN/infinite voxels set to -1024 HU (air) when the case was cached" in err
    doc = json.loads((out / "c1.findings.json").read_text())
    assert doc["nonfinite_voxels_set_to_air"] == 10


def test_ctpipe_reconstruct_on_a_cleaned_cache_entry_warns_and_records_the_count(tmp_path, capsys):
    from pipeline.cli import main

    cache = CaseCache(tmp_path / "cache")
    cache.write("c1", _dirty(10))
    out = tmp_path / "out"
    argv = ["reconstruct", str(cache.entry("c1").array_path), "--out", str(out), "--organs", "body", "--device", "cpu"]
    code = main([*argv, "--no-render", "--dicom", "none"])
    assert code == 0
    err = capsys.readouterr().err
    assert "c1: 10 NaN/infinite voxels set to -1024 HU (air) when the case was cached" in err
    doc = json.loads((out / "c1_measurements.json").read_text())
    assert doc["nonfinite_voxels_set_to_air"] == 10


@pytest.mark.parametrize("n_bad", [0, 10])
def test_the_reconstruction_api_reports_the_voxels_the_cache_set_to_air(tmp_path, n_bad):
    from pipeline.reconstruction import reconstruct

    cache = CaseCache(tmp_path)
    cache.write("c1", _dirty(n_bad))
    rec = reconstruct(cache.read("c1"), organs="body", device="cpu", render=False)
    assert rec.measurements["nonfinite_voxels_set_to_air"] == n_bad


@pytest.mark.parametrize("written_by", ["this version", "an earlier version"])
def test_the_runs_findings_keep_the_count_as_ctpipe_detects_do(tmp_path, detector, written_by):
    """The run's detect stage on the same entry: its findings JSON says what ``ctpipe detect``'s says, whether the
    cache set the voxels to air when it wrote the case or the load stage did (an entry of an earlier version)."""
    from pipeline.runner.model_stages import DetectStage, LoadStage
    from tests.test_run_detect_parity import _loading
    from tests.test_run_load_nonfinite import _as_written_by_an_earlier_version

    dirty = _dirty(10)
    _, ctx = _loading(tmp_path, dirty)
    if written_by != "this version":
        _as_written_by_an_earlier_version(CaseCache(ctx.cache_dir), "c1", dirty)
    detect = DetectStage()
    detect.setup(ctx.worker)
    LoadStage().process(ctx)
    doc = detect.process(ctx)["findings_doc"]
    assert doc["nonfinite_voxels_set_to_air"] == 10
