"""``ctpipe run`` killed (SIGKILL) at the moment a case's folder is published and before the run store marks it done.
The next run finds the complete folder and marks the case done from its manifest (it is not analysed again); the case
keeps the time it was published, so the report counts it on the day it was done, in the run that did it, with the
latency it took, not up to the time the next run happened to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.runner import PHANTOM, db_rows

_KILLED_AT_PUBLISH = """
import os, signal, sys
from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from pipeline.runner.store import RunStore
RunStore.complete_case = lambda self, *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # the folder is published
run_batch([sys.argv[1]], out=sys.argv[2], stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})
"""


def test_a_case_published_by_a_run_killed_before_recording_it_keeps_its_own_end(tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    src, out = tmp_path / "src", tmp_path / "run"
    write_dicom_series(generate_phantom(33, n_nodules=1, **PHANTOM).volume, src / "a", seed=33)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_PUBLISH, str(src), str(out)], env=env, timeout=300)
    assert killed.returncode == -9
    ((cid, status),) = db_rows(out, "SELECT case_id, status FROM cases")
    assert status == "running" and (out / "cases" / cid / "manifest.json").is_file()
    published = (out / "cases" / cid / "manifest.json").stat().st_mtime
    resumed_at = time.time()

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})

    assert again.exit_code == 0 and again.done == 0, again.lines()  # recovered, not analysed again
    ((status, ended, latency, started, run_id),) = db_rows(
        out, "SELECT status, ended_at, latency_s, started_at, run_id FROM cases WHERE case_id=?", (cid,)
    )
    first_run, _ = (r for (r,) in db_rows(out, "SELECT run_id FROM runs ORDER BY started_at"))
    assert status == "done" and run_id == first_run
    assert ended <= published + 1.0 and ended < resumed_at, (ended, published, resumed_at)
    assert 0 <= latency <= published - started + 1.0, (latency, published - started)


_KILLED_AT_SECOND_CASE = """
import os, signal, sys
from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from pipeline.runner.store import RunStore
complete, calls = RunStore.complete_case, []
def complete_then_die(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:  # the second case's folder is published: killed before the store marks it done
        os.kill(os.getpid(), signal.SIGKILL)
    return complete(self, *a, **k)
RunStore.complete_case = complete_then_die
run_batch([sys.argv[1]], out=sys.argv[2], stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})
"""


def test_the_cases_a_killed_run_completed_count_in_the_next_runs_metrics(tmp_path):
    """A killed run never writes its metrics textfile: the next run adds the cases it completed (those it recorded,
    and the one it published just before the kill), so ``ctpipe_cases_processed_total`` counts every completed case."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    src, out = tmp_path / "src", tmp_path / "run"
    for seed in (35, 36):
        write_dicom_series(generate_phantom(seed, n_nodules=1, **PHANTOM).volume, src / str(seed), seed=seed)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_SECOND_CASE, str(src), str(out)], env=env, timeout=300)
    assert killed.returncode == -9 and not (out / "metrics.prom").exists()

    again = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})

    assert again.exit_code == 0 and again.done == 0 and again.skipped == 2, again.lines()
    text = (out / "metrics.prom").read_text()
    processed = [ln for ln in text.splitlines() if ln.startswith("ctpipe_cases_processed_total{")]
    assert processed and processed[0].endswith(" 2.0"), processed

    third = run_batch([src], out=out, stages=[IngestStage(), WriteStage()], workers=0, **{"report.enabled": False})

    assert third.exit_code == 0 and third.done == 0
    processed = [ln for ln in (out / "metrics.prom").read_text().splitlines() if ln.startswith("ctpipe_cases_processed_total{")]
    assert processed[0].endswith(" 2.0"), processed  # counted once, not again by each later run
