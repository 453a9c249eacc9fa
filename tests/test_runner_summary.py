"""The end of a run as an operator reads it: cases quarantined by this run told apart from those still quarantined
by earlier runs of the folder (summary line, run.log, the run store, metrics, report), and the exit status rule."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest

from pipeline.cli import main


@pytest.fixture
def own_signals():
    """``ctpipe run`` installs SIGTERM/SIGHUP handlers in this process: put the previous ones back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture
def ingest_only(monkeypatch):
    """The runner's stages cut to ingest: a good series is done in a moment."""
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])


def _gap_series(folder: Path) -> None:
    """A phantom series with a slice missing: quarantined (MissingSliceError) at every attempt."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.runner import PHANTOM

    write_dicom_series(generate_phantom(21, **PHANTOM).volume, folder, quirks=["missing_slice"], seed=21)


def _metric(path: Path, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _run_end(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "run.log").read_text().splitlines()]
    return [r for r in records if r.get("event") == "run_end"][-1]


def test_a_rerun_tells_cases_still_quarantined_from_earlier_runs_from_new_ones(tmp_path, capsys, own_signals, ingest_only):
    from tests._support.dicom import write_series

    src, out = tmp_path / "incoming", tmp_path / "run"
    _gap_series(src / "gap")
    argv = ["run", str(src), "--out", str(out), "--workers", "0", "--quiet", "--set", "report.enabled=false"]

    # night 1: the bad series arrives and is quarantined by this run
    assert main(argv) == 3
    first = capsys.readouterr().out.splitlines()
    assert "0 case(s) done, 1 newly quarantined, 0 already done earlier" in first[0], first
    assert any(ln.startswith("  quarantined ") and "MissingSliceError" in ln for ln in first), first
    assert not any("still quarantined" in ln for ln in first), first

    # night 2: a good series arrives; the bad one is not tried again (no --retry-failed)
    write_series(src / "good", n=12, series_uid="1.2.3.4242")
    assert main(argv) == 3  # unresolved bad cases keep exit 3; the summary says none is new
    second = capsys.readouterr().out.splitlines()
    assert (
        "1 case(s) done, 0 newly quarantined, 1 still quarantined from earlier runs (ctpipe run --retry-failed to retry "
        "them), 0 already done earlier, of 2" in second[0]
    ), second
    still = [ln for ln in second if ln.startswith("  still quarantined from an earlier run ")]
    assert len(still) == 1 and "MissingSliceError" in still[0], second
    assert not any(ln.startswith("  quarantined ") for ln in second), second
    end = _run_end(out)
    assert (end["quarantined_new"], end["quarantined_earlier"]) == (0, 1)
    assert "0 newly quarantined, 1 still quarantined from earlier runs" in end["msg"]
    prom = out / "metrics.prom"
    assert _metric(prom, "ctpipe_cases_quarantined", when="this_run") == 0
    assert _metric(prom, "ctpipe_cases_quarantined", when="earlier_runs") == 1
    assert _metric(prom, "ctpipe_run_exit_status") == 3
    with sqlite3.connect(out / "runs.sqlite") as db:
        recorded = db.execute("SELECT n_done, n_failed, n_failed_earlier FROM runs ORDER BY started_at").fetchall()
    assert recorded == [(0, 1, 0), (1, 0, 1)]

    # night 3, retried: the case is tried again by this run, and fails again: newly quarantined, nothing earlier
    assert main([*argv, "--retry-failed"]) == 3
    third = capsys.readouterr().out.splitlines()
    assert "0 case(s) done, 1 newly quarantined, 1 already done earlier" in third[0], third
    assert not any("still quarantined" in ln for ln in third), third
    assert (_run_end(out)["quarantined_new"], _run_end(out)["quarantined_earlier"]) == (1, 0)
