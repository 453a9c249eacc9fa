"""The throughput plot's bin width: set, or chosen from the span of the completed cases, and named as its axis
names it (``cases per 5 min``, ``cases per 2 h``, ``cases per day``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The bin widths (minutes) the throughput plot chooses from when ``bin_minutes`` is 0: minutes for a short run,
#: hours for a nightly run, days over several days.
AUTO_BINS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 10080)
#: At most this many bins over the completed cases' span when the bin is chosen from it.
AUTO_MAX_BINS = 30


def throughput_bin_minutes(first_done_s: Sequence[float], *, bin_minutes: int = 0) -> int:
    """The throughput plot's bin width (minutes): ``bin_minutes`` where it is set (> 0), else chosen from the span of
    ``first_done_s`` (the completed cases' first completions, epoch s): the smallest of :data:`AUTO_BINS_MIN` giving
    at most :data:`AUTO_MAX_BINS` bins, and a day at least over more than two days, so that a run of a few minutes is
    drawn per minute, not as one bar across its hour, and one over weeks per day (or week)."""
    if bin_minutes > 0:
        return int(bin_minutes)
    times = np.asarray(first_done_s, dtype=np.float64)
    span_min = float(times.max() - times.min()) / 60.0 if times.size else 0.0
    floor = 1440 if span_min > 2 * 1440 else 1
    return next((m for m in AUTO_BINS_MIN if m >= floor and span_min / m <= AUTO_MAX_BINS), AUTO_BINS_MIN[-1])


def bin_label(minutes: int) -> str:
    """A bin width (minutes) as the plot's axis names it: ``5 min``, ``2 h``, ``day``, ``7 days``."""
    if minutes % 1440 == 0:
        return "day" if minutes == 1440 else f"{minutes // 1440} days"
    if minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"
