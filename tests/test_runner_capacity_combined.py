"""A report over several run folders: the capacity model at the runs' own deployment gives the measured rate.

Every expected figure is worked by hand in the test. The runs are synthetic run stores as a 1-GPU, 2-CPU-worker run
leaves them: per case an ``ingest`` attempt on a CPU worker and a ``detect`` attempt on the GPU.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from pipeline.runner import build_report
from pipeline.runner.store import DB_NAME, RunStore
from tests._support.runner import record_ok_stage

T0 = 1_800_000_000.0
DEVICE = "cuda:0 (NVIDIA A100-SXM4-80GB)"


def _run(run_dir: Path, run_id: str, *, start: float, end: float, ingest_s: float, n: int, host: str = "node-a") -> Path:
    """A completed run ``run_id`` active from ``start`` to ``end`` (Unix s) that completed ``n`` cases, each with
    ingest ``ingest_s`` s (CPU worker) and detect 40 s (GPU)."""
    store = RunStore(run_dir)
    store.start_run(
        run_id,
        command="ctpipe run",
        sources=["/data"],
        config={"runner": {"workers": 2}},
        versions={},
        device=DEVICE,
        host=host,
        pid=1,
        started_at=start,
    )
    for i in range(n):
        key = f"uid:{run_id}.{i}"
        store.upsert_discovered(case_key=key, case_id=f"{run_id}-{i}", series_uid=key[4:], fingerprint="f", source="/data")
        attempt = store.begin_case(key, run_id)
        for stage, worker, device, wall in (
            ("ingest", f"cpu-{i % 2}", "cpu", ingest_s),
            ("detect", "model-cuda:0", "cuda:0", 40.0),
        ):
            record_ok_stage(
                store,
                run_id=run_id,
                case_key=key,
                attempt=attempt,
                stage=stage,
                worker=worker,
                device=device,
                start=start,
                wall=wall,
            )
        store.complete_case(key, output_dir=f"cases/{i}", findings=[], measurements=[], ended_at=start + 20 * (i + 1))
    store.end_run(run_id, status="completed", n_cases=n, n_done=n, n_failed=0, n_skipped=0, ended_at=end)
    store.close()
    with sqlite3.connect(run_dir / DB_NAME) as db:
        db.execute("UPDATE runs SET started_at=?, ended_at=? WHERE run_id=?", (start, end, run_id))
    return run_dir


def test_capacity_at_the_runs_own_deployment_equals_the_measured_rate_over_sequential_runs(tmp_path):
    # night 1: 12 cases, ingest 100 s each, 750 s active; night 2: 12 cases, ingest 50 s each, 600 s active;
    # night 3: a resume that found nothing left to do, 150 s active (start-up, discovery).
    a = _run(tmp_path / "a", "ra", start=T0, end=T0 + 750, ingest_s=100.0, n=12)
    b = _run(tmp_path / "b", "rb", start=T0 + 10_000, end=T0 + 10_600, ingest_s=50.0, n=12)
    c = _run(tmp_path / "c", "rc", start=T0 + 20_000, end=T0 + 20_150, ingest_s=0.0, n=0)
    s = build_report([a, b, c], tmp_path / "rep").summary
    # measured: 24 cases over 750 + 600 + 150 = 1,500 active s = 0.016 cases/s = 57.6 cases/h = 1,382.4 cases/day
    assert s["throughput"]["cases_per_hour"] == pytest.approx(57.6)
    assert s["throughput"]["cases_per_day_projected"] == pytest.approx(1382.4)
    # stage times over all 24 cases: ingest (12 x 100 + 12 x 50) / 24 = 75 core-s, detect 40 s on the GPU.
    # 1 GPU: 1 / 40 = 0.025 cases/s; 2 CPU workers: 2 / 75 = 0.0267 cases/s -> model bound, 0.025 cases/s.
    # efficiency: 24 done / (0.025 x 1,500 s) = 37.5 predicted = 0.64; 0.64 x 0.025 x 86,400 = 1,382.4 cases/day.
    cap = s["capacity"]
    assert (cap["gpus"], cap["nodes"], cap["cpu_workers_per_node"], cap["bottleneck"]) == (1, 1, 2, "model")
    assert cap["efficiency_measured"] == pytest.approx(0.64)
    assert cap["cases_per_day"] == pytest.approx(1382.4)
    assert cap["cases_per_day"] == pytest.approx(s["throughput"]["cases_per_day_projected"])
    # a larger cluster is projected with the same efficiency: 2 GPUs: 2 / 40 = 0.05; 2 CPU workers: 0.0267 -> CPU
    # bound, 2 / 75 x 0.64 x 86,400 = 1,474.56 cases/day
    two = build_report([a, b, c], tmp_path / "rep2", gpus=2).summary["capacity"]
    assert two["bottleneck"] == "CPU" and two["cases_per_day"] == pytest.approx(1474.56)


def test_overlapping_runs_on_one_machine_count_their_shared_time_once_in_both_figures(tmp_path):
    # two folders run side by side on node-a: 750 s and 600 s, overlapping 250 s -> 1,100 s active
    a = _run(tmp_path / "a", "ra", start=T0, end=T0 + 750, ingest_s=100.0, n=12)
    b = _run(tmp_path / "b", "rb", start=T0 + 500, end=T0 + 1100, ingest_s=50.0, n=12)
    s = build_report([a, b], tmp_path / "rep").summary
    # measured: 24 / 1,100 s x 86,400 = 1,885.09 cases/day; predicted 0.025 x 1,100 = 27.5 cases: efficiency 0.8727
    assert s["throughput"]["cases_per_day_projected"] == pytest.approx(24 / 1100 * 86_400)
    assert s["capacity"]["efficiency_measured"] == pytest.approx(24 / 27.5)
    assert s["capacity"]["cases_per_day"] == pytest.approx(24 / 1100 * 86_400)
    assert "worked side by side for 4.2 min" in s["capacity"]["method"]  # 250 s


def test_the_report_says_how_each_rate_is_computed(tmp_path):
    a = _run(tmp_path / "a", "ra", start=T0, end=T0 + 750, ingest_s=100.0, n=12)
    b = _run(tmp_path / "b", "rb", start=T0 + 10_000, end=T0 + 10_600, ingest_s=50.0, n=12)
    rep = build_report([a, b], tmp_path / "rep")
    s = json.loads((rep.out_dir / "report.json").read_text())
    how = s["throughput"]["method"]
    # over active time (1,350 s) 64 cases/h; over the wall time from the first start to the last end (10,600 s) 8.15
    assert s["throughput"]["cases_per_hour"] == pytest.approx(64.0)
    assert s["throughput"]["cases_per_hour_wall"] == pytest.approx(24 / 10_600 * 3600)
    assert "active" in how and "first run's start to the last run's end" in how
    assert "8.2 cases/hour" in how
    assert "the capacity model" in s["capacity"]["method"] and "measured rate" in s["capacity"]["method"]
    page = rep.html.read_text()
    assert "How these figures are computed" in page and "8.2 cases/hour" in page


def test_runs_of_several_shapes_say_why_the_model_differs_from_the_measured_rate(tmp_path):
    a = _run(tmp_path / "a", "ra", start=T0, end=T0 + 750, ingest_s=100.0, n=12)
    b = _run(tmp_path / "b", "rb", start=T0 + 10_000, end=T0 + 10_600, ingest_s=50.0, n=12)
    with sqlite3.connect(b / DB_NAME) as db:  # night 2 ran every stage in one process
        db.execute("UPDATE runs SET config=?", (json.dumps({"runner": {"workers": 0}}),))
    s = build_report([a, b], tmp_path / "rep").summary
    # ingest 75 core-s + detect 40 s: night 1 (2 workers) predicts 0.025 cases/s x 750 s = 18.75 cases, night 2 (one
    # process) 1 / 115 cases/s x 600 s = 5.217: efficiency 24 / 23.967 = 1.0014, counted as 1.0; the model at
    # 2 CPU workers gives 0.025 x 86,400 = 2,160 cases/day, the measured rate 24 / 1,350 s x 86,400 = 1,536.
    assert s["capacity"]["cases_per_day"] == pytest.approx(2160.0)
    assert s["throughput"]["cases_per_day_projected"] == pytest.approx(1536.0)
    how = s["capacity"]["method"]
    assert "2,160 cases/day, the measured rate 1,536 cases/day" in how
    assert "different shapes (1 model worker(s) and runner.workers 0, 1 model worker(s) and runner.workers 2)" in how


def test_runs_that_completed_no_case_say_the_model_is_not_comparable_with_the_measured_rate(tmp_path):
    from tests.test_runner_capacity import _write_run

    run = tmp_path / "run"
    _write_run(run, n_cases=3, duration_s=400.0, complete=False)  # stopped with 3 cases past ingest, none done
    s = build_report([run], tmp_path / "rep").summary
    assert s["throughput"]["cases_per_hour"] == 0.0
    how = s["capacity"]["method"]
    assert "the measured rate 0 cases/day" in how
    assert "no case completed: the efficiency is not measured (1.00 assumed)" in how
    assert "not comparable with the measured rate" in how


def test_runs_of_two_machines_at_once_give_one_nodes_capacity_and_say_the_measured_rate_is_both(tmp_path):
    # node-a 750 s and node-b 600 s, from the same start: 750 s active, 24 cases -> 2,764.8 cases/day measured;
    # predicted per machine 0.025 x 750 + 0.025 x 600 = 33.75 cases: efficiency 24 / 33.75 = 0.7111;
    # one node: 0.7111 x 0.025 x 86,400 = 1,536 cases/day
    a = _run(tmp_path / "a", "ra", start=T0, end=T0 + 750, ingest_s=100.0, n=12, host="node-a")
    b = _run(tmp_path / "b", "rb", start=T0, end=T0 + 600, ingest_s=50.0, n=12, host="node-b")
    s = build_report([a, b], tmp_path / "rep").summary
    assert s["throughput"]["cases_per_day_projected"] == pytest.approx(2764.8)
    assert s["capacity"]["efficiency_measured"] == pytest.approx(24 / 33.75)
    assert s["capacity"]["cases_per_day"] == pytest.approx(1536.0)
    assert "The runs come from 2 machines: the measured rate is theirs together" in s["capacity"]["method"]
    assert "side by side" not in s["capacity"]["method"]  # on two machines, not one
