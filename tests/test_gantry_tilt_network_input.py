"""The detector's network input on a tilt-corrected grid: the unmeasured wedge reads as each image continued past
its edge, not as -1024 HU.

Read as the fill value, the wedge met the lungs that a small field of view cuts at the tilted images' edge in a
sharp lung-to-air step that no scan has, and the network gave a finding there (score 0.67 against the 0.40
operating point) where the same chest scanned untilted has none. Untilted series are read as they are.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.detection import Detector
from pipeline.ingest import load_series
from pipeline.ingest.measured import continued_past_edge, measured_mask
from pipeline.load import preprocess_array, preprocess_volume
from tests.test_gantry_tilt_detector_lungs import _write


def test_no_finding_comes_from_the_unmeasured_wedge_next_to_the_lungs(tmp_path):
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    detector = Detector(device="cpu")
    assert detector.detect(straight).findings == []
    found = detector.detect(tilted)
    reported = [f for f in found.findings if f.score >= found.score_threshold]
    assert reported == [], [(f.score, f.center_lps) for f in reported]


def test_the_network_reads_the_wedge_as_the_image_continued_and_untilted_inputs_as_they_are(tmp_path):
    straight = load_series(_write(tmp_path / "straight", tilt_deg=0.0))
    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    spec = Detector(device="cpu").spec
    measured = measured_mask(tilted.geometry, tilted.metadata)
    assert measured is not None
    filled = tilted.with_array(continued_past_edge(tilted.array, measured))
    got = preprocess_volume(tilted, spec, device="cpu", slab_voxels=4096).unwrap()  # many slabs, each filled
    want = preprocess_volume(filled, spec, device="cpu").unwrap()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    plain = preprocess_volume(straight, spec, device="cpu").unwrap()
    # an untilted series' input is the array's own (no fill): bit-identical to preprocessing the bare array
    case = preprocess_volume(straight, spec, device="cpu")
    assert case.geometry is not None
    bare = preprocess_array(np.asarray(straight.array), case.geometry, spec, device="cpu")
    assert torch.equal(plain, bare)


def test_the_batch_loader_reads_a_cached_tilted_case_as_the_detector_does(tmp_path):
    from pipeline.cache import CaseCache
    from pipeline.load import TorchLoader

    tilted = load_series(_write(tmp_path / "tilted", tilt_deg=15.0), allow_gantry_tilt=True)
    spec = Detector(device="cpu").spec
    cache = CaseCache(tmp_path / "cache")
    cache.write("tilted", tilted)
    loaded = TorchLoader(cache, spec, device="cpu", num_threads=1).load_one("tilted").unwrap()
    torch.testing.assert_close(loaded, preprocess_volume(tilted, spec, device="cpu").unwrap(), rtol=0, atol=0)
    case = preprocess_volume(tilted, spec, device="cpu")
    assert case.geometry is not None
    unfilled = preprocess_array(np.asarray(tilted.array), case.geometry, spec, device="cpu")
    assert not torch.equal(loaded, unfilled)  # the cache's entry says which voxels were measured
