"""``ctpipe listen`` stopped by systemd or Ctrl-C: a second SIGTERM or Ctrl-C while it stops (systemctl stop sent
twice, an impatient operator) does not cut its stop short; as for ``ctpipe run``, a third stops it at once."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.pacs.listener import Listener


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_second_stop_signal_while_the_listener_stops_is_noted_not_obeyed(tmp_path, capfd, monkeypatch, own_handlers):
    real_close = Listener.close
    closed: list[bool] = []

    def serve_until_stopped(self: Listener) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # systemctl stop
        time.sleep(30)  # interrupted by the signal's KeyboardInterrupt

    def close_after_a_second_signal(self: Listener) -> None:
        if not closed:
            os.kill(os.getpid(), signal.SIGTERM)  # sent again while the listener stops
        real_close(self)
        closed.append(True)

    monkeypatch.setattr(Listener, "serve_forever", serve_until_stopped)
    monkeypatch.setattr(Listener, "close", close_after_a_second_signal)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    argv: list[Any] = ["listen", "--allow", "SCU", "--out", str(out), "--port", str(_free_port()), "--workers", "0"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    assert "ctpipe listen: already stopping" in captured.err, captured.err
    assert "stopped; received series not yet processed" in captured.out, captured.out
    assert closed == [True]  # the stop ran to its end
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handling again (main called in-process)
