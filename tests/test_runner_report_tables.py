"""The report's tables as managers and hospital IT open them: runs counted per run (an interrupted run and its
resumed run count each case once), killed runs and their cases shown as interrupted, CSV times in ISO 8601 UTC,
UTF-8 with a byte-order mark, whole numbers, units in the column names; the cases/day headline of a short CPU
run; run folders named twice."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.report import summarize
from pipeline.runner.store import RunStore, db_path

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
BOM = b"\xef\xbb\xbf"


def _dead_pid() -> int:
    """The id of a process of this host that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _start(store: RunStore, run_id: str, *, pid: int, device: str = "cpu") -> None:
    store.start_run(
        run_id, command="ctpipe run", sources=["/src"], config={}, versions={}, device=device, host=socket.gethostname(), pid=pid
    )


def _begin(store: RunStore, cid: str, run_id: str, stages: dict[str, str], *, device: str = "cpu", worker: str = "main") -> int:
    """Begin case ``cid`` in ``run_id`` and record its stage attempts (stage -> status); returns the attempt number."""
    key = f"{cid}:fp"
    if store.case(key) is None:
        store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="f", source=f"/src/{cid}")
    attempt = store.begin_case(key, run_id)
    for n, (stage, status) in enumerate(stages.items()):
        done = status != "running"
        store.record_attempt(
            run_id=run_id,
            case_key=key,
            stage=stage,
            attempt=attempt,
            status=status,
            worker=worker,
            device=device if stage == "detect" else "cpu",
            ready_at=T0 + n,
            started_at=T0 + n,
            ended_at=T0 + n + 2.0 if done else None,
            wall_s=2.0 if done else None,
            peak_rss_mb=100.0,
            peak_cuda_mb=None,
        )
    return attempt


def _done(store: RunStore, cid: str, run_id: str, *, findings: int = 0, device: str = "cpu") -> None:
    _begin(store, cid, run_id, {"ingest": "ok", "detect": "ok"}, device=device)
    found = [{"center_lps": [1.0, 2.0, 3.0], "diameter_mm": 6.0, "score": 0.9}] * findings
    store.complete_case(f"{cid}:fp", output_dir=f"cases/{cid}", findings=found, measurements=[])


def _clock(run_dir: Path, sql: str, params: tuple = ()) -> None:
    """Set the store's times (Unix s), as the runs' own clocks would have written them."""
    import sqlite3

    with sqlite3.connect(db_path(run_dir)) as db:
        db.execute(sql, params)


