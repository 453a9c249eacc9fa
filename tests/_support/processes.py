"""Servers that tests start: stopped by their PID, politely first."""

from __future__ import annotations

import subprocess

PYTEST_DONT_REWRITE = True


def terminate(proc: subprocess.Popen | None, *, grace_s: float = 15.0) -> None:
    """SIGTERM ``proc`` and wait up to ``grace_s`` seconds, then SIGKILL it; nothing when it already ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
