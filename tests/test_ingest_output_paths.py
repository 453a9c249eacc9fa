"""Output file paths: `ctpipe ingest --json` naming a folder is refused before the scan and the cache writes, and the
atomic writer's errors name the file it writes, never its temporary file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pipeline.atomic import atomic_write_bytes
from pipeline.errors import CtpipeError
from tests._support.cli import cli_error as _err

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"


def test_ingest_json_that_is_a_folder_is_refused_before_any_work(tmp_path, capsys):
    # was: "error: <folder>/.empty.cenv31gj.tmp: Is a directory", after the cache was written
    folder = tmp_path / "bad" / "empty"
    folder.mkdir(parents=True)
    cache = tmp_path / "cache"
    rc, err = _err(capsys, "ingest", str(SAMPLE / "dicom"), "--out", str(cache), "--json", str(folder))
    assert rc == 1 and f"{folder}: --json: this is a folder, not a file. Fix: give --json a file path" in err
    assert ".tmp" not in err and not cache.exists() and list(folder.iterdir()) == []
    rc, err = _err(capsys, "ingest", str(SAMPLE / "dicom"), "--out", str(cache), "--json", str(cache))
    assert rc == 2 and "--json names the --out cache folder" in err and not cache.exists()
    report = tmp_path / "new" / "ingest.json"
    rc, _ = _err(capsys, "ingest", str(SAMPLE / "dicom"), "--out", str(cache), "--json", str(report))
    assert rc == 0 and report.is_file()


def test_ensure_file_path_makes_the_folder_and_refuses_a_folder(tmp_path):
    from pipeline.atomic import ensure_file_path

    assert ensure_file_path(tmp_path / "a" / "b.json", what="--json") == tmp_path / "a" / "b.json"
    assert (tmp_path / "a").is_dir()
    with pytest.raises(CtpipeError, match=r"--json: this is a folder, not a file"):
        ensure_file_path(tmp_path / "a", what="--json")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CtpipeError, match=r"the folder of --json: this is a file, not a folder"):
        ensure_file_path(tmp_path / "f" / "b.json", what="--json")


def test_the_atomic_writers_errors_name_the_target_not_its_temporary_file(tmp_path, monkeypatch):
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as ei:
        atomic_write_bytes(folder, b"{}")
    assert ei.value.filename == str(folder) and list(tmp_path.iterdir()) == [folder]

    def replace(src, dst):  # the rename fails (a folder made there meanwhile, a full disk, ...)
        raise OSError(errno.EACCES, "Permission denied", src, dst)

    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "out.json"
    with pytest.raises(PermissionError) as ei2:
        atomic_write_bytes(target, b"{}")
    assert ei2.value.filename == str(target) and ".tmp" not in str(ei2.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no temporary file left


def test_ingest_json_dash_prints_the_report_json_on_stdout(tmp_path, capsys, monkeypatch):
    # was: a file named "-" in the working folder, and nothing on stdout but the table
    import json

    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    rc = main(["ingest", str(SAMPLE / "dicom"), "--out", str(cache), "--json", "-"])
    out = capsys.readouterr()
    assert rc == 0 and not (tmp_path / "-").exists()
    report = json.loads(out.out)  # stdout holds only the JSON report (the table goes to stderr), for jq and scripts
    assert report["cache"] == str(cache) and len(report["cached"]) == 1
    assert "cached" in out.err and "files skipped" in out.err