@pytest.fixture
def resumed(tmp_path) -> Path:
    """Run r1 is killed (no end record) after finishing case a, with case b half done; run r2 resumes: b again,
    then c, and records n_done = 3 (every case done in the folder) at its end."""
    run_dir = tmp_path / "resumed"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1", findings=2)
    _begin(store, "b", "r1", {"ingest": "ok", "detect": "running"})
    store.mark_abandoned_runs()  # what the next run does first
    _start(store, "r2", pid=_dead_pid())
    _done(store, "b", "r2", findings=1)
    _done(store, "c", "r2")
    store.end_run("r2", status="completed", n_cases=3, n_done=3, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = 'r2'", (T0 + 600, T0 + 900))
    _clock(run_dir, "UPDATE runs SET started_at = ? WHERE run_id='r1'", (T0,))
    return run_dir


def _runs(summary: dict) -> dict[str, dict]:
    return {r["run_id"]: r for r in summary["runs_table"]}


def test_each_case_counts_once_in_the_run_that_finished_it(resumed, tmp_path):
    summary, _ = summarize([resumed])
    runs = _runs(summary)
    assert (runs["r1"]["n_done"], runs["r2"]["n_done"]) == (1, 2)  # not 0 (no end record) and 3 (a counted twice)
    assert sum(r["n_done"] for r in runs.values()) == summary["cases"]["done"] == 3
    assert runs["r1"]["status"] == "interrupted" and runs["r1"]["ended_utc"] is None
    assert runs["r2"]["status"] == "completed" and runs["r2"]["ended_utc"] == "2027-01-15T08:15:00Z"
    rep = build_report([resumed], tmp_path / "rep")
    table = read_table(rep.out_dir / "runs.csv")
    assert [(r["run_id"], r["status"], r["n_done"]) for r in table.rows] == [("r1", "interrupted", "1"), ("r2", "completed", "2")]
    assert table.rows[0]["started_utc"] == "2027-01-15T08:00:00Z" and table.rows[0]["ended_utc"] == ""
    html = rep.html.read_text()
    runs_html = html.split("<h2>Runs</h2>", 1)[1].split("</table>", 1)[0]
    assert "<td>all runs (each case once)</td>" in runs_html and re.search(
        r"<td>3</td><td>0</td><td>0</td><td></td><td></td></tr>$", runs_html
    )


def test_a_killed_runs_case_is_interrupted_once_another_run_started(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=os.getpid())  # its process lives on: only the later run tells
    _begin(store, "x", "r1", {"ingest": "ok", "detect": "running"})
    _start(store, "r2", pid=_dead_pid())  # a later run that never reached x (other sources)
    _done(store, "y", "r2")
    store.end_run("r2", status="completed", n_cases=1, n_done=1, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = started_at + 60 WHERE run_id = 'r2'")
    rep = build_report([run_dir], tmp_path / "rep")
    cases = {r["case_id"]: r["status"] for r in read_table(rep.out_dir / "cases.csv").rows}
    assert cases == {"x": "interrupted", "y": "done"}
    assert ">interrupted<" in rep.html.read_text() and ">running<" not in rep.html.read_text()
    assert rep.summary["cases"] == {"total": 2, "done": 1, "failed": 0, "unfinished": 1, "interrupted": 1}
    assert _runs(rep.summary)["r1"]["status"] == "interrupted"


def test_a_killed_runs_case_is_interrupted_once_its_process_is_gone(tmp_path):
    def one_run(name: str, pid: int) -> dict:
        run_dir = tmp_path / name
        store = RunStore(run_dir)
        _start(store, "r1", pid=pid)
        _begin(store, "x", "r1", {"ingest": "ok", "detect": "running"})
        store.close()
        _, t = summarize([run_dir])
        return {"case": t["cases"].status.tolist(), "run": t["runs"].status.tolist()}

    assert one_run("gone", _dead_pid()) == {"case": ["interrupted"], "run": ["interrupted"]}
    assert one_run("alive", os.getpid()) == {"case": ["running"], "run": ["running"]}  # still at work


@pytest.fixture
def report_dir(resumed, tmp_path) -> Path:
    """The report of ``resumed`` and a third run with a failed case whose reason has a non-ASCII dash."""
    store = RunStore(resumed)
    _start(store, "r3", pid=_dead_pid())
    _begin(store, "bad", "r3", {"ingest": "failed"})
    store.fail_case("bad:fp", reason="slices 3–5 are missing", error_class="MissingSliceError", stage="ingest")
    store.end_run("r3", status="completed", n_cases=1, n_done=0, n_failed=1, n_skipped=0)
    store.close()
    return build_report([resumed], tmp_path / "rep").out_dir


def test_csv_files_have_a_bom_and_read_back(report_dir):
    paths = sorted(report_dir.glob("*.csv"))
    assert {"cases.csv", "latency.csv", "stages.csv"} <= {p.name for p in paths}
    for path in paths:
        raw = path.read_bytes()
        assert raw.startswith(BOM), path.name  # Excel on Windows reads UTF-8 only with it
        assert read_table(path).columns[0] == raw[3:].decode().split(",", 1)[0].strip(), path.name
    rows = {r["case_id"]: r for r in read_table(report_dir / "cases.csv").rows}
    assert rows["bad"]["reason"] == "slices 3–5 are missing"


def test_csv_times_are_iso_utc(report_dir):
    cases = read_table(report_dir / "cases.csv")
    assert {"started_utc", "ended_utc"} <= set(cases.columns) and not {"started_at", "ended_at"} & set(cases.columns)
    assert all(ISO_UTC.match(r["started_utc"]) and ISO_UTC.match(r["ended_utc"]) for r in cases.rows)
    hourly = read_table(report_dir / "throughput_hourly.csv")
    assert hourly.columns == ["hour_utc", "cases", "cases_redone", "cases_total_work"] and all(
        ISO_UTC.match(r["hour_utc"]) for r in hourly.rows
    )


def test_csv_findings_are_whole_numbers_and_empty_for_failed_cases(report_dir):
    rows = read_table(report_dir / "cases.csv").rows
    assert {r["case_id"]: r["n_findings"] for r in rows} == {"a": "2", "b": "1", "c": "0", "bad": ""}


def test_csv_run_counts_are_whole_numbers_and_unknown_where_they_cannot_be_known(report_dir):
    rows = read_table(report_dir / "runs.csv").rows
    counts = {r["run_id"]: (r["n_done"], r["n_failed"], r["n_failed_earlier"]) for r in rows}
    # r1 was killed (no end record) and later runs changed the store since: what it left quarantined is not known
    assert counts == {"r1": ("1", "0", "unknown"), "r2": ("2", "0", "0"), "r3": ("0", "1", "0")}


def test_a_killed_latest_run_counts_the_cases_it_left_quarantined_as_its_end_would_have(tmp_path):
    """r1 quarantines bad; r2 is killed with case a done, not retrying bad: it would have recorded 1 at its end."""
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _begin(store, "bad", "r1", {"ingest": "failed"})
    store.fail_case("bad:fp", reason="no PixelData", error_class="TruncatedFileError", stage="ingest")
    store.end_run("r1", status="completed", n_cases=1, n_done=0, n_failed=1, n_skipped=0)
    _start(store, "r2", pid=_dead_pid())
    _done(store, "a", "r2")
    store.close()
    rep = build_report([run_dir], tmp_path / "rep")
    runs = _runs(rep.summary)
    assert (runs["r1"]["n_failed_earlier"], runs["r2"]["n_failed_earlier"]) == (0, 1)
    assert runs["r2"]["n_failed_earlier_from"] == "run store" and runs["r1"]["n_failed_earlier_from"] == "end record"
    table = {r["run_id"]: r["n_failed_earlier"] for r in read_table(rep.out_dir / "runs.csv").rows}
    assert table == {"r1": "0", "r2": "1"}


def test_csv_latency_columns_name_their_unit(report_dir):
    latency = read_table(report_dir / "latency.csv")
    assert latency.columns == ["stage", "n", "mean_s", "p50_s", "p90_s", "p99_s", "n_skipped"]  # skipped: a count of cases
    assert {r["stage"]: r["p50_s"] for r in latency.rows}["ingest"] == "2.0"


def _short_run(tmp_path: Path, device: str) -> dict:
    run_dir = tmp_path / device.split(":")[0]
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid(), device=device)
    for cid in ("a", "b", "c"):
        _done(store, cid, "r1", device="cuda:0" if device.startswith("cuda") else "cpu")
    store.end_run("r1", status="completed", n_cases=3, n_done=3, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (T0, T0 + 30))
    return build_report([run_dir], tmp_path / f"rep-{run_dir.name}").summary


def test_a_short_cpu_run_leads_with_what_it_measured(tmp_path):
    s = _short_run(tmp_path, "cpu")
    tp = s["throughput"]
    assert not tp["enough_to_project"] and tp["cases_per_hour"] == pytest.approx(360.0)
    assert s["projection"].startswith("measured 360.0 cases/hour from 3 completed case(s) over 30 active seconds")
    assert "cases/day projection: not enough data" in s["projection"]
    assert "8,640" not in s["projection"] and tp["cases_per_day_projected"] is None  # no big number, text or JSON
    cap = s["capacity"]
    assert not cap["gpu_recorded"] and cap["text"].startswith("capacity model")
    assert cap["cases_per_gpu_day"] is None and cap["cases_per_day"] is not None  # no GPU ran: no per-GPU figure
    for gpu_words in ("GPU/day", "per GPU", "reference deployment", "×"):
        assert gpu_words not in cap["text"], gpu_words
    assert "no GPU recorded" in cap["text"] and "too few to project from" in cap["text"]
    html = (tmp_path / "rep-cpu" / "report.html").read_text()
    section = html.split("<h2>Capacity model</h2>", 1)[1].split("<h2>", 1)[0]
    assert "cases/GPU/day" not in section and "reference deployment" not in section and "No GPU recorded" in section


def test_a_gpu_run_keeps_its_per_gpu_figures(tmp_path):
    s = _short_run(tmp_path, "cuda:0 (NVIDIA A100-SXM4-80GB)")
    assert s["capacity"]["gpu_recorded"] and "cases/GPU/day" in s["capacity"]["text"]
    html = (tmp_path / "rep-cuda" / "report.html").read_text()
    assert "cases/GPU/day; reference deployment" in html


def test_run_dirs_named_twice_are_listed_once_in_order(resumed, tmp_path, monkeypatch):
    other = tmp_path / "other"
    store = RunStore(other)
    _start(store, "o1", pid=_dead_pid())
    store.end_run("o1", status="completed", n_cases=0, n_done=0, n_failed=0, n_skipped=0)
    store.close()
    monkeypatch.chdir(tmp_path)
    rep = build_report(["resumed", str(other), str(resumed) + "/", "./resumed", other], tmp_path / "rep")
    want = [str(resumed.resolve()), str(other.resolve())]
    assert rep.summary["run_dirs"] == want
    assert json.loads(rep.json.read_text())["run_dirs"] == want and rep.summary["runs"] == 3


def test_latency_histograms_share_one_scale_so_a_single_case_shows():
    from pipeline.runner.report import shared_bins

    edges = shared_bins([np.array([51.0]), np.array([15.0]), np.array([])])
    assert edges[0] == 0.0 and edges[-1] >= 51.0 and len(edges) == 31
    assert np.diff(edges).min() > 1.0  # a bar of about 1.7 s on a 52 s axis, not 0.03 s
    assert shared_bins([])[-1] > 0.0
    log = shared_bins([np.array([51.0]), np.array([0.2, 0.0])])  # 255 times: bins of equal ratio from just below 0.2 s
    assert 0.19 < log[0] < 0.2 and log[-1] >= 51.0 and len(log) == 31
    assert np.allclose(log[1:] / log[:-1], log[1] / log[0])


def test_latency_per_node_names_ray_nodes_and_the_local_host(tmp_path):
    run = tmp_path / "run"
    store = RunStore(run)
    _start(store, "r1", pid=_dead_pid())
    for cid, worker in (("a", "cpu-1@10.0.0.1"), ("b", "cpu-1@10.0.0.2"), ("c", "main")):
        _begin(store, cid, "r1", {"ingest": "ok", "detect": "ok"}, worker=worker)
        store.complete_case(f"{cid}:fp", output_dir=f"cases/{cid}", findings=[], measurements=[])
    store.end_run("r1", status="completed", n_cases=3, n_done=3, n_failed=0, n_skipped=0)
    store.close()
    rep = build_report([run], tmp_path / "rep")
    table = read_table(tmp_path / "rep" / "latency_by_node.csv")
    nodes = {(r["node"], r["stage"]): r for r in table.rows}
    assert set(nodes) == {(n, s) for n in ("10.0.0.1", "10.0.0.2", socket.gethostname()) for s in ("ingest", "detect")}
    assert all(r["n"] == "1" and float(r["p50_s"]) == 2.0 for r in table.rows)
    assert set(rep.summary["latency_by_node_s"]) == {"10.0.0.1", "10.0.0.2", socket.gethostname()}


def test_the_headline_names_the_machines_whose_rate_it_gives(tmp_path):
    def folder(host: str) -> Path:
        run_dir = tmp_path / host
        store = RunStore(run_dir)
        store.start_run(f"r-{host}", command="t", sources=[], config={}, versions={}, device="cpu", host=host, pid=1)
        for n in range(12):
            _done(store, f"{host}-{n}", f"r-{host}")
        store.end_run(f"r-{host}", status="completed", n_cases=12, n_done=12, n_failed=0, n_skipped=0)
        store.close()
        _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (T0, T0 + 600))  # the same ten minutes
        return run_dir

    a, b = folder("node-a"), folder("node-b")
    one, _ = summarize([a])
    assert one["projection"].startswith("at the measured rate machine node-a handles 1,728 cases/day")
    both, _ = summarize([a, b])
    assert both["throughput"]["cases_per_hour"] == pytest.approx(144.0)  # the two machines' combined rate
    assert both["projection"].startswith("at the measured rate 2 machines together (node-a, node-b) handle 3,456 cases/day")
    assert "this machine" not in both["projection"]


