"""What Ray's driver prints while a run is joined to it. Ray pushes the cluster's error messages (a node marked dead, a
raylet that ended, each with the last twenty lines of its log) to every driver, whose own thread prints them to
stdout whatever ``log_to_driver`` says: a node lost during ``ctpipe run --quiet`` put forty lines of raylet state
dumps into the mail of a cron job that succeeded. They go to ctpipe's log instead: the first line as a warning, the
rest at debug level. Checked with a real private Ray instance (``runner.ray_address: local``) and Ray's own way of
pushing such a message to the drivers.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests._support.ray_cluster import OBJECT_STORE_BYTES, ray_environment, reload_ray_authentication

pytestmark = pytest.mark.slow

MESSAGE = (
    "The node with node id: 0123abcd and address: 127.0.0.1 has been marked dead because the detector has missed too "
    "many heartbeats from it.\n    [state-dump] NodeManager.GCTaskFailureReason - 1 total (1 active)\n"
    "    [state-dump] DebugString() time ms: 0"
)


def test_the_clusters_error_messages_go_to_the_log_not_to_stdout(capfd, caplog, monkeypatch):
    ray = pytest.importorskip("ray")
    from pipeline.runner.ray_connect import connect

    for key, value in ray_environment().items():  # as every test cluster: token authentication on, usage stats off
        monkeypatch.setenv(key, value)
    reload_ray_authentication()
    caplog.set_level(logging.DEBUG, logger="pipeline.runner.ray_connect")
    session = connect("local", timeout_s=60, init_options={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES})
    try:
        capfd.readouterr()
        from ray._private.utils import publish_error_to_driver

        publish_error_to_driver("node_died", MESSAGE, gcs_client=ray._private.worker.global_worker.gcs_client)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("marked dead" in r.getMessage() for r in caplog.records):
            time.sleep(0.1)
    finally:
        session.close()
    out = capfd.readouterr().out
    assert "state-dump" not in out and "marked dead" not in out, out
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "marked dead" in r.getMessage()]
    assert len(warned) == 1 and "state-dump" not in warned[0].getMessage()
    assert any("state-dump" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
