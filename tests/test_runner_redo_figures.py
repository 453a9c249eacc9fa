"""One rule for a case done again (its published folder removed): it counts where it was first completed, and the redo
is shown apart. The run's own figures follow it: the summary's ``done`` and the run's end record, the metrics
(``ctpipe_cases_processed_total`` against ``ctpipe_cases_redone_total``), and the report's summed stage time, which
counts the same attempts as capacity.csv."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.store import RunStore

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86_400.0


def _metric(path: Path, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    return None


@pytest.fixture(scope="module")
def redone(tmp_path_factory) -> dict[str, Any]:
    """Night 1 completes c63; its published folder is removed; night 2 does it again."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage
    from tests._support.runner import PHANTOM

    tmp = tmp_path_factory.mktemp("redo")
    write_phantom_case(generate_phantom(63, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp / "src" / "c63")
    out, opts = tmp / "run", {"report.enabled": False}
    first = run_batch([tmp / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
    after_first = {n: _metric(out / "metrics.prom", n) for n in ("ctpipe_cases_processed_total", "ctpipe_cases_redone_total")}
    (case_dir,) = list((out / "cases").iterdir())
    shutil.rmtree(case_dir)
    again = run_batch([tmp / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
    with sqlite3.connect(out / "runs.sqlite") as db:
        n_done = dict(db.execute("SELECT run_id, n_done FROM runs").fetchall())
    return {"first": first, "again": again, "out": out, "after_first": after_first, "n_done": n_done}


def test_the_run_that_does_a_case_again_records_no_new_completed_case(redone):
    first, again = redone["first"], redone["again"]
    assert (first.done, first.redone) == (1, 0)
    assert (again.done, again.redone) == (0, 1)
    assert redone["n_done"] == {first.run_id: 1, again.run_id: 0}  # the end records add up to the cases completed
    assert again.lines()[0].startswith(f"run {again.run_id}: 0 case(s) done, 1 done again")


def test_prometheus_counts_a_redo_apart_from_the_cases_completed(redone):
    out = redone["out"]
    assert redone["after_first"] == {"ctpipe_cases_processed_total": 1.0, "ctpipe_cases_redone_total": 0.0}
    # the counters go on from night 1 (monotonic): one case completed in all, done once again
    assert _metric(out / "metrics.prom", "ctpipe_cases_processed_total") == 1.0
    assert _metric(out / "metrics.prom", "ctpipe_cases_redone_total") == 1.0


def test_the_dashboard_and_readme_chart_completed_cases_from_the_counter_without_redos():
    root = Path(__file__).resolve().parents[1]
    dash = json.loads((root / "configs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert any("ctpipe_cases_redone_total" in e for e in exprs)
    readme = (root / "README.md").read_text()
    assert "ctpipe_cases_redone_total" in readme


def _start(store: RunStore, run_id: str, at: float) -> None:
    store.start_run(
        run_id,
        command="ctpipe run",
        sources=["/src"],
        config={},
        versions={},
        device="cpu",
        host=socket.gethostname(),
        pid=1,
        started_at=at,
    )


def _done(store: RunStore, cid: str, run_id: str, at: float, wall_s: float = 105.0) -> None:
    key = f"{cid}:fp"
    if store.case(key) is None:
        store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="fp", source=f"/src/{cid}")
    attempt = store.begin_case(key, run_id)
    store.db.execute("UPDATE cases SET started_at=? WHERE case_key=?", (at, key))
    store.record_attempt(
        run_id=run_id,
        case_key=key,
        stage="ingest",
        attempt=attempt,
        status="ok",
        worker="main",
        device="cpu",
        ready_at=at,
        started_at=at,
        ended_at=at + wall_s,
        wall_s=wall_s,
        peak_rss_mb=100.0,
        peak_cuda_mb=None,
    )
    store.complete_case(key, output_dir=f"cases/{cid}", findings=[], measurements=[], ended_at=at + wall_s, latency_s=wall_s)


def test_the_pages_summed_stage_time_counts_the_attempts_capacity_counts(tmp_path):
    """Four cases of 105 s each; a's first attempt is replaced when its published folder is removed and it is done
    again: 'stages busy' is 4 x 105 s, as capacity.csv's busy time per case times its attempts."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", T0)
    for i, cid in enumerate("abcd"):
        _done(store, cid, "r1", T0 + 200 * i)
    store.end_run("r1", status="completed", n_cases=4, n_done=4, n_failed=0, n_skipped=0, ended_at=T0 + 900)
    store.reset_case("a:fp")
    _start(store, "r2", T0 + DAY)
    _done(store, "a", "r2", T0 + DAY + 10)
    store.end_run("r2", status="completed", n_cases=4, n_done=0, n_failed=0, n_skipped=3, ended_at=T0 + DAY + 200)
    store.close()
    rep = build_report([run_dir], tmp_path / "rep", timezone="UTC")
    capacity = read_table(tmp_path / "rep" / "capacity.csv").rows
    from_capacity = sum(float(r["busy_s_per_case"]) * int(r["successful_attempts"]) for r in capacity)
    assert from_capacity == pytest.approx(420.0)
    overlap = rep.summary["overlap"]
    assert overlap["stage_busy_s"] == pytest.approx(from_capacity)
    assert overlap["left_out_s"] == pytest.approx(105.0)  # its first, replaced attempt
    page = rep.html.read_text()
    assert "stages busy 420.0 worker-s" in page
    assert "done again" in page and "capacity.csv" in page  # the page says which attempts the figure counts


def test_the_summary_says_how_many_of_the_quarantine_folders_cases_are_this_runs(tmp_path, monkeypatch):
    """A folder into which two sources run holds the quarantined cases of both: the summary line that sends the reader
    there for the cases it does not show says how many of the folder's are of this run's sources."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner import run_batch, run_summary
    from pipeline.runner.stages import IngestStage
    from tests._support.runner import PHANTOM

    monkeypatch.setattr(run_summary, "SHOWN", 1)  # the line for the cases not shown, without writing 21 of them
    for seed, folder in ((21, "nightly/g1"), (22, "nightly/g2"), (23, "backfill/g3")):
        vol = generate_phantom(seed, n_nodules=0, **{**PHANTOM, "slices": 12}).volume
        write_dicom_series(vol, tmp_path / folder, quirks=["missing_slice"], seed=seed)
    out, opts = tmp_path / "run", {"report.enabled": False}
    assert len(run_batch([tmp_path / "nightly"], out=out, stages=[IngestStage()], workers=0, **opts).quarantined) == 2
    assert len(run_batch([tmp_path / "backfill"], out=out, stages=[IngestStage()], workers=0, **opts).quarantined) == 1
    assert len(list((out / "quarantine").iterdir())) == 3
    again = run_batch([tmp_path / "nightly"], out=out, stages=[IngestStage()], workers=0, **opts)
    assert len(again.still_quarantined) == 2
    (line,) = [ln for ln in again.lines() if "1 more" in ln]
    assert str(out / "quarantine") in line
    assert "2 of its 3 quarantined case(s) are of this run's sources" in line


def test_a_killed_runs_redo_is_counted_apart_by_the_next_run(tmp_path):
    """A run killed before it wrote its metrics did a case again: the next run adds it to ctpipe_cases_redone_total,
    not to the cases processed."""
    import subprocess
    import sys

    from pipeline.runner.metrics import RunMetrics
    from pipeline.runner.resume import MANIFEST, reconcile

    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", T0)
    for cid in "ab":
        _done(store, cid, "r1", T0)
        (run_dir / "cases" / cid).mkdir(parents=True)
        (run_dir / "cases" / cid / MANIFEST).write_text(json.dumps({"case_key": f"{cid}:fp"}))
    store.end_run("r1", status="completed", n_cases=2, n_done=2, n_failed=0, n_skipped=0, ended_at=T0 + 300)
    store.reset_case("a:fp")  # its published folder was removed ...
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.start_run(
        "r2",
        command="ctpipe run",
        sources=["/src"],
        config={},
        versions={},
        device="cpu",
        host=socket.gethostname(),
        pid=dead.pid,
        started_at=T0 + DAY,
    )
    _done(store, "a", "r2", T0 + DAY)  # ... and the next run did it again, then was killed without an end record
    found = reconcile(store, run_dir)
    metrics = RunMetrics(node="n")
    metrics.count_killed_runs(found.uncounted)
    text = metrics.text()
    assert 'ctpipe_cases_processed_total{node="n"} 0.0' in text
    assert 'ctpipe_cases_redone_total{node="n"} 1.0' in text
    store.close()


def test_the_dashboard_never_divides_redo_including_latencies_by_new_cases_and_says_which_counts_redos():
    """``ctpipe_case_latency_seconds`` observes every completion, redos included; ``ctpipe_cases_processed_total``
    counts new cases only: no panel divides one by the other, and the panels say which of them takes in the redos."""
    root = Path(__file__).resolve().parents[1]
    dash = json.loads((root / "configs" / "grafana-dashboard.json").read_text())
    for panel in dash["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        for e in exprs:
            with_redos = "ctpipe_case_latency_seconds" in e or "ctpipe_cases_redone_total" in e
            assert not (with_redos and "/" in e and "ctpipe_cases_processed_total" in e), (panel["title"], e)
        text = panel.get("description", "")
        if any("ctpipe_case_latency_seconds" in e for e in exprs):
            assert "done again" in text and "included" in text, (panel["title"], text)
        if any("rate(ctpipe_cases_processed_total" in e for e in exprs):
            assert "done again" in text, (panel["title"], text)
    metrics_doc = (root / "pipeline" / "runner" / "metrics.py").read_text()
    line = next(x for x in metrics_doc.splitlines() if x.startswith("* ``ctpipe_case_latency_seconds``"))
    assert "done again" in line, line


def test_the_report_shows_cases_done_again_per_day_and_hour_beside_the_new_ones(tmp_path):
    """Night 1 completes a, b, c, d; their folders a and b are removed, and night 2 does them again besides a new
    case e: the daily and hourly figures keep counting new cases (1 on night 2), and show the 2 done again and the
    work done, 3, beside them: a node busy redoing cases does not look slower than the work it does."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", T0)
    for i, cid in enumerate("abcd"):
        _done(store, cid, "r1", T0 + 200 * i)
    store.end_run("r1", status="completed", n_cases=4, n_done=4, n_failed=0, n_skipped=0, ended_at=T0 + 900)
    store.reset_case("a:fp")
    store.reset_case("b:fp")
    _start(store, "r2", T0 + DAY)
    for i, cid in enumerate("abe"):
        _done(store, cid, "r2", T0 + DAY + 200 * i)
    store.end_run("r2", status="completed", n_cases=5, n_done=1, n_failed=0, n_skipped=2, ended_at=T0 + DAY + 700)
    store.close()

    rep = build_report([run_dir], tmp_path / "rep", timezone="UTC")

    tp = rep.summary["throughput"]
    assert tp["per_day_utc"] == {"2027-01-15": 4, "2027-01-16": 1}  # new cases, as before
    assert tp["redone_per_day_utc"] == {"2027-01-15": 0, "2027-01-16": 2}
    assert tp["redone_per_day_local"] == {"2027-01-15": 0, "2027-01-16": 2}
    assert tp["per_hour_utc"]["2027-01-16 08:00"] == 1 and tp["redone_per_hour_utc"]["2027-01-16 08:00"] == 2
    assert set(tp["redone_per_hour_utc"]) == set(tp["per_hour_utc"])
    assert tp["cases_done"] == 5 and tp["cases_redone"] == 2
    active_h = rep.summary["active_hours"]
    assert tp["cases_per_hour"] == pytest.approx(5 / active_h)  # new cases per active hour: its meaning kept
    assert tp["cases_redone_per_hour"] == pytest.approx(2 / active_h)

    daily = {r["day_utc"]: r for r in read_table(tmp_path / "rep" / "throughput_daily.csv").rows}
    assert [daily["2027-01-16"][k] for k in ("cases", "cases_redone", "cases_total_work")] == ["1", "2", "3"]
    assert [daily["2027-01-15"][k] for k in ("cases", "cases_redone", "cases_total_work")] == ["4", "0", "4"]
    local = {r["day_local"]: r for r in read_table(tmp_path / "rep" / "throughput_daily_local.csv").rows}
    assert [local["2027-01-16"][k] for k in ("cases", "cases_redone", "cases_total_work")] == ["1", "2", "3"]
    hourly = {r["hour_utc"]: r for r in read_table(tmp_path / "rep" / "throughput_hourly.csv").rows}
    assert [hourly["2027-01-16T08:00:00Z"][k] for k in ("cases", "cases_redone", "cases_total_work")] == ["1", "2", "3"]

    page = rep.html.read_text()
    assert "<th>new cases</th><th>done again</th><th>all cases worked</th>" in page
    assert "<tr><td>2027-01-16</td><td>1</td><td>2</td><td>3</td><td>ran</td></tr>" in page
    assert "done again per active hour" in page


def test_the_dashboard_charts_cases_done_again_per_hour_and_day_beside_the_new_ones():
    """Beside each rate of new cases (ctpipe_cases_processed_total), the same panel charts the cases done again
    (ctpipe_cases_redone_total) over the same window, and the two together: the node's whole work; one panel gives
    both per day."""
    import re

    root = Path(__file__).resolve().parents[1]
    dash = json.loads((root / "configs" / "grafana-dashboard.json").read_text())
    per_day = []
    for panel in dash["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        for e in exprs:
            for fn, window in re.findall(r"(rate|increase)\(ctpipe_cases_processed_total\{[^}]*\}\[(\w+)\]\)", e):
                if "Projected" in panel["title"]:
                    continue  # a projection of new cases: its meaning kept
                redone = [x for x in exprs if f"{fn}(ctpipe_cases_redone_total" in x and f"[{window}]" in x]
                assert any("ctpipe_cases_processed_total" not in x for x in redone), (panel["title"], "no redo series")
                assert any("ctpipe_cases_processed_total" in x for x in redone), (panel["title"], "no sum of both")
                if fn == "increase" and window == "1d":
                    per_day.append(panel["title"])
        if any("ctpipe_cases_redone_total" in e for e in exprs):
            assert "done again" in panel.get("description", ""), panel["title"]
    assert per_day, "no panel gives the cases per day"
