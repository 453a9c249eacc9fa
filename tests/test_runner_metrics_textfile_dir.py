"""Run folders that share ``metrics.textfile_dir`` on one node: each writes its own textfile, its series labelled
with its folder, so node_exporter shows every run's gauges and counters without one overwriting or doubling another;
a rerun of a folder carries on that folder's counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pipeline.runner.batch import run_batch
from pipeline.runner.stages import IngestStage
from tests._support.runner import PHANTOM


def _series(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = path.read_text(encoding="utf-8")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def _one(series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> tuple[dict[str, str], float]:
    found = [(dict(labels), v) for (n, labels), v in series.items() if n == name]
    assert len(found) == 1, (name, found)
    return found[0]


def test_two_run_folders_sharing_a_textfile_dir_neither_overwrite_nor_double_each_other(tmp_path, monkeypatch):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series, write_phantom_case

    monkeypatch.setenv("CTPIPE_NODE", "n")
    write_phantom_case(generate_phantom(61, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp_path / "src_ok" / "c61")
    write_dicom_series(generate_phantom(21, **PHANTOM).volume, tmp_path / "src_gap", quirks=["missing_slice"], seed=21)
    textfiles = tmp_path / "textfiles"
    opts: dict[str, Any] = {"workers": 0, "stages": [IngestStage()], "report.enabled": False}
    opts["metrics.textfile_dir"] = str(textfiles)
    nightly, research = tmp_path / "nightly", tmp_path / "research"
    for _ in range(2):  # the second round reruns each folder: its counters go on, its file keeps its name
        assert run_batch([tmp_path / "src_gap"], out=nightly, **opts).exit_code == 3
        assert run_batch([tmp_path / "src_ok"], out=research, **opts).exit_code == 0
        files = sorted(textfiles.glob("*.prom"))
        assert [f.name.rsplit("-", 1)[0] for f in files] == ["ctpipe-nightly", "ctpipe-research"], files
        by_folder = {_one(_series(f), "ctpipe_run_exit_status")[0].get("run_dir"): _series(f) for f in files}
        assert set(by_folder) == {str(nightly.resolve()), str(research.resolve())}
        night, res = by_folder[str(nightly.resolve())], by_folder[str(research.resolve())]
        assert _one(night, "ctpipe_run_exit_status")[1] == 3  # not overwritten by the later run of the other folder
        assert _one(res, "ctpipe_run_exit_status")[1] == 0
        assert _one(night, "ctpipe_cases_failed_total")[1] == 1  # quarantined once, not retried by the rerun
        assert _one(res, "ctpipe_cases_processed_total")[1] == 1  # done once: the rerun skips it
        assert _one(night, "ctpipe_cases_processed_total")[1] == 0  # the other folder's case is not carried here
        assert not set(night) & set(res)  # node_exporter refuses a series that two files both hold
        for f, run_dir in ((nightly / "metrics.prom", nightly), (research / "metrics.prom", research)):
            assert _one(_series(f), "ctpipe_run_exit_status")[0] == {"node": "n", "run_dir": str(run_dir.resolve())}


def test_a_textfile_written_before_the_run_dir_label_is_carried_and_the_old_shared_file_is_named(tmp_path, caplog):
    import logging

    from pipeline.runner.metrics import RunMetrics, textfile_path
    from tests.test_runner_prometheus import _feed

    before = RunMetrics(node="n")  # series with a node label only, as every textfile had them before
    _feed(before, done=2, failed=0)
    old = before.write_textfile(tmp_path / "run" / "metrics.prom")
    m = RunMetrics(node="n", run_dir=tmp_path / "run")
    m.carry_from(old)
    series = {(n, labels): v for (n, labels), v in _series(m.write_textfile(tmp_path / "now.prom")).items()}
    assert series[("ctpipe_cases_processed_total", (("node", "n"), ("run_dir", str((tmp_path / "run").resolve()))))] == 2
    assert {dict(labels).get("run_dir") for _, labels in series} == {str((tmp_path / "run").resolve())}
    shared = tmp_path / "textfiles" / "ctpipe.prom"
    shared.parent.mkdir()
    shared.write_text(old.read_text())
    with caplog.at_level(logging.WARNING, logger="pipeline.runner.metrics"):
        path = textfile_path(shared.parent, tmp_path / "run")
    assert path.parent == shared.parent and path.name.startswith("ctpipe-run-") and path.suffix == ".prom"
    assert f"{shared}: the textfile that every run folder shared" in caplog.text and f"Fix: remove {shared}" in caplog.text
