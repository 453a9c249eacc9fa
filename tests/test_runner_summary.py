"""The end of a run as an operator reads it: cases quarantined by this run told apart from those still quarantined
by earlier runs of the folder (summary line, run.log, the run store, metrics, report), and the exit status rule."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.runner.stage import CaseContext, Stage


@pytest.fixture
def ingest_only(monkeypatch):
    """The runner's stages cut to ingest: a good series is done in a moment."""
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])


def _gap_series(folder: Path) -> None:
    """A phantom series with a slice missing: quarantined (MissingSliceError) at every attempt."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.runner import PHANTOM

    write_dicom_series(generate_phantom(21, **PHANTOM).volume, folder, quirks=["missing_slice"], seed=21)


def _metric(path: Path, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _run_end(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines()]
    return [r for r in records if r.get("event") == "run_end"][-1]


def test_a_rerun_tells_cases_still_quarantined_from_earlier_runs_from_new_ones(tmp_path, capsys, own_signals, ingest_only):
    from tests._support.dicom import write_series

    src, out = tmp_path / "incoming", tmp_path / "run"
    _gap_series(src / "gap")
    argv = ["run", str(src), "--out", str(out), "--workers", "0", "--quiet", "--set", "report.enabled=false"]

    # night 1: the bad series arrives and is quarantined by this run
    assert main(argv) == 3
    first = capsys.readouterr().out.splitlines()
    assert "0 case(s) done, 1 newly quarantined, 0 already done earlier" in first[0], first
    assert any(ln.startswith("  quarantined ") and "MissingSliceError" in ln for ln in first), first
    assert not any("still quarantined" in ln for ln in first), first

    # night 2: a good series arrives; the bad one is not tried again (no --retry-failed)
    write_series(src / "good", n=12, series_uid="1.2.3.4242")
    assert main(argv) == 3  # unresolved bad cases keep exit 3; the summary says none is new
    second = capsys.readouterr().out.splitlines()
    assert (
        "1 case(s) done, 0 newly quarantined, 1 still quarantined from earlier runs (ctpipe run --retry-failed to retry "
        "them), 0 already done earlier, of 2" in second[0]
    ), second
    still = [ln for ln in second if ln.startswith("  still quarantined from an earlier run ")]
    assert len(still) == 1 and "MissingSliceError" in still[0], second
    assert not any(ln.startswith("  quarantined ") for ln in second), second
    end = _run_end(out)
    assert (end["quarantined_new"], end["quarantined_earlier"]) == (0, 1)
    assert "0 newly quarantined, 1 still quarantined from earlier runs" in end["msg"]
    prom = out / "metrics.prom"
    assert _metric(prom, "ctpipe_cases_quarantined", when="this_run") == 0
    assert _metric(prom, "ctpipe_cases_quarantined", when="earlier_runs") == 1
    assert _metric(prom, "ctpipe_run_exit_status") == 3
    with sqlite3.connect(out / "runs.sqlite") as db:
        recorded = db.execute("SELECT n_done, n_failed, n_failed_earlier FROM runs ORDER BY started_at").fetchall()
    assert recorded == [(0, 1, 0), (1, 0, 1)]

    # night 3, retried: the case is tried again by this run, and fails again: newly quarantined, nothing earlier
    assert main([*argv, "--retry-failed"]) == 3
    third = capsys.readouterr().out.splitlines()
    assert "0 case(s) done, 1 newly quarantined, 1 already done earlier" in third[0], third
    assert not any("still quarantined" in ln for ln in third), third
    assert (_run_end(out)["quarantined_new"], _run_end(out)["quarantined_earlier"]) == (1, 0)


def test_the_run_end_record_carries_the_summary_lines_figures(tmp_path, capsys, own_signals, ingest_only):
    from tests._support.dicom import write_series

    src, out = tmp_path / "incoming", tmp_path / "run"
    _gap_series(src / "gap")
    write_series(src / "good", n=12, series_uid="1.2.3.4243")
    argv = ["run", str(src), "--out", str(out), "--workers", "0", "--quiet", "--set", "report.enabled=false"]
    assert main(argv) == 3
    assert main(argv) == 3  # the rerun: the good case done earlier, the bad one still quarantined
    line = capsys.readouterr().out.splitlines()
    end = _run_end(out)
    figures = {k: end[k] for k in ("cases", "done", "done_earlier", "quarantined_new", "quarantined_earlier", "unfinished")}
    assert figures == {"cases": 2, "done": 0, "done_earlier": 1, "quarantined_new": 0, "quarantined_earlier": 1, "unfinished": 0}
    assert end["exit_status"] == 3 == _metric(out / "metrics.prom", "ctpipe_run_exit_status")
    summary = [ln for ln in line if ln.startswith("run ")][-1]
    assert summary.endswith(f"of 2, in {end['elapsed_s']:.1f} s"), (summary, end)


def test_the_report_lists_per_run_the_cases_still_quarantined_from_earlier_runs(tmp_path, ingest_only):
    from pipeline.runner.batch import run_batch
    from pipeline.runner.report import build_report

    _gap_series(tmp_path / "src" / "gap")
    opts = {"workers": 0, "report.enabled": False}
    assert run_batch(tmp_path / "src", out=tmp_path / "run", **opts).exit_code == 3
    again = run_batch(tmp_path / "src", out=tmp_path / "run", **opts)
    assert again.exit_code == 3 and again.quarantined == [] and len(again.still_quarantined) == 1, again.lines()
    rep = build_report([tmp_path / "run"], tmp_path / "rep")
    rows = rep.summary["runs_table"]
    assert [(r["n_failed"], r["n_failed_earlier"]) for r in rows] == [(1, 0), (0, 1)]
    assert "n_failed_earlier" in (tmp_path / "rep" / "runs.csv").read_text(encoding="utf-8-sig").splitlines()[0]


class _Peek(Stage):
    """An ingest stage that looks at the run folder's report while the run is under way, then stops the run."""

    name = "ingest"
    group = "cpu"
    report: Path
    seen: list[dict[str, Any]] = []
    stop = False

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        status = json.loads((self.report / "status.json").read_text())
        page = (self.report / "report.html").read_text()
        seen = {"status": status, "page": page, "json": json.loads((self.report / "report.json").read_text())}
        seen["files"] = {p.name: p.read_bytes() for p in self.report.iterdir() if p.is_file()}  # as a SIGKILL leaves them
        if self.stop:  # ctpipe report while the run is under way: in progress, figures as of the report's writing
            from pipeline.runner.report import build_report

            seen["rebuilt"] = build_report([self.report.parent], self.report.parent.parent / "during").summary["status"]
        self.seen.append(seen)
        if self.stop:
            raise KeyboardInterrupt
        return {}


