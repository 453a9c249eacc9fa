"""A folder whose file system gives no file locks (NFS without its lock service: ENOLCK) is named with the fix.

The file system's answer is injected at ``fcntl.flock`` (a local disk always gives locks); everything else runs as
it does for a user: the run lock, the PACS lock and a cache write.
"""

from __future__ import annotations

import errno
import fcntl

import pytest

from pipeline.cache import CaseCache
from pipeline.errors import CacheError, RunStoreError
from pipeline.pacs.ledger import PacsLock
from pipeline.runner.resume import RunLock
from tests._support.volumes import synthetic


@pytest.fixture
def no_locks(monkeypatch):
    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


def _says_no_locks(err: Exception, folder) -> None:
    text = str(err)
    assert text.startswith(f"{folder}: the file system of this folder gives no file locks")
    assert "ENOLCK" in text and "Fix: use a folder on a local disk" in text and "lockd" in text


def test_run_folder_without_locks(tmp_path, no_locks):
    with pytest.raises(RunStoreError) as info:
        RunLock(tmp_path / "run")
    _says_no_locks(info.value, tmp_path / "run")
    assert "two runs never write one run folder at once" in str(info.value)


def test_pacs_lock_without_locks(tmp_path, no_locks):
    with pytest.raises(RunStoreError) as info:
        PacsLock(tmp_path, holder="ctpipe listen")
    _says_no_locks(info.value, tmp_path)


def test_cache_without_locks(tmp_path, no_locks):
    cache = CaseCache(tmp_path / "cache")
    with pytest.raises(CacheError) as info:
        cache.write("case1", synthetic((4, 8, 8), (2.0, 1.0, 1.0)))
    _says_no_locks(info.value, tmp_path / "cache")
    assert "case1" not in cache and cache.temp_files() == []  # nothing half-written left behind


def test_a_held_lock_still_says_who_holds_it(tmp_path):
    first = RunLock(tmp_path)
    try:
        with pytest.raises(RunStoreError, match=r"another ctpipe run \(pid \d+\) is using this folder"):
            RunLock(tmp_path)
    finally:
        first.release()
