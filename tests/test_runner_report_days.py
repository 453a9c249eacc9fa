"""Completed cases per day as a hospital counts its days: from local midnight in a named time zone, beside the UTC
days; a night run across local midnight counts its cases on the local day each ended."""

from __future__ import annotations

import pytest

from pipeline.csvfile import read_table
from pipeline.runner import build_report
from pipeline.runner.report_days import cases_per_local_day, report_zone
from pipeline.runner.store import RunStore
from tests._support.cli import cli_error
from tests.test_runner_report_tables import T0, _clock, _dead_pid, _done, _start

# T0 is 2027-01-15T08:00:00Z; 06:30 later is 14:30Z, 23:30 in Tokyo (UTC+09:00)
NIGHT = T0 + 6.5 * 3600


def _night_run(run_dir):
    """A run from 23:30 to 01:30 Tokyo time (14:30Z to 16:30Z): case a ends at 23:50, b at 00:10 and c at 01:00."""
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for cid in ("a", "b", "c"):
        _done(store, cid, "r1")
    store.end_run("r1", status="completed", n_cases=3, n_done=3, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (NIGHT, NIGHT + 7200))
    for cid, minutes in (("a", 20), ("b", 40), ("c", 90)):
        _clock(run_dir, "UPDATE cases SET ended_at = ?1, first_done_at = ?1 WHERE case_id = ?", (NIGHT + 60 * minutes, cid))
    return run_dir


def test_a_night_run_counts_its_cases_on_the_local_day_each_ended(tmp_path):
    rep = build_report([_night_run(tmp_path / "run")], tmp_path / "rep", timezone="Asia/Tokyo")
    tp = rep.summary["throughput"]
    assert tp["per_day_utc"] == {"2027-01-15": 3}
    assert tp["per_day_local"] == {"2027-01-15": 1, "2027-01-16": 2}
    assert tp["timezone"] == "Asia/Tokyo, UTC+09:00"
    rows = read_table(rep.out_dir / "throughput_daily_local.csv").rows
    assert [(r["day_local"], r["timezone"], r["cases"]) for r in rows] == [
        ("2027-01-15", "Asia/Tokyo, UTC+09:00", "1"),
        ("2027-01-16", "Asia/Tokyo, UTC+09:00", "2"),
    ]
    page = rep.html.read_text()
    assert "<th>day (Asia/Tokyo, UTC+09:00)</th>" in page and "<th>day (UTC)</th>" in page


def test_a_local_day_with_a_run_but_no_completed_case_counts_zero():
    zone, _ = report_zone("America/New_York")  # UTC-05:00 in January
    # a run from 22:00 to 02:00 New York time whose only case ended at 23:00: the next local day counts 0
    start = T0 + 19 * 3600  # 2027-01-16T03:00Z = 22:00 on the 15th in New York
    assert cases_per_local_day([start + 3600], [(start, start + 4 * 3600)], zone) == {"2027-01-15": 1, "2027-01-16": 0}


def test_an_unknown_time_zone_is_refused_with_its_name(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli_error(capsys, "report", str(tmp_path), "--out", str(tmp_path / "rep"), "--timezone", "Europe/Berlni")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "'Europe/Berlni' is not known" in err and "IANA time zone name" in err
    assert not (tmp_path / "rep").exists()  # refused before anything is written


def test_each_local_day_names_its_own_offset_across_a_daylight_saving_change(tmp_path):
    # was: every row said "Europe/Berlin, UTC+02:00" (the offset at the latest run's end), winter days too
    import datetime as dt

    def at(text: str) -> float:
        return dt.datetime.fromisoformat(text).timestamp()

    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    ends = {"a": "2027-03-27T12:00:00+00:00", "b": "2027-03-28T12:00:00+00:00", "c": "2027-03-29T21:59:00+00:00"}
    for cid in ends:
        _done(store, cid, "r1")
    store.end_run("r1", status="completed", n_cases=3, n_done=3, n_failed=0, n_skipped=0)
    store.close()
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (at("2027-03-27T11:00:00+00:00"), at(ends["c"]) + 30))
    for cid, end in ends.items():
        _clock(run_dir, "UPDATE cases SET ended_at = ?1, first_done_at = ?1 WHERE case_id = ?", (at(end), cid))
    rep = build_report([run_dir], tmp_path / "rep", timezone="Europe/Berlin")  # clocks go forward 2027-03-28 02:00
    tp = rep.summary["throughput"]
    assert tp["per_day_local"] == {"2027-03-27": 1, "2027-03-28": 1, "2027-03-29": 1}  # c: 23:59 CEST on the 29th
    assert tp["timezone"] == "Europe/Berlin, UTC+01:00 then UTC+02:00"
    rows = read_table(rep.out_dir / "throughput_daily_local.csv").rows
    assert [(r["day_local"], r["timezone"]) for r in rows] == [
        ("2027-03-27", "Europe/Berlin, UTC+01:00"),
        ("2027-03-28", "Europe/Berlin, UTC+01:00 then UTC+02:00"),
        ("2027-03-29", "Europe/Berlin, UTC+02:00"),
    ]
    assert "<th>day (Europe/Berlin, UTC+01:00 then UTC+02:00)</th>" in rep.html.read_text()
