"""The stop signals (Ctrl-C, SIGTERM, SIGHUP) while ``ray.init`` starts a run's private Ray instance in the main thread.

Ray's driver, and the head node it starts, put a SIGTERM handler of their own in place there, which ends the process
at once (status 15 and nothing said; status 1 once the instance runs, the run left recorded as completed); and a stop
signal handled while the instance starts would cut its start short, its processes half started. So Ray is kept off
SIGTERM while it starts, and the stop signals are held (:class:`~.end_signals.EndSignals`): the first is handed to the
caller's handler once the instance has started (``ctpipe run``: stop as for Ctrl-C, exit status 130, "run the same
command again"), the instance shut down first; a second one stops it at once, should the start hang.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from .end_signals import EndSignals


@contextmanager
def stops_held_while_starting(ray: ModuleType, *, stopped: Callable[[], None]) -> Iterator[None]:
    """Run the block (``ray.init`` of a private instance) with the stop signals held and Ray kept off SIGTERM (see the
    module's docstring); a stop signal held meanwhile reaches its handler once the block is over. ``stopped``: called
    before the KeyboardInterrupt that handler raises goes on (the instance shut down, the environment put back)."""
    on_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    stops = EndSignals(at_once=2)  # a second one: a start that hangs is cut short at once
    try:
        with _sigterm_kept_from(ray):
            stops.hold()
            yield
    finally:
        try:
            stops.release()
        except KeyboardInterrupt:  # stopped as it started: the run goes no further
            stopped()
            raise
        finally:
            if on_term is not None:  # not held (no handler of the caller's): Ray's, should it have set one all the same
                signal.signal(signal.SIGTERM, on_term)


@contextmanager
def _sigterm_kept_from(ray: ModuleType) -> Iterator[None]:
    """Keep ``ray.init`` from putting its own SIGTERM handler in place (Ray's ``set_sigterm_handler``, which its driver
    and a head it starts call), as long as the block runs; nothing where this Ray has no such function."""
    utils: Any = getattr(getattr(ray, "_private", None), "utils", None)
    setter = getattr(utils, "set_sigterm_handler", None)
    if setter is None:
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = setter
