"""The stop signals (Ctrl-C, SIGTERM, SIGHUP) that come once a run's end is being recorded: the run's work is over
(every case finished, or the run failed or stopped on its own), so a signal can no longer interrupt it. It is held
until :func:`~pipeline.runner.batch.run_batch` has recorded the run's end (run store, metrics, report, ``run_end`` in
run.log) and called back with its summary; it only ends the ``metrics.linger_s`` wait early. Then the handler it was
held from runs: ``ctpipe run``'s ignores it (its run has ended), ``ctpipe listen``'s stops the listener after its
batch, Python's own raises KeyboardInterrupt to the caller of ``run_batch``, the run recorded as it ended.

Exit status, for schedulers (cron, systemd, Slurm) that read it: ``ctpipe run`` exits 130 only when a stop signal
really stopped something, i.e. came while the run's work was going on (the run recorded as interrupted). A signal
held here stopped nothing, so the run's own status stands. When the process also crashes (an error while the run's
end is recorded, its report written or its summary printed, with a signal held or after one interrupted the run), the
crash stands: ``ctpipe run`` exits with the crash's status (1 with its traceback for an unforeseen error, as any crash;
its own status for a run folder that cannot be written), never 130, as what the run left is incomplete (no report,
no summary), which a scheduler must see as a failure, not as a stop to resume from. The run store keeps the run as it
ended (completed, or interrupted). A held signal is still handed to its handler, and the KeyboardInterrupt that
handler raises for it is dropped in favour of the crash, which names the signal instead (``stop_after_crash`` in
run.log, a note under its traceback, :func:`held_stop`): ``ctpipe listen``, which outlives a batch that failed,
stops on it all the same.

:mod:`.ray_start_signals` holds the stop signals the same way while ``ray.init`` starts a private Ray instance, which a
signal handled mid-start would leave half started: it is handed to its handler once the instance has started (and
is then shut down); a second one cuts a start that hangs short at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

#: The signals ``ctpipe run`` stops on alike: Ctrl-C, ``kill`` (systemd, a script) and the terminal closing.
STOP_SIGNALS: tuple[int, ...] = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class _WaitEnded(Exception):
    """Raised by the holding handler into :meth:`EndSignals.wait`, and nowhere else."""


class EndSignals:
    """Holds the stop signals that come between :meth:`hold` and :meth:`release` (see the module's docstring)."""

    def __init__(self, *, at_once: int | None = None) -> None:
        """``at_once``: the count of stop signals whose last, held no longer, raises KeyboardInterrupt at once (a
        private Ray instance's start that hangs is still cut short by a second Ctrl-C); None: held, however many."""
        self.noted: int | None = None  # the first stop signal held, by number
        self._at_once = at_once
        self._count = 0  # stop signals noted since hold()
        self._held: dict[int, Any] = {}  # the handlers held back, by signal number
        self._waiting = False  # in wait(): a signal ends it
        self._crash: BaseException | None = None  # the exception the run is ending with (crashed())

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
        self._count += 1
        if self._at_once is not None and self._count >= self._at_once:
            raise KeyboardInterrupt
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

    def crashed(self, crash: BaseException) -> None:
        """The run is ending with ``crash`` (see the module's docstring): if a stop signal is held, the crash is marked
        with it (:func:`held_stop`, a note under its traceback) and ``stop_after_crash`` is logged, and a
        KeyboardInterrupt its handler raises at :meth:`release` is dropped. KeyboardInterrupt itself is no crash."""
        if isinstance(crash, KeyboardInterrupt):
            return
        self._crash = crash
        if self.noted is not None and self.noted in self._held:
            _mark(crash, self.noted)

    def release(self) -> None:
        """The handlers held back again; the first stop signal noted, if any, is then handed to its own handler (which
        may raise KeyboardInterrupt, unless the run crashed: :meth:`crashed`)."""
        held, self._held = self._held, {}
        crash, self._crash = self._crash, None
        self._count = 0
        for signum, handler in held.items():
            signal.signal(signum, handler)
        noted, self.noted = self.noted, None
        if noted is None or noted not in held:
            return
        try:
            held[noted](noted, None)
        except KeyboardInterrupt:
            if crash is None:
                raise
            if held_stop(crash) is None:  # the signal came after crashed()
                _mark(crash, noted)


def _mark(crash: BaseException, signum: int) -> None:
    """Mark ``crash`` with the stop signal ``signum`` held as the run ended with it, and log it (``stop_after_crash``)."""
    name = signal.Signals(signum).name
    text = f"{name} came after the run's work was over; the run ended with an error, whose exit status stands"
    log.warning("%s: %s", text, crash, extra={"event": "stop_after_crash"})
    setattr(crash, _HELD_STOP, signum)
    if hasattr(crash, "add_note"):  # Python >= 3.11: printed under the traceback
        crash.add_note(text)


_HELD_STOP = "ctpipe_held_stop"


def held_stop(exc: BaseException) -> int | None:
    """The stop signal (its number) held while the run that raised ``exc`` recorded its end, which ``exc`` stands in
    for (:meth:`EndSignals.release`); None when there was none."""
    return getattr(exc, _HELD_STOP, None)
