"""Counters and histograms go on from the previous run's textfile: never lower after a resume (nothing left to do),
a second night's cases added to the first's, series of earlier runs kept; gauges are the run's own."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline.runner import run_batch
from pipeline.runner.metrics import RunMetrics
from pipeline.runner.stages import IngestStage
from tests._support.prometheus import prometheus_tool
from tests._support.runner import PHANTOM
from tests.test_runner_prometheus import _feed


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def _value(text: str, name: str, **labels: str) -> float | None:
    return _samples(text).get((name, tuple(sorted(labels.items()))))


def test_counters_and_histograms_add_up_across_runs_and_never_go_down(tmp_path):
    first = RunMetrics(node="n")
    _feed(first, done=2, failed=1)
    path = first.write_textfile(tmp_path / "metrics.prom")
    resumed = RunMetrics(node="n")  # a rerun with nothing left to do
    resumed.carry_from(tmp_path / "missing.prom", path)
    text = resumed.text()
    assert _value(text, "ctpipe_cases_processed_total", node="n") == 2
    assert _value(text, "ctpipe_cases_failed_total", node="n", reason="MissingSliceError") == 1  # kept, not seen again
    assert _value(text, "ctpipe_stage_latency_seconds_count", node="n", stage="detect") == 3
    assert _value(text, "ctpipe_stage_latency_seconds_bucket", node="n", stage="detect", le="2.0") == 3
    assert not [k for k in _samples(text) if k[0].endswith("_created")]  # the carried series did not start now
    path = resumed.write_textfile(path)
    night2 = RunMetrics(node="n")
    night2.carry_from(path)
    _feed(night2, done=2, failed=0)
    text = night2.text()
    assert _value(text, "ctpipe_cases_processed_total", node="n") == 4
    assert _value(text, "ctpipe_case_latency_seconds_sum", node="n") == 12.0  # 4 cases of 3 s
    assert _value(text, "ctpipe_cases_released_total", node="n") == 2  # one per _feed: the first run and this one
    assert _value(text, "ctpipe_discovery_skipped", node="n", what="file") == 2  # a gauge: this run's own
    promtool = prometheus_tool("promtool")
    with night2.write_textfile(tmp_path / "night2.prom").open("rb") as f:
        p = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_another_node_s_counters_and_a_damaged_file_are_not_carried(tmp_path, caplog):
    other = RunMetrics(node="other")
    _feed(other, done=5, failed=0)
    path = other.write_textfile(tmp_path / "metrics.prom")
    m = RunMetrics(node="n")
    m.carry_from(path)
    assert {s.labels["node"] for fam in text_string_to_metric_families(m.text()) for s in fam.samples} == {"n"}
    bad = tmp_path / "bad.prom"
    bad.write_text('ctpipe_cases_processed_total{node="n" 3\n')
    with caplog.at_level(logging.WARNING, logger="pipeline.runner.metrics_carry"):
        m = RunMetrics(node="n")
        m.carry_from(bad)
    assert _value(m.text(), "ctpipe_cases_processed_total", node="n") == 0
    assert f"{bad}: cannot read the previous run's metrics" in caplog.text and "Fix: remove or repair" in caplog.text


def test_a_resumed_run_folder_s_metrics_prom_keeps_the_cases_done_before(tmp_path, monkeypatch):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    monkeypatch.setenv("CTPIPE_NODE", "n")
    write_phantom_case(generate_phantom(61, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / "src" / "c61")
    out, textfiles = tmp_path / "run", tmp_path / "textfiles"
    opts = {"report.enabled": False, "metrics.textfile_dir": str(textfiles)}
    for _ in range(2):  # the second run resumes with nothing left to do
        s = run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
        for prom in (out / "metrics.prom", textfiles / "ctpipe.prom"):
            assert _value(Path(prom).read_text(), "ctpipe_cases_processed_total", node="n") == 1, prom
    assert s.skipped == 1


def test_each_job_names_its_node_textfile_and_a_file_rewritten_by_another_job_is_warned_of(tmp_path, monkeypatch, caplog):
    """Jobs that may run at once on one node (a nightly run, a listener) each write their own ``metrics.textfile_name``
    in ``metrics.textfile_dir``; a run whose node file another job wrote while it ran says so, with that fix."""
    import os
    import time

    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from pipeline.runner.metrics import warn_if_rewritten

    monkeypatch.setenv("CTPIPE_NODE", "n")
    write_phantom_case(generate_phantom(62, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / "src" / "c62")
    textfiles = tmp_path / "textfiles"
    opts = {"report.enabled": False, "metrics.textfile_dir": str(textfiles), "metrics.textfile_name": "ctpipe-nightly.prom"}
    run_batch([tmp_path / "src"], out=tmp_path / "run", stages=[IngestStage()], workers=0, **opts)
    assert sorted(p.name for p in textfiles.iterdir()) == ["ctpipe-nightly.prom"]
    assert _value((textfiles / "ctpipe-nightly.prom").read_text(), "ctpipe_cases_processed_total", node="n") == 1

    shared = textfiles / "ctpipe-nightly.prom"
    started = time.time() - 60.0
    os.utime(shared, (started - 10.0, started - 10.0))  # written before this run started: the previous night's file
    with caplog.at_level(logging.WARNING, logger="pipeline.runner.metrics"):
        assert not warn_if_rewritten(shared, since=started, run_dir=tmp_path / "run")
        assert not warn_if_rewritten(textfiles / "absent.prom", since=started, run_dir=tmp_path / "run")
        assert caplog.text == ""
        os.utime(shared, (started + 5.0, started + 5.0))  # another job wrote it while this run was under way
        assert warn_if_rewritten(shared, since=started, run_dir=tmp_path / "run")
    assert f"{shared} was written by another job" in caplog.text and "metrics.textfile_name=ctpipe-run.prom" in caplog.text


def test_a_node_textfile_name_that_node_exporter_would_not_read_is_refused():
    import pytest

    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    assert load_config(overrides={"metrics.textfile_name": "ctpipe-listen.prom"}, environ={}).metrics.textfile_name == (
        "ctpipe-listen.prom"
    )
    for bad in ("ctpipe.txt", "sub/ctpipe.prom", ".prom", ".hidden.prom"):
        with pytest.raises(ConfigError, match=r"metrics.textfile_name = .* a file name ending in .prom"):
            load_config(overrides={"metrics.textfile_name": bad}, environ={})
