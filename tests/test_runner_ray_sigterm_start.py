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
from types import SimpleNamespace
from typing import Any

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


class _StartingRay:
    """Stands in for ``ray``: its ``init`` puts a SIGTERM handler of its own in place through Ray's own function (as
    the real one does), receives ``signals`` stop signals as it starts, then says whether it finished starting."""

    def __init__(self, signals: int) -> None:
        self.signals = signals
        self.started = self.shut_down = False
        self._private = SimpleNamespace(utils=SimpleNamespace(set_sigterm_handler=self._exit_at_once))

    @staticmethod
    def _exit_at_once(handler: Any) -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: Any) -> None:
        self._private.utils.set_sigterm_handler(None)
        for _ in range(self.signals):
            os.kill(os.getpid(), signal.SIGTERM)
        self.started = True

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_signal_while_a_private_instance_starts_stops_the_run_once_started_a_second_at_once(monkeypatch, signals):
    from pipeline.runner import ray_connect
    from pipeline.runner.cli import stop_once

    ray = _StartingRay(signals)
    monkeypatch.setattr(ray_connect, "import_ray", lambda **_: ray)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 32)  # a token of the user's: none of the instance's own to put back
    replaced = stop_once("run")  # ctpipe run's handlers
    ours = signal.getsignal(signal.SIGTERM)
    caught: BaseException | None = None
    try:
        ray_connect.connect("local", timeout_s=10)
    except BaseException as exc:  # noqa: BLE001 - SystemExit (Ray's handler) is what must not come
        caught = exc
    finally:
        after = signal.getsignal(signal.SIGTERM)
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
    assert isinstance(caught, KeyboardInterrupt), repr(caught)  # ctpipe run: recorded as interrupted, exit 130
    assert after is ours
    assert ray.started is (signals == 1) and ray.shut_down  # held until started; a second one cut it short
