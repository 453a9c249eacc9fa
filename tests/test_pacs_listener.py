"""ctpipe listen against real DICOM senders: Orthanc's C-STORE pushes, and pynetdicom's C-STORE client (with Orthanc's
AE title) where a test needs a partial or broken send. Each pushed series processed exactly once (duplicates, restarts,
kill -9 mid-transfer), unknown AE titles and non-CT instances refused, series that never complete reported,
received files removed once processed (pacs.keep_received), leftovers of a crash cleaned on restart, the
origin of each case in the run store, and the model worker started once for series arriving at different times.

The in-process tests run the listener with the runner's real ingest and write stages (no model: they
test receiving, not detection); the slow test runs the ``ctpipe listen`` command with the full pipeline.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from pipeline.config import load_config
from pipeline.errors import PacsAddressError
from pipeline.pacs import Listener
from pipeline.runner import open_run
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import SetupCountingStage, cstore, free_port, write_phantom_series
from tests.test_pacs_listen_receive import _limit_clock

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs

AET = "CTPIPE_L"


@pytest.fixture(scope="module")
def series(orthanc, tmp_path_factory):
    """A phantom series stored in Orthanc: (SeriesInstanceUID, files)."""
    uid, files = write_phantom_series(tmp_path_factory.mktemp("listen") / "case", 3)
    orthanc.upload(files)
    return uid, files


def _listener(orthanc, run: Path, *, stages=None, **extra) -> Listener:
    port = free_port()
    orthanc.add_modality("ctpipe-listen", AET, port)
    opts = {
        "pacs.ae_title": AET,
        "pacs.port": port,
        "pacs.allowed_aets": ["ORTHANC"],
        "pacs.quiet_period_s": 1.0,
        "pacs.series_limit_s": 60.0,
        "report.enabled": False,
        "workers": 0,
    }
    opts.update(extra)
    stages = stages or [IngestStage(), WriteStage()]
    return Listener(run, load_config(overrides=opts, environ={}), stages=stages, poll_s=0.1)


def _until_processed(listener: Listener, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = listener.step()
        if done:
            return done
        time.sleep(0.2)
    raise AssertionError("no series was handed to the runner in time")


def _journal(run: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def test_pushed_series_processed_once_even_when_sent_twice(orthanc, series, tmp_path):
    """pacs.keep_received: all keeps the received files; a resend after processing is not stored again."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(orthanc, run, **{"pacs.keep_received": "all"}) as lst:
        orthanc.push(uid, "ctpipe-listen")
        orthanc.push(uid, "ctpipe-listen")  # the modality sends it again: duplicates are not stored twice
        done = _until_processed(lst)
        assert [(r["series_uid"], r["generation"], r["n_instances"]) for r in done] == [(uid, 1, len(files))]
        orthanc.push(uid, "ctpipe-listen")  # after processing: still nothing new
        time.sleep(1.3)
        assert lst.step() == []
    cases = open_run(run).cases
    assert list(cases.series_uid) == [uid] and list(cases.status) == ["done"]
    assert _journal(run, "SELECT state, n_instances, outcome FROM series") == [("processed", len(files), "done")]
    assert _journal(run, "SELECT COUNT(*) FROM instances") == [(len(files),)]
    folder = Path(_journal(run, "SELECT folder FROM series")[0][0])
    assert sorted(p.stem for p in folder.glob("*.dcm")) == sorted(str(pydicom.dcmread(f).SOPInstanceUID) for f in files)


def test_received_files_removed_once_processed_origin_recorded_resend_not_processed_again(orthanc, series, tmp_path, caplog):
    """The default pacs.keep_received (none): the series' files go once its case is published; the run store
    says where the case came from; the same series sent again is stored again but not processed again, and the log
    says it was sent again (not that it grew)."""
    uid, files = series
    study = str(pydicom.dcmread(files[0]).StudyInstanceUID)
    run = tmp_path / "run"
    with _listener(orthanc, run) as lst:
        orthanc.push(uid, "ctpipe-listen")
        _until_processed(lst)
        folder = Path(_journal(run, "SELECT folder FROM series")[0][0])
        assert not folder.exists() and not (run / "pacs" / "incoming" / uid).exists()
        assert _journal(run, "SELECT removed_at IS NOT NULL FROM series") == [(1,)]
        attempts = len(open_run(run).stages)
        with caplog.at_level(logging.INFO, logger="pipeline.pacs.journal"):
            orthanc.push(uid, "ctpipe-listen")  # the files are gone: stored again, a case the run store has done
            again = _until_processed(lst)
        said = [r.getMessage() for r in caplog.records if r.name == "pipeline.pacs.journal"]
        assert not any("grew" in m for m in said), said
        assert any(f"series {uid} sent again" in m and "generation 2" in m for m in said), said
        assert [(r["generation"], r["n_instances"]) for r in again] == [(2, len(files))]
    res = open_run(run)
    assert len(res.stages) == attempts, "the resent series must not be processed again"
    (case,) = res.cases.itertuples()
    assert (case.status, case.origin, case.origin_via) == ("done", "C-STORE from AE ORTHANC", "c-store")
    assert (case.origin_series_uid, case.origin_study_uid) == (uid, study)
    assert _journal(run, "SELECT generation, outcome, removed_at IS NOT NULL FROM series ORDER BY generation") == [
        (1, "done", 1),
        (2, "done", 1),
    ]
    assert not (run / "pacs" / "incoming").exists() or not any((run / "pacs" / "incoming").iterdir())


