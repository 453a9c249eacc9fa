"""A source folder an archive is still writing into while the nightly run scans it: with ``runner.stable_age_s`` a
series whose newest file is younger than that is left for the next run (a skipped series, with the reason), never
processed half-written and published as done, nor quarantined for a file still being written."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.config import load_config
from pipeline.runner import open_run, run_batch
from pipeline.runner.discover import discover
from pipeline.runner.stages import IngestStage

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"


def _arriving(src: Path, n: int, *, age_s: float) -> list[Path]:
    """``n`` files of the sample series (64 in all) copied into ``src``, last written ``age_s`` seconds ago."""
    src.mkdir(parents=True, exist_ok=True)
    files = sorted(f for f in SAMPLE.rglob("*") if f.is_file())[:n]
    out = []
    for f in files:
        dst = src / f.name
        dst.write_bytes(f.read_bytes())
        when = time.time() - age_s
        os.utime(dst, (when, when))
        out.append(dst)
    return out


def test_a_series_still_being_written_is_left_for_the_next_run(tmp_path):
    src = tmp_path / "incoming" / "s1"
    files = _arriving(src, 64, age_s=3600.0)  # written an hour ago
    newest = files[-1]
    os.utime(newest, None)  # the archive wrote this one just now: it may not be done
    cfg = load_config(environ={}, overrides={"runner.stable_age_s": 120})
    found = discover([tmp_path / "incoming"], cfg)
    assert found.cases == []
    (skipped,) = found.not_selected
    assert skipped["why"].startswith(f"still being written: its newest file {newest} changed ")
    assert "less than runner.stable_age_s = 120 s ago; the next run takes it" in skipped["why"]
    summary = run_batch(
        [tmp_path / "incoming"], out=tmp_path / "run", workers=0, stages=[IngestStage()], config=cfg, **{"report.enabled": False}
    )
    assert summary.exit_code == 0 and summary.total == 0 and summary.quarantined == []
    assert [r.kind for r in open_run(tmp_path / "run").skipped.itertuples()] == ["not_selected"]
    assert (
        "no CT series ready in" in summary.lines()[1]
        and "1 series still being written, left for the next run" in (summary.lines()[1])
    )
    old = time.time() - 3600.0
    os.utime(newest, (old, old))  # the archive is done with the series
    (case,) = discover([tmp_path / "incoming"], cfg).cases
    assert len(case.files) == 64 and case.rejected is None


def test_without_stable_age_a_fresh_series_is_taken_at_once(tmp_path):
    _arriving(tmp_path / "incoming", 64, age_s=0.0)  # ctpipe phantom, then ctpipe run: nothing to wait for
    (case,) = discover([tmp_path / "incoming"], load_config(environ={})).cases
    assert len(case.files) == 64
