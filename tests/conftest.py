"""Shared pytest setup: `gpu` tests are skipped without CUDA; torch uses at most 2 threads (1 per pytest-xdist worker)."""

from __future__ import annotations

import gc
import os
import signal

import pytest

# Ray clusters started by tests stay on the loopback interface (tests/_support/ray_cluster.py, ray_environment)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    # the modules imported while collecting (torch, MONAI, the package, the tests) live until the end: frozen,
    # the garbage collector stops walking them at every full collection and at the process's exit
    gc.freeze()


def pytest_sessionfinish(session, exitstatus):
    gc.freeze()  # what the tests left alive need no collection when the process exits


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    try:
        import torch
    except ImportError:
        yield
        return
    # several xdist workers share the cores: one thread each keeps them from oversubscribing the machine
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))
    yield


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """``ctpipe`` run in the test's process sets the root logger's level and handlers for its console (``--quiet``:
    errors only): put them back, so that later tests see the warnings they look for."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (the machine's cores are shared; one thread avoids OpenMP stalls)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope``, with a worker kept for the modules that mostly wait and the longest modules first
    (tests/_support/scheduling.py)."""
    if config.getoption("dist") != "loadscope":
        return None
    from tests._support.scheduling import WaitAwareScheduling

    return WaitAwareScheduling(config, log)


# The suite runs as a command typed at a terminal would, also when a script started it in the background: a shell
# without job control starts a background command with SIGINT ignored, and every run a test starts would inherit that
# (ctpipe then leaves Ctrl-C alone, as for a background job; tests/test_runner_background_stop.py checks that case).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def own_signals():
    """``ctpipe run`` installs SIGTERM/SIGHUP handlers in this process: put the previous ones back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