def test_model_worker_started_once_for_series_arriving_at_different_times(orthanc, series, tmp_path):
    """With worker processes, the listener keeps them (and the model they load) from batch to batch."""
    uid, files = series
    other, other_files = write_phantom_series(tmp_path / "other", 4)
    counter = SetupCountingStage(tmp_path / "setups.txt")
    run = tmp_path / "run"
    stages = [IngestStage(), counter, WriteStage()]
    with _listener(orthanc, run, stages=stages, workers=1) as lst:
        assert cstore(files, lst.port, called=AET) == [0] * len(files)
        assert [r["series_uid"] for r in _until_processed(lst, 60)] == [uid]
        time.sleep(1.5)  # the second series arrives later, in a batch of its own
        assert cstore(other_files, lst.port, called=AET) == [0] * len(other_files)
        assert [r["series_uid"] for r in _until_processed(lst, 60)] == [other]
        assert lst.batches == 2
        workers_pid = counter.setups()
    assert len(workers_pid) == 1, f"the model stage was set up {len(workers_pid)} times: {workers_pid}"
    cases = open_run(run).cases
    assert sorted(cases.series_uid) == sorted([uid, other]) and set(cases.status) == {"done"}
    assert set(open_run(run).stages.query("stage == 'count_setups'").worker) == {"model-cpu"}


def test_unknown_ae_titles_rejected_and_non_ct_refused_with_a_status(orthanc, series, tmp_path, caplog):
    _, files = series
    mr = tmp_path / "mr.dcm"
    ds = pydicom.dcmread(files[0])
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.4"  # MR Image Storage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.Modality = "MR"
    ds.save_as(mr)
    with _listener(orthanc, tmp_path / "run") as lst:
        with caplog.at_level(logging.WARNING, logger="pipeline.pacs.listener"):
            assert cstore(files[:1], lst.port, calling="INTRUDER", called=AET) is None  # association rejected
            assert cstore(files[:1], lst.port, calling="ORTHANC", called="OTHERNODE") is None  # addressed elsewhere
        rejected = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "listen_rejected"]
        assert len(rejected) == 2, rejected
        assert "'INTRUDER' is not among pacs.allowed_aets" in rejected[0]
        assert f"called AE title 'OTHERNODE' is not this listener's '{AET}'" in rejected[1]
        assert cstore([mr], lst.port, calling="ORTHANC", called=AET) == [0x0122]  # SOP class not supported
        assert cstore(files[:2], lst.port, calling="ORTHANC", called=AET) == [0, 0]
    assert _journal(tmp_path / "run", "SELECT COUNT(*) FROM instances") == [(2,)]
    with pytest.raises(PacsAddressError, match="allowed_aets is empty"):
        Listener(tmp_path / "run2", load_config(environ={}))
    with _listener(orthanc, tmp_path / "run3", **{"pacs.check_called_aet": False}) as lst:  # the check turned off
        assert cstore(files[:1], lst.port, calling="ORTHANC", called="OTHERNODE") == [0]


