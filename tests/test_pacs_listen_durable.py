"""``ctpipe listen``'s promise to a sender: an instance answered Success is on disk, complete, and in the journal
(a restart processes it); one not answered is never kept incomplete.

The listener renames each file before syncing it and writes its journal row while the file is being synced, so
after a crash a file may stand under its name incomplete (the rename reached the disk, the data did not) and a row
may name a file that is incomplete (the row reached the disk first). Neither instance was answered; the restart
removes both. Real pynetdicom C-STORE clients send; a listener process is killed with SIGKILL mid-transfer; the
states a power cut can leave (which SIGKILL cannot) are made by hand in the listener's folder and journal.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pydicom
import pytest

from pipeline.config import load_config
from pipeline.pacs import Listener
from pipeline.pacs import spool as spool_module
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import HOST, cstore, free_port, write_phantom_series

pytestmark = pytest.mark.pacs

AET = "CTPIPE_D"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("durable") / "case", 7)


def _cfg(port: int) -> object:
    opts = {
        "pacs.ae_title": AET,
        "pacs.port": port,
        "pacs.allowed_aets": ["ORTHANC"],
        "pacs.quiet_period_s": 3600.0,
        "report.enabled": False,
        "workers": 0,
    }
    return load_config(overrides=opts, environ={})


def _listener(run: Path) -> Listener:
    return Listener(run, _cfg(free_port()), stages=[IngestStage(), WriteStage()], poll_s=0.1)


def _rows(run: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def _sop(path: Path) -> str:
    return str(pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID)


def test_restart_removes_unanswered_instances_a_power_cut_left_incomplete_and_keeps_the_answered(series, tmp_path, caplog):
    uid, files = series
    run = tmp_path / "run"
    with _listener(run) as lst:
        assert cstore(files[:6], lst.port, called=AET) == [0] * 6
    g1 = run / "pacs" / "incoming" / uid / "g1"
    answered = {p.name: p.read_bytes() for p in g1.glob("*.dcm")}
    assert len(answered) == 6
    # renamed, data not synced, no row: the name reached the disk with part of the content
    renamed = g1 / f"{_sop(files[6])}.dcm"
    renamed.write_bytes(files[6].read_bytes()[:3000])
    # row synced, file not: the row names the full instance, the disk holds a third of it
    full = files[7].read_bytes()
    recorded = g1 / f"{_sop(files[7])}.dcm"
    recorded.write_bytes(full[: len(full) // 3])
    with sqlite3.connect(run / "pacs" / "ledger.sqlite") as db:
        db.execute(
            "INSERT INTO instances (sop_uid, series_uid, generation, sop_class, calling_aet, received_at, size, crc32) "
            "VALUES (?, ?, 1, '1.2.840.10008.5.1.4.1.1.2', 'ORTHANC', 0, ?, ?)",
            (_sop(files[7]), uid, len(full), zlib.crc32(full)),
        )
        db.execute("UPDATE series SET n_instances = 7")
    with caplog.at_level("WARNING", logger="pipeline.pacs"), _listener(run) as again:
        assert {p.name: p.read_bytes() for p in g1.glob("*.dcm")} == answered
        assert sorted(r[0] for r in _rows(run, "SELECT sop_uid FROM instances")) == sorted(p[: -len(".dcm")] for p in answered)
        assert _rows(run, "SELECT n_instances FROM series") == [(6,)]
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "2 instance file(s) never acknowledged removed" in said, said
        assert f"instance {_sop(files[7])} of series {uid}: its file is incomplete" in said, said
        # the sender, told nothing for those two, sends them again
        assert cstore(files[6:8], again.port, called=AET) == [0, 0]
        assert pydicom.dcmread(renamed).PixelData == pydicom.dcmread(files[6]).PixelData
        assert pydicom.dcmread(recorded).PixelData == pydicom.dcmread(files[7]).PixelData
    assert _rows(run, "SELECT n_instances FROM series") == [(8,)]


def test_a_failed_sync_answers_out_of_resources_and_keeps_neither_file_nor_row(series, tmp_path, monkeypatch):
    uid, files = series
    run = tmp_path / "run"
    real = os.fdatasync
    failures = [errno.EIO]

    def fdatasync(fd: int) -> None:
        if failures:
            raise OSError(failures.pop(), "Input/output error")
        real(fd)

    monkeypatch.setattr(spool_module.os, "fdatasync", fdatasync)
    with _listener(run) as lst:
        assert cstore(files[:1], lst.port, called=AET) == [0xA700]
        g1 = run / "pacs" / "incoming" / uid / "g1"
        assert list(g1.iterdir()) == []
        assert _rows(run, "SELECT COUNT(*) FROM instances") == [(0,)]
        assert _rows(run, "SELECT n_instances FROM series") == [(0,)]
        assert cstore(files[:1], lst.port, called=AET) == [0]  # the sender's retry
        assert [p.name for p in g1.iterdir()] == [f"{_sop(files[0])}.dcm"]
        assert _rows(run, "SELECT n_instances FROM series") == [(1,)]


def test_the_same_instance_sent_on_two_associations_at_once_is_stored_once_complete(series, tmp_path):
    uid, files = series
    run = tmp_path / "run"
    with _listener(run) as lst:
        results: list[list[int] | None] = []
        senders = [threading.Thread(target=lambda: results.append(cstore(files, lst.port, called=AET))) for _ in range(3)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(timeout=120)
        assert results == [[0] * len(files)] * 3
        g1 = run / "pacs" / "incoming" / uid / "g1"
        stored = sorted(g1.iterdir())
        assert [p.name for p in stored] == sorted(f"{_sop(f)}.dcm" for f in files)
        for p, f in zip(stored, sorted(files, key=lambda f: f"{_sop(f)}.dcm")):
            assert pydicom.dcmread(p).PixelData == pydicom.dcmread(f).PixelData
        assert _rows(run, "SELECT COUNT(*) FROM instances") == [(len(files),)]
        assert _rows(run, "SELECT n_instances FROM series") == [(len(files),)]


_SERVE = """
import sys, time
from pipeline.config import load_config
from pipeline.pacs import Listener
from pipeline.runner.stages import IngestStage, WriteStage
run, port, aet = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opts = {"pacs.ae_title": aet, "pacs.port": port, "pacs.allowed_aets": ["ORTHANC"], "pacs.quiet_period_s": 3600.0,
        "report.enabled": False, "workers": 0}
