"""A case folder a run killed as it recorded the case left in place, which a later run over other sources leaves as
it is (its series is not among that run's sources): the run's warning and the report's line of the case name the
command that checks its series and adopts the folder, the one ``ctpipe send`` names (pipeline/runner/left_unsent.py),
not "the same ctpipe run command", which does not take it up when its sources do not hold the series."""

from __future__ import annotations

import json
import logging

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.adopt import source_check
from pipeline.runner.arrivals import SourceSnapshot
from pipeline.runner.resume import MANIFEST, reconcile
from pipeline.runner.store import RunStore
from tests.test_runner_report_tables import _begin, _dead_pid, _done, _start

PACS = "dicomweb+http://pacs:8042/dicom-web"


def _left_by_a_killed_run(tmp_path):
    """Run r1 finished case a and was killed as it recorded cases b (from a folder) and p (retrieved from a PACS),
    their folders in place; nothing ran since. The store is returned open."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1")
    for cid in ("b", "p"):
        _begin(store, cid, "r1", {"ingest": "ok", "detect": "ok", "write": "ok"})
        (run_dir / "cases" / cid).mkdir(parents=True)
        (run_dir / "cases" / cid / MANIFEST).write_text(json.dumps({"case_key": f"{cid}:fp", "findings": []}))
    store.record_origins("r1", [("p:fp", {"remote": PACS, "via": "wado", "series_uid": "1.2.3"})])
    return run_dir, store


def test_a_run_whose_sources_do_not_hold_the_series_names_the_command_that_adopts_the_folder(tmp_path, caplog):
    run_dir, store = _left_by_a_killed_run(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.runner.resume"):
            out = reconcile(store, run_dir, source_check=source_check([], SourceSnapshot()))  # sources of other series
    finally:
        store.close()
    assert sorted(out.unchecked) == ["b", "p"] and (run_dir / "cases" / "b").is_dir()
    said = {r.case_id: r.getMessage() for r in caplog.records if getattr(r, "event", "") == "reconcile_unchecked"}
    # was: "...; a run over its source decides", naming no command
    assert f"ctpipe run /src/b --out {run_dir} (a run over the folder it came from)" in said["b"], said
    assert f'ctpipe run "{PACS}?series=1.2.3" --out {run_dir}' in said["p"], said


def test_the_report_names_the_command_that_adopts_a_folder_a_later_run_left(tmp_path):
    run_dir, store = _left_by_a_killed_run(tmp_path)
    try:
        _start(store, "r2", pid=_dead_pid())  # a run over other sources: it leaves b's and p's folders as they are
        store.end_run("r2", status="completed", n_cases=0, n_done=0, n_failed=0, n_skipped=0)
    finally:
        store.close()
    rep = build_report([run_dir], tmp_path / "rep")
    reasons = {r["case_id"]: r["reason"] for r in read_table(rep.out_dir / "cases.csv").rows}
    for cid, command in (
        ("b", f"ctpipe run /src/b --out {run_dir} (a run over the folder it came from)"),
        ("p", f'ctpipe run "{PACS}?series=1.2.3" --out {run_dir}'),
    ):
        why = reasons[cid]
        # was: "run r1 stopped while the case was at work ...; not quarantined: the same ctpipe run command analyses it"
        assert "the same ctpipe run command" not in why, why
        assert f"run r1 was stopped as it recorded the case, its results in place in cases/{cid}" in why, why
        assert "the latest run, r2, left it as it is: its series was not among that run's sources" in why, why
        assert f"; {command} checks its series in the source and adopts them" in why, why
    assert reasons["a"] == ""
