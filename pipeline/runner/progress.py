"""Progress of a run: cases done, failures, cases/hour and ETA; a tqdm bar for the command line.

:class:`Progress` is a plain observer of the engine (no output). The command
line wraps it in :class:`TqdmBar`; notebooks can pass their own callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .stage import CaseSpec, TaskResult


def hms(seconds: float) -> str:
    """A duration (s) as hours:minutes:seconds, the hours going past 24 (``25:00:00``, not a clock's ``01:00:00``)."""
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class Progress:
    """Counts and rates of the cases of this run (``skipped`` = done in an earlier run).

    ``done``: cases this run completed for the first time; ``redone``: cases an earlier run completed that this run
    did again (their published folder was removed, see :meth:`expect_redos`), counted apart as the run's summary line
    and ``ctpipe_cases_redone_total`` count them. Both are work finished: the bar, the rate and the ETA count both.
    """

    total: int = 0
    done: int = 0
    redone: int = 0
    failed: int = 0
    skipped: int = 0
    released: int = 0  # left for the next run (the run folder could not be written, the series was still being written)
    started: float = field(default_factory=time.monotonic)
    callback: Callable[[Progress], Any] | None = None
    _redos: set[str] = field(default_factory=set, repr=False)

    def expect_redos(self, case_keys: Iterable[str]) -> None:
        """The cases of this run that an earlier run completed (``case_keys``): done again, they count in ``redone``."""
        self._redos.update(case_keys)

    @property
    def finished(self) -> int:
        return self.done + self.redone + self.failed + self.released

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def cases_per_hour(self) -> float:
        """Cases finished (done or failed) per hour of this run so far."""
        el = self.elapsed_s
        return 3600.0 * self.finished / el if el > 0 and self.finished else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None before the first case finishes."""
        rate = self.cases_per_hour
        if rate <= 0:
            return None
        return max(0.0, (self.total - self.finished) / rate * 3600.0)

    def describe(self) -> str:
        eta = self.eta_s
        eta_txt = "?" if eta is None else hms(eta)
        again = f"{self.redone} done again, " if self.redone else ""
        return (
            f"{self.done} done, {again}{self.failed} failed of {self.total} | {self.cases_per_hour:.1f} cases/h | ETA {eta_txt}"
        )

    def _changed(self) -> None:
        if self.callback is not None:
            self.callback(self)

    # observer interface
    def on_stage(self, result: TaskResult) -> None:
        pass

    def on_case_done(self, case: CaseSpec, latency_s: float, n_findings: int) -> None:
        if case.case_key in self._redos:
            self.redone += 1
        else:
            self.done += 1
        self._changed()

    def on_case_failed(self, case: CaseSpec, reason: str, error_class: str) -> None:
        self.failed += 1
        self._changed()

    def on_case_released(self, case: CaseSpec, reason: str) -> None:
        self.released += 1
        self._changed()


class TqdmBar:
    """A tqdm progress bar fed by :class:`Progress` (used by ``ctpipe run`` unless ``--quiet``)."""

    def __init__(self, total: int, *, desc: str = "cases"):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="case", dynamic_ncols=True)
        self._n = 0

    def __call__(self, p: Progress) -> None:
        self.bar.update(p.finished - self._n)
        self._n = p.finished
        eta = p.eta_s
        again = f"done again={p.redone} " if p.redone else ""
        self.bar.set_postfix_str(f"{again}failed={p.failed} {p.cases_per_hour:.1f}/h ETA {'?' if eta is None else hms(eta)}")

    def close(self) -> None:
        self.bar.close()
