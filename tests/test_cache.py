"""Case cache: atomic writes, validation of damaged entries, round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.cache import CaseCache, check_case_id
from pipeline.errors import CacheError
from pipeline.volume import CTVolume, Geometry


def _vol(dtype=np.int16) -> CTVolume:
    arr = np.arange(4 * 5 * 6, dtype=dtype).reshape(4, 5, 6) - 100
    geom = Geometry(shape=(4, 5, 6), spacing=(0.7, 0.7, 1.25), origin=(-10, 20, -30), direction=np.diag([1.0, 1, -1]))
    return CTVolume(arr, geom, metadata={"SeriesInstanceUID": "1.2.840.1", "KVP": np.float64(120.0)})


def test_round_trip(tmp_path):
    cache = CaseCache(tmp_path)
    vol = _vol()
    cache.write("case-1", vol)
    back = cache.read("case-1", verify=True)
    np.testing.assert_array_equal(back.array, vol.array)
    assert back.geometry.same_grid(vol.geometry, atol=0)
    assert back.metadata["KVP"] == 120.0
    assert cache.case_ids() == ["case-1"]
    assert "case-1" in cache
    mm = cache.read("case-1", mmap=True)
    assert not mm.array.flags.writeable and not mm.array.flags.owndata  # mapped read-only, not read into memory
    assert isinstance(mm.array.base, np.memmap) and Path(mm.array.base.filename) == (tmp_path / "case-1.npy").resolve()
    np.testing.assert_array_equal(mm.array, vol.array)


def test_no_temporary_files_remain(tmp_path):
    cache = CaseCache(tmp_path)
    cache.write("a", _vol())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.npy"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    cache = CaseCache(tmp_path)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.write("a", _vol())
    assert list(tmp_path.iterdir()) == []
    assert cache.case_ids() == []


def test_missing_array_names_the_file(tmp_path):
    cache = CaseCache(tmp_path)
    cache.write("a", _vol())
    (tmp_path / "a.npy").unlink()
    with pytest.raises(CacheError, match=r"a\.npy: array file is missing.*Fix: ingest the case again"):
        cache.read("a")


def test_truncated_array_is_detected(tmp_path):
    cache = CaseCache(tmp_path)
    cache.write("a", _vol())
    path = tmp_path / "a.npy"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CacheError, match="truncated"):
        cache.entry("a")


def test_sidecar_that_disagrees_with_array(tmp_path):
    cache = CaseCache(tmp_path)
    cache.write("a", _vol())
    side = json.loads((tmp_path / "a.json").read_text())
    side["geometry"]["shape"] = [4, 5, 7]
    (tmp_path / "a.json").write_text(json.dumps(side))
    with pytest.raises(CacheError, match=r"array is \(4, 5, 6\).*sidecar says \(4, 5, 7\)"):
        cache.read("a")


def test_fingerprint_detects_changed_content(tmp_path):
    cache = CaseCache(tmp_path)
    cache.write("a", _vol())
    arr = np.load(tmp_path / "a.npy")
    arr[0, 0, 0] += 1
    np.save(tmp_path / "a.npy", arr)
    cache.read("a")  # cheap read does not hash
    with pytest.raises(CacheError, match="fingerprint"):
        cache.read("a", verify=True)


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "x.json"])
def test_unsafe_case_ids_are_refused(bad):
    with pytest.raises(CacheError, match="not a safe file name"):
        check_case_id(bad)


def test_float_volumes_are_stored_as_float32(tmp_path):
    cache = CaseCache(tmp_path)
    vol = _vol(dtype=np.float64)
    entry = cache.write("f", vol)
    assert entry.sidecar["dtype"] == "<f4"
    assert cache.read("f").array.dtype == np.float32


def test_an_entry_echoes_in_one_short_line(tmp_path):
    vol = _vol()
    n = vol.shape[0]
    uids = [f"1.2.840.10008.999.{10**40 + k}" for k in range(n)]  # a real series lists hundreds of these
    big = CTVolume(vol.array, vol.geometry, metadata={**vol.metadata, "SOPInstanceUIDs": uids})
    entry = CaseCache(tmp_path).write("case-1", big)
    text = repr(entry)
    assert text.startswith("CacheEntry(case_id='case-1'") and "case-1.npy" in text
    assert uids[0] not in text and "\n" not in text
    assert entry.sidecar["metadata"]["SOPInstanceUIDs"] == uids  # still there, only not echoed
