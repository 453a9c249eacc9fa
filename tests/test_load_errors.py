"""Bad cache entries give an error naming the case; the other cases of the batch still load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.errors import CacheError, LoaderError
from pipeline.load import PreprocessSpec, Roi, dali_available, make_loader
from pipeline.volume import CTVolume, Geometry

HAVE_DALI = dali_available()[0]
LOADERS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(not HAVE_DALI, reason="nvidia-dali not installed"))]
SPEC = PreprocessSpec(spacing=(0.9, 0.9, 1.5), size_divisible=(4, 4, 2))


def volume(n: int, seed: int) -> CTVolume:
    rng = np.random.default_rng(seed)
    arr = rng.integers(-1100, 1500, size=(8 + n, 16 + n, 18 + n)).astype(np.int16)
    return CTVolume(arr, Geometry(shape=arr.shape, spacing=(0.8, 0.8, 1.4), origin=(0.0, 0.0, float(seed))))


def build(tmp_path) -> CaseCache:
    cache = CaseCache(tmp_path / "cache")
    for n, name in enumerate(["good1", "missing", "good2", "truncated", "mismatch", "badjson", "good3"]):
        cache.write(name, volume(n, n))
    cache.array_path("missing").unlink()
    path = cache.array_path("truncated")
    path.write_bytes(path.read_bytes()[:-100])
    side = cache.sidecar_path("mismatch")
    data = json.loads(side.read_text())
    data["geometry"]["shape"] = [5, 5, 5]
    side.write_text(json.dumps(data))
    cache.sidecar_path("badjson").write_text("{not json")
    return cache


@pytest.mark.parametrize("loader", LOADERS)
def test_bad_entries_are_reported_and_the_rest_load(tmp_path, loader, caplog):
    cache = build(tmp_path)
    ids = ["good1", "missing", "good2", "truncated", "mismatch", "badjson", "nosuchcase", "good3"]
    out = list(make_loader(cache, SPEC, loader=loader, device="cpu", batch_size=3).load(ids))
    assert [c.case_id for c in out] == ids
    by_id = {c.case_id: c for c in out}
    for good in ("good1", "good2", "good3"):
        assert by_id[good].ok and by_id[good].tensor.shape[0] == 1
    expect = {
        "missing": "missing",
        "truncated": "truncated",
        "mismatch": "sidecar says",
        "badjson": "not valid JSON",
        "nosuchcase": "no sidecar",
    }
    for bad, words in expect.items():
        case = by_id[bad]
        assert not case.ok and case.tensor is None
        assert isinstance(case.error, CacheError)
        assert bad in str(case.error), str(case.error)
        assert words in str(case.error), str(case.error)
        assert "Fix:" in str(case.error)
        with pytest.raises(CacheError) as raised:
            case.unwrap()
        assert raised.value is case.error  # the case's own error, not another one
        with pytest.raises(LoaderError, match=rf"case {bad}: the case failed to load, so it has no geometry"):
            case.input_index_to_lps(np.zeros((1, 3)))
    assert any("truncated" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not HAVE_DALI, reason="nvidia-dali not installed")
def test_dali_recovers_when_a_file_breaks_after_validation(tmp_path):
    """A file that disappears between validation and DALI's read fails alone; later cases still load."""
    cache = CaseCache(tmp_path / "cache")
    ids = [f"c{n}" for n in range(6)]
    for n, name in enumerate(ids):
        cache.write(name, volume(n % 3, n))
    stream = make_loader(cache, SPEC, loader="dali", device="cpu", batch_size=1).load(ids)
    first = next(stream)  # all entries validated, pipeline started
    assert first.ok
    cache.array_path("c5").unlink()
    rest = list(stream)
    assert [c.case_id for c in rest] == ids[1:]
    assert all(c.ok for c in rest[:-1])
    assert not rest[-1].ok and "c5" in str(rest[-1].error), rest[-1]


@pytest.mark.parametrize("loader", LOADERS)
def test_roi_outside_the_image_is_an_error_for_that_case_only(tmp_path, loader):
    cache = CaseCache(tmp_path / "cache")
    cache.write("a", volume(0, 0))
    cache.write("b", volume(1, 1))
    far = Roi(lo=(500, 500, 500), hi=(600, 600, 600), space="lps")
    out = list(make_loader(cache, SPEC, loader=loader, device="cpu").load(["a", "b"], rois={"a": far}))
    assert isinstance(out[0].error, LoaderError) and "case a" in str(out[0].error) and "outside" in str(out[0].error)
    assert out[1].ok


@pytest.mark.parametrize("loader", LOADERS)
def test_batches_keep_order_and_size_with_errors(tmp_path, loader):
    cache = build(tmp_path)
    ids = ["good1", "missing", "good2", "truncated", "good3"]
    batches = list(make_loader(cache, SPEC, loader=loader, device="cpu", batch_size=2).batches(ids))
    assert [[c.case_id for c in b] for b in batches] == [["good1", "missing"], ["good2", "truncated"], ["good3"]]
    assert [c.ok for b in batches for c in b] == [True, False, True, False, True]
