"""A series whose files are moved or deleted from the source after the run found them (a PACS clean-up during the
nightly run): the ingest stage says so, as the DICOM stage does, rather than "no such file: check the path" or a
volume built from the slices that are left, published as if it were the whole scan."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import load_config
from pipeline.errors import SourceMismatchError
from pipeline.ingest import read_headers
from pipeline.runner.discover import discover
from pipeline.runner.stages import IngestStage

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"


def _found(tmp_path: Path) -> SimpleNamespace:
    """The sample series copied to a source folder and discovered: the ingest stage's context for it."""
    src = tmp_path / "incoming"
    shutil.copytree(SAMPLE, src)
    cfg = load_config(environ={})
    (case,) = [c for c in discover([src], cfg).cases if c.rejected is None]
    return SimpleNamespace(case=case, config=cfg, cache_dir=tmp_path / "cache")


def test_the_top_slices_removed_after_discovery_are_not_ingested_as_a_shorter_scan(tmp_path):
    ctx = _found(tmp_path)
    headers, _ = read_headers([Path(f) for f in ctx.case.files], processes=False)
    top = sorted(headers, key=lambda h: h.position[2])[-3:]  # the three highest slices: the rest stays contiguous
    for h in top:
        Path(h.path).unlink()
    with pytest.raises(SourceMismatchError) as err:
        IngestStage().process(ctx)
    text = str(err.value)
    assert f"3 of the series' {len(ctx.case.files)} file(s) are gone from the source since the run found them" in text
    assert "moved or deleted while the run went on" in text and not (tmp_path / "cache").exists()


def test_a_series_folder_removed_after_discovery_is_named_as_such(tmp_path):
    ctx = _found(tmp_path)
    shutil.rmtree(tmp_path / "incoming")
    with pytest.raises(SourceMismatchError, match=r"64 of the series' 64 file\(s\) are gone from the source"):
        IngestStage().process(ctx)


def test_a_file_rewritten_after_discovery_is_named_as_changed(tmp_path):
    ctx = _found(tmp_path)
    victim = Path(ctx.case.files[5])
    victim.write_bytes(victim.read_bytes() + b"\0" * 16)  # the archive wrote it again, otherwise
    with pytest.raises(SourceMismatchError, match="changed in the source since the run found it"):
        IngestStage().process(ctx)
    assert IngestStage().process(_found(tmp_path / "again"))["shape_kji"][0] == 64  # untouched: ingested
