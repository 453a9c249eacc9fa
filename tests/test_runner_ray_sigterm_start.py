"""SIGTERM (systemd, ``kill``) sent to ``ctpipe run --ray local`` while ``ray.init`` starts the run's private Ray
instance: as a non-Ray run stopped before its first case, the run stops with ctpipe's exit status for an interruption
(130) and its line saying to run the same command again, not with Ray's own SIGTERM handling (exit status 15,
nothing said), and the instance's processes do not outlive it. The signal is sent once the instance's first process
is up, i.e. while ``ray.init`` is still starting it (or, should it be done by then, just after)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._support.runner import QUICK, as_cli, db_rows
from tests.test_runner_ray_ops import _ray_pids

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sigterm_while_the_private_ray_instance_starts_is_an_interruption(tmp_path):
    pytest.importorskip("ray")
    from tests._support.ray_cluster import ray_environment

    out = tmp_path / "run"
    args = [sys.executable, "-m", "pipeline", "run", str(ROOT / "data_samples"), "--out", str(out), "--ray", "local"]
    args += [*as_cli({**QUICK, "report.enabled": False, "runner.torch_threads": 1}), "--quiet"]
    env = {**os.environ, **ray_environment()}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (started := _ray_pids(proc.pid)):  # ray.init has begun starting the instance
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # the driver alone, as systemd or kill would
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "SIGTERM received" not in err, err
    assert db_rows(out, "SELECT status FROM runs") in ([], [("interrupted",)])  # stopped before or as it was recorded
    deadline = time.monotonic() + 60
    while _ray_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _ray_pids(proc.pid)
    assert left == set(), f"processes of the run's private Ray instance were left running ({len(started)} at the signal)"