Listener(run, load_config(overrides=opts, environ={}), stages=[IngestStage(), WriteStage()]).start()
print("ready", flush=True)
time.sleep(600)
"""


def _send_recording(files: list[Path], port: int, answered: list[tuple[str, int]]) -> None:
    """C-STORE ``files`` one association; ``answered`` gets (SOPInstanceUID, status) of each answer received."""
    from pynetdicom import AE

    ae = AE(ae_title="ORTHANC")
    ae.add_requested_context("1.2.840.10008.5.1.4.1.1.2", ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(HOST, port, ae_title=AET)
    try:
        for f in files:
            ds = pydicom.dcmread(f)
            status = assoc.send_c_store(ds)
            if not status or "Status" not in status:  # the listener is gone
                return
            answered.append((str(ds.SOPInstanceUID), int(status.Status)))
    finally:
        assoc.release() if assoc.is_established else None
        ae.shutdown()


def test_listener_killed_mid_transfer_keeps_every_answered_instance_complete_and_journalled(tmp_path):
    uid, files = write_phantom_series(tmp_path / "case", 8, slices=80)  # long enough to be cut short
    run = tmp_path / "run"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(run), str(port), AET], stdout=subprocess.PIPE, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        answered: list[tuple[str, int]] = []
        sender = threading.Thread(target=_send_recording, args=(files, port, answered))
        sender.start()
        deadline = time.monotonic() + 60
        while len(answered) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        sender.join(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert 5 <= len(answered) < len(files), "the kill should come mid-transfer"
    assert all(status == 0 for _, status in answered)
    sent = {_sop(f): f for f in files}
    with _listener(run):  # the restart: recovery
        g1 = run / "pacs" / "incoming" / uid / "g1"
        kept = {p.stem: p for p in g1.glob("*.dcm")}
        journal = {r[0]: (r[1], r[2]) for r in _rows(run, "SELECT sop_uid, size, crc32 FROM instances")}
        for sop, _ in answered:  # answered Success: present, complete, journalled
            assert sop in kept and sop in journal
            data = kept[sop].read_bytes()
            assert journal[sop] == (len(data), zlib.crc32(data))
            assert pydicom.dcmread(kept[sop]).PixelData == pydicom.dcmread(sent[sop]).PixelData
        assert set(kept) == set(journal)  # nothing unjournalled kept; nothing journalled missing
        assert _rows(run, "SELECT n_instances FROM series") == [(len(kept),)]


def test_senders_are_told_to_send_pdus_of_up_to_a_mebibyte(tmp_path):
    """One PDU per CT slice, not pynetdicom's default 16 382 bytes (32 PDUs for a 512 × 512 slice)."""
    from pynetdicom import AE

    with _listener(tmp_path / "run") as lst:
        ae = AE(ae_title="ORTHANC")
        ae.add_requested_context("1.2.840.10008.1.1")
        assoc = ae.associate(HOST, lst.port, ae_title=AET)
        try:
            assert assoc.is_established
            assert assoc.acceptor.maximum_length == 1_048_576
        finally:
            assoc.release()
            ae.shutdown()
