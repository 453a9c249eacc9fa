"""Per-node Prometheus metrics: the ``node`` label on every series, a real Prometheus scraping two nodes'
metrics endpoints, and ``promtool check metrics`` on the textfile."""

from __future__ import annotations

import socket
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.runner.metrics import NODE_ENV, RunMetrics, node_id
from pipeline.runner.stage import CaseSpec, TaskResult
from tests._support.orthanc import HOST, free_port
from tests._support.prometheus import PrometheusServer, prometheus_tool


def _case(i: int) -> CaseSpec:
    return CaseSpec(case_id=f"case{i}", case_key=f"uid:{i}", series_uid=f"1.2.3.{i}", fingerprint=f"f{i}", source="/data")


def _feed(m: RunMetrics, *, done: int, failed: int) -> None:
    """Every kind of event a run reports: stages, completed and failed cases, flags, skips, a GPU sample."""
    for i in range(done + failed):
        for stage, wall in (("ingest", 0.4), ("detect", 1.5)):
            m.on_stage(
                TaskResult(
                    case_key=f"uid:{i}",
                    stage=stage,
                    stage_index=0,
                    attempt=1,
                    ok=True,
                    worker="cpu-0",
                    device="cpu",
                    ready_at=100.0,
                    started_at=100.5,
                    ended_at=100.5 + wall,
                    wall_s=wall,
                    peak_rss_mb=200.0,
                )
            )
    for i in range(done):
        m.on_case_done(_case(i), 3.0, 1)
        m.on_case_quality(_case(i), {"flags": [{"code": "lungs_cut", "severity": "warning"}]})
    for i in range(done, done + failed):
        m.on_case_failed(_case(i), "slice 7 missing", "MissingSliceError")
    m.on_case_released(_case(99), "disk full")
    m.files_skipped(2, 1)
    m.gpu_sample(0, 73.0, 1024.0)


def _nodes(text: str) -> set[str]:
    """The ``node`` label of every sample (a sample without one counts as "")."""
    return {s.labels.get("node", "") for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_node_label_is_given_or_ctpipe_node_or_the_host_name(monkeypatch):
    monkeypatch.delenv(NODE_ENV, raising=False)
    assert node_id() == socket.gethostname()
    assert _nodes(RunMetrics().text()) == {socket.gethostname()}
    monkeypatch.setenv(NODE_ENV, "rack3-gpu7")
    assert node_id() == "rack3-gpu7"
    m = RunMetrics()
    _feed(m, done=2, failed=1)
    assert _nodes(m.text()) == {"rack3-gpu7"}
    assert _nodes(RunMetrics(node="explicit").text()) == {"explicit"}


def test_every_metric_name_kept_and_promtool_accepts_the_textfile(tmp_path):
    m = RunMetrics(node="node-a")
    _feed(m, done=3, failed=1)
    path = m.write_textfile(tmp_path / "metrics.prom")
    text = path.read_text()
    names = {fam.name for fam in text_string_to_metric_families(text)}
    assert {
        "ctpipe_cases_processed",
        "ctpipe_cases_failed",
        "ctpipe_cases_released",
        "ctpipe_case_flags",
        "ctpipe_discovery_skipped",
        "ctpipe_stage_latency_seconds",
        "ctpipe_stage_queue_wait_seconds",
        "ctpipe_case_latency_seconds",
        "ctpipe_stage_peak_rss_bytes",
        "ctpipe_gpu_utilization_percent",
        "ctpipe_gpu_memory_used_bytes",
        "ctpipe_run_start_time_seconds",
        "ctpipe_run_last_update_time_seconds",
    } <= names
    assert _nodes(text) == {"node-a"}
    assert 'ctpipe_cases_failed_total{node="node-a",reason="MissingSliceError"} 1.0' in text
    promtool = prometheus_tool("promtool")
    with path.open("rb") as f:
        p = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (p.stdout + p.stderr).strip(), p.stdout + p.stderr  # no lint complaints either
    # promtool does fail a malformed exposition
    bad = tmp_path / "bad.prom"
    bad.write_text(text.replace("# TYPE ctpipe_cases_processed_total counter", "# TYPE ctpipe_cases_processed_total bogus"))
    with bad.open("rb") as f:
        assert subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, timeout=60).returncode != 0


@pytest.mark.slow
def test_prometheus_scrapes_two_nodes_and_answers_by_node(tmp_path):
    prometheus_tool("prometheus")
    nodes = {"node-a": RunMetrics(node="node-a"), "node-b": RunMetrics(node="node-b")}
    _feed(nodes["node-a"], done=3, failed=1)
    _feed(nodes["node-b"], done=2, failed=0)
    ports = {name: free_port() for name in nodes}
    server: PrometheusServer | None = None
    try:
        for name, m in nodes.items():
            m.serve(ports[name], HOST)
        server = PrometheusServer(tmp_path / "prometheus", [f"{HOST}:{p}" for p in ports.values()]).start()
        active = server.wait_scraped()
        assert {t["labels"]["instance"] for t in active} == {f"{HOST}:{p}" for p in ports.values()}
        done = {r["metric"]["node"]: float(r["value"][1]) for r in server.query("ctpipe_cases_processed_total")}
        assert done == {"node-a": 3.0, "node-b": 2.0}
        failed = server.query('ctpipe_cases_failed_total{reason="MissingSliceError"}')
        assert [(r["metric"]["node"], float(r["value"][1])) for r in failed] == [("node-a", 1.0)]
        per_node = server.query('sum by (node) (ctpipe_stage_latency_seconds_count{stage="detect"})')
        assert {r["metric"]["node"]: float(r["value"][1]) for r in per_node} == {"node-a": 4.0, "node-b": 2.0}
        # the cluster total over both nodes
        assert float(server.query("sum(ctpipe_cases_processed_total)")[0]["value"][1]) == 5.0
    finally:
        if server is not None:
            server.stop()
        for m in nodes.values():
            m.stop()


def test_a_metrics_address_that_cannot_be_served_names_the_setting_at_fault():
    """A port in use is metrics.port's fault; an address that is not this machine's, or a host name that does not
    resolve, is metrics.bind's: it was reported as "metrics.port ... (Unknown error -2). Fix: choose a free port"."""
    from pipeline.errors import ConfigError

    held = socket.socket()
    held.bind((HOST, 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as ei:
            RunMetrics().serve(port, HOST)
        assert str(ei.value).startswith("metrics.port:") and "free port" in str(ei.value)
    finally:
        held.close()
    for bind in ("nohost.invalid", "192.0.2.77"):  # a misspelt host; an address of no interface here (TEST-NET-1)
        with pytest.raises(ConfigError) as ei:
            RunMetrics().serve(free_port(), bind)
        text = str(ei.value)
        assert text.startswith("metrics.bind:") and repr(bind) in text, text
        assert "Unknown error" not in text and "free port" not in text and "0.0.0.0" in text, text
