"""Results back to a PACS: SR and SEG of completed cases sent by STOW-RS or C-STORE, once, in the
background; failures retried with backoff and recorded; ``ctpipe send --retry-failed``.

Delivery and retries are checked against a real Orthanc (``tests._support.orthanc``). The destinations that
misbehave on purpose (refusing a SOP class, aborting the association mid-case) and the one that receives
around a damaged result file are pynetdicom storage SCPs on 127.0.0.1 defined here (``_PickyStore``,
``_AbortingStore``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pydicom
import pytest

from pipeline.config import load_config
from pipeline.dicom_out import write_dicom_outputs
from pipeline.pacs.ledger import Ledger
from pipeline.pacs.sender import ResultSender, result_files
from pipeline.runner import open_run
from pipeline.runner.store import RunStore
from tests._support.orthanc import SilentServer, free_port
from tests.test_dicom_out_sources import phantom_case

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs


def _completed_case(run: Path, name: str, source_case, *, manifest: bool = True) -> dict[str, str]:
    """A case folder as the runner publishes it, with an SR, a SEG and a CT slice; {kind: SOPInstanceUID}."""
    folder = run / "cases" / name
    paths = write_dicom_outputs(
        folder / "dicom",
        source=source_case.source,
        volume=source_case.volume,
        findings=source_case.findings,
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        nodules=source_case.nodules,
    )
    shutil.copy(next(source_case.dicom.rglob("*.dcm")), folder / "dicom" / "ct_slice.dcm")  # not a result: not sent
    store = RunStore(run)
    try:
        store.upsert_discovered(case_key=f"{name}:k", case_id=name, series_uid=name, fingerprint="f" * 24, source="src")
    finally:
        store.close()
    if manifest:
        _commit(run, name)
    return {k: str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for k, p in paths.items()}


def _commit(run: Path, name: str) -> None:
    """Complete case ``name`` as the runner does: its manifest last, then the run store records it done."""
    (run / "cases" / name / "manifest.json").write_text(json.dumps({"case_id": name}))
    store = RunStore(run)
    try:
        store.complete_case(f"{name}:k", output_dir=f"cases/{name}", findings=[], measurements=[])
    finally:
        store.close()


@pytest.fixture(scope="module")
def source_case(tmp_path_factory):
    return phantom_case(tmp_path_factory.mktemp("sender") / "case", n_nodules=1)


def _cfg(**extra):
    opts = {"pacs.timeout_s": 10.0, "pacs.retries": 0, "pacs.backoff_s": 0.05, "pacs.send_retries": 2}
    opts.update(extra)
    return load_config(overrides=opts, environ={})


def _wait(pred, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_result_files_found_by_sop_class(source_case, tmp_path):
    uids = _completed_case(tmp_path, "c1", source_case)
    found = {uid: cls for _, uid, cls in result_files(tmp_path / "cases" / "c1")}
    assert set(found) == set(uids.values())
    assert set(found.values()) <= {"1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"}


@pytest.mark.parametrize("protocol", ["dicomweb", "dimse"])
def test_results_of_completed_cases_reach_orthanc_once(orthanc, source_case, tmp_path, monkeypatch, protocol):
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    dest = orthanc.dicomweb if protocol == "dicomweb" else orthanc.dimse
    done = _completed_case(run, "c1", source_case)
    in_progress = _completed_case(run, "c2", source_case, manifest=False)
    sender = ResultSender(run, _cfg(), destination=dest, poll_s=0.2).start()
    try:
        assert _wait(lambda: sender.counts().sent == len(done))
        assert all(orthanc.holds(uid) for uid in done.values())
        assert not any(orthanc.holds(uid) for uid in in_progress.values())  # not committed yet: still being written
        _commit(run, "c2")
        assert _wait(lambda: sender.counts().sent == len(done) + len(in_progress))
    finally:
        counts = sender.close()
    assert (counts.sent, counts.pending, counts.failed) == (4, 0, 0)
    assert all(orthanc.holds(uid) for uid in in_progress.values())
    again = ResultSender(run, _cfg(), destination=dest)
    assert again.scan() == 0 and again.send_due() == 0  # nothing is sent twice
    again.close()
    rows = Ledger(run).rows("SELECT state, attempts FROM sent")
    assert rows == [{"state": "sent", "attempts": 1}] * 4


def test_sending_runs_beside_the_caller_while_the_destination_hangs(source_case, tmp_path):
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    with SilentServer() as hang:  # accepts the connection, never answers: each attempt waits pacs.timeout_s
        dest = f"dicomweb+http://127.0.0.1:{hang.port}/dicom-web"
        sender = ResultSender(run, _cfg(**{"pacs.timeout_s": 3.0}), destination=dest, poll_s=0.1).start()
        try:
            # start() has returned while the first send still hangs: sent inline, it would have returned only after
            # every attempt had timed out and been recorded as failed
            assert _wait(lambda: len(hang.accepted) > 0, timeout_s=10)
            counts = sender.counts()
            assert (counts.pending, counts.sent, counts.failed) == (len(uids), 0, 0)
            assert all(r["error"] is None for r in Ledger(run).rows("SELECT error FROM sent"))
        finally:
            sender.close()


def test_failures_retried_with_backoff_recorded_then_sent_by_ctpipe_send(orthanc, source_case, tmp_path, monkeypatch):
    from pipeline.cli import main

    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dead = f"dicomweb+http://127.0.0.1:{free_port()}/dicom-web"
    sender = ResultSender(run, _cfg(), destination=dead, poll_s=0.1).start()
    try:
        assert _wait(lambda: sender.counts().failed == len(uids), timeout_s=30)
    finally:
        sender.close()
    rows = Ledger(run).rows("SELECT state, attempts, error FROM sent")
    assert all(r["state"] == "failed" and r["attempts"] == 3 for r in rows)
    assert all("PacsUnavailableError" in r["error"] and "cannot connect" in r["error"] for r in rows)
    recorded = open_run(run).deliveries  # the failures are in the run store too, with the reason
    assert sorted(recorded.sop_uid) == sorted(uids.values())
    assert set(recorded.state) == {"failed"} and set(recorded.attempts) == {3}
    assert all("cannot connect" in e for e in recorded.error)
    assert main(["send", str(run), "--to", dead, "--set", "pacs.retries=0", "--timeout", "5"]) == 3  # still failed
    assert main(["send", str(run), "--to", orthanc.dicomweb, "--retry-failed", "--timeout", "60"]) == 0
    assert all(orthanc.holds(uid) for uid in uids.values())
    final = open_run(run).deliveries.set_index("destination").state
    assert set(final[orthanc.dicomweb]) == {"sent"} and set(final[dead]) == {"failed"}
    log_text = "\n".join(r["error"] or "" for r in Ledger(run).rows("SELECT error FROM sent"))
    assert orthanc.password not in log_text


#: these storage SCPs answer no C-FIND, so what they answered success for cannot be confirmed (pacs.verify_sent)
_NO_FIND = ["--set", "pacs.verify_sent=false"]


class _PickyStore:
    """A storage SCP on 127.0.0.1 that accepts only the SOP classes given (none: it accepts no context at all)."""

    def __init__(self, sop_classes: list[str]):
        from pynetdicom import AE, evt

        self.ae = AE(ae_title="PICKY")
        for cls in sop_classes or ["1.2.840.10008.5.1.4.1.1.2"]:  # CT only when nothing of ctpipe's results is taken
            self.ae.add_supported_context(cls, ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
        self.received: list[str] = []
        self.port = free_port()
        self.server = self.ae.start_server(("127.0.0.1", self.port), block=False, evt_handlers=[(evt.EVT_C_STORE, self._store)])

    def _store(self, event) -> int:
        self.received.append(str(event.request.AffectedSOPInstanceUID))
        return 0x0000

    def close(self) -> None:
        self.server.shutdown()
        self.ae.shutdown()


def test_destination_refusing_a_result_sop_class_fails_those_files_clearly(source_case, tmp_path, capsys):
    """A PACS that takes the SR but not the SEG: the SR is sent, the SEG recorded failed with the reason, no crash;
    one that takes neither is named as refusing both SOP classes (not as unreachable)."""
    from pipeline.cli import main

    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    sr_only = _PickyStore(["1.2.840.10008.5.1.4.1.1.88.34"])
    try:
        dest = f"dimse://PICKY@127.0.0.1:{sr_only.port}"
        rc = main(["send", str(run), "--to", dest, *_NO_FIND, "--set", "pacs.send_retries=0", "--timeout", "20"])
    finally:
        sr_only.close()
    assert rc == 3 and sr_only.received == [uids["sr"]]
    err = capsys.readouterr().err
    assert "Segmentation Storage not accepted by the destination" in err and "--retry-failed" in err
    state = open_run(run).deliveries.set_index("sop_uid").state
    assert state[uids["sr"]] == "sent" and state[uids["seg"]] == "failed"
    neither = _PickyStore([])
    try:
        dest = f"dimse://PICKY@127.0.0.1:{neither.port}"
        rc = main(["send", str(run), "--to", dest, "--set", "pacs.send_retries=0", "--timeout", "20"])
    finally:
        neither.close()
    assert rc == 3 and neither.received == []
    err = capsys.readouterr().err
    assert "accepts none of the SOP classes offered (Comprehensive 3D SR Storage, Segmentation Storage)" in err
    assert "running and reachable" not in err


def test_ctpipe_send_says_what_to_do_with_files_still_pending(source_case, tmp_path, capsys):
    """A destination that does not answer within --timeout: exit 3, and the files left pending are named with the
    fix (was: only "0 sent, 2 pending, 0 failed")."""
    from pipeline.cli import main

    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = f"dimse://NOBODY@127.0.0.1:{free_port()}"  # nothing listens there: refused at once, retried until --timeout
    rc = main(["send", str(run), "--to", dest, "--timeout", "1", "--set", "pacs.retries=0"])
    captured = capsys.readouterr()
    assert rc == 3 and "0 sent, 2 pending, 0 failed" in captured.out
    assert f"2 result file(s) not sent to {dest} within --timeout 1 s" in captured.err
    assert f"run ctpipe send {run} again once the destination answers" in captured.err


class _AbortingStore(_PickyStore):
    """Takes SR and SEG, one per association: it aborts the association at the second C-STORE request."""

    def _store(self, event) -> int:
        if not hasattr(self, "stores"):
            self.stores: dict[int, int] = {}
        seen = self.stores.get(id(event.assoc), 0)
        self.stores[id(event.assoc)] = seen + 1
        if seen:
            event.assoc.abort()
            return 0xA700
        self.received.append(str(event.request.AffectedSOPInstanceUID))
        return 0x0000


def test_a_destination_that_drops_the_association_mid_case_gets_the_rest_on_a_new_one(source_case, tmp_path):
    from pipeline.cli import main

    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = _AbortingStore(["1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"])
    try:
        rc = main(["send", str(run), "--to", f"dimse://PICKY@127.0.0.1:{dest.port}", *_NO_FIND, "--timeout", "20"])
    finally:
        dest.close()
    assert rc == 0 and sorted(dest.received) == sorted(uids.values())
    deliveries = open_run(run).deliveries
    assert set(deliveries.state) == {"sent"}
    # the file answered is recorded sent at once, the other goes on the next association (no file sent twice)
    assert sorted(deliveries.attempts) == [1, 2]


def test_a_damaged_result_file_fails_for_good_and_the_sender_goes_on(source_case, tmp_path):
    run = tmp_path / "run"
    _completed_case(run, "c1", source_case)
    RunStore(run).close()
    dest = _PickyStore(["1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.66.4"])
    sender = ResultSender(run, _cfg(), destination=f"dimse://PICKY@127.0.0.1:{dest.port}")
    try:
        sender.scan()  # recorded as due; then the file is damaged on disk before it is sent
        next((run / "cases" / "c1" / "dicom").glob("*_sr.dcm")).write_bytes(b"not DICOM any more")
        sender.start()
        assert _wait(lambda: sender.counts().failed >= 1 and not sender.counts().pending)
        assert sender._thread is not None and sender._thread.is_alive()
    finally:
        sender.close()
        dest.close()
    errors = [r["error"] or "" for r in Ledger(run).rows("SELECT error FROM sent WHERE state = 'failed'")]
    assert errors and all("cannot read a result file of the case" in e for e in errors)


def test_a_destination_refusing_the_request_fails_at_once_not_after_every_retry(orthanc, source_case, tmp_path, monkeypatch):
    """Wrong credentials (HTTP 401 from Orthanc) cannot come right by waiting: the files are recorded failed after one
    attempt, with the reason, instead of holding the end of the run through pacs.send_retries backoffs."""
    monkeypatch.setenv("CTPIPE_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("CTPIPE_DICOMWEB_PASSWORD", "not-" + orthanc.password)
    run = tmp_path / "run"
    uids = _completed_case(run, "c1", source_case)
    RunStore(run).close()
    sender = ResultSender(run, _cfg(**{"pacs.backoff_s": 60.0}), destination=orthanc.dicomweb, poll_s=0.1).start()
    try:
        assert _wait(lambda: sender.counts().failed == len(uids), timeout_s=30)  # no 60 s backoff before giving up
    finally:
        sender.close()
    rows = Ledger(run).rows("SELECT state, attempts, error FROM sent")
    assert all(r["state"] == "failed" and r["attempts"] == 1 for r in rows)
    assert all("HTTP 401" in r["error"] and "CTPIPE_DICOMWEB_PASSWORD" in r["error"] for r in rows)
    assert not any(orthanc.holds(uid) for uid in uids.values())


def test_a_destination_that_cannot_be_reached_is_tried_once_per_pass_not_once_per_case(source_case, tmp_path, caplog):
    """Three cases due and the archive down: the pass stops at the first case that cannot reach it (each further case
    would wait pacs.timeout_s for a hanging archive, and log the same error for each of its files); the others stay
    pending, not charged an attempt, and one line says how many wait."""
    import logging

    run = tmp_path / "run"
    cases = [_completed_case(run, f"c{i}", source_case) for i in (1, 2, 3)]
    RunStore(run).close()
    dest = f"dimse://NOBODY@127.0.0.1:{free_port()}"  # nothing listens there
    sender = ResultSender(run, _cfg(), destination=dest)
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.sender"):
        sender.scan()
        assert sender.send_due() == 0
    attempts = {r["case_id"]: r["attempts"] for r in Ledger(run).rows("SELECT case_id, attempts FROM sent")}
    assert attempts == {"c1": 1, "c2": 0, "c3": 0}
    assert sender.counts().pending == sum(len(c) for c in cases)
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING and "attempt 1" in r.getMessage()]
    assert len(failed) == len(cases[0])  # c1's files only
    waiting = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "send_unreachable"]
    assert len(waiting) == 1 and "2 more case(s)" in waiting[0] and dest in waiting[0]
    sender.close()
