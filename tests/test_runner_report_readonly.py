"""Run folders a manager may read but not write (nightly folders owned by the job's user, an archive on a read-only
share): ``ctpipe report`` and ``open_run`` read them as they are, without writing beside the run store; a report
folder that cannot take the report (full disk, file-size limit) is named with the true reason and its fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.runner import open_run
from pipeline.runner.report import summarize
from pipeline.runner.store import RunStore, db_path
from tests._support.runner import can_mount, small_tmpfs
from tests.test_runner_report_tables import T0, _dead_pid, _done, _start


def _night(run_dir: Path, *, more: int = 0) -> None:
    """A completed nightly run (r1) that finished cases a and b (and ``more`` others)."""
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1", findings=1)
    _done(store, "b", "r1")
    for n in range(more):
        _done(store, f"case{n:04d}", "r1")
    store.end_run("r1", status="completed", n_cases=2 + more, n_done=2 + more, n_failed=0, n_skipped=0)
    store.db.execute("UPDATE runs SET started_at = ?, ended_at = ?", (T0, T0 + 600))
    store.db.commit()
    store.close()


@contextmanager
def _read_only(tmp_path: Path, fill) -> Iterator[Path]:
    """A folder filled by ``fill`` (writable then), then made read-only: a tmpfs remounted read-only for root
    (whom permissions do not stop), else the folder's write permission taken away."""
    folder = tmp_path / "archive"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        why = can_mount()
        if why:
            pytest.skip(f"root ignores permissions and {why}")
        with small_tmpfs(folder, 4096):
            fill(folder)
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
            yield folder
    else:
        folder.mkdir()
        fill(folder)
        for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            d.chmod(0o555)
        try:
            yield folder
        finally:
            for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
                d.chmod(0o755)


def test_a_report_over_a_run_folder_that_cannot_be_written(tmp_path, capsys):
    # was: "runs.sqlite: the run database is unreadable (unable to open database file)": SQLite could not make the
    # shared-memory file a WAL store's reader needs beside it
    with _read_only(tmp_path, lambda f: _night(f / "night1")) as archive:
        night = archive / "night1"
        assert not os.access(night, os.W_OK)
        summary, _ = summarize([night])
        assert summary["cases"]["done"] == 2
        assert main(["report", str(night), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
        assert (tmp_path / "rep" / "report.html").is_file()
        assert len(open_run(night).cases) == 2
        assert sorted(p.name for p in night.iterdir()) == ["runs.sqlite"]  # nothing written beside it


def test_a_read_only_copy_of_a_killed_runs_folder_shows_what_its_log_holds(tmp_path):
    # a run killed before SQLite moved its log into the database: the folder copied as it was, log and all
    def killed(folder: Path) -> None:
        src = tmp_path / "live"
        _night(src)
        store = RunStore(src)  # a writer that is killed: its log is left beside the database
        _start(store, "r2", pid=_dead_pid())
        _done(store, "c", "r2")
        (folder / "night1").mkdir()
        for name in ("runs.sqlite", "runs.sqlite-wal"):
            shutil.copyfile(db_path(src).with_name(name), folder / "night1" / name)
        store.close()

    with _read_only(tmp_path, killed) as archive:
        night = archive / "night1"
        assert (night / "runs.sqlite-wal").stat().st_size > 0
        summary, _ = summarize([night])
        assert summary["cases"]["done"] == 3 and summary["runs"] == 2
        assert sorted(p.name for p in night.iterdir()) == ["runs.sqlite", "runs.sqlite-wal"]


def test_a_report_that_cannot_be_written_names_its_folder_the_reason_and_the_fix(tmp_path):
    # was: "ctpipe report: error: File too large. Fix: check the path": no file named, and a fix beside the point
    import resource
    import sys

    night = tmp_path / "night1"
    _night(night, more=300)  # a report larger than the limit
    out = tmp_path / "rep"

    def small_files() -> None:  # ulimit -f 64 in the cron script
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))

    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "report", str(night), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=small_files,
        cwd=Path(__file__).resolve().parents[1],
    )
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"ctpipe report: error: {out}: File too large (EFBIG)"), err
    assert "file-size limit of 65536 bytes" in err and "Fix: raise the file-size limit" in err and "check the path" not in err


def test_a_report_over_a_writable_run_folder_leaves_nothing_beside_its_store(tmp_path, capsys):
    """``ctpipe report`` writes nothing in the run folders it reads, writable ones included: was runs.sqlite-shm and
    an empty runs.sqlite-wal left beside the store (by the reading user, with that user's owner and permissions, in a
    nightly folder another account writes)."""
    run = tmp_path / "night"
    _night(run)
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert sorted(p.name for p in run.iterdir()) == before
    assert len(open_run(run).cases) == 2
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_report_prints_an_interrupted_runs_status_first(tmp_path, capsys):
    """The README: ctpipe report prints the status first when a run is in progress or was interrupted (was: after a
    line for each path a glob caught beside the run folders)."""
    run = tmp_path / "runs" / "night"
    store = RunStore(run)
    _start(store, "r1", pid=_dead_pid())  # killed: no end record, its process gone
    _done(store, "a", "r1")
    store.close()
    (tmp_path / "runs" / "cron.log").write_text("cron mail\n")  # what runs/* catches beside it
    runs = sorted(str(p) for p in (tmp_path / "runs").iterdir())
    assert main(["report", *runs, "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("run status: the latest run r1") and "was interrupted" in printed[0], printed
    assert "left out 1 path(s): a file, not a run folder" in printed[1:], printed  # cron.log, counted, not named


def test_stage_latency_has_the_columns_the_readme_names(tmp_path):
    """``open_run(...).stage_latency()``: "seconds per stage: count, mean, p50, p90, p99" (was pandas' own 50%, 90%,
    99%: ``lat["p50"]`` was a KeyError)."""
    _night(tmp_path / "night")
    lat = open_run(tmp_path / "night").stage_latency()
    assert list(lat.columns) == ["count", "mean", "p50", "p90", "p99"]
    assert list(lat.index) == ["ingest", "detect"] and (lat["count"] == 2).all() and (lat["p50"] <= lat["p99"]).all()


def test_a_report_into_a_run_folder_it_reads_is_refused(tmp_path, capsys):
    """``ctpipe report RUN --out RUN``: was report.html, report.json and a dozen CSV files written among the run's own
    files, in a folder the README says ctpipe report writes nothing in."""
    run = tmp_path / "night"
    _night(run)
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", str(run), "--out", f"{run}/"]) == 2  # two arguments that do not go together
    err = capsys.readouterr().err
    assert f"{run}/: --out is a run folder this report reads" in err and f"e.g. {run / 'report'}" in err, err
    assert sorted(p.name for p in run.iterdir()) == before
    assert main(["report", str(run), "--out", str(run / "report")]) == 0  # its own report folder, as the run writes it