def test_gpus_of_one_index_on_two_hosts_are_two_gpus(tmp_path):
    folders = []
    for host, util in (("node-a", 100.0), ("node-b", 0.0)):
        run_dir = tmp_path / host
        store = RunStore(run_dir)
        store.start_run(f"r-{host}", command="t", sources=[], config={}, versions={}, device="cuda:0 (A100)", host=host, pid=1)
        store.add_gpu_samples(f"r-{host}", [(T0 + i, 0, util, 1000.0, 80000.0) for i in range(10)])
        store.end_run(f"r-{host}", status="completed", n_cases=0, n_done=0, n_failed=0, n_skipped=0)
        store.close()
        folders.append(run_dir)
    one, _ = summarize(folders[:1])
    assert one["gpu"] == {"0": {"util_mean_pct": 100.0, "util_max_pct": 100.0, "mem_max_mb": 1000.0, "samples": 10}}
    both = build_report(folders, tmp_path / "rep").summary["gpu"]
    assert {g: (v["util_mean_pct"], v["samples"]) for g, v in both.items()} == {"node-a:0": (100.0, 10), "node-b:0": (0.0, 10)}


def test_every_day_of_the_period_is_listed_and_says_whether_a_run_was_active(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "a", "r1")
    _done(store, "b", "r1")
    store.end_run("r1", status="completed", n_cases=2, n_done=2, n_failed=0, n_skipped=0)
    _start(store, "r2", pid=_dead_pid())  # two days later every case fails
    _begin(store, "bad", "r2", {"ingest": "failed"})
    store.fail_case("bad:fp", reason="no PixelData", error_class="TruncatedFileError", stage="ingest")
    store.end_run("r2", status="completed", n_cases=1, n_done=0, n_failed=1, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = 'r1'", (T0, T0 + 3600))
    _clock(run_dir, "UPDATE cases SET ended_at = ?1, first_done_at = ?1 WHERE run_id = 'r1'", (T0 + 600,))
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = 'r2'", (T0 + 2 * 86400, T0 + 2 * 86400 + 1800))
    rep = build_report([run_dir], tmp_path / "rep", timezone="Asia/Tokyo")
    tp = rep.summary["throughput"]
    # every calendar day of the period is a row, so that the mean of the rows is the mean per day; the 16th, when no
    # run was active, is told from the 17th, when a run was active and completed nothing
    assert tp["per_day_utc"] == {"2027-01-15": 2, "2027-01-16": 0, "2027-01-17": 0}
    assert tp["days_without_run_utc"] == ["2027-01-16"]
    assert tp["per_hour_utc"] == {"2027-01-15 08:00": 2, "2027-01-17 08:00": 0}  # r1 ended at 09:00:00
    daily = read_table(rep.out_dir / "throughput_daily.csv")
    assert [(r["day_utc"], r["cases"], r["run_active"]) for r in daily.rows] == [
        ("2027-01-15", "2", "True"),
        ("2027-01-16", "0", "False"),
        ("2027-01-17", "0", "True"),
    ]
    # local days (Tokyo, UTC+9): r1 17:00-18:00 on the 15th, r2 17:00-17:30 on the 17th
    assert tp["per_day_local"] == {"2027-01-15": 2, "2027-01-16": 0, "2027-01-17": 0}
    assert tp["days_without_run_local"] == ["2027-01-16"]
    local = read_table(rep.out_dir / "throughput_daily_local.csv")
    assert [(r["day_local"], r["cases"], r["run_active"]) for r in local.rows] == [
        ("2027-01-15", "2", "True"),
        ("2027-01-16", "0", "False"),
        ("2027-01-17", "0", "True"),
    ]
    assert "no run" in (rep.out_dir / "report.html").read_text()


def test_the_gpu_plot_draws_no_line_across_the_idle_time_between_runs():
    """Two runs of one GPU an hour apart: two lines of one colour and one legend entry, not a line joining them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from pipeline.runner.report_plots import gpu_lines

    samples = pd.DataFrame(
        {
            "run_id": ["r1"] * 5 + ["r2"] * 5,
            "t": [T0 + i for i in range(5)] + [T0 + 3600 + i for i in range(5)],
            "util_pct": [90.0] * 10,
            "label": ["0"] * 10,
        }
    )
    fig, ax = plt.subplots()
    try:
        gpu_lines(ax, samples)
        assert [len(line.get_xdata()) for line in ax.get_lines()] == [5, 5]
        assert len({line.get_color() for line in ax.get_lines()}) == 1
        assert [text.get_text() for text in ax.legend().get_texts()] == ["GPU 0"]
    finally:
        plt.close(fig)


def test_the_status_of_a_run_under_way_names_its_folder_as_the_finished_report_does(tmp_path, monkeypatch):
    from pipeline.runner.report import mark_run_started

    store = RunStore(tmp_path / "run")
    _start(store, "r1", pid=os.getpid())
    store.close()
    monkeypatch.chdir(tmp_path)  # ctpipe run --out run: the folder given relative to the working directory
    during = mark_run_started(Path("run") / "report", Path("run"))
    written = json.loads((tmp_path / "run" / "report" / "status.json").read_text())
    after = build_report([Path("run")], Path("run") / "report").summary["status"]
    assert during["runs"][0]["run_dir"] == written["runs"][0]["run_dir"] == after["runs"][0]["run_dir"]
    assert after["runs"][0]["run_dir"] == str((tmp_path / "run").resolve())


def test_a_run_under_way_is_active_until_the_report_is_made(tmp_path):
    import time

    from pipeline.runner.tables import _process_start

    started = (_process_start(os.getpid()) or time.time() - 5.0) + 0.1  # this process is the run's, still at work
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=os.getpid())
    _done(store, "a", "r1")
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?", (started,))
    _clock(run_dir, "UPDATE stage_attempts SET started_at = ?, ended_at = ?", (started, started + 0.1))
    _clock(run_dir, "UPDATE cases SET started_at = ?, ended_at = ?, first_done_at = ?2", (started, started + 0.1))
    before = time.time()
    s, _ = summarize([run_dir])
    (run,) = s["runs_table"]
    assert before - started > 0.3  # the process has run for longer than its last recorded stage
    assert run["status"] == "running" and run["active_s"] >= before - started  # not 0.1 s: a case may be at work, or hung
    assert s["throughput"]["cases_per_hour"] <= 3600.0 / (before - started)


def test_the_run_under_way_status_changes_the_report_files_together_or_not_at_all(tmp_path, monkeypatch):
    """A failure while marking a run as started leaves status.json, report.json and report.html as they were: the
    bookmarked page and the JSON never disagree on whether a run is under way."""
    from pipeline.runner import report as report_module

    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=os.getpid())
    _done(store, "a", "r1")
    store.close()
    out = run_dir / "report"
    build_report([run_dir], out)
    before = {name: (out / name).read_bytes() for name in ("status.json", "report.json", "report.html")}

    def broken(status: dict) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_module, "status_banner", broken)
    with pytest.raises(OSError):
        report_module.mark_run_started(out, run_dir)
    assert {name: (out / name).read_bytes() for name in before} == before
