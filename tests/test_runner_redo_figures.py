"""One rule for a case done again (its published folder removed): it counts where it was first completed, and the redo
is shown apart. The run's own figures follow it: the summary's ``done`` and the run's end record, the metrics
(``ctpipe_cases_processed_total`` against ``ctpipe_cases_redone_total``), and the report's summed stage time, which
counts the same attempts as capacity.csv."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest


def _metric(path: Path, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    return None


@pytest.fixture(scope="module")
def redone(tmp_path_factory) -> dict[str, Any]:
    """Night 1 completes c63; its published folder is removed; night 2 does it again."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case
    from pipeline.runner import run_batch
    from pipeline.runner.stages import IngestStage
    from tests._support.runner import PHANTOM

    tmp = tmp_path_factory.mktemp("redo")
    write_phantom_case(generate_phantom(63, n_nodules=0, **{**PHANTOM, "slices": 12}), tmp / "src" / "c63")
    out, opts = tmp / "run", {"report.enabled": False}
    first = run_batch([tmp / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
    after_first = {n: _metric(out / "metrics.prom", n) for n in ("ctpipe_cases_processed_total", "ctpipe_cases_redone_total")}
    (case_dir,) = list((out / "cases").iterdir())
    shutil.rmtree(case_dir)
    again = run_batch([tmp / "src"], out=out, stages=[IngestStage()], workers=0, **opts)
    with sqlite3.connect(out / "runs.sqlite") as db:
        n_done = dict(db.execute("SELECT run_id, n_done FROM runs").fetchall())
    return {"first": first, "again": again, "out": out, "after_first": after_first, "n_done": n_done}


def test_the_run_that_does_a_case_again_records_no_new_completed_case(redone):
    first, again = redone["first"], redone["again"]
    assert (first.done, first.redone) == (1, 0)
    assert (again.done, again.redone) == (0, 1)
    assert redone["n_done"] == {first.run_id: 1, again.run_id: 0}  # the end records add up to the cases completed
    assert again.lines()[0].startswith(f"run {again.run_id}: 0 case(s) done, 1 done again")


def test_prometheus_counts_a_redo_apart_from_the_cases_completed(redone):
    out = redone["out"]
    assert redone["after_first"] == {"ctpipe_cases_processed_total": 1.0, "ctpipe_cases_redone_total": 0.0}
    # the counters go on from night 1 (monotonic): one case completed in all, done once again
    assert _metric(out / "metrics.prom", "ctpipe_cases_processed_total") == 1.0
    assert _metric(out / "metrics.prom", "ctpipe_cases_redone_total") == 1.0


def test_the_dashboard_and_readme_chart_completed_cases_from_the_counter_without_redos():
    root = Path(__file__).resolve().parents[1]
    dash = json.loads((root / "configs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert any("ctpipe_cases_redone_total" in e for e in exprs)
    readme = (root / "README.md").read_text()
    assert "ctpipe_cases_redone_total" in readme
