"""``ctpipe listen`` stopped (systemctl stop: SIGTERM) as a batch ends, and that batch failing as it records its end (a
full disk): the batch's error is logged and the listener stops all the same, instead of taking the error for one to
try again after and serving on, the stop lost. The series stays handed, for the next start."""

from __future__ import annotations

import errno
import logging
import os
import signal
import time

import pydicom
import pytest

from pipeline.errors import CtpipeError
from pipeline.runner.cli import stop_once
from tests._support.orthanc import write_phantom_series
from tests.test_pacs_listen_receive import _listener, _send

pytestmark = pytest.mark.pacs


def test_a_stop_signal_held_while_a_batch_fails_at_its_end_stops_the_listener(tmp_path, monkeypatch, caplog):
    import pipeline.runner.batch as batch

    uid, files = write_phantom_series(tmp_path / "case", 12, slices=8)
    run = tmp_path / "run"

    def stop_then_disk_full(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # held: the batch's end is being recorded
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "report" / "status.json"))

    monkeypatch.setattr(batch, "build_or_mark_report", stop_then_disk_full)
    replaced = stop_once(str(run), note="ctpipe listen: already stopping\n")  # as ctpipe listen
    stopped: BaseException | None = None
    try:
        opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 3600.0, "ingest.min_slices": 3}
        with caplog.at_level(logging.ERROR, logger="pipeline.pacs"), _listener(run, **opts) as lst:
            datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
            assert _send(lst.port, datasets) == [0] * len(files)
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:  # until the series is quiet and handed to the runner
                    lst.step()
                    time.sleep(0.1)
            except BaseException as exc:  # noqa: BLE001 - the stop is what is checked
                stopped = exc
            assert lst.journal is not None
            still_handed = [r["series_uid"] for r in lst.journal.handed()]
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
    assert isinstance(stopped, KeyboardInterrupt), repr(stopped)
    assert isinstance(stopped.__cause__, CtpipeError) and "No space left" in str(stopped.__cause__), stopped.__cause__
    (logged,) = [r for r in caplog.records if getattr(r, "event", None) == "listen_run_error"]
    assert "stopping, as a stop signal came" in logged.getMessage(), logged.getMessage()
    assert still_handed == [uid]
