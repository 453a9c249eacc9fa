"""The stop signals (Ctrl-C, SIGTERM, SIGHUP) that come once a run's end is being recorded: the run's work is over
(every case finished, or the run failed or stopped on its own), so a signal can no longer interrupt it. It is held
until :func:`~pipeline.runner.batch.run_batch` has recorded the run's end (run store, metrics, report, ``run_end`` in
run.log) and called back with its summary; it only ends the ``metrics.linger_s`` wait early. Then the handler it was
held from runs: ``ctpipe run``'s ignores it (its run has ended), ``ctpipe listen``'s stops the listener after its
batch, Python's own raises KeyboardInterrupt to the caller of ``run_batch``, the run recorded as it ended.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

#: The signals ``ctpipe run`` stops on alike: Ctrl-C, ``kill`` (systemd, a script) and the terminal closing.
STOP_SIGNALS: tuple[int, ...] = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class _WaitEnded(Exception):
    """Raised by the holding handler into :meth:`EndSignals.wait`, and nowhere else."""


class EndSignals:
    """Holds the stop signals that come between :meth:`hold` and :meth:`release` (see the module's docstring)."""

    def __init__(self) -> None:
        self.noted: int | None = None  # the first stop signal held, by number
        self._held: dict[int, Any] = {}  # the handlers held back, by signal number
        self._waiting = False  # in wait(): a signal ends it

    def hold(self) -> None:
        """From now until :meth:`release`, note a stop signal whose handler is Python code (Python's own Ctrl-C,
        ``ctpipe run``'s or ``ctpipe listen``'s) instead of running that handler. A signal ignored or left to the
        system's default (SIGTERM outside ``ctpipe``) is left alone, and so is every signal off the main thread, where
        Python runs no handler."""
        if self._held or threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            if callable(signal.getsignal(signum)):
                self._held[signum] = signal.signal(signum, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.noted is None:
            self.noted = signum
        if self._waiting:  # once: a second signal does not escape the wait's own ending
            self._waiting = False
            raise _WaitEnded

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` (s), or less: a held stop signal ends the wait, also one that came before it. True when
        a signal ended it."""
        try:
            self._waiting = True
            if self.noted is None:
                time.sleep(seconds)
        except _WaitEnded:
            pass
        finally:
            self._waiting = False
        return self.noted is not None

    def release(self) -> None:
        """The handlers held back again; the first stop signal noted, if any, is then handed to its own handler (which
        may raise KeyboardInterrupt)."""
        held, self._held = self._held, {}
        for signum, handler in held.items():
            signal.signal(signum, handler)
        noted, self.noted = self.noted, None
        if noted is not None and noted in held:
            held[noted](noted, None)
