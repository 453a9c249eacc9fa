"""``ctpipe run`` with ``metrics.linger_s``: the summary and the run's end records come first, then the wait that keeps
the metrics endpoint up for a last scrape, which Ctrl-C ends early without changing the run's outcome."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests._support.orthanc import free_port


def _events(run_dir: Path) -> list[str]:
    return [json.loads(line).get("event", "") for line in (run_dir / "run.log").read_text().splitlines()]


def test_the_summary_is_printed_before_the_metrics_linger_and_ctrl_c_ends_it(tmp_path):
    (tmp_path / "incoming").mkdir()  # a night without new studies: the run's own work takes a moment
    run = tmp_path / "run"
    port = free_port()
    cmd = [
        sys.executable, "-m", "pipeline", "run", str(tmp_path / "incoming"), "--out", str(run), "--workers", "0",
        "--set", "report.enabled=true", "--set", f"metrics.port={port}", "--set", "metrics.linger_s=60",
    ]  # fmt: skip
    # a terminal's Ctrl-C reaches the run whatever this test process does with SIGINT
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )
    try:
        assert proc.stdout is not None
        printed: list[str] = []
        for line in proc.stdout:  # through a pipe, as under cron or systemd
            printed.append(line.rstrip("\n"))
            if "stays up" in line:
                break
        assert printed and "stays up" in printed[-1], printed  # before the fix: nothing until the linger ended
        assert proc.poll() is None  # still serving the metrics
        assert printed[0].startswith("run ") and "0 case(s) done" in printed[0], printed
        assert any(ln.startswith("report: ") for ln in printed) and any(ln.startswith("log: ") for ln in printed)
        assert printed[-1] == (
            f"the metrics endpoint http://127.0.0.1:{port}/metrics stays up for 60 s for a last scrape (Ctrl-C ends it early)"
        )
        events = _events(run)
        assert "run_end" in events and events.index("run_end") < events.index("metrics_linger"), events
        assert (run / "report" / "report.html").is_file()

        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, rest  # the run completed: Ctrl-C only ended the wait
    assert "interrupted" not in rest
    assert _events(run)[-1] == "metrics_linger_ended"
