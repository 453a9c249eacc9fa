"""A real Prometheus for the tests: Debian's ``prometheus`` run as a plain process, and its ``promtool``.

:func:`prometheus_tool` finds ``prometheus`` or ``promtool`` or skips the test, naming
``scripts/install_monitoring_tools.sh`` (which ``scripts/test.sh`` runs before pytest).
:class:`PrometheusServer` writes a config (scrape every second, the given ``127.0.0.1`` targets), starts
Prometheus on a free port of 127.0.0.1 with its database in a temporary folder, waits until every target
has been scraped, answers ``/api/v1/query`` and is terminated by PID. All traffic stays on 127.0.0.1.

Test modules import the helpers directly, so pytest is told not to rewrite this module: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests._support.orthanc import HOST, free_port
from tests._support.processes import terminate

#: Prometheus answers at once but scrapes a target first 6-10 s after it starts.
FIRST_SCRAPE_S = 60.0


def prometheus_tool(name: str) -> str:
    """The ``prometheus`` or ``promtool`` executable, or skip (naming the install script) when it is missing."""
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} not installed: run `bash scripts/install_monitoring_tools.sh`")
    return exe


def local_opener() -> urllib.request.OpenerDirector:
    """A urllib opener that ignores ``http_proxy`` and friends, for requests to 127.0.0.1."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: localhost only, whatever the environment


def _get(url: str, timeout: float = 5.0) -> Any:
    with local_opener().open(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port``) every second (see the module docstring)."""

    def __init__(self, root: Path, targets: list[str]):
        self.root = root
        self.targets = targets
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = root / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        exe = prometheus_tool("prometheus")
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "prometheus.yml"
        cfg.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [{"job_name": "ctpipe", "static_configs": [{"targets": self.targets}]}],
                }
            )
        )
        args = [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address={HOST}:{self.port}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._alive()
            if self._ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Prometheus not ready within {timeout_s} s: {self.log_path.read_text()[-2000:]}")

    def _ready(self) -> bool:
        """``/-/ready`` answers 200 (plain text); before that the port refuses or answers 503."""
        try:
            with local_opener().open(self.url + "/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"Prometheus exited with status {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")

    def wait_scraped(self, timeout_s: float = FIRST_SCRAPE_S) -> list[dict[str, Any]]:
        """Poll ``/api/v1/targets`` until every target is up (scraped); the active targets."""
        deadline = time.monotonic() + timeout_s
        active: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            self._alive()
            active = _get(self.url + "/api/v1/targets")["data"]["activeTargets"]
            if len(active) == len(self.targets) and all(t["health"] == "up" for t in active):
                return active
            time.sleep(0.5)
        raise RuntimeError(f"targets not all up within {timeout_s} s: {active}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query (``/api/v1/query``)."""
        out = _get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert out["status"] == "success", out
        return list(out["data"]["result"])

    def stop(self) -> None:
        """Terminate the Prometheus process started here (by its PID)."""
        terminate(self.proc)
        self.proc = None
