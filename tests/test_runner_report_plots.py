"""The report's plots as a reader takes them in: one latency histogram row per stage on one seconds axis, so that no
stage's bars blend with another's into a colour that reads as a third stage."""

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
        assert axes[-1].get_xlabel() == "seconds"
    finally:
        plt.close(fig)
