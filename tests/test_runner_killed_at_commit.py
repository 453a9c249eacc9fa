"""A run killed (SIGKILL) after it put a case's folder in place and before that case was recorded done for good: at
the moment before the run store's commit, or between the commit and the check of the source made after it. The next
run checks the case's source series again before it adopts the folder: when a file of the series landed in that
moment, the folder is withdrawn and the whole series analysed (the case is never left done without that file);
when nothing changed, the folder is adopted as it is, not analysed again.

The run is killed in a child process by the runner's own code path (a hook on the store's commit, or on the
confirmation after it, that lets the file land and then sends SIGKILL to its own process)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.runner import db_rows
from tests.test_runner_commit_race import _series, _slices

OPTS: dict[str, Any] = {"workers": 0, "report.enabled": False}

#: the child: a run over SRC into OUT whose process is killed at HOOK (RunStore.complete_case: before the commit;
#: RunStore.confirm_case: after it), the file LAND (if any) copied into the source first
CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage, WriteStage
    from pipeline.runner.store import RunStore

    src, out, hook, land, dest = sys.argv[1:6]

    def killed(self, case_key, **kw):  # before the commit, or before the confirmation after it
        if land != "-":
            shutil.copy2(land, dest)  # a file of the series lands in that moment
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(RunStore, hook, killed)
    run_batch([src], out=out, stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})
    """
)


def _killed_run(tmp_path: Path, seed: int, hook: str, *, land: bool) -> tuple[Path, Path, str, list[Path]]:
    src, out = tmp_path / "export", tmp_path / "run"
    uid, files = _series(tmp_path / "archive", seed)
    (src / "s").mkdir(parents=True)
    for f in files[:-1]:
        shutil.copy2(f, src / "s" / f.name)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    late = str(files[-1]) if land else "-"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(out), hook, late, str(src / "s" / files[-1].name)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    published = sorted((out / "cases").iterdir())
    assert [_slices(d) for d in published] == [len(files) - 1], "the killed run left no folder in place"
    return src, out, uid, files


@pytest.mark.parametrize("hook", ["complete_case", "confirm_case"])
def test_a_file_landing_as_the_run_is_killed_at_the_commit_is_analysed_whole_by_the_next(tmp_path, hook):
    src, out, uid, files = _killed_run(tmp_path, 43, hook, land=True)

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **OPTS)

    assert again.exit_code == 0, again.lines()
    done = db_rows(out, "SELECT case_id FROM cases WHERE status='done' AND series_uid=?", (uid,))
    assert [_slices(out / "cases" / cid) for (cid,) in done] == [len(files)], (
        f"a case done without the file that landed: {again.lines()}"
    )
    assert [_slices(d) for d in sorted((out / "cases").iterdir())] == [len(files)]  # no incomplete folder left
    assert again.done + again.redone == 1, again.lines()


@pytest.mark.parametrize("hook", ["complete_case", "confirm_case"])
def test_a_folder_whose_series_is_unchanged_is_adopted_not_analysed_again(tmp_path, hook):
    src, out, uid, files = _killed_run(tmp_path, 44, hook, land=False)
    published = sorted((out / "cases").iterdir())

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **OPTS)

    assert again.exit_code == 0 and again.done == 0 and again.skipped == 1, again.lines()
    assert db_rows(out, "SELECT case_id FROM cases WHERE status='done'") == [(published[0].name,)]
    assert db_rows(out, "SELECT COUNT(*) FROM unconfirmed") == [(0,)]


def test_a_folder_whose_series_is_not_among_the_sources_waits_for_a_run_over_its_source(tmp_path):
    """The next run is given another folder: the series cannot be checked, so the folder is neither adopted nor
    withdrawn; the run over its source then checks and adopts it."""
    src, out, uid, files = _killed_run(tmp_path, 45, "complete_case", land=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("no DICOM here")

    elsewhere = run_batch([other], out=out, stages=[IngestStage(), WriteStage()], **OPTS)

    assert elsewhere.done == 0, elsewhere.lines()
    assert db_rows(out, "SELECT status FROM cases WHERE series_uid=?", (uid,)) == [("running",)]
    assert [_slices(d) for d in sorted((out / "cases").iterdir())] == [len(files) - 1]

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], **OPTS)

    assert again.done == 0 and again.skipped == 1, again.lines()
    assert db_rows(out, "SELECT status FROM cases WHERE series_uid=?", (uid,)) == [("done",)]
