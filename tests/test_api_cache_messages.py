"""CaseCache.read of a case it does not hold: the message says why (no such folder, a file, another id)."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline as ctp
from pipeline.errors import CacheError


def _volume() -> ctp.CTVolume:
    return ctp.CTVolume(np.zeros((2, 3, 3), np.int16), ctp.Geometry((2, 3, 3), (1.0, 1.0, 2.0), (0.0, 0.0, 0.0)))


def test_a_mistyped_case_id_names_the_cached_cases(tmp_path):
    cache = ctp.CaseCache(tmp_path / "cache")
    cache.write("case1", _volume())
    cache.write("case2", _volume())
    with pytest.raises(CacheError) as err:
        cache.read("case_1")
    text = str(err.value)
    assert "no case 'case_1' in the cache" in text and "2 case(s): case1, case2" in text
    assert "CaseCache.case_ids()" in (err.value.fix or "")


def test_a_cache_folder_that_does_not_exist_says_so(tmp_path):
    with pytest.raises(CacheError) as err:
        ctp.CaseCache(tmp_path / "nope").read("case1")
    assert str(tmp_path / "nope") in str(err.value) and "no such cache folder" in str(err.value)


def test_a_file_given_as_the_cache_folder_says_so(tmp_path):
    path = tmp_path / "ground_truth.json"
    path.write_text("{}")
    with pytest.raises(CacheError) as err:
        ctp.CaseCache(path).read("case1")
    assert f"{path}: is a file, not a cache folder" in str(err.value)


def test_an_empty_cache_says_it_holds_no_cases(tmp_path):
    (tmp_path / "cache").mkdir()
    with pytest.raises(CacheError, match="the cache holds no cases"):
        ctp.CaseCache(tmp_path / "cache").read("case1")


def test_listing_a_cache_folder_that_does_not_exist_says_so(tmp_path):
    cache = ctp.CaseCache(tmp_path / "nope")
    for listing in (cache.case_ids, lambda: list(cache)):  # was: [] without a word, as for an empty cache
        with pytest.raises(CacheError) as err:
            listing()
        assert f"{tmp_path / 'nope'}: no such cache folder" in str(err.value)
    assert repr(cache) == f"CaseCache({str(tmp_path / 'nope')!r}, no folder yet: the first write makes it)"
    assert "case1" not in cache and not (tmp_path / "nope").exists()

    cache.write("case1", _volume())  # a new cache: its first write makes the folder, as the runner's and ingest's do
    assert cache.case_ids() == ["case1"] and repr(cache) == f"CaseCache({str(tmp_path / 'nope')!r}, cases=1)"


def test_listing_a_file_given_as_the_cache_folder_says_so(tmp_path):
    path = tmp_path / "ground_truth.json"
    path.write_text("{}")
    cache = ctp.CaseCache(path)
    with pytest.raises(CacheError) as err:
        cache.case_ids()
    assert f"{path}: is a file, not a cache folder" in str(err.value)
    assert repr(cache) == f"CaseCache({str(path)!r}, a file, not a cache folder)"
