"""The capacity model (pipeline/runner/capacity.py): every expected figure is worked by hand in the test."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.errors import ConfigError
from pipeline.runner.capacity import (
    REFERENCE_CASES_PER_GPU_DAY,
    StageLoad,
    ideal_rate,
    measured_efficiency,
    model_workers,
    project,
    stage_loads,
)
from pipeline.runner.store import DB_NAME, RunStore
from tests._support.runner import record_ok_stage

LOADS = [
    StageLoad("ingest", "cpu", 2.0, 10),
    StageLoad("reconstruct", "cpu", 6.0, 10),
    StageLoad("load", "model", 1.0, 10),
    StageLoad("detect", "model", 3.0, 10),
]  # model 4 s per case per GPU, CPU 8 core-s per case


def test_reference_deployment_is_15000_cases_on_32_gpus():
    assert REFERENCE_CASES_PER_GPU_DAY == 468.75  # 15,000 / 32


def test_model_bound_cluster():
    # 8 GPUs: 8 / 4 s = 2 cases/s; 2 nodes x 16 CPU workers: 32 / 8 core-s = 4 cases/s -> the model group decides.
    # 2 cases/s x 86,400 s x efficiency 0.5 = 86,400 cases/day; CPU alone 4 x 86,400 x 0.5 = 172,800.
    cap = project(LOADS, gpus=8, nodes=2, cpu_workers_per_node=16, efficiency=0.5)
    assert cap.bottleneck == "model"
    assert cap.model_cases_per_day == pytest.approx(86_400)
    assert cap.cpu_cases_per_day == pytest.approx(172_800)
    assert cap.cases_per_day == pytest.approx(86_400)
    assert cap.per_gpu_day == pytest.approx(10_800)  # 86,400 / 8; 10,800 / 468.75 = 23.04 x the reference deployment
    text = cap.text()
    assert "86,400 cases/day" in text and "10,800 cases/GPU/day (23.04×" in text
    assert "15,000 cases/day on 32 A100s = 469 cases/GPU/day" in text
    assert "efficiency 0.50 measured" in text and "cross-node traffic not measured" in text
    assert "too few" not in text
    d = cap.to_dict()
    assert d["model_busy_s_per_case"] == 4.0 and d["cpu_busy_s_per_case"] == 8.0
    assert json.loads(json.dumps(d)) == d


def test_cpu_bound_cluster_with_efficiency_assumed():
    # 32 GPUs: 32 / 4 = 8 cases/s; 4 nodes x 8 workers: 32 / 8 = 4 cases/s -> the CPU group decides.
    # 20 operating hours = 72,000 s: 4 x 72,000 = 288,000 cases/day (efficiency assumed 1.0); per GPU 9,000.
    cap = project(LOADS, gpus=32, nodes=4, cpu_workers_per_node=8, hours_per_day=20, efficiency=None, enough=False)
    assert cap.bottleneck == "CPU"
    assert cap.cases_per_day == pytest.approx(288_000)
    assert cap.model_cases_per_day == pytest.approx(576_000)
    assert cap.per_gpu_day == pytest.approx(9_000)
    text = cap.text()
    assert "efficiency 1.00 assumed" in text
    assert "too few to project from" in text and "indicative only" in text
    assert text.index("too few") < text.index("288,000 cases/day")  # the caveat comes before the figure


def test_efficiency_above_one_counts_as_one_and_cpu_measured_model_is_said():
    # 1 GPU: 1 / 4 = 0.25 cases/s = 21,600 cases/day; 1 node x 4 workers: 4 / 8 = 0.5 cases/s.
    cap = project(LOADS, gpus=1, cpu_workers_per_node=4, efficiency=1.2, model_device="cpu")
    assert cap.cases_per_day == pytest.approx(21_600) and cap.efficiency == 1.0 and cap.efficiency_measured == 1.2
    assert "counted as 1.00" in cap.text() and "measured on the CPU" in cap.text()


def test_only_one_group_and_nothing_to_project():
    cpu_only = [StageLoad("ingest", "cpu", 0.5, 4)]
    # 2 workers / 0.5 core-s = 4 cases/s = 345,600 cases/day; no model stage: no model limit
    cap = project(cpu_only, gpus=1, cpu_workers_per_node=2)
    assert cap.cases_per_day == pytest.approx(345_600) and cap.model_cases_per_day is None and cap.bottleneck == "CPU"
    assert "unlimited" in cap.text()
    empty = project([], gpus=4, cpu_workers_per_node=2)
    assert empty.cases_per_day is None and "no completed stage attempts" in empty.text()


@pytest.mark.parametrize(("key", "value"), [("gpus", 0), ("nodes", -1), ("cpu_workers_per_node", 0)])
def test_bad_cluster_sizes_are_refused_by_name(key, value):
    kw = {"gpus": 1, "nodes": 1, "cpu_workers_per_node": 1, key: value}
    with pytest.raises(ConfigError, match=rf"= {value} is not a positive whole number"):
        project(LOADS, **kw)


def test_model_workers_from_the_recorded_device():
    assert model_workers("cpu") == 1
    assert model_workers("cuda:0 (NVIDIA A100-SXM4-80GB), cuda:1 (NVIDIA A100-SXM4-80GB)") == 2
    assert model_workers(None) == 1


def test_ideal_rate_pipelined_and_one_process():
    # pipelined, 2 GPUs and 4 CPU workers: min(2 / 4, 4 / 8) = 0.5 cases/s; one process: 1 / (4 + 8) cases/s
    assert ideal_rate(LOADS, gpus=2, cpu_workers=4) == pytest.approx(0.5)
    assert ideal_rate(LOADS, gpus=2, cpu_workers=0) == pytest.approx(1 / 12)


def _attempts(rows):
    cols = ["id", "run_id", "case_key", "stage", "status", "worker", "device", "wall_s"]
    return pd.DataFrame([dict(zip(cols, (i, *r))) for i, r in enumerate(rows)], columns=cols)


def _runs(*rows):
    return pd.DataFrame(
        [{"run_id": r, "device": d, "config": json.dumps(c)} for r, d, c in rows], columns=["run_id", "device", "config"]
    )


def test_stage_loads_charge_failures_and_take_groups_from_workers_or_names():
    stages = _attempts(
        [
            ("A", "c1", "ingest", "ok", "cpu-0", "cpu", 2.0),
            ("A", "c2", "ingest", "ok", "cpu-1", "cpu", 4.0),
            ("A", "c3", "ingest", "failed", "cpu-0", "cpu", 3.0),
            ("A", "c4", "ingest", "superseded", "cpu-0", "cpu", 100.0),
            ("A", "c1", "detect", "ok", "model-cuda:0", "cuda:0", 1.0),
            ("A", "c2", "detect", "ok", "model-cuda:0", "cuda:0", 2.0),
            ("B", "c5", "reconstruct", "ok", "main", "cpu", 5.0),
            ("B", "c5", "load", "ok", "main", "cpu", 0.5),
        ]
    )
    runs = _runs(("A", "cuda:0 (A100)", {"runner": {"workers": 2}}), ("B", "cpu", {"runner": {"workers": 0}}))
    loads = {x.stage: x for x in stage_loads(stages, runs)}
    assert list(loads) == ["ingest", "detect", "reconstruct", "load"]
    assert loads["ingest"] == StageLoad("ingest", "cpu", (2.0 + 4.0 + 3.0) / 2, 2)  # 4.5 s; superseded left out
    assert loads["detect"] == StageLoad("detect", "model", 1.5, 2)
    assert loads["reconstruct"].group == "cpu" and loads["load"].group == "model"  # one process: by name
    on_model = _runs(("A", "cuda:0 (A100)", {}), ("B", "cpu", {"reconstruct": {"device": "model"}}))
    assert {x.stage: x.group for x in stage_loads(stages, on_model)}["reconstruct"] == "model"


def test_measured_efficiency_over_runs_of_two_shapes_counts_shared_time_once():
    # the stage times of all runs together: ingest 2 s (cpu) + detect 1 s (model).
    # run A: 1 GPU, 2 CPU workers: min(1 / 1, 2 / 2) = 1 case/s over 20 s -> 20 cases predicted.
    # runs B and C: one process on the same host, 1 / 3 case/s, active 100-130 s and 120-140 s: 40 s once
    #   (not 30 + 20) -> 13.33 predicted. C completed nothing: its time counts all the same.
    # 20 done / (20 + 13.33) = 0.6.
    loads = [StageLoad("ingest", "cpu", 2.0, 20), StageLoad("detect", "model", 1.0, 20)]
    runs = _runs(
        ("A", "cuda:0 (A100)", {"runner": {"workers": 2}}),
        ("B", "cpu", {"runner": {"workers": 0}}),
        ("C", "cpu", {"runner": {"workers": 0}}),
    ).assign(host="h1")
    spans = {"A": (0.0, 20.0), "B": (100.0, 130.0), "C": (120.0, 140.0)}
    assert measured_efficiency(runs, loads, 20, spans) == pytest.approx(0.6)
    # on two hosts B and C worked side by side: 30 s + 20 s at 1 / 3 = 16.67 predicted -> 20 / 36.67
    two_hosts = runs.assign(host=["h1", "h1", "h2"])
    assert measured_efficiency(two_hosts, loads, 20, spans) == pytest.approx(20 / (20 + 50 / 3))
    assert measured_efficiency(runs, loads, 0, spans) is None


def _write_run(run_dir, *, n_cases: int, duration_s: float, complete: bool = True) -> None:
    """A run store as a 1-GPU, 2-worker run leaves it: per case ingest 100 s on a CPU worker, detect 40 s on the GPU
    (``complete`` False: ingest alone, no case completed, as a run killed early leaves it)."""
    store = RunStore(run_dir)
    t0 = 1_800_000_000.0
    store.start_run(
        "r1",
        command="ctpipe run",
        sources=["/data"],
        config={"runner": {"workers": 2}},
        versions={},
        device="cuda:0 (NVIDIA A100-SXM4-80GB)",
        host="node-a",
        pid=1,
    )
    for i in range(n_cases):
        key = f"uid:{i}"
        store.upsert_discovered(case_key=key, case_id=f"case{i}", series_uid=f"1.2.{i}", fingerprint="f", source="/data")
        attempt = store.begin_case(key, "r1")
        steps = (("ingest", f"cpu-{i % 2}", "cpu", 100.0), ("detect", "model-cuda:0", "cuda:0", 40.0))
        for stage, worker, device, wall in steps if complete else steps[:1]:
            record_ok_stage(
                store,
                run_id="r1",
                case_key=key,
                attempt=attempt,
                stage=stage,
                worker=worker,
                device=device,
                start=t0,
                wall=wall,
            )
        if complete:
            store.complete_case(key, output_dir=f"cases/case{i}", findings=[], measurements=[], ended_at=t0 + 60 * (i + 1))
    store.end_run("r1", status="completed", n_cases=n_cases, n_done=n_cases if complete else 0, n_failed=0, n_skipped=0)
    store.close()
    import sqlite3

    with sqlite3.connect(run_dir / DB_NAME) as db:  # the run's clock: active for exactly duration_s
        db.execute("UPDATE runs SET started_at=?, ended_at=?", (t0, t0 + duration_s))


def test_ctpipe_report_projects_from_the_runs_own_stage_times(tmp_path, capsys):
    from pipeline.cli import main

    run = tmp_path / "run"
    _write_run(run, n_cases=12, duration_s=750.0)
    # the run's own shape, 1 GPU and 2 CPU workers: model 1 / 40 s = 0.025 cases/s, CPU 2 / 100 s = 0.02 cases/s,
    # so 0.02 x 750 s = 15 cases predicted, 12 done: efficiency 0.8.
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    cap = json.loads((tmp_path / "rep" / "report.json").read_text())["capacity"]
    assert cap["efficiency_measured"] == pytest.approx(0.8)
    assert (cap["gpus"], cap["nodes"], cap["cpu_workers_per_node"], cap["bottleneck"]) == (1, 1, 2, "CPU")
    assert cap["cases_per_day"] == pytest.approx(0.02 * 86_400 * 0.8)  # 1,382.4
    assert cap["enough_to_project"]  # 12 cases over 12.5 active minutes
    # 8 GPUs over 2 nodes of 16 CPU workers: model 8 / 40 = 0.2 cases/s, CPU 32 / 100 = 0.32 cases/s -> model bound,
    # 0.2 x 86,400 x 0.8 = 13,824 cases/day, 1,728 per GPU = 3.69 x the reference deployment's 468.75.
    out = tmp_path / "rep8"
    assert main(["report", str(run), "--out", str(out), "--gpus", "8", "--nodes", "2", "--cpu-workers", "16"]) == 0
    printed = capsys.readouterr().out
    assert "13,824 cases/day" in printed and "1,728 cases/GPU/day (3.69×" in printed and "bottleneck: model" in printed
    html = (out / "report.html").read_text()
    assert "Capacity model" in html and "13,824" in html
    table = pd.read_csv(out / "capacity.csv", encoding="utf-8-sig")
    assert list(table.columns) == ["stage", "group", "busy_s_per_case", "successful_attempts"]  # what each figure is
    assert table.set_index("stage").busy_s_per_case.to_dict() == {"ingest": 100.0, "detect": 40.0}
    assert table.set_index("stage").successful_attempts.to_dict() == {"ingest": 12, "detect": 12}


def test_report_says_too_few_cases_back_the_capacity_figure(tmp_path, capsys):
    from pipeline.cli import main

    run = tmp_path / "run"
    _write_run(run, n_cases=3, duration_s=400.0)
    # argparse refuses each, with the range; --cpu-workers 0 was "cpu_workers = 0 is not a positive whole number"
    for option in ("--gpus", "--nodes", "--cpu-workers"):
        with pytest.raises(SystemExit) as exc:
            main(["report", str(run), "--out", str(tmp_path / "rep"), option, "0"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"argument {option}: 0 is out of range (>= 1)" in err, err
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out.splitlines()
    capacity = next(line for line in printed if line.startswith("capacity model"))
    assert "too few to project from" in capacity


def test_a_capacity_figure_from_runs_that_completed_no_case_says_it_is_optimistic(tmp_path, capsys):
    """A run killed before any case got past ingest measured ingest alone: the figure leaves the other stages out."""
    from pipeline.cli import main

    run = tmp_path / "run"
    _write_run(run, n_cases=3, duration_s=400.0, complete=False)
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    capacity = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("capacity model"))
    assert "no case completed" in capacity and "optimistic" in capacity and "stages measured: ingest" in capacity
    cap = json.loads((tmp_path / "rep" / "report.json").read_text())["capacity"]
    assert any("no case completed" in a for a in cap["assumptions"])
