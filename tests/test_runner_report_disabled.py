"""``report.enabled: false`` leaves ``RUN_DIR/report`` as it was, figures included: its status then says that the
latest run did not rebuild it, and which run its figures are from, so that no one reads an older run's figures as
tonight's."""

from __future__ import annotations

import json

from pipeline.runner import run_batch
from pipeline.runner.report_html import STATUS_END, STATUS_START
from pipeline.runner.stages import IngestStage


def _without_status(page: str) -> str:
    return page[: page.index(STATUS_START)] + page[page.index(STATUS_END) :]


def test_a_run_with_the_report_off_marks_the_earlier_report_as_not_updated(tmp_path):
    (tmp_path / "incoming").mkdir()
    out = tmp_path / "run"
    first = run_batch([tmp_path / "incoming"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": True})
    page_before = (out / "report" / "report.html").read_text()
    second = run_batch([tmp_path / "incoming"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": False})
    assert second.report_html is None
    status = json.loads((out / "report" / "status.json").read_text())
    # the report's status in its three places: status.json, report.json and the page's run-status line
    assert json.loads((out / "report" / "report.json").read_text())["status"] == status
    assert status["figures_current"] is False and status["figures_from"]["run_id"] == first.run_id
    assert f"not rebuilt by the latest run, {second.run_id} (report.enabled: false)" in status["note"], status
    assert f"after run {first.run_id} ended" in status["note"], status
    assert f"run {second.run_id}" in status["text"] and status["state"] == "ended"
    page = (out / "report" / "report.html").read_text()
    assert f"not rebuilt by the latest run, {second.run_id}" in page
    assert _without_status(page) == _without_status(page_before)  # the figures themselves are left as they were


def test_a_run_with_the_report_off_and_no_earlier_report_writes_none(tmp_path):
    (tmp_path / "incoming").mkdir()
    out = tmp_path / "run"
    run_batch([tmp_path / "incoming"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": False})
    assert not (out / "report").exists()