def _as_if_killed(run_dir: Path) -> str:
    """Leave the latest run's record as SIGKILL leaves it: no end record, its process gone. Returns its run id."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with sqlite3.connect(run_dir / "runs.sqlite") as db:
        (run_id,) = db.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
        db.execute("UPDATE runs SET status='running', ended_at=NULL, pid=? WHERE run_id=?", (dead.pid, run_id))
    return run_id


def test_the_report_says_a_run_is_in_progress_and_later_that_it_was_interrupted(tmp_path, monkeypatch, capsys, own_signals):
    import pipeline.runner.batch as batch
    from tests._support.dicom import write_series

    src, out = tmp_path / "src", tmp_path / "run"
    report = out / "report"
    write_series(src / "a", n=12, series_uid="1.2.3.501")
    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])
    first = batch.run_batch(src, out=out, workers=0)
    assert first.exit_code == 0 and first.report_html is not None
    ended = json.loads((report / "status.json").read_text())
    assert ended["state"] == "ended" and f"run {first.run_id}" in ended["text"] and "(completed)" in ended["text"]
    first_json = json.loads((report / "report.json").read_text())

    # a second run starts: while it runs, the report says so, and that its figures are from the first run
    write_series(src / "b", n=12, series_uid="1.2.3.502")
    _Peek.report, _Peek.seen, _Peek.stop = report, [], True
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [_Peek()])
    with pytest.raises(KeyboardInterrupt):
        batch.run_batch(src, out=out, workers=0)
    (during,) = _Peek.seen
    status = during["status"]
    assert status["state"] == "in_progress" and "is in progress" in status["text"]
    (latest,) = status["runs"]
    assert latest["pid"] is not None and latest["run_id"] != first.run_id
    assert f"(pid {latest['pid']}" in status["text"] and latest["started_utc"] in status["text"]
    assert status["note"] == (
        f"the figures below are from before it, in the report written at {first_json['generated_at']}, after run "
        f"{first.run_id} ended at {ended['runs'][0]['ended_utc']} (completed)"
    )
    assert during["json"]["status"] == status  # report.json says so too; its figures stay those of the first run
    assert during["json"]["cases"] == first_json["cases"]
    assert "is in progress" in during["page"] and "the figures below are from before it" in during["page"]
    assert during["page"].count("Run status:") == 1
    rebuilt = during["rebuilt"]
    assert rebuilt["state"] == "in_progress" and rebuilt["runs"][0]["run_id"] == latest["run_id"]
    assert rebuilt["note"].startswith("the figures below are as of ") and rebuilt["note"].endswith(", while it runs")

    # stopped by a signal (KeyboardInterrupt), the run rebuilt its report: interrupted
    assert json.loads((report / "status.json").read_text())["state"] == "interrupted"
    # killed instead (no end record, no report rebuilt, its process gone): the page still says "in progress", until ...
    for name, data in during["files"].items():
        (report / name).write_bytes(data)
    killed = _as_if_killed(out)
    assert "is in progress" in (report / "report.html").read_text()
    # ... ctpipe report shows it as interrupted
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"run status: the latest run {killed}") and "was interrupted" in printed
    rebuilt = json.loads((tmp_path / "rep" / "status.json").read_text())
    assert rebuilt["state"] == "interrupted" and rebuilt["runs"][0]["run_id"] == killed
    assert "was interrupted: it ended without finishing" in (tmp_path / "rep" / "report.html").read_text()

    # ... and so does the next run's start
    _Peek.seen, _Peek.stop = [], False
    batch.run_batch(src, out=out, workers=0)
    (again,) = _Peek.seen
    assert again["status"]["state"] == "in_progress"
    assert f"the run before it, {killed}" in again["status"]["text"] and "was interrupted" in again["status"]["text"]
    assert f"the run before it, {killed}" in again["page"]
    assert again["status"]["note"] == status["note"]  # its figures are still those of the first run's report
    final = json.loads((report / "status.json").read_text())
    assert final["state"] == "ended" and "(completed)" in final["text"]
    assert "is in progress" not in (report / "report.html").read_text()


def test_the_repr_of_a_large_batch_s_summary_is_a_few_lines_not_every_case(tmp_path):
    """A notebook echoes ``run_batch(...)``'s summary: its counts, the first per-case lines (not hundreds), where the
    rest is, and no column padding meant for the terminal."""
    from pipeline.runner.run_summary import RunSummary

    summary = RunSummary(tmp_path, "r1", total=400, done=100)
    summary.quarantined = [(f"case{n}", "MissingSliceError", "slice 12 missing") for n in range(300)]
    summary.skipped_files = [{"path": "/d/readme.txt", "kind": "not_dicom", "reason": "not DICOM"}]
    text = repr(summary)
    assert text.startswith("RunSummary(run r1: 100 case(s) done, 300 newly quarantined")
    assert "quarantined case0: MissingSliceError: slice 12 missing" in text and "case3:" not in text
    assert "; 298 more in .lines()" in text and ";  " not in text
    assert len(summary.lines()) == 302  # the command line's summary still lists every case


def test_the_summary_lines_time_is_the_reports_active_time(tmp_path, own_signals, ingest_only):
    from pipeline.runner.batch import run_batch
    from tests._support.dicom import write_series

    write_series(tmp_path / "src" / "a", n=12, series_uid="1.2.3.4244")
    s = run_batch(tmp_path / "src", out=tmp_path / "run", workers=0)
    with sqlite3.connect(tmp_path / "run" / "runs.sqlite") as db:
        ((started, ended),) = db.execute("SELECT started_at, ended_at FROM runs").fetchall()
    assert abs((ended - started) - s.elapsed_s) < 0.01  # the run's record spans what the summary line says
    report = json.loads((tmp_path / "run" / "report" / "report.json").read_text())
    (run,) = report["runs_table"]
    assert f"in {run['active_s']:.1f} s" in s.lines()[0]


def test_a_case_done_again_is_told_as_a_redo_not_a_new_case(tmp_path):
    """Its published folder removed, a case is done again by the next run: the summary line says so, as the report's
    runs.csv counts it (n_redone), instead of counting a new completed case."""
    import shutil

    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage
    from tests._support.runner import PHANTOM

    write_phantom_case(generate_phantom(63, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / "src" / "c63")
    out, opts = tmp_path / "run", {"report.enabled": False}
    first = run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
    assert (first.done, first.redone) == (1, 0)
    (case_dir,) = list((out / "cases").iterdir())
    shutil.rmtree(case_dir)
    seen: list[str] = []  # the live progress, as a notebook's callback or the command line's bar gets it
    again = run_batch(
        [tmp_path / "src"], out=out, stages=[IngestStage()], workers=0, progress=lambda p: seen.append(p.describe()), **opts
    )
    assert (again.done, again.redone) == (0, 1)  # a redo is not a newly completed case
    assert seen[-1].startswith("0 done, 1 done again, 0 failed of 1 |"), seen
    assert again.lines()[0].startswith(f"run {again.run_id}: 0 case(s) done, 1 done again (its published folder was removed")
    # run.log's end record carries the same figures as fields (was: done_again and still_written dropped from it)
    end = _run_end(out)
    assert (end["done"], end["done_again"], end["still_written"]) == (0, 1, 0), end
