"""Stage latency as IT reads it: a stage that did not run for a case (detection skipped: no lungs in the scan) is no
latency sample of that stage; the report counts such cases per stage instead."""

from __future__ import annotations

import socket

import pytest

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.store import RunStore

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _case(store: RunStore, cid: str, *, detect_s: float, skipped: str | None) -> None:
    """Case ``cid`` done in run r1: ingest 2 s, detect ``detect_s`` (s); ``skipped``: why detection did not run."""
    key = f"{cid}:fp"
    store.upsert_discovered(case_key=key, case_id=cid, series_uid=cid, fingerprint="f", source=f"/src/{cid}")
    attempt = store.begin_case(key, "r1")
    t = T0
    for stage, wall in (("ingest", 2.0), ("detect", detect_s)):
        store.record_attempt(
            run_id="r1",
            case_key=key,
            stage=stage,
            attempt=attempt,
            status="ok",
            worker="main",
            device="cpu",
            ready_at=t,
            started_at=t,
            ended_at=t + wall,
            wall_s=wall,
            peak_rss_mb=100.0,
            peak_cuda_mb=None,
        )
        t += wall
    store.complete_case(key, output_dir=f"cases/{cid}", findings=[], measurements=[], detect_skipped=skipped)


def test_a_skipped_detection_is_no_latency_sample_but_a_count(tmp_path):
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    store.start_run(
        "r1", command="ctpipe run", sources=["/src"], config={}, versions={}, device="cpu", host=socket.gethostname(), pid=1
    )
    for n, wall in enumerate((4.0, 6.0, 8.0)):  # three real detections
        _case(store, f"real{n}", detect_s=wall, skipped=None)
    for n in range(3):  # three scans without lungs: detection returned at once
        _case(store, f"nolungs{n}", detect_s=0.0005, skipped="no lungs in the scan")
    store.end_run("r1", status="completed", n_cases=6, n_done=6, n_failed=0, n_skipped=0)
    store.close()
    rep = build_report([run_dir], tmp_path / "rep")
    lat = rep.summary["latency_s"]
    assert lat["detect"]["n"] == 3 and lat["detect"]["p50"] == pytest.approx(6.0)  # not 2.0 (six samples, three ~0)
    assert lat["detect"]["skipped"] == 3 and lat["ingest"]["skipped"] == 0 and lat["ingest"]["n"] == 6
    assert rep.summary["queue_wait_s"]["detect"]["n"] == 3
    by_node = next(iter(rep.summary["latency_by_node_s"].values()))
    assert by_node["detect"]["n"] == 3
    rows = {r["stage"]: r for r in read_table(rep.out_dir / "latency.csv").rows}
    assert (rows["detect"]["n"], rows["detect"]["n_skipped"], float(rows["detect"]["p50_s"])) == ("3", "3", 6.0)
    assert rows["ingest"]["n_skipped"] == "0"
