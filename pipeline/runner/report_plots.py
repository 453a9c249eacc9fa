"""The throughput report's plots (:func:`.report.build_report`), as PNGs for ``report.html``: throughput per bin,
the latency histograms, the stage breakdown and GPU utilisation.

Figures are drawn without pyplot, so the calling application's backend and figures stay as they are. Time axes
are UTC; latencies and bins in seconds.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from .report_bins import bin_label, throughput_bin_s
from .report_days import redo_ends


def _subplots(figsize: tuple[float, float], nrows: int = 1, **kw: Any) -> tuple[Any, Any]:
    """A figure and its axes drawn without pyplot, so the calling application's backend and figures stay as they
    are (a notebook keeps showing its plots); ``kw`` as :meth:`matplotlib.figure.Figure.subplots` takes them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, 1, **kw)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _legend_outside(ax: Any) -> None:
    """The legend of ``ax`` right of its plot, on none of its bars or lines (the PNG is cut to what is drawn)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, borderaxespad=0.0)


def _utc_time_axis(ax: Any) -> None:
    """The x axis of ``ax`` (UTC datetimes) labelled as UTC, its ticks as hh:mm with the day and year written where
    they change (:class:`matplotlib.dates.ConciseDateFormatter`), not ``01-15 09``."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator(tz="UTC")
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz="UTC", show_offset=True))
    ax.set_xlabel("time (UTC)")


#: Latencies whose longest is more than this many times their shortest (above 0 s) are binned on a log scale: on a
#: linear one the fast stages (ingest, load, DICOM writing, under a second) all fall in the first of 30 bins beside
#: a reconstruction of a minute.
LOG_SPAN = 20.0


def shared_bins(series: Sequence[Any], *, n: int = 30) -> np.ndarray:
    """``n`` bins (edges, s) shared by every histogram of a plot, so that one case's bar is as wide as a thirtieth of
    the axis, not of its own zero range: equal bins from 0 to just past the largest value of any of ``series``; or,
    when the values span more than :data:`LOG_SPAN` (a stage of 0.2 s beside one of 60 s), bins of equal ratio from
    just below the smallest value above 0 s to just past the largest."""
    values = [np.asarray(v, dtype=float) for v in series if len(v)]
    longest = max((float(v.max()) for v in values), default=0.0)
    shortest = min((float(v[v > 0].min()) for v in values if (v > 0).any()), default=0.0)
    if shortest > 0.0 and longest / shortest > LOG_SPAN:
        return np.geomspace(shortest / 1.02, longest * 1.02, n + 1)
    return np.linspace(0.0, max(longest, 1e-3) * 1.02, n + 1)


def draw_plots(summary: dict[str, Any], t: dict, bin_minutes: int) -> dict[str, str]:
    import pandas as pd
    from matplotlib.ticker import MaxNLocator

    out: dict[str, str] = {}
    done = t["cases"][t["cases"].status == "done"]
    if len(done):  # no completed case: no empty axes (the page says why there is no plot)
        fig, ax = _subplots(figsize=(8, 3))
        runs = t["runs"]
        # the runs' whole period, from the first start to the last end (or completion): the time before a run's first
        # case completes (ingest, reconstruction) and after its last shows as such, not as work spread over the bin
        period = np.array([*runs.started_at.dropna(), *runs.ended_at.dropna(), *done.first_done_at], dtype=float)
        bin_s = throughput_bin_s(period, bin_minutes=bin_minutes)
        per = bin_label(bin_s)
        ended = pd.to_datetime(done.first_done_at, unit="s", utc=True)  # at its first completion, as the tables
        counts = ended.dt.floor(f"{bin_s}s").value_counts().sort_index()
        again = pd.to_datetime(pd.Series(redo_ends(done), dtype=float), unit="s", utc=True)  # at its latest completion
        redone = again.dt.floor(f"{bin_s}s").value_counts()
        width = bin_s / 86400.0 * 0.9  # days, matplotlib's date unit
        if len(redone):  # the cases done again stacked on the new ones: the work done
            bins = counts.index.union(redone.index)
            counts, redone = counts.reindex(bins, fill_value=0), redone.reindex(bins, fill_value=0)
            ax.bar(bins, redone.values, width=width, align="edge", bottom=counts.values, color="#f0a030", label="done again")
        ax.bar(counts.index, counts.values, width=width, align="edge", color="#3a7bd5", label="new")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # whole cases
        lo, hi = (pd.Timestamp(x, unit="s", tz="UTC") for x in (period.min(), period.max()))
        ax.set_xlim(lo.floor(f"{bin_s}s"), hi.floor(f"{bin_s}s") + pd.Timedelta(seconds=bin_s))  # the whole period
        _utc_time_axis(ax)
        if len(redone):  # top to bottom as the bars are stacked: done again over new
            _legend_outside(ax)
        ax.set_title(f"Completed cases per {per} (UTC)" + (": new and done again" if len(redone) else ""))
        ax.set_ylabel(f"cases per {per}")
        out["throughput"] = _png(fig)

    ok = t["stages"][(t["stages"].status == "ok") & ~t["stages"].skipped]
    if len(ok):  # no completed stage: no latency or stage plot
        series = [("end to end", done.latency_s.dropna())] if len(done) else []
        series += [(s, ok[ok.stage == s].wall_s.dropna()) for s in summary["latency_s"] if s != "end_to_end"]
        series = [(label, values) for label, values in series if len(values)]
        if series:
            out["latency"] = _png(latency_figure(series))

        stages = [s for s in summary["latency_s"] if s != "end_to_end"]
        fig, ax = _subplots(figsize=(8, 0.5 + 0.5 * max(1, len(stages))))
        means = [summary["latency_s"][s]["mean"] or 0.0 for s in stages]
        waits = [summary["queue_wait_s"][s]["mean"] or 0.0 for s in stages]
        y = np.arange(len(stages))
        ax.barh(y, means, color="#3a7bd5", label="wall time (mean)")
        ax.barh(y, waits, left=means, color="#f0a030", label="queue wait (mean)")
        ax.set_yticks(y, stages)
        ax.invert_yaxis()
        ax.set_xlabel("seconds per case")
        ax.set_title("Stage breakdown")
        _legend_outside(ax)
        out["stages"] = _png(fig)

    gpu = t["gpu"]
    if len(gpu):
        fig, ax = _subplots(figsize=(8, 3))
        gpu_lines(ax, gpu)
        ax.set_ylabel("utilisation %")
        ax.set_title("GPU utilisation (NVML)")
        _legend_outside(ax)
        _utc_time_axis(ax)
        out["gpu"] = _png(fig)
    return out


