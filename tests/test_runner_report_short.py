"""What the report says of times it did not measure and of short runs: a case quarantined at discovery has no latency
(empty in cases.csv, left out of every latency figure), and a run under a minute shows its active time in seconds."""

from __future__ import annotations

import csv
import re

import pytest


@pytest.fixture
def ingest_only(monkeypatch):
    """The runner's stages cut to ingest: a good series is done in a moment."""
    import pipeline.runner.batch as batch

    real = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real(cfg) if s.name == "ingest"])


def test_a_case_quarantined_at_discovery_has_no_latency_and_a_short_run_shows_seconds(tmp_path, own_signals, ingest_only):
    from pipeline.runner import build_report, run_batch
    from tests._support.dicom import write_series

    write_series(tmp_path / "in" / "good", n=12, series_uid="1.2.3.4242")
    wl = tmp_path / "worklist.csv"
    wl.write_text(f"path\n{tmp_path / 'in' / 'good'}\nno/such/folder\n")  # the second row: quarantined at discovery
    run = tmp_path / "run"
    s = run_batch([wl], out=run, workers=0, **{"report.enabled": False, "outputs.dicom": []})
    assert s.done == 1 and len(s.quarantined) == 1

    rep = build_report([run], tmp_path / "report")
    rows = {r["status"]: r for r in csv.DictReader((tmp_path / "report" / "cases.csv").open())}
    assert rows["failed"]["latency_s"] == "", rows["failed"]  # was 0.0003: the time between two store writes
    assert float(rows["done"]["latency_s"]) > 0.0
    assert rep.summary["latency_s"]["end_to_end"]["n"] == 1  # the completed case only

    html = (tmp_path / "report" / "report.html").read_text()
    # was "0.0" active minutes, in the runs table and in the headline, for a run of a few seconds
    assert "<th>active min</th>" not in html and "<th>active</th>" in html
    assert re.search(r"<td>\d+(\.\d)? s</td><td>cpu</td>", html), html
    assert "over 0.0 active minutes" not in html and re.search(r"over \d+(\.\d)? active seconds", html), html
