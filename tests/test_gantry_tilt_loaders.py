"""Both batch loaders give the detector's network the same input for a tilt-corrected series.

The unmeasured wedge of a gantry-tilt corrected grid reads as each image continued past its edge in the torch
loader and in ``ctpipe detect`` (:func:`pipeline.ingest.measured.continued_past_edge`). The DALI loader fed it to the
network as the -1024 HU fill, so ``ctpipe run`` with DALI and ``ctpipe detect`` could report different findings for
the same tilted series.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.cache import CaseCache
from pipeline.detection import Detector
from pipeline.ingest import load_series
from pipeline.load import DaliLoader, TorchLoader, dali_available, preprocess_array, preprocess_volume
from tests.test_gantry_tilt_detector_lungs import _write

pytestmark = pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed")

#: DALI samples at float32 positions: ~4e-5 from the torch loader in output units (see pipeline.load)
DALI_ATOL = 2e-4


def _cached(tmp_path, tilt_deg: float):
    kw = {"allow_gantry_tilt": True} if tilt_deg else {}
    vol = load_series(_write(tmp_path / f"src{tilt_deg:g}", tilt_deg=tilt_deg), **kw)
    cache = CaseCache(tmp_path / "cache")
    cache.write(f"t{tilt_deg:g}", vol)
    return vol, cache


def test_dali_and_torch_loaders_read_the_tilted_wedge_alike(tmp_path):
    tilted, cache = _cached(tmp_path, 15.0)
    spec = Detector(device="cpu").spec
    dali_case = DaliLoader(cache, spec, device="cpu", num_threads=1).load_one("t15")
    torch_case = TorchLoader(cache, spec, device="cpu", num_threads=1).load_one("t15")
    dali, torch_ = dali_case.unwrap(), torch_case.unwrap()
    assert dali_case.measured is not None and dali_case.measured == torch_case.measured  # to_volume() knows the wedge
    assert dali.shape == torch_.shape
    torch.testing.assert_close(dali, torch_, rtol=0, atol=DALI_ATOL)
    # the wedge: air as the -1024 HU fill reads it, tissue as the images continued past their edge read it
    case = preprocess_volume(tilted, spec, device="cpu")
    assert case.geometry is not None
    unfilled = preprocess_array(np.asarray(tilted.array), case.geometry, spec, device="cpu")
    air = float(unfilled.min())
    wedge_tissue = (unfilled <= air + 1e-6) & (torch_ > air + 0.5)
    assert int(wedge_tissue.sum()) > 100
    assert bool((dali[wedge_tissue] > air + 0.5).all())


def test_dali_reads_a_batch_of_tilted_and_untilted_cases_as_torch_does(tmp_path):
    _cached(tmp_path, 15.0)
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    cache = CaseCache(tmp_path / "cache")
    cache.write("t0", straight)
    spec = Detector(device="cpu").spec
    ids = ["t0", "t15", "t0"]
    dali = list(DaliLoader(cache, spec, device="cpu", batch_size=3, num_threads=1).load(ids))
    torch_ = list(TorchLoader(cache, spec, device="cpu", num_threads=1).load(ids))
    assert [c.case_id for c in dali] == ids
    for d, t in zip(dali, torch_):
        torch.testing.assert_close(d.unwrap(), t.unwrap(), rtol=0, atol=DALI_ATOL)


def test_a_tilted_case_whose_array_goes_after_validation_fails_alone(tmp_path):
    """The DALI loader reads a tilted case's array itself (to fill its wedge): an array removed between the check of
    the cache entry and the read is that case's error, naming the fix; the batch's other case still loads."""
    from pipeline.errors import CacheError

    tilted, cache = _cached(tmp_path, 15.0)
    cache.write("t15b", tilted)
    spec = Detector(device="cpu").spec
    loader = DaliLoader(cache, spec, device="cpu", batch_size=2, num_threads=1)
    jobs = [loader.prepare("t15"), loader.prepare("t15b")]
    jobs[1].entry.array_path.unlink()
    first, second = list(loader._run(jobs))
    assert first.ok and first.case_id == "t15"
    assert not second.ok and isinstance(second.error, CacheError), second.error
    assert "ingest the case again" in str(second.error)
