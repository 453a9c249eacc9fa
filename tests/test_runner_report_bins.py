"""The throughput plot's bin chosen from the run's span: with one 60-minute bin a run of a few minutes was drawn as
one bar across its whole hour (11:00 to 11:54), which read as steady work over the hour. A short run is now drawn
per minute, a nightly run per hour or so, a report over days per day, the y axis naming the bin; the daily
tables still count every case on its day."""

from __future__ import annotations

import csv

import pytest

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _report(tmp_path, monkeypatch, ends: list[float], **kw):
    import pipeline.runner.report as report
    from pipeline.runner import build_report
    from pipeline.runner.store import RunStore
    from tests.test_runner_report_tables import _clock, _dead_pid, _done, _start

    figures: list = []
    png = report._png
    monkeypatch.setattr(report, "_png", lambda fig: (figures.append(fig), png(fig))[1])
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for n in range(len(ends)):
        _done(store, f"c{n}", "r1")
    store.end_run("r1", status="completed", n_cases=len(ends), n_done=len(ends), n_failed=0, n_skipped=0)
    store.close()
    for n, end in enumerate(ends):
        _clock(run_dir, "UPDATE cases SET ended_at = ?1, first_done_at = ?1 WHERE case_id = ?2", (end, f"c{n}"))
    _clock(run_dir, "UPDATE runs SET started_at = ?, ended_at = ?", (min(ends) - 30.0, max(ends) + 1.0))
    build_report([run_dir], tmp_path / "rep", **kw)
    (fig,) = [f for f in figures if f.axes[0].get_title().startswith("Completed cases")]
    return fig.axes[0], tmp_path / "rep"


def _bars(ax) -> list[tuple[float, float, float]]:
    """(start, width in days, height) of each bar drawn."""
    return [(p.get_x(), p.get_width(), p.get_height()) for p in ax.patches if p.get_height() > 0]


@pytest.mark.parametrize(
    ("span_s", "label", "most_days"),
    [
        (300.0, "cases per 1 min", 1.0 / 1440),  # a five-minute run: per minute
        (8 * 3600.0, "cases per 30 min", 30.0 / 1440),  # a nightly run of 8 hours
        (10 * 86400.0, "cases per day", 1.0),  # a report over ten days
    ],
)
def test_the_throughput_bin_follows_the_runs_span_and_the_axis_names_it(tmp_path, monkeypatch, span_s, label, most_days):
    ends = [T0 + 600.0 + span_s * n / 5 for n in range(6)]  # six cases spread over the span
    ax, rep = _report(tmp_path, monkeypatch, ends)
    assert ax.get_ylabel() == label, ax.get_ylabel()
    assert label.replace("cases ", "") in ax.get_title(), ax.get_title()
    bars = _bars(ax)
    assert sum(h for _, _, h in bars) == 6
    assert all(w <= most_days for _, w, _ in bars), f"bars {[w * 1440 for _, w, _ in bars]} min wide, {label}"
    assert len(bars) == 6, f"six cases {span_s / 5:.0f} s apart drawn as {len(bars)} bars"
    # the bars cover the run's span, not the hour (or day) around it
    covered = (max(x + w for x, w, _ in bars) - min(x for x, _, _ in bars)) * 86400.0
    assert covered <= span_s + most_days * 86400.0, covered
    with open(rep / "throughput_daily.csv", encoding="utf-8-sig") as f:
        daily = {row["day_utc"]: int(row["cases"]) for row in csv.DictReader(f)}
    assert sum(daily.values()) == 6, daily  # cases per day as they were: each case on its day


def test_a_set_bin_is_kept(tmp_path, monkeypatch):
    ax, _ = _report(tmp_path, monkeypatch, [T0 + 60.0 * n for n in range(6)], bin_minutes=60)
    assert ax.get_ylabel() == "cases per 1 h"
    assert [h for _, _, h in _bars(ax)] == [6]


def test_bin_choice():
    from pipeline.runner.report_bins import bin_label, throughput_bin_minutes

    assert throughput_bin_minutes([T0]) == 1  # one case
    assert throughput_bin_minutes([T0, T0 + 54 * 60]) == 2  # 54 minutes: 27 bins of 2 min
    assert throughput_bin_minutes([T0, T0 + 3 * 86400]) == 1440  # over more than two days: per day
    assert throughput_bin_minutes([T0, T0 + 90 * 86400]) == 10080  # over three months: per week
    assert throughput_bin_minutes([T0, T0 + 600], bin_minutes=15) == 15
    assert [bin_label(m) for m in (5, 120, 1440, 10080)] == ["5 min", "2 h", "day", "7 days"]
