"""A report's files appear together: a ``ctpipe report`` that fails partway leaves the report folder (a manager's
bookmarked page) with the earlier complete report, never part of tonight's beside part of last night's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.atomic import published_together
from pipeline.cli import main
from tests.test_runner_report_globs import _night


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_report_that_fails_partway_leaves_the_earlier_report_whole(tmp_path, capsys):
    runs, out = tmp_path / "RUNS", tmp_path / "reports" / "x"
    _night(runs / "n1", "r1", ["a", "b"], day=0)
    assert main(["report", str(runs / "n1"), "--out", str(out)]) == 0, capsys.readouterr().err
    last_night = _files(out)
    assert {"report.html", "report.json", "status.json", "cases.csv", "stages.csv"} <= set(last_night)

    # tonight's report stops at its last table: a folder stands where it writes stages.csv
    _night(runs / "n2", "r2", ["c", "d", "e"], day=1)
    (out / "stages.csv").unlink()
    (out / "stages.csv").mkdir()
    (out / "stages.csv" / "kept.txt").write_text("x")
    del last_night["stages.csv"]
    assert main(["report", str(runs / "n1"), str(runs / "n2"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "stages.csv" in err and "folder" in err
    assert _files(out) == last_night  # every file of the earlier report as it was
    assert json.loads((out / "report.json").read_text())["cases"]["done"] == 2
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind

    (out / "stages.csv" / "kept.txt").unlink()
    (out / "stages.csv").rmdir()
    assert main(["report", str(runs / "n1"), str(runs / "n2"), "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["cases"]["done"] == 5


def test_files_published_together_appear_only_when_all_are_written(tmp_path):
    folder = tmp_path / "rep"
    folder.mkdir()
    (folder / "a.txt").write_text("old a")
    (folder / "b.txt").write_text("old b")
    with pytest.raises(ValueError, match="a table that cannot be made"):
        with published_together(folder) as write:
            assert write("a.txt", b"new a") == folder / "a.txt"
            assert (folder / "a.txt").read_text() == "old a"  # not yet: only when every file is written
            raise ValueError("a table that cannot be made")
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt"]
    assert (folder / "a.txt").read_text() == "old a" and (folder / "b.txt").read_text() == "old b"
    with published_together(folder) as write:
        write("a.txt", b"new a")
        write("b.txt", b"new b")
    assert (folder / "a.txt").read_text() == "new a" and (folder / "b.txt").read_text() == "new b"
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt"]
