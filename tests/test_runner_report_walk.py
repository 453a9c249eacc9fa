"""A manager's walk through three nights of one run folder, every figure checked against the run store by hand.

Night 1 (2027-01-15): r1 completes a and b and quarantines c; beside it, rx (another source into the same folder)
quarantines x. Night 2: a's published folder was removed, so r2 does a again (a redo, not a new case) and
completes d; c is left quarantined. Night 3: r3 completes e, quarantines f and is killed (no end record).
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.store import RunStore, db_path

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86_400.0


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _start(store: RunStore, run_id: str, at: float, *, source: str = "/src/nightly", pid: int = 1) -> None:
    store.start_run(
        run_id,
        command="ctpipe run",
        sources=[source],
        config={},
        versions={},
        device="cpu",
        host=socket.gethostname(),
        pid=pid,
        started_at=at,
    )


def _attempt(store: RunStore, cid: str, run_id: str, at: float, *, status: str = "ok", source: str = "/src/nightly") -> str:
    """Begin case ``cid`` in ``run_id`` at ``at`` (Unix s) with one ingest attempt of 60 s ending ``status``."""
    key = f"{cid}:fp"
    if store.case(key) is None:
        store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="fp", source=f"{source}/{cid}")
    attempt = store.begin_case(key, run_id)
    store.db.execute("UPDATE cases SET started_at=? WHERE case_key=?", (at, key))
    store.record_attempt(
        run_id=run_id,
        case_key=key,
        stage="ingest",
        attempt=attempt,
        status=status,
        worker="main",
        device="cpu",
        ready_at=at,
        started_at=at,
        ended_at=at + 60.0,
        wall_s=60.0,
        peak_rss_mb=100.0,
        peak_cuda_mb=None,
    )
    return key


def _done(store: RunStore, cid: str, run_id: str, at: float) -> None:
    key = _attempt(store, cid, run_id, at)
    store.complete_case(key, output_dir=f"cases/{cid}", findings=[], measurements=[], ended_at=at + 60.0, latency_s=60.0)


def _failed(store: RunStore, cid: str, run_id: str, at: float, *, source: str = "/src/nightly") -> None:
    key = _attempt(store, cid, run_id, at, status="failed", source=source)
    store.fail_case(key, reason="no PixelData", error_class="TruncatedFileError", stage="ingest")
    store.db.execute("UPDATE cases SET ended_at=?, latency_s=60.0 WHERE case_key=?", (at + 60.0, key))


@pytest.fixture(scope="module")
def three_nights(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("walk") / "run"
    store = RunStore(run_dir)
    # night 1
    _start(store, "r1", T0)
    _done(store, "a", "r1", T0 + 60)
    _done(store, "b", "r1", T0 + 180)
    _failed(store, "c", "r1", T0 + 300)
    store.mark_found("r1", ["a:fp", "b:fp", "c:fp"])  # as the run records what its discovery found
    store.end_run("r1", status="completed", n_cases=3, n_done=2, n_failed=1, n_skipped=0, ended_at=T0 + 600)
    _start(store, "rx", T0 + 3600, source="/src/other")
    _failed(store, "x", "rx", T0 + 3660, source="/src/other")
    store.mark_found("rx", ["x:fp"])
    store.end_run("rx", status="completed", n_cases=1, n_done=0, n_failed=1, n_skipped=0, ended_at=T0 + 3900)
    # night 2: a's published folder is gone, so it is done again
    store.reset_case("a:fp")
    _start(store, "r2", T0 + DAY)
    _done(store, "a", "r2", T0 + DAY + 60)
    _done(store, "d", "r2", T0 + DAY + 180)
    store.mark_found("r2", ["a:fp", "b:fp", "c:fp", "d:fp"])
    store.add_gpu_samples("r2", [(T0 + DAY + 60, 0, 50.0, 1000.0, 80000.0), (T0 + DAY + 120, 0, 70.0, 3000.0, 80000.0)])
    store.end_run(
        "r2", status="completed", n_cases=4, n_done=2, n_failed=0, n_skipped=1, n_failed_earlier=1, ended_at=T0 + DAY + 600
    )
    # night 3: killed after e and f
    _start(store, "r3", T0 + 2 * DAY, pid=_dead_pid())
    _done(store, "e", "r3", T0 + 2 * DAY + 60)
    _failed(store, "f", "r3", T0 + 2 * DAY + 180)
    store.mark_found("r3", ["a:fp", "b:fp", "c:fp", "d:fp", "e:fp", "f:fp"])
    store.close()
    return run_dir


@pytest.fixture(scope="module")
def report(three_nights, tmp_path_factory):
    return build_report([three_nights], tmp_path_factory.mktemp("walk-rep") / "rep", timezone="UTC")


def _runs_csv(report) -> dict[str, dict[str, str]]:
    return {r["run_id"]: r for r in read_table(report.out_dir / "runs.csv").rows}


def test_the_store_holds_what_the_walk_checks_against(three_nights):
    with sqlite3.connect(db_path(three_nights)) as db:
        rows = dict(db.execute("SELECT case_id, status || ' ' || run_id FROM cases").fetchall())
        first, ended = db.execute("SELECT first_done_at, ended_at FROM cases WHERE case_id='a'").fetchone()
    assert rows == {
        "a": "done r2",
        "b": "done r1",
        "c": "failed r1",
        "x": "failed rx",
        "d": "done r2",
        "e": "done r3",
        "f": "failed r3",
    }
    assert (first, ended) == (T0 + 120, T0 + DAY + 120)


def test_runs_csv_credits_a_redone_case_to_its_first_completion(report):
    runs = _runs_csv(report)
    done = {k: r["n_done"] for k, r in runs.items()}
    assert done == {"r1": "2", "rx": "0", "r2": "1", "r3": "1"}  # a counts in r1, as on the day tables
    assert {k: r["n_redone"] for k, r in runs.items()} == {"r1": "0", "rx": "0", "r2": "1", "r3": "0"}


def test_runs_csv_and_the_day_tables_and_the_headline_agree(report):
    s = report.summary
    runs = _runs_csv(report)
    assert sum(int(r["n_done"]) for r in runs.values()) == s["cases"]["done"] == 4
    assert sum(int(r["n_failed"]) for r in runs.values()) == s["cases"]["failed"] == 3
    assert s["throughput"]["per_day_utc"] == {"2027-01-15": 2, "2027-01-16": 1, "2027-01-17": 1}
    assert sum(s["throughput"]["per_day_utc"].values()) == s["cases"]["done"]
    by_day: dict[str, int] = {}
    for r in runs.values():
        by_day[r["started_utc"][:10]] = by_day.get(r["started_utc"][:10], 0) + int(r["n_done"])
    assert by_day == s["throughput"]["per_day_utc"]


def test_a_killed_run_counts_only_the_quarantined_cases_its_discovery_found(report):
    runs = _runs_csv(report)
    assert runs["r3"]["status"] == "interrupted" and runs["r3"]["ended_utc"] == ""
    # c (found by r3, quarantined by r1) is left quarantined; x is another source's, which r3 never looked at
    assert (runs["r3"]["n_failed"], runs["r3"]["n_failed_earlier"]) == ("1", "1")
    assert report.summary["runs_table"][-1]["n_failed_earlier_from"] == "run store"


def test_a_run_records_the_cases_its_discovery_found(tmp_path):
    """Two sources into one run folder: each run answers for the cases of its own sources only."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage
    from tests._support.runner import PHANTOM

    for seed, src in ((71, "nightly"), (72, "other")):
        write_phantom_case(generate_phantom(seed, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / src / f"c{seed}")
    out = tmp_path / "run"
    first = run_batch([tmp_path / "nightly"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": False})
    second = run_batch([tmp_path / "other"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": False})
    with sqlite3.connect(db_path(out)) as db:
        found = sorted(db.execute("SELECT found_by FROM cases").fetchall())
    assert found == sorted([(first.run_id,), (second.run_id,)])


def test_cases_csv_gives_the_day_each_case_counts_on(report):
    """A redone case ended on night 2, but counts on night 1: cases.csv says both, so the daily rows can be checked."""
    rows = {r["case_id"]: r for r in read_table(report.out_dir / "cases.csv").rows}
    assert (rows["a"]["first_done_utc"], rows["a"]["ended_utc"]) == ("2027-01-15T08:02:00Z", "2027-01-16T08:02:00Z")
    assert rows["c"]["first_done_utc"] == ""  # quarantined: never done
    by_day: dict[str, int] = {}
    for r in rows.values():
        if r["status"] == "done":
            by_day[r["first_done_utc"][:10]] = by_day.get(r["first_done_utc"][:10], 0) + 1
    assert by_day == report.summary["throughput"]["per_day_utc"]


def test_the_page_names_medians_and_means_and_their_unit(report):
    html = report.html.read_text()
    latency = html.split("<h2>Latency (seconds)</h2>", 1)[1].split("</table>", 1)[0]
    heads = [h.split("</th>")[0] for h in latency.split("<th>")[1:]]
    assert heads == ["stage", "n", "mean", "median (p50)", "p90", "p99", "skipped"]
    assert "median (p50): half of them took at most this long" in html


def test_the_gpu_table_names_what_and_in_which_unit(report):
    assert report.summary["gpu"] == {"0": {"util_mean_pct": 60.0, "util_max_pct": 70.0, "mem_max_mb": 3000.0, "samples": 2}}
    gpu = report.html.read_text().split("<h2>GPU</h2>", 1)[1].split("</table>", 1)[0]
    heads = [h.split("</th>")[0] for h in gpu.split("<th>")[1:]]
    assert heads == ["gpu", "mean utilisation (%)", "max utilisation (%)", "max memory used (MB)", "samples"]
