"""Files ctpipe writes are readable as the umask says (``-rw-r--r--`` under 022), like any file the user creates:
the atomic writer's temporary file is owner-only (0600), and its mode used to stay on every report, PNG, mesh and
cache file, so that a web server or the radiologists' group could not read ``report.html`` or the renderings."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.atomic import atomic_write_bytes, current_umask
from tests._support.cli import cli_error as _err

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the process's umask after a test that sets it."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_gives_the_mode_the_umask_gives(tmp_path, umask, mask, expected):
    os.umask(mask)
    assert current_umask() == mask
    target = tmp_path / "report.html"
    atomic_write_bytes(target, b"<html></html>")
    assert _mode(target) == expected, f"{target}: mode {oct(_mode(target))} under umask {oct(mask)}"
    atomic_write_bytes(target, b"<html>again</html>")  # replaced: the same mode
    assert _mode(target) == expected


def test_ctpipe_ingest_cache_files_are_readable_by_others_under_umask_022(tmp_path, umask, capsys):
    os.umask(0o022)
    cache = tmp_path / "cache"
    rc, err = _err(capsys, "ingest", str(SAMPLE / "dicom"), "--out", str(cache), "--json", str(tmp_path / "ingest.json"))
    assert rc == 0, err
    written = [*cache.iterdir(), tmp_path / "ingest.json"]
    assert len(written) == 3
    assert {p.name: oct(_mode(p)) for p in written} == {p.name: oct(0o644) for p in written}