def test_restart_keeps_what_was_received_and_processes_it_once(orthanc, series, tmp_path):
    """The listener stops (as after a crash) with half a series received; the sender sends all of it again."""
    uid, files = series
    run = tmp_path / "run"
    with _listener(orthanc, run, **{"pacs.quiet_period_s": 2.0}) as first:
        assert cstore(files[:8], first.port, called=AET) == [0] * 8
    # leftovers of a crash: a write cut short (never acknowledged), a folder created but never recorded
    g1 = run / "pacs" / "incoming" / uid / "g1"
    (g1 / ".cut-short.dcm.abcd1234.tmp").write_bytes(b"\0" * 100)
    (run / "pacs" / "incoming" / uid / "g7").mkdir()
    (run / "pacs" / "incoming" / "1.2.3.4" / "g1").mkdir(parents=True)
    with _listener(orthanc, run, **{"pacs.quiet_period_s": 2.0}) as second:
        assert sorted(p.name for p in g1.iterdir()) == sorted(f"{pydicom.dcmread(f).SOPInstanceUID}.dcm" for f in files[:8])
        assert sorted(p.name for p in (run / "pacs" / "incoming").iterdir()) == [uid]
        assert [p.name for p in (run / "pacs" / "incoming" / uid).iterdir()] == ["g1"]
        time.sleep(1.0)
        assert second.step() == []  # the quiet period starts again at the restart
        assert cstore(files, second.port, called=AET) == [0] * len(files)
        done = _until_processed(second)
        assert [(r["generation"], r["n_instances"]) for r in done] == [(1, len(files))]
    cases = open_run(run).cases
    assert list(cases.status) == ["done"] and list(cases.series_uid) == [uid]


@pytest.mark.parametrize("keep", ["all", "none"])
def test_series_that_grows_after_processing_is_a_new_generation(orthanc, series, tmp_path, keep):
    """Kept files: the new instance alone makes generation 2 whole; removed files: the sender sends the series again."""
    uid, files = series
    run = tmp_path / "run"
    extra = tmp_path / "extra.dcm"
    ds = pydicom.dcmread(files[-1])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    last, before = (float(v) for v in (ds.ImagePositionPatient[2], pydicom.dcmread(files[-2]).ImagePositionPatient[2]))
    ds.ImagePositionPatient[2] = last + (last - before)
    ds.InstanceNumber = len(files) + 1
    ds.save_as(extra)
    with _listener(orthanc, run, **{"pacs.keep_received": keep}) as lst:
        assert cstore(files, lst.port, called=AET) == [0] * len(files)
        _until_processed(lst)
        resend = [extra] if keep == "all" else [*files[:5], extra, *files[5:]]
        assert cstore(resend, lst.port, called=AET) == [0] * len(resend)
        done = _until_processed(lst)
        assert [(r["generation"], r["n_instances"]) for r in done] == [(2, len(files) + 1)]
    cases = open_run(run).cases
    assert len(cases) == 2 and set(cases.status) == {"done"}


@pytest.mark.slow
def test_series_that_never_completes_is_reported_after_the_limit(orthanc, series, tmp_path):
    _, files = series
    run = tmp_path / "run"
    gap = files[:7] + files[8:]  # slice 8 never arrives
    limit = 6.0  # s: well beyond the transfer and the quiet period, even on a loaded machine
    with _listener(
        orthanc, run, **{"pacs.quiet_period_s": 0.5, "pacs.series_limit_s": limit, "pacs.keep_received": "failed"}
    ) as lst:
        t0 = time.monotonic()
        assert cstore(gap, lst.port, called=AET) == [0] * len(gap)
        time.sleep(0.8)
        assert time.monotonic() - t0 < limit, "the transfer took longer than the series limit: nothing left to test"
        assert lst.step() == []  # quiet, but a slice is missing: it waits
        assert "MissingSliceError" in _journal(run, "SELECT note FROM series")[0][0]
        done = _until_processed(lst, timeout_s=20)
        assert time.monotonic() - t0 >= limit
    (report,) = (run / "pacs" / "incomplete").glob("*.json")
    data = json.loads(report.read_text())
    assert data["instances"] == len(gap) and "MissingSliceError" in data["reason"]
    assert done[0]["note"].startswith(f"incomplete after {limit:g} s")
    cases = open_run(run).cases
    assert list(cases.status) == ["failed"] and list(cases.error_class) == ["MissingSliceError"]
    kept = Path(_journal(run, "SELECT folder FROM series")[0][0])  # keep_received: failed keeps a quarantined series
    assert len(list(kept.glob("*.dcm"))) == len(gap)


