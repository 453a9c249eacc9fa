"""The report's plots as a manager reads them: the time axes of the throughput and GPU plots say they are UTC and
write their dates with the year and the time as hh:mm (not '01-15 09'), and no legend covers the bars or lines
(the stage breakdown's legend lay over the wall-time bar)."""

from __future__ import annotations


def _figures(tmp_path, monkeypatch) -> dict[str, object]:
    import pipeline.runner.report_plots as report_plots
    from pipeline.runner import build_report
    from pipeline.runner.store import RunStore
    from tests.test_runner_report_tables import _dead_pid, _done, _start

    figures: list = []
    png = report_plots._png
    monkeypatch.setattr(report_plots, "_png", lambda fig: (figures.append(fig), png(fig))[1])
    run_dir = tmp_path / "run"
    store = RunStore(run_dir)
    _start(store, "r1", pid=_dead_pid())
    for n in range(4):
        _done(store, f"ok{n}", "r1")
    store.end_run("r1", status="completed", n_cases=4, n_done=4, n_failed=0, n_skipped=0)
    store.close()
    build_report([run_dir], tmp_path / "rep")
    return {fig.axes[0].get_title(): fig for fig in figures}


def test_no_legend_covers_a_plots_data_and_time_axes_say_utc(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figures = _figures(tmp_path, monkeypatch)
    for title, fig in figures.items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), title
    (throughput,) = [fig for title, fig in figures.items() if title.startswith("Completed cases")]
    ax = throughput.axes[0]
    assert "UTC" in ax.get_xlabel(), ax.get_xlabel()
    labels = [t.get_text() for t in ax.get_xticklabels()] + [ax.xaxis.get_offset_text().get_text()]
    assert any(":" in t for t in labels) or any(len(t) == 4 and t.isdigit() for t in labels), labels
    assert any(str(y) in " ".join(labels) for y in range(2000, 2100)), labels  # the year is written
