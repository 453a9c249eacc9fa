"""The report's page as a reader takes it in: one latency histogram row per stage on one seconds axis, so that no
stage's bars blend with another's into a colour that reads as a third stage; a page over many cases that a browser
opens, with the cases that need attention on it."""

from __future__ import annotations

import numpy as np

from pipeline.runner.report import latency_figure


def test_each_stage_has_its_own_latency_row_on_one_seconds_axis():
    import matplotlib.pyplot as plt

    series = [("end to end", np.array([30.0, 45.0])), ("reconstruct", np.array([25.0, 40.0])), ("write", np.array([1.0]))]
    fig = latency_figure(series)
    try:
        axes = fig.axes
        assert [ax.get_ylabel() for ax in axes] == ["end to end", "reconstruct", "write"]
        assert len({ax.get_xlim() for ax in axes}) == 1  # one scale: a bar at 40 s is at 40 s in every row
        bars = [[p for p in ax.patches if p.get_height() > 0] for ax in axes]
        assert [len(b) for b in bars] == [2, 2, 1]  # each row holds its own stage's cases only
        assert max(p.get_x() + p.get_width() for p in bars[2]) < 5.0  # write's case stays near 1 s, not 40 s
        assert axes[-1].get_xlabel().startswith("seconds, log scale (each bin ")  # 1 s to 45 s: over LOG_SPAN
    finally:
        plt.close(fig)


def test_a_page_over_many_cases_shows_those_that_need_attention_and_points_to_the_csv(tmp_path, monkeypatch):
    import pipeline.runner.report_html as report_html
    from pipeline.csvfile import read_table
    from pipeline.runner import build_report
    from pipeline.runner.store import RunStore
    from tests.test_runner_report_tables import _begin, _dead_pid, _done, _start

    monkeypatch.setattr(report_html, "CASES_SHOWN", 4)
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for n in range(8):
        _done(store, f"ok{n}", "r1")
    for cid in ("bad1", "bad2"):
        _begin(store, cid, "r1", {"ingest": "failed"})
        store.fail_case(f"{cid}:fp", reason="cut short. Fix: copy it again", error_class="TruncatedFileError", stage="ingest")
    store.end_run("r1", status="completed", n_cases=10, n_done=8, n_failed=2, n_skipped=0)
    store.close()
    rep = build_report([run_dir], tmp_path / "rep")
    page = rep.html.read_text()
    cases = page.split("<h2>Cases</h2>", 1)[1].split("<h2>", 1)[0]
    assert cases.count("<tr><td>") == 4 and "4 of 10 cases shown" in cases and "cases.csv lists them all" in cases
    assert "<td>bad1</td>" in cases and "<td>bad2</td>" in cases  # the quarantined cases are never left out
    assert len(read_table(rep.out_dir / "cases.csv").rows) == 10
    monkeypatch.setattr(report_html, "CASES_SHOWN", 500)
    small = build_report([run_dir], tmp_path / "rep-all")  # under the limit: every case, no note
    assert "cases shown" not in small.html.read_text()


def test_the_latency_table_and_histogram_say_what_they_count(tmp_path):
    """end_to_end counts completed cases; a stage's row counts its successful runs, which a quarantined case or a
    series also run in another folder adds to: "n" and "cases per bin" alone read as cases everywhere."""
    import matplotlib.pyplot as plt

    from pipeline.runner import build_report
    from pipeline.runner.store import RunStore
    from tests.test_runner_report_tables import _dead_pid, _done, _start

    fig = latency_figure([("end to end", np.array([30.0])), ("write", np.array([1.0, 2.0]))])
    try:
        title = fig.axes[0].get_title()
        assert "end to end: cases" in title and "stages: stage runs" in title, title
    finally:
        plt.close(fig)
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    _done(store, "ok1", "r1")
    store.end_run("r1", status="completed", n_cases=1, n_done=1, n_failed=0, n_skipped=0)
    store.close()
    page = build_report([run_dir], tmp_path / "rep").html.read_text()
    latency = page.split("<h2>Latency (seconds)</h2>", 1)[1].split("<h2>", 1)[0]
    assert "n: completed cases for end_to_end, successful runs of the stage for each stage" in latency


