"""The throughput plot's bin width: set, or chosen from the span of the runs, and named as its axis names it
(``cases per 10 s``, ``cases per 5 min``, ``cases per 2 h``, ``cases per day``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The bin widths (s) the throughput plot chooses from when ``bin_minutes`` is 0: seconds for a run of a minute or
#: two, minutes for a short run, hours for a nightly run, days over several days.
AUTO_BINS_S = tuple(
    [10, 15, 30] + [60 * m for m in (1, 2, 5, 10, 15, 30)] + [3600 * h for h in (1, 2, 3, 6, 12)] + [86400, 7 * 86400]
)
#: At most this many bins over the span when the bin is chosen from it.
AUTO_MAX_BINS = 24


def throughput_bin_s(times_s: Sequence[float] | np.ndarray, *, bin_minutes: int = 0) -> int:
    """The throughput plot's bin width (s): ``bin_minutes`` where it is set (> 0), else chosen from the span of
    ``times_s`` (epoch s: the runs' starts and ends and the completed cases' first completions): the smallest of
    :data:`AUTO_BINS_S` giving at most :data:`AUTO_MAX_BINS` bins, and a day at least over more than two days, so that
    a short run is drawn in seconds or minutes, not as one bar across its hour, and runs over weeks per day (or
    week)."""
    if bin_minutes > 0:
        return int(bin_minutes) * 60
    times = np.asarray(times_s, dtype=np.float64)
    times = times[np.isfinite(times)]
    span = float(times.max() - times.min()) if times.size else 0.0
    least = 86400 if span > 2 * 86400 else 0
    return next((b for b in AUTO_BINS_S if b >= least and span / b <= AUTO_MAX_BINS), AUTO_BINS_S[-1])


def bin_label(seconds: int) -> str:
    """A bin width (s) as the plot's axis names it: ``10 s``, ``5 min``, ``2 h``, ``day``, ``7 days``."""
    if seconds % 86400 == 0:
        return "day" if seconds == 86400 else f"{seconds // 86400} days"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"
