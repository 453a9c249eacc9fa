"""``ctpipe report RUNS/*`` as a manager types it: the glob also catches entries of RUNS that are not run folders (a
cron log, an earlier report's folder, a README, a dangling ``latest`` link). Those are left out, each named with the
reason, counted per reason and never named (a folder beside the run folders may be named after a patient: a printed
line per reason, ``report.json`` ``left_out``); the report is made from the run folders. A folder that looks
like a run folder whose store is damaged, a path that does not exist and a glob with no run folder stay errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.runner.report import summarize
from pipeline.runner.store import RunStore, db_path
from tests.test_runner_report_tables import T0, _dead_pid, _done, _start


def _night(run_dir: Path, run_id: str, cases: list[str], *, day: int) -> None:
    """A completed nightly run ``run_id`` that finished ``cases``, ``day`` days after T0."""
    store = RunStore(run_dir)
    _start(store, run_id, pid=_dead_pid())
    for cid in cases:
        _done(store, cid, run_id)
    store.end_run(run_id, status="completed", n_cases=len(cases), n_done=len(cases), n_failed=0, n_skipped=0)
    store.db.execute("UPDATE runs SET started_at = ?, ended_at = ?", (T0 + day * 86400, T0 + day * 86400 + 600))
    store.db.commit()
    store.close()


def _runs_with_strays(tmp_path: Path) -> Path:
    """RUNS with two nightly run folders beside what a nightly job's folder also holds."""
    runs = tmp_path / "RUNS"
    runs.mkdir()
    _night(runs / "2026-12-01", "r1", ["a", "b"], day=0)
    _night(runs / "2026-12-02", "r2", ["c", "d", "e"], day=1)
    (runs / "cron.log").write_text("ctpipe run ... exit 0\n")
    (runs / "README").write_text("nightly runs of the lung-nodule pipeline\n")
    (runs / "report-november").mkdir()
    (runs / "report-november" / "report.json").write_text("{}")
    (runs / "latest").symlink_to(runs / "2026-11-30")  # the folder it named was cleaned up
    return runs


def test_report_over_a_glob_leaves_out_what_is_not_a_run_folder(tmp_path, capsys):
    runs = _runs_with_strays(tmp_path)
    out = tmp_path / "reports" / "x"
    entries = sorted(str(p) for p in runs.iterdir())  # what the shell gives for RUNS/*
    assert main(["report", *entries, "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    left = {e["reason"]: e["count"] for e in json.loads((out / "report.json").read_text())["left_out"]}
    assert left == {
        "a file, not a run folder": 2,  # cron.log, README
        "a folder of ctpipe report files, without a run store (runs.sqlite): not a run folder": 1,  # an earlier report
        "a link to a path that does not exist": 1,  # latest
    }
    for reason, n in left.items():  # one line each reason, with how many
        lines = [line for line in printed.splitlines() if line.startswith(f"left out {n} path(s): {reason}")]
        assert len(lines) == 1, printed
    summary = json.loads((out / "report.json").read_text())
    assert summary["cases"]["done"] == 5  # both nights: 2 + 3 cases
    assert len(summary["runs_table"]) == 2


def test_what_is_left_out_is_counted_never_named(tmp_path, capsys):
    """A folder of an archive export named after the patient, beside the run folders, is no run folder: the report
    (its page, report.json, its printed lines) says how many such paths it left out and why, not their names."""
    runs = _runs_with_strays(tmp_path)
    (runs / "SMITH^JOHN_1234567").mkdir()
    (runs / "SMITH^JOHN_1234567" / "notes.txt").write_text("export\n")
    (runs / "Doe_Jane_19600101.txt").write_text("export list\n")
    (runs / "prior").symlink_to(runs / "DOE^JANE_7654321")  # a link to an export cleaned up since
    out = tmp_path / "reports" / "x"
    assert main(["report", *sorted(str(p) for p in runs.iterdir()), "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for text in (printed, (out / "report.json").read_text(), (out / "report.html").read_text()):
        for name in ("SMITH", "1234567", "Doe_Jane", "DOE^JANE", "7654321", "cron.log", "report-november"):
            assert name not in text
    left = {e["reason"]: e["count"] for e in json.loads((out / "report.json").read_text())["left_out"]}
    assert left["a file, not a run folder"] == 3 and left["a link to a path that does not exist"] == 2
    assert sum(left.values()) == 7
    assert "Left out, not run folders" in (out / "report.html").read_text()


def test_a_folder_that_looks_like_a_run_folder_with_a_damaged_store_stays_an_error(tmp_path, capsys):
    runs = _runs_with_strays(tmp_path)
    db_path(runs / "2026-12-02").write_bytes(b"this is not an SQLite database" * 100)
    out = tmp_path / "rep"
    assert main(["report", *sorted(str(p) for p in runs.iterdir()), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "2026-12-02" in err and "unreadable" in err


def test_a_run_folder_whose_store_file_is_gone_but_its_log_is_there_stays_an_error(tmp_path):
    runs = _runs_with_strays(tmp_path)
    night = runs / "2026-12-01"
    db_path(night).with_name("runs.sqlite-wal").write_bytes(b"")
    db_path(night).unlink()
    with pytest.raises(Exception, match=r"runs\.sqlite-wal") as err:
        summarize(sorted(runs.iterdir()))
    assert "2026-12-01" in str(err.value)


def test_no_run_folder_among_the_entries_is_an_error_naming_each(tmp_path, capsys):
    runs = tmp_path / "RUNS"
    runs.mkdir()
    (runs / "cron.log").write_text("x")
    (runs / "old-report").mkdir()
    assert main(["report", str(runs / "cron.log"), str(runs / "old-report"), "--out", str(tmp_path / "rep")]) == 1
    err = capsys.readouterr().err
    assert "no run folder" in err and "cron.log" in err and "old-report" in err
    assert not (tmp_path / "rep").exists()


def test_a_path_that_does_not_exist_stays_an_error(tmp_path, capsys):
    # a mistyped run folder is not silently left out (a glob never names what is not there)
    runs = _runs_with_strays(tmp_path)
    code = main(["report", str(runs / "2026-12-01"), str(runs / "2026-12-0l"), "--out", str(tmp_path / "rep")])
    assert code == 1
    assert "2026-12-0l" in capsys.readouterr().err
