"""Reports over several runs, Prometheus metrics (textfile and HTTP during a run)."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.runner import run_batch
from pipeline.runner.stages import IngestStage
from tests._support.prometheus import local_opener
from tests._support.runner import ctpipe, db_rows

pytest_plugins = ["tests._support.runner"]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """Samples by (name, labels); the ``node`` label every series carries is left out (tests/test_runner_prometheus.py)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node")))] = s.value
    return out


@pytest.fixture(scope="module")
def ingest_run(dicom_data, tmp_path_factory):
    """A second, cheap run (ingest stage only, in-process) that scrapes its own metrics endpoint while running."""
    out = tmp_path_factory.mktemp("r2") / "ingest_only"
    port = _free_port()
    scraped: list[str] = []

    def scrape(progress) -> None:
        if progress.done == 1 and not scraped:
            with local_opener().open(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                scraped.append(r.read().decode())

    textdir = out.parent / "node_exporter"
    summary = run_batch(
        [dicom_data["good"]],
        out=out,
        workers=0,
        stages=[IngestStage()],
        metrics_port=port,
        progress=scrape,
        **{"report.enabled": False, "metrics.textfile_dir": str(textdir)},
    )
    return {"out": out, "summary": summary, "scraped": scraped, "port": port, "textdir": textdir}


def test_metrics_served_during_the_run_and_closed_after(ingest_run):
    assert ingest_run["summary"].exit_code == 0 and ingest_run["summary"].done == 3
    assert len(ingest_run["scraped"]) == 1
    live = _samples(ingest_run["scraped"][0])
    assert live[("ctpipe_cases_processed_total", ())] == 1.0
    assert live[("ctpipe_stage_latency_seconds_count", (("stage", "ingest"),))] >= 1.0
    with pytest.raises(urllib.error.URLError) as refused:
        local_opener().open(f"http://127.0.0.1:{ingest_run['port']}/metrics", timeout=2)
    assert isinstance(refused.value.reason, ConnectionRefusedError), refused.value


def test_metrics_textfile_parses_with_prometheus_parser(full_run, ingest_run):
    s = _samples((full_run["out"] / "metrics.prom").read_text())
    assert s[("ctpipe_cases_processed_total", ())] == 3.0
    failed = {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "ctpipe_cases_failed_total"}
    assert failed == {"MissingSliceError": 1.0, "TruncatedFileError": 1.0, "CorruptPixelDataError": 1.0}
    counts = {dict(k[1])["stage"]: v for k, v in s.items() if k[0] == "ctpipe_stage_latency_seconds_count"}
    assert counts == {"ingest": 3.0, "reconstruct": 3.0, "load": 3.0, "detect": 3.0, "nodules": 3.0, "write": 3.0, "dicom": 3.0}
    assert s[("ctpipe_case_latency_seconds_count", ())] == 3.0
    # cumulative buckets never decrease and end at the count
    buckets = sorted(
        (float(dict(k[1])["le"]), v)
        for k, v in s.items()
        if k[0] == "ctpipe_stage_latency_seconds_bucket" and dict(k[1])["stage"] == "detect"
    )
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])) and buckets[-1][1] == 3.0
    assert s[("ctpipe_stage_peak_rss_bytes", (("stage", "detect"),))] > 50e6
    s2 = _samples((ingest_run["out"] / "metrics.prom").read_text())
    assert s2[("ctpipe_cases_processed_total", ())] == 3.0
    assert (ingest_run["textdir"] / "ctpipe.prom").read_text() == (ingest_run["out"] / "metrics.prom").read_text()


def test_report_over_two_runs(full_run, ingest_run, tmp_path):
    out = tmp_path / "report"
    p = ctpipe("report", str(full_run["out"]), str(ingest_run["out"]), "--out", str(out), "--hours-per-day", "20")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("measured ") and "cases/day projection: not enough data" in p.stdout and "report: " in p.stdout
    summary = json.loads((out / "report.json").read_text())
    assert summary["runs"] == 2
    # both runs completed the 3 good series: each is one case, counted at its first completion, the other listed
    assert summary["cases"] == {"total": 6, "done": 3, "failed": 3, "unfinished": 0, "interrupted": 0}
    runs = summary["runs_table"]
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert sum(r["n_done"] for r in runs) == 3 and [r["n_failed"] for r in runs] == [3, 0]
    assert sorted(o["status"] for o in summary["other_attempts"]) == ["done"] * 3
    tp = summary["throughput"]
    assert sum(tp["per_day_utc"].values()) == 3 and sum(tp["per_hour_utc"].values()) == 3
    # the active time: the union of the two runs' start-to-end spans, as their run stores hold them
    spans = sorted(
        span for run in (full_run, ingest_run) for span in db_rows(run["out"], "SELECT started_at, ended_at FROM runs")
    )
    assert len(spans) == 2
    (s0, e0), (s1, e1) = spans
    union_s = (e0 - s0) + (e1 - max(s1, e0) if e1 > e0 else 0.0)
    assert summary["active_hours"] == pytest.approx(union_s / 3600.0, rel=1e-9)
    assert tp["cases_per_hour"] == pytest.approx(3 / summary["active_hours"])
    assert not tp["enough_to_project"]  # 3 cases: the headline leads with the measured rate, no cases/day figure
    assert f"{tp['cases_per_hour']:,.1f} cases/hour from 3 completed case(s)" in summary["projection"]
    assert tp["cases_per_day_projected"] is None  # nor in the JSON, where a dashboard would show it
    assert f"{tp['cases_per_hour'] * 20:,.0f} cases/day" not in summary["projection"]
    lat = summary["latency_s"]
    assert set(lat) == {"end_to_end", "ingest", "reconstruct", "load", "detect", "nodules", "write", "dicom"}
    assert lat["ingest"]["n"] == 6 and lat["detect"]["n"] == 3  # ingest ran in both runs
    assert lat["end_to_end"]["n"] == 3
    for v in lat.values():
        assert 0 < v["p50"] <= v["p90"] <= v["p99"]
    assert summary["failures_by_reason"] == {"TruncatedFileError": 1, "CorruptPixelDataError": 1, "MissingSliceError": 1}
    # self-contained HTML: plots embedded as PNG
    html = (out / "report.html").read_text()
    imgs = html.count('src="data:image/png;base64,')
    assert imgs >= 3 and "<script" not in html and "http://" not in html and "https://" not in html
    first = html.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"
    # CSV tables
    latency = pd.read_csv(out / "latency.csv")
    assert set(latency.stage) == set(lat) and {"mean_s", "p50_s", "p90_s", "p99_s"} <= set(latency.columns)
    assert len(pd.read_csv(out / "failures.csv")) == 3
    assert pd.read_csv(out / "throughput_daily.csv").cases.sum() == 3
    assert len(pd.read_csv(out / "cases.csv")) == 6 and len(pd.read_csv(out / "other_attempts.csv")) == 3


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 1
    assert "no run database here" in capsys.readouterr().err


def test_grafana_dashboard_uses_only_exported_metrics(full_run):
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).parent.parent / "configs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count|total)$", "", m) for e in exprs for m in re.findall(r"ctpipe_[a-z_]+", e)}
    families = {f.name for f in text_string_to_metric_families((full_run["out"] / "metrics.prom").read_text())}
    assert used and used <= families, used - families
