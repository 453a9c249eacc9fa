"""The whole source going away during a nightly run (an NFS or SMB mount that drops, the share unmounted): the run
stops admitting cases, says so naming the source and the fix, is recorded as interrupted (exit status 4) and the same
command finishes the rest once the source is back, without ``--retry-failed``. A series whose own files vanish while
the source folder is still there is quarantined, as before."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import SourceMismatchError
from pipeline.runner import run_batch
from pipeline.runner.source_roots import SourceRoots
from pipeline.runner.stage import CaseContext, CaseSpec, Stage
from pipeline.runner.stages import IngestStage
from tests._support.runner import db_rows

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"


class _Vanish(Stage):
    """Before a case is ingested, once: the source folder goes away (renamed, as a dropped mount leaves its path
    without the files), or only that case's series folder is removed."""

    name = "fetch"

    def __init__(self, src: Path, *, whole: bool) -> None:
        self.src, self.whole, self.done = src, whole, False

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if not self.done:
            self.done = True
            if self.whole:
                self.src.rename(self.src.with_name("mount-dropped"))
            else:
                shutil.rmtree(ctx.case.source)
        return {}


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "pacs-share" / "incoming"
    for name in ("phantom_00001", "phantom_00002", "phantom_00003"):
        shutil.copytree(SAMPLES / name / "dicom", src / name)
    return src


def test_a_source_that_goes_away_mid_run_stops_it_and_the_same_command_finishes_the_rest(tmp_path):
    src, out = _source(tmp_path), tmp_path / "runs" / "night"
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False}
    s = run_batch([src], out=out, stages=[_Vanish(src, whole=True), IngestStage()], **opts)
    assert s.quarantined == [] and s.done == 0, s.lines()
    assert s.exit_code == 4 and s.unfinished == 3
    assert s.stopped and str(src) in s.stopped and "is gone" in s.stopped
    stopped = [line for line in s.lines() if line.startswith("run stopped early")]
    assert len(stopped) == 1 and str(src) in stopped[0] and "mount" in stopped[0] and "no --retry-failed" in stopped[0]
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    assert {r[0] for r in db_rows(out, "SELECT status FROM cases")} == {"pending"}
    assert not (out / "quarantine").exists() or not list((out / "quarantine").iterdir())

    src.with_name("mount-dropped").rename(src)  # the mount is back
    again = run_batch([src], out=out, stages=[IngestStage()], **opts)  # the same command, no --retry-failed
    assert again.exit_code == 0 and again.done == 3 and again.quarantined == [], again.lines()
    assert {r[0] for r in db_rows(out, "SELECT status FROM cases")} == {"done"}


def test_a_series_whose_own_files_vanish_while_the_source_stays_is_still_quarantined(tmp_path):
    src, out = _source(tmp_path), tmp_path / "runs" / "night"
    s = run_batch([src], out=out, stages=[_Vanish(src, whole=False), IngestStage()], workers=0, **{"report.enabled": False})
    assert s.exit_code == 3 and s.done == 2 and not s.stopped, s.lines()
    ((_, error_class, reason),) = s.quarantined
    assert error_class == SourceMismatchError.__name__ and "gone from the source" in reason


def _case(path: Path) -> CaseSpec:
    return CaseSpec("c", "k", "1.2", "f", str(path), (str(path / "1.dcm"),))


def test_source_roots_name_the_folder_that_is_gone_or_unreadable(tmp_path):
    share = tmp_path / "share"
    (share / "s1").mkdir(parents=True)
    roots = SourceRoots([share])
    assert roots.gone(_case(share / "s1")) is None
    assert roots.gone(_case(tmp_path / "elsewhere")) is None  # not under any source folder: not judged here
    shutil.rmtree(share / "s1")
    assert roots.gone(_case(share / "s1")) is None  # the series' own folder: the case's matter
    share.rename(tmp_path / "away")
    why = roots.gone(_case(share / "s1"))
    assert why is not None and str(share) in why and "No such file or directory" in why
    if os.geteuid() != 0:  # root reads any folder
        (tmp_path / "away").rename(share)
        share.chmod(0)
        try:
            why = roots.gone(_case(share / "s1"))
            assert why is not None and "Permission denied" in why
        finally:
            share.chmod(0o755)


@pytest.mark.parametrize("worklist_root", [True, False])
def test_a_worklists_folders_count_as_its_source_folders(tmp_path, worklist_root):
    from pipeline.config import load_config

    share = tmp_path / "share"
    (share / "s1").mkdir(parents=True)
    csv = tmp_path / "lists" / "tonight.csv"
    csv.parent.mkdir()
    csv.write_text("path\ns1\n")
    cfg = load_config(environ={}, overrides={"runner.worklist_root": str(share)} if worklist_root else {})
    roots = SourceRoots.of([csv], cfg)
    assert (share in roots.folders) == worklist_root and csv.parent in roots.folders
