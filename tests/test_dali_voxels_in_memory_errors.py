"""DALI failing on a case's voxels handed over in memory names them, not the cached file they replace.

The run's load stage hands the loader a cached case's voxels with their NaN or infinite voxels set to air in place of
the cached file's (``load_one(case_id, array=...)``). When DALI failed on them, the case's error named the cached
``.npy`` as where it happened, said the cached array "cannot be read by DALI" or that the file "is gone", and told
hospital IT to ingest the case again: the file was never read. The error now names the voxels in memory.

DALI's failure is real (CPU mode): the slice arguments of the case are made invalid, so DALI's own check refuses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.errors import CacheError, LoaderError
from pipeline.load import DaliLoader, dali_available, dali_loader
from tests.test_run_detect_parity import _chest

pytestmark = pytest.mark.skipif(not dali_available()[0], reason="nvidia-dali not installed (CPU mode runs this test)")


@pytest.fixture(scope="module")
def spec() -> Any:
    from pipeline.detection import Detector

    return Detector(device="cpu").spec


def _failing_slice(monkeypatch: pytest.MonkeyPatch, *, remove: Path | None = None) -> None:
    """DALI refuses every case's crop (a negative slice shape); ``remove``: this cached file goes first, as when the
    case is removed from the cache while the loader runs."""
    real = dali_loader.resize_arguments

    def bad(geometry: Any) -> dict[str, np.ndarray]:
        if remove is not None:
            remove.unlink(missing_ok=True)
        args = real(geometry)
        return {**args, "shape": np.full(3, -5, np.int32)}

    monkeypatch.setattr(dali_loader, "resize_arguments", bad)


@pytest.mark.parametrize("gone", [False, True], ids=["file-there", "file-gone"])
def test_a_dali_failure_on_voxels_in_memory_names_them_not_the_cached_file(tmp_path, spec, monkeypatch, gone):
    cache = CaseCache(tmp_path / "cache")
    chest = _chest()
    cache.write("c1", chest)
    path = cache.entry("c1").array_path
    voxels = chest.array.copy()  # e.g. the cached voxels with their NaN set to air
    _failing_slice(monkeypatch, remove=path if gone else None)
    case = DaliLoader(cache, spec, device="cpu").load_one("c1", array=voxels)
    assert not case.ok
    err = case.error
    assert isinstance(err, LoaderError) and not isinstance(err, CacheError), repr(err)
    text = str(err)
    assert "case c1" in text and "in memory" in text, text
    assert "end coordinates" in text  # DALI's own reason
    assert str(path) not in text, text  # not the file, which DALI never read
    assert "gone" not in text and "cannot be read" not in text and "ingest the case again" not in text, text


def test_a_dali_failure_reading_the_cached_file_still_names_it(tmp_path, spec, monkeypatch):
    cache = CaseCache(tmp_path / "cache")
    cache.write("c1", _chest())
    path = cache.entry("c1").array_path
    _failing_slice(monkeypatch, remove=path)
    case = DaliLoader(cache, spec, device="cpu").load_one("c1")
    assert isinstance(case.error, CacheError) and str(path) in str(case.error)
    assert "ingest the case again" in str(case.error)