def latency_figure(series: Sequence[tuple[str, Any]]) -> Any:
    """The latency histograms, one row per stage (``series``: label and latencies in s; end to end first), on one
    shared seconds axis (:func:`shared_bins`, a log scale where the stages' times span more than :data:`LOG_SPAN`):
    no stage's bars drawn over another's, whose blended colours would read as a third stage's."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = _subplots((8, 0.8 + 0.55 * len(series)), len(series), sharex=True, squeeze=False)
    edges = [float(e) for e in shared_bins([v for _, v in series])]
    log = edges[0] > 0.0
    for n, (ax, (label, values)) in enumerate(zip(axes[:, 0], series)):
        shown = np.clip(np.asarray(values, dtype=float), edges[0], None) if log else values  # 0 s: the first bin
        counts, _, _ = ax.hist(shown, bins=edges, color="#333333" if label == "end to end" else f"C{n % 10}")
        ax.set_ylabel(label, rotation=0, ha="right", va="center")
        most = int(np.max(counts))  # the row's tallest bar: its own scale, each row's count written at its top
        ax.set_yticks([0, most])
        ax.set_ylim(0, most * 1.1)
        ax.tick_params(axis="y", labelsize=LATENCY_TICK_PT)
    bottom = axes[-1, 0]
    if log:
        bottom.set_xscale("log")
        bottom.set_xlim(edges[0], edges[-1])
        bottom.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0), numticks=30))
        bottom.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        bottom.xaxis.set_minor_formatter(NullFormatter())
        bottom.set_xlabel(f"seconds, log scale (each bin {edges[1] / edges[0]:.2f} times as wide as the one before)")
    else:
        bottom.set_xlim(0.0, edges[-1])  # no seconds below 0
        bottom.set_xlabel(f"seconds (bins of {_seconds(edges[1] - edges[0])})")
    bottom.tick_params(axis="x", labelsize=LATENCY_TICK_PT)
    axes[0, 0].set_title("Latency histogram, one row per stage (per bin: end to end: cases; stages: stage runs)")
    fig.tight_layout(h_pad=0.2)
    return fig


#: Points of the latency histogram's tick labels: read at the size of the PNG on the report's page.
LATENCY_TICK_PT = 9


def _seconds(value: float) -> str:
    """A bin's width (s) with the digits that tell it apart: ``3.4 s``, ``0.034 s``, ``120 s``."""
    return f"{value:.2g} s" if value < 10 else f"{value:.0f} s"


def gpu_lines(ax: Any, gpu: Any) -> None:
    """Draw each GPU's utilisation (``gpu``: the samples, with ``label``, ``run_id``, ``t`` in Unix s and
    ``util_pct``) on ``ax``: one line per run in the GPU's colour, so that no line crosses the idle time between two
    runs as if the GPU had been busy; one legend entry per GPU."""
    import pandas as pd

    for n, (g, d) in enumerate(gpu.groupby("label", sort=True)):
        for m, (_, r) in enumerate(d.sort_values("t").groupby("run_id", sort=False)):
            when = pd.to_datetime(r.t, unit="s", utc=True)
            ax.plot(when, r.util_pct, color=f"C{n % 10}", label=f"GPU {g}" if m == 0 else None)
