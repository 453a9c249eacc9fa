"""Threads for the detector's CPU post-processing (the small-blob search of :mod:`.candidates`).

SciPy's filters and NumPy's arithmetic on large arrays release the GIL, so independent pieces of work (slabs of a
volume) run side by side in threads of one process; work that is mostly Python (one small window per candidate)
does not gain from threads and stays on one. The number of threads is torch's
intra-op thread count (``torch.set_num_threads``): the share of the cores this process was given (the batch runner
gives each worker process its share), so post-processing never uses more cores than the network does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def cpu_workers() -> int:
    """Threads post-processing may use: ``torch.get_num_threads()``, at least 1."""
    return max(1, torch.get_num_threads())


def run_all(fn: Callable[[T], object], items: Iterable[T], *, workers: int) -> None:
    """``fn(item)`` for every item, on ``workers`` threads (in order on this thread when ``workers`` is 1); the
    first exception raised is raised here once all have run."""
    if workers <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for job in [pool.submit(fn, item) for item in items]:
            job.result()