@pytest.mark.parametrize("hold_s", [259200.0, 0.0, pytest.param(10.0, marks=pytest.mark.slow)])
def test_missing_slice_sent_after_the_limit_completes_the_quarantined_series(orthanc, series, tmp_path, monkeypatch, hold_s):
    """keep_received none (the default): the incomplete series' files wait pacs.incomplete_keep_s for the missing
    instance, which then completes it as the same case; with no wait they go at once, as keep_received says. The
    series limit and the end of a short wait are reached by moving the clocks the listener measures them on
    (``pipeline.pacs.handover.now``, ``pipeline.pacs.journal.now``) past them, not by sleeping through them."""
    uid, files = series
    run = tmp_path / "run"
    gap = files[:7] + files[8:]
    limit = _limit_clock(monkeypatch)
    opts = {"pacs.quiet_period_s": 0.5, "pacs.series_limit_s": 3600.0, "pacs.incomplete_keep_s": hold_s}
    with _listener(orthanc, run, **opts) as lst:
        assert cstore(gap, lst.port, called=AET) == [0] * len(gap)
        deadline = time.monotonic() + 20
        while "MissingSliceError" not in str(_journal(run, "SELECT note FROM series")) and time.monotonic() < deadline:
            assert lst.step() == []  # quiet, a slice missing: it waits for the limit
            time.sleep(0.1)
        limit["ahead"] = 3600.0  # then the series limit passes
        (first,) = _until_processed(lst, timeout_s=20)
        limit["ahead"] = 0.0
        assert first["note"].startswith("incomplete after")
        (case,) = open_run(run).cases.itertuples()
        assert case.status == "failed" and case.error_class == "MissingSliceError"
        g1 = Path(first["folder"])
        if not hold_s:
            assert not g1.exists()  # nothing waits: removed once quarantined
            return
        assert len(list(g1.glob("*.dcm"))) == len(gap)
        lst._swept = 0.0
        assert lst.step() == [] and g1.exists()  # a sweep before the time is up keeps them
        if hold_s < 60:  # no missing slice within the wait: the next sweep after it removes them
            from pipeline.pacs import journal, ledger

            past = first["last_at"] + hold_s + 0.2  # just after the wait, on the listener's clock
            monkeypatch.setattr(journal, "now", lambda: max(ledger.now(), past))
            lst._swept = 0.0
            assert lst.step() == [] and not g1.exists()
            return
        assert cstore(files[7:8], lst.port, called=AET) == [0]  # the missing slice, later
        done = _until_processed(lst, timeout_s=20)
        assert [(r["generation"], r["n_instances"]) for r in done] == [(2, len(files))]
    cases = open_run(run).cases
    assert len(cases) == 1 and cases.iloc[0]["case_id"] == case.case_id and cases.iloc[0]["status"] == "done"
    assert not g1.exists() and not Path(done[0]["folder"]).exists()  # both generations' files go once it is done
    assert not (run / "pacs" / "incoming" / uid).exists()


@pytest.mark.slow
def test_ctpipe_listen_killed_mid_transfer_then_restarted_processes_the_series_once(orthanc, series, tmp_path):
    """Orthanc pushes to ``ctpipe listen`` (full pipeline); kill -9 mid-transfer; restart; Orthanc sends again."""
    uid, files = series
    run = tmp_path / "run"
    port = free_port()
    orthanc.add_modality("ctpipe-cli", AET, port)
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "listen",
        "--out",
        str(run),
        "--port",
        str(port),
        "--ae-title",
        AET,
        "--allow",
        "ORTHANC",
        "--quiet-period",
        "3",
        "--set",
        "reconstruct.enabled=false",
        "--set",
        "report.enabled=false",
        "--set",
        "detector.write_png=false",
        "--set",
        "detector.postprocess=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTPIPE_")}

    def start(log: Path) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "listening as" in log.read_text():
                return proc
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        raise AssertionError(log.read_text())

    def received() -> int:
        try:
            return _journal(run, "SELECT COUNT(*) FROM instances")[0][0]
        except sqlite3.Error:
            return 0

    first = start(tmp_path / "listen1.log")
    try:
        orthanc.push(uid, "ctpipe-cli", asynchronous=True)
        deadline = time.monotonic() + 30
        while received() < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        n_before = received()
        assert 4 <= n_before < len(files), "the kill should come mid-transfer"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    second = start(tmp_path / "listen2.log")
    try:
        orthanc.push(uid, "ctpipe-cli")  # the sender's retry: the whole series again
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            rows = _journal(run, "SELECT state FROM series")
            if rows and all(r[0] == "processed" for r in rows):
                break
            assert second.poll() is None, (tmp_path / "listen2.log").read_text()
            time.sleep(0.5)
        time.sleep(4)  # a further quiet period: nothing else may be handed over
        rows = _journal(run, "SELECT generation, state, n_instances, outcome FROM series")
        assert rows == [(1, "processed", len(files), "done")], rows
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    cases = open_run(run).cases
    assert list(cases.series_uid) == [uid] and list(cases.status) == ["done"]
    (case,) = (run / "cases").iterdir()
    assert json.loads((case / "findings.json").read_text())["series_uid"] == uid