def test_each_latency_row_labels_its_tallest_bar_and_the_bins_width_readably():
    """Each row of the latency histogram had two integer ticks chosen by matplotlib, 7 points high: a row whose
    tallest bar held 3 runs was labelled 0 and 2, so the bar read as 2, and the labels were too small to read on the
    page; the bins' width was not given. Each row now labels 0 and its tallest bar's count, the tick labels are as
    large as the axis labels' text, and the seconds axis names the bins' width."""
    import matplotlib.pyplot as plt

    series = [
        ("end to end", np.array([47.0, 58.0, 97.0])),
        ("ingest", np.array([0.1, 0.2, 1.7])),  # three runs in the first bin
        ("reconstruct", np.array([12.0, 13.0, 15.5, 15.6, 15.7])),
    ]
    fig = latency_figure(series)
    try:
        fig.canvas.draw()
        for ax, (label, _) in zip(fig.axes, series):
            tallest = max(p.get_height() for p in ax.patches)
            assert list(ax.get_yticks()) == [0, tallest], (label, ax.get_yticks())
            assert ax.get_ylim()[1] >= tallest  # the bar's top is within the row
            labels = [t for t in ax.get_yticklabels() if t.get_text()]
            assert [t.get_text() for t in labels] == ["0", f"{tallest:.0f}"], label
            assert all(t.get_fontsize() >= 8 for t in labels), label
        bottom = fig.axes[-1]
        first, second = bottom.patches[0], bottom.patches[1]
        ratio = (second.get_x() + second.get_width()) / (first.get_x() + first.get_width())
        assert bottom.get_xlabel() == f"seconds, log scale (each bin {ratio:.2f} times as wide as the one before)"
        assert bottom.get_xlim()[0] > 0.0  # a log axis: from just below the fastest run
        assert all(t.get_fontsize() >= 8 for t in bottom.get_xticklabels())
    finally:
        plt.close(fig)
    fig = latency_figure([("end to end", np.array([47.0, 58.0, 97.0])), ("reconstruct", np.array([12.0, 15.5]))])
    try:
        bottom = fig.axes[-1]
        width = bottom.patches[0].get_width()
        assert bottom.get_xlabel() == f"seconds (bins of {width:.2g} s)"  # within LOG_SPAN: equal bins from 0 s
        assert bottom.get_xlim()[0] == 0.0  # no negative seconds
    finally:
        plt.close(fig)


def test_the_fast_stages_latencies_are_told_apart_beside_a_slow_stage():
    """On one linear axis up to 100 s, bins are 3.4 s wide: ingest runs of 0.1, 0.4 and 1.7 s, and a DICOM writing
    run of 0 s, all fell in the first bin, one bar of 4 that tells nothing of them. On the log axis each has its own
    bar, and the 0 s run is counted in the first bin, not dropped."""
    import matplotlib.pyplot as plt

    series = [
        ("end to end", np.array([47.0, 58.0, 97.0])),
        ("ingest", np.array([0.1, 0.4, 1.7])),
        ("dicom", np.array([0.0, 0.3])),
        ("reconstruct", np.array([12.0, 13.0, 15.5])),
    ]
    fig = latency_figure(series)
    try:
        assert fig.axes[-1].get_xscale() == "log"
        ingest = [p for p in fig.axes[1].patches if p.get_height() > 0]
        assert [p.get_height() for p in ingest] == [1, 1, 1]
        dicom = fig.axes[2].patches
        assert sum(p.get_height() for p in dicom) == 2 and dicom[0].get_height() == 1  # 0 s: the first bin
        for ax, (_, values) in zip(fig.axes, series):
            for v in values[values > 0]:  # each run's bar spans its latency
                assert any(p.get_x() <= v <= p.get_x() + p.get_width() and p.get_height() > 0 for p in ax.patches)
    finally:
        plt.close(fig)
