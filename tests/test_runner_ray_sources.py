"""A Ray connection error names where the user set the option it is about (``--ray``, a ``--set`` item, the
``--config`` file, an environment variable such as one left in a service file), as the error for a GPU the host lacks
does, not the option's name alone: the user then knows what to change. No cluster is started: the address is a port
of this machine with nothing on it, refused before Ray is asked to connect."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests._support.cli import cli_error
from tests._support.ray_cases import needs_ray

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"


def _closed_port() -> int:
    """A port of the loopback interface that nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_head_is_named_after_where_its_address_was_set(tmp_path, capsys, monkeypatch):
    # was: "runner.ray_address: cannot reach the Ray head at 127.0.0.1:PORT (Connection refused)" from each of them
    needs_ray()
    monkeypatch.delenv("CTPIPE_RUNNER_ENGINE", raising=False)
    monkeypatch.delenv("CTPIPE_RUNNER_RAY_ADDRESS", raising=False)
    address = f"127.0.0.1:{_closed_port()}"
    run = ["run", str(SAMPLE), "--workers", "0"]
    rc, err = cli_error(capsys, *run, "--out", str(tmp_path / "flag"), "--ray", address)
    assert rc == 1 and f"--ray: cannot reach the Ray head at {address} (" in err and "Fix: start the head" in err, err
    item = f"runner.ray_address={address}"
    rc, err = cli_error(capsys, *run, "--out", str(tmp_path / "set"), "--set", "runner.engine=ray", "--set", item)
    assert rc == 1 and f"--set {item}: cannot reach the Ray head at {address}" in err, err
    config = tmp_path / "cluster.yaml"
    config.write_text(f"runner:\n  engine: ray\n  ray_address: '{address}'\n")
    rc, err = cli_error(capsys, *run, "--out", str(tmp_path / "file"), "--config", str(config))
    assert rc == 1 and f"{config}: runner.ray_address: cannot reach the Ray head at {address}" in err, err
    monkeypatch.setenv("CTPIPE_RUNNER_ENGINE", "ray")
    monkeypatch.setenv("CTPIPE_RUNNER_RAY_ADDRESS", address)
    rc, err = cli_error(capsys, *run, "--out", str(tmp_path / "env"))
    assert rc == 1 and f"environment variable CTPIPE_RUNNER_RAY_ADDRESS: cannot reach the Ray head at {address}" in err, err


def test_ray_missing_is_named_after_where_the_ray_engine_was_set(tmp_path, capsys, monkeypatch):
    # was: "runner.engine: runner.engine = ray needs Ray, which is not installed", whatever asked for Ray
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.delenv("CTPIPE_RUNNER_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CTPIPE_RUNNER_ENGINE", "ray")
    rc, err = cli_error(capsys, "run", str(SAMPLE), "--workers", "0", "--out", str(tmp_path / "env"))
    assert rc == 1 and "environment variable CTPIPE_RUNNER_ENGINE: runner.engine = ray needs Ray" in err, err
    rc, err = cli_error(capsys, "run", str(SAMPLE), "--workers", "0", "--out", str(tmp_path / "flag"), "--ray", "local")
    assert rc == 1 and "--ray: runner.engine = ray needs Ray, which is not installed. Fix: pip install" in err, err


def test_a_source_that_does_not_name_the_option_is_followed_by_it(tmp_path):
    # was: "overrides: cannot reach the Ray head at ..." for run_batch(ray_address=...), and a config file's path alone
    from pipeline.config import load_config
    from pipeline.runner.run_config import effective_config

    config = tmp_path / "cluster.yaml"
    config.write_text("runner:\n  engine: ray\n  ray_address: '127.0.0.1:1'\n")
    from_file = load_config(config)
    assert from_file.source_of("runner.ray_address") == f"{config}: runner.ray_address"
    from_python = effective_config(from_file, {"ray_address": "127.0.0.1:2"})
    assert from_python.source_of("runner.ray_address") == "overrides: runner.ray_address"
    assert from_python.source_of("runner.engine") == f"{config}: runner.engine"
    assert from_python.source_of("runner.workers") == "runner.workers"  # its default: set nowhere
    by_env = load_config(None, environ={"CTPIPE_RUNNER_RAY_ADDRESS": "127.0.0.1:3"})
    assert by_env.source_of("runner.ray_address") == "environment variable CTPIPE_RUNNER_RAY_ADDRESS"
