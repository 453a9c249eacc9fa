"""The throughput plot's bin chosen from the run's span: with one 60-minute bin a run of a few minutes was drawn as
one bar across its whole hour (11:00 to 11:54), which read as steady work over the hour. The bin now follows the
runs' period (seconds for a run of a minute or two, minutes for a short run, an hour or less for a nightly run, days
over days), the time axis spans that period, the y axis names the bin; the daily tables still count every case on
its day."""

from __future__ import annotations

import csv

import pytest

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _report(tmp_path, monkeypatch, ends: list[float], *, run: tuple[float, float] | None = None, **kw):
    import pipeline.runner.report_plots as report_plots
    from pipeline.runner import build_report
    from pipeline.runner.store import RunStore
    from tests.test_runner_report_tables import _clock, _dead_pid, _done, _start

    figures: list = []
    png = report_plots._png
    monkeypatch.setattr(report_plots, "_png", lambda fig: (figures.append(fig), png(fig))[1])
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for n in range(len(ends)):
        _done(store, f"c{n}", "r1")
    store.end_run("r1", status="completed", n_cases=len(ends), n_done=len(ends), n_failed=0, n_skipped=0)
    store.close()
    for n, end in enumerate(ends):
        _clock(run_dir, "UPDATE cases SET ended_at = ?1, first_done_at = ?1 WHERE case_id = ?2", (end, f"c{n}"))
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", run or (min(ends) - 1.0, max(ends) + 1.0))
    build_report([run_dir], tmp_path / "rep", **kw)
    (fig,) = [f for f in figures if f.axes[0].get_title().startswith("Completed cases")]
    return fig.axes[0], tmp_path / "rep"


def _bars(ax) -> list[tuple[float, float, float]]:
    """(start, width in days, height) of each bar drawn."""
    return [(p.get_x(), p.get_width(), p.get_height()) for p in ax.patches if p.get_height() > 0]


@pytest.mark.parametrize(
    ("span_s", "label", "bin_days"),
    [
        (20 * 60.0, "cases per 1 min", 1.0 / 1440),  # a run of 20 minutes: per minute
        (8 * 3600.0, "cases per 30 min", 30.0 / 1440),  # a nightly run of 8 hours
        (10 * 86400.0, "cases per day", 1.0),  # a report over ten days
    ],
)
def test_the_throughput_bin_follows_the_runs_span_and_the_axis_names_it(tmp_path, monkeypatch, span_s, label, bin_days):
    ends = [T0 + span_s * (n + 0.5) / 6 for n in range(6)]  # six cases spread over the run
    ax, rep = _report(tmp_path, monkeypatch, ends, run=(T0, T0 + span_s))
    assert ax.get_ylabel() == label, ax.get_ylabel()
    assert label.replace("cases ", "") in ax.get_title(), ax.get_title()
    bars = _bars(ax)
    assert sum(h for _, _, h in bars) == 6
    assert all(w <= bin_days for _, w, _ in bars), f"bars {[w * 1440 for _, w, _ in bars]} min wide, {label}"
    assert len(bars) == 6, f"six cases {span_s / 6:.0f} s apart drawn as {len(bars)} bars"
    # the time axis is the run's period, to the bin: not the hour (or day) around a short run
    lo, hi = (x * 86400.0 for x in ax.get_xlim())
    assert T0 - bin_days * 86400 <= lo <= T0 and T0 + span_s <= hi <= T0 + span_s + bin_days * 86400, (lo - T0, hi - T0)
    with open(rep / "throughput_daily.csv", encoding="utf-8-sig") as f:
        daily = {row["day_utc"]: int(row["cases"]) for row in csv.DictReader(f)}
    assert sum(daily.values()) == 6, daily  # cases per day as they were: each case on its day


def test_a_run_of_a_minute_or_two_is_drawn_per_10_s_from_its_start(tmp_path, monkeypatch):
    # the cases of an 88 s run all complete in its last 25 s, after ingest and reconstruction
    ax, _ = _report(tmp_path, monkeypatch, [T0 + 66.0, T0 + 87.0, T0 + 88.0], run=(T0, T0 + 88.0))
    assert ax.get_ylabel() == "cases per 10 s"
    assert sorted(h for _, _, h in _bars(ax)) == [1, 2]
    assert ax.get_xlim()[0] * 86400.0 <= T0, "the axis starts with the run, before its first case completes"


def test_a_set_bin_is_kept(tmp_path, monkeypatch):
    ax, _ = _report(tmp_path, monkeypatch, [T0 + 60.0 * n for n in range(6)], bin_minutes=60)
    assert ax.get_ylabel() == "cases per 1 h"
    assert [h for _, _, h in _bars(ax)] == [6]


def test_bin_choice():
    from pipeline.runner.report_bins import bin_label, throughput_bin_s

    assert throughput_bin_s([T0]) == 10  # one moment
    assert throughput_bin_s([T0, T0 + 88]) == 10  # a run of 88 s: per 10 s
    assert throughput_bin_s([T0, T0 + 54 * 60]) == 300  # 54 minutes: 11 bins of 5 min
    assert throughput_bin_s([T0, T0 + 3 * 86400]) == 86400  # over more than two days: per day
    assert throughput_bin_s([T0, T0 + 90 * 86400]) == 7 * 86400  # over three months: per week
    assert throughput_bin_s([T0, T0 + 600], bin_minutes=15) == 900
    assert [bin_label(s) for s in (10, 300, 7200, 86400, 7 * 86400)] == ["10 s", "5 min", "2 h", "day", "7 days"]
