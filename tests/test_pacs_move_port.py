"""C-MOVE retrieval when ctpipe's receiver port (``pacs.move_port``) is already taken by another process: found once,
before any series is asked for, and said with the port, the process holding it and the key to change; not retried
for every series of the source."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from pipeline.config import load_config
from pipeline.pacs import fetch_sources
from tests._support.orthanc import free_port, write_phantom_series

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs


@pytest.fixture(scope="module")
def two_series(orthanc, tmp_path_factory):
    root = tmp_path_factory.mktemp("move-port")
    uids = []
    for seed in (11, 12):
        uid, files = write_phantom_series(root / f"s{seed}", seed)
        orthanc.upload(files)
        uids.append(uid)
    return uids


def test_a_move_port_already_in_use_fails_the_source_once_naming_port_holder_and_key(orthanc, two_series, tmp_path, caplog):
    port = free_port()  # not the session Orthanc's move port: other modules' receivers may have just left it
    cfg = load_config(
        overrides={"pacs.move_port": port, "pacs.timeout_s": 10.0, "pacs.retries": 2, "pacs.backoff_s": 0.2},
        environ={},
    )
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind((cfg.pacs.bind, port))
    busy.listen(1)
    src = f"{orthanc.dimse}?studydate=19000101-29991231&retrieve=move"
    try:
        with caplog.at_level(logging.INFO):
            res = fetch_sources([src], run_dir=tmp_path / "run", cfg=cfg)
    finally:
        busy.close()
    assert not res.folders and res.fetched == 0
    assert len(res.failures) == 1, res.failures  # one failure for the source, not one per series
    what, kind, msg = res.failures[0]
    assert what == src and kind == "PacsReceiverError"
    assert f"{cfg.pacs.bind}:{port}" in msg and "already in use" in msg
    assert f"pid {os.getpid()}" in msg  # the process holding it: this test's
    assert "pacs.move_port" in msg and "retrieve=get" in msg
    assert "series not retrieved" in msg
    assert not [r for r in caplog.records if getattr(r, "event", "") == "pacs_retry"]  # never retried
