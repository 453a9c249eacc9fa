"""A series reached through two sources of one run (its folder and a worklist row naming it, as in the README's
``ctpipe run /data/dicom worklist.csv``) is one case: the summary counts it once."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.runner import open_run, run_batch
from pipeline.runner.stages import IngestStage

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"


def test_a_series_named_by_a_folder_and_a_worklist_row_counts_once(tmp_path):
    # was: "1 case(s) done, ... of 2" (and run_end's cases 2) for a run that had one case, all of it done
    src = tmp_path / "dicom"
    shutil.copytree(SAMPLE, src / "case1")
    worklist = tmp_path / "worklist.csv"
    worklist.write_text("path\ndicom/case1\n", encoding="utf-8")
    summary = run_batch(
        [src, worklist],
        out=tmp_path / "run",
        workers=0,
        stages=[IngestStage()],
        **{"report.enabled": False, "metrics.textfile": False},
    )
    assert summary.exit_code == 0 and summary.done == 1
    assert summary.total == 1, summary
    assert len(open_run(tmp_path / "run").cases) == 1
