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


def test_nan_and_infinite_voxels_are_set_to_air_once_when_written_and_counted(tmp_path, caplog):
    """The cache checks a float volume once, at write: a few bad voxels become -1024 HU in the file, the count is kept."""
    import logging

    from pipeline.cache import fingerprint_array

    arr = np.random.default_rng(0).uniform(-1000, 1000, (10, 12, 14)).astype(np.float32)
    arr[1, 2, :3] = [np.nan, np.inf, -np.inf]  # 3 of 1680 voxels
    cache = CaseCache(tmp_path)
    with caplog.at_level(logging.WARNING):
        entry = cache.write("c1", CTVolume(arr, Geometry(arr.shape, (0.7, 0.7, 1.25), (0.0, 0.0, 0.0))))
    assert "case c1: 3 NaN/infinite voxels set to -1024 HU (air) in the case cache" in caplog.text
    assert entry.nonfinite == {"voxels": 3, "set_to_air": True}
    assert cache.entry("c1").nonfinite == {"voxels": 3, "set_to_air": True}  # kept in the sidecar
    stored = cache.read("c1", verify=True).array  # the fingerprint is the stored array's
    assert np.isfinite(stored).all() and stored[1, 2, :3].tolist() == [-1024.0] * 3
    assert np.array_equal(stored[np.isfinite(arr)], arr[np.isfinite(arr)])
    assert np.isnan(arr[1, 2, 0])  # the caller's volume is left as it was
    assert entry.fingerprint == fingerprint_array(stored)


@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_a_finite_volume_is_recorded_finite(tmp_path, dtype):
    entry = CaseCache(tmp_path).write("c1", _vol(dtype))
    assert CaseCache(tmp_path).entry("c1").nonfinite == entry.nonfinite == {"voxels": 0, "set_to_air": False}


def test_a_volume_mostly_nan_is_cached_as_it_is_with_its_count(tmp_path):
    """Too many bad voxels to call it air: stored as they are (the detector refuses the volume by name)."""
    vol = _vol(np.float32)
    arr = vol.array.copy()
    arr[0] = np.nan
    entry = CaseCache(tmp_path).write("c1", CTVolume(arr, vol.geometry))
    assert entry.nonfinite == {"voxels": int(np.isnan(arr).sum()), "set_to_air": False}
    assert np.isnan(CaseCache(tmp_path).read("c1").array[0]).all()


def test_an_entry_an_earlier_version_wrote_has_no_nonfinite_record(tmp_path):
    entry = CaseCache(tmp_path).write("c1", _vol(np.float32))
    sidecar = json.loads(entry.sidecar_path.read_text())
    del sidecar["nonfinite"]
    entry.sidecar_path.write_text(json.dumps(sidecar))
    assert CaseCache(tmp_path).entry("c1").nonfinite is None


def test_a_volume_and_case_id_swapped_or_of_the_wrong_kind_are_named(tmp_path):
    """Was: AttributeError: 'str' object has no attribute 'array' for cache.write(volume, "case") or a path as the
    volume, and TypeError: expected string or bytes-like object for cache.read(5)."""
    from pipeline.errors import NotAVolumeError

    cache = CaseCache(tmp_path / "cache")
    with pytest.raises(CacheError) as err:
        cache.write(_vol(), "case1")  # type: ignore[arg-type]
    assert "the volume was given where the case id goes" in str(err.value)
    assert err.value.fix == "pass the case id first: cache.write('case1', volume)"
    with pytest.raises(NotAVolumeError) as err2:
        cache.write("case1", str(tmp_path / "dicom"))  # type: ignore[arg-type]
    assert "load_series(" in str(err2.value)
    for call in (lambda: cache.read(5), lambda: cache.write(5, _vol())):  # type: ignore[arg-type]
        with pytest.raises(CacheError) as err:
            call()
        assert "case id must be text, got int 5" in str(err.value) and "case_ids()" in str(err.value)
    assert not (tmp_path / "cache").exists()  # nothing written: no folder made
    cache.write("case1", _vol())
    assert list(cache.case_ids()) == ["case1"]
