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
        "ctpipe_gpu_utilization_ratio",
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


#: Units a metric name may end in (Prometheus naming: base units only; a count has none).
BASE_UNITS = ("seconds", "bytes", "ratio")
#: Units that are not base units: a name must not carry them (percent is a ratio, milliseconds seconds, MB bytes).
NOT_BASE_UNITS = ("percent", "pct", "milliseconds", "ms", "minutes", "hours", "days", "mb", "kb", "gb", "mib", "kib")


def test_every_metric_is_in_base_units_and_every_counter_ends_in_total():
    """Prometheus naming conventions: seconds, bytes and ratios (0..1), the unit as the name's last word before
    ``_total``/``_bucket``; ``_total`` on counters only. A GPU busy 73% of the time reads 0.73."""
    m = RunMetrics(node="node-a")
    _feed(m, done=2, failed=1)
    m.run_ended(0, ended_at=200.0)
    m.quarantined_at_end(1, 0)
    families = list(text_string_to_metric_families(m.text()))
    assert len(families) >= 15
    for fam in families:
        words = fam.name.split("_")
        assert not set(words) & set(NOT_BASE_UNITS), f"{fam.name}: not in base units"
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        else:
            assert not fam.name.endswith("_total"), f"{fam.name}: a {fam.type} named as a counter"
        if fam.type == "histogram":
            assert words[-1] in BASE_UNITS, f"{fam.name}: a histogram without its unit"
        if words[-1] == "ratio":
            assert all(0.0 <= s.value <= 1.0 for s in fam.samples), fam.name
        if "time" in words and fam.type == "gauge":  # a point in time: Unix seconds
            assert words[-1] == "seconds", fam.name
    util = {s.name: s.value for fam in families for s in fam.samples if fam.name.startswith("ctpipe_gpu_utilization")}
    assert util == {"ctpipe_gpu_utilization_ratio": pytest.approx(0.73)}


def test_the_grafana_dashboard_charts_each_metric_in_its_unit():
    """Each panel of configs/grafana-dashboard.json charts metrics a run exposes, with Grafana's unit for their base
    unit: a ratio as ``percentunit`` (0.73 shown as 73%), seconds as ``s``, bytes as ``bytes``."""
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).parent.parent / "configs" / "grafana-dashboard.json").read_text())
    m = RunMetrics(node="node-a")
    _feed(m, done=1, failed=0)
    exposed = {fam.name for fam in text_string_to_metric_families(m.text())}
    grafana = {"ratio": "percentunit", "seconds": "s", "bytes": "bytes"}
    for panel in dash["panels"]:
        names = {
            re.sub(r"_(bucket|sum|count|total)$", "", n)
            for t in panel["targets"]
            for n in re.findall(r"ctpipe_[a-z_]+", t["expr"])
        }
        assert names <= exposed | {"ctpipe_run_end_time_seconds", "ctpipe_run_exit_status"}, (panel["title"], names)
        units = {grafana[n.rsplit("_", 1)[1]] for n in names if n.rsplit("_", 1)[1] in grafana}
        rate = any("rate(" in t["expr"] or "increase(" in t["expr"] or "time() -" in t["expr"] for t in panel["targets"])
        if len(units) == 1 and not rate:
            assert panel["fieldConfig"]["defaults"]["unit"] == units.pop(), panel["title"]


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
        busy = server.query("max by (node) (ctpipe_gpu_utilization_ratio)")  # a ratio, as Grafana's percentunit shows
        assert {r["metric"]["node"]: float(r["value"][1]) for r in busy} == {"node-a": 0.73, "node-b": 0.73}
        # the cluster total over both nodes
        assert float(server.query("sum(ctpipe_cases_processed_total)")[0]["value"][1]) == 5.0
    finally:
        if server is not None:
            server.stop()
        for m in nodes.values():
            m.stop()


@pytest.mark.slow
def test_prometheus_answers_every_query_of_the_grafana_dashboard(tmp_path):
    """Each panel's query, ``$job`` as Grafana's "All" sends it, is PromQL that Prometheus answers (not an error)."""
    import json
    from pathlib import Path

    prometheus_tool("prometheus")
    dash = json.loads((Path(__file__).parent.parent / "configs" / "grafana-dashboard.json").read_text())
    m = RunMetrics(node="node-a")
    _feed(m, done=2, failed=1)
    port = free_port()
    server: PrometheusServer | None = None
    try:
        m.serve(port, HOST)
        server = PrometheusServer(tmp_path / "prometheus", [f"{HOST}:{port}"]).start()
        server.wait_scraped()
        for panel in dash["panels"]:
            for target in panel["targets"]:
                server.query(target["expr"].replace("$job", ".*"))  # fails on an error answer
    finally:
        if server is not None:
            server.stop()
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
