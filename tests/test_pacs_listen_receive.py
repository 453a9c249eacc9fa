"""``ctpipe listen`` receiving instances from a real pynetdicom C-STORE client: it files each under the Study and
Series Instance UIDs read from the dataset as received, without decoding it, in every uncompressed transfer syntax
it accepts (a sequence of undefined length before the UIDs included), and it summarises the instances a sender
sent again in one INFO line per series and association, with their count (each one at DEBUG)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence

from pipeline.config import load_config
from pipeline.pacs import Listener
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import HOST, free_port, write_phantom_series

pytestmark = pytest.mark.pacs

AET = "CTPIPE_R"
SYNTAXES = ["1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.2", "1.2.840.10008.1.2.1.99"]


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[str, list[Path]]:
    return write_phantom_series(tmp_path_factory.mktemp("receive") / "case", 11, slices=8)


def _listener(run: Path, **extra: object) -> Listener:
    opts = {
        "pacs.ae_title": AET,
        "pacs.port": free_port(),
        "pacs.allowed_aets": ["MODALITY"],
        "pacs.quiet_period_s": 3600.0,
        "report.enabled": False,
        "workers": 0,
        **extra,
    }
    return Listener(run, load_config(overrides=opts, environ={}), stages=[IngestStage(), WriteStage()], poll_s=0.1)


def _limit_clock(monkeypatch) -> dict[str, float]:
    """The clock the listener measures ``pacs.series_limit_s`` on (``pipeline.pacs.handover.now``): the real one,
    ahead by ``["ahead"]`` seconds once a test sets it. A test that checks a series is held before the limit and
    quarantined after it sets a limit no transfer reaches (3600 s) and then moves this clock past it, instead of a
    limit of a few seconds that a slow transfer on a loaded machine can run past before the first check."""
    from pipeline.pacs import handover, ledger

    shift = {"ahead": 0.0}
    monkeypatch.setattr(handover, "now", lambda: ledger.now() + shift["ahead"])
    return shift


def _until_cut(run: Path, uid: str, timeout_s: float = 60.0) -> str:
    """The note of series ``uid`` in the listener's ledger once it says the sender was cut off (the listener has
    seen the association end, dropped or aborted): a test that steps the listener before then, with a quiet period of
    0.2 s, may find what arrived quiet and without a gap and hand it on as complete before that end is noticed."""
    import time

    ledger = run / "pacs" / "ledger.sqlite"
    deadline = time.monotonic() + timeout_s
    while True:
        note = ""
        if ledger.is_file():
            with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
                row = db.execute("SELECT note FROM series WHERE series_uid = ? ORDER BY generation DESC", (uid,)).fetchone()
            note = str(row[0] or "") if row else ""
        if "cut off" in note or time.monotonic() > deadline:
            return note
        time.sleep(0.05)


def _send(port: int, datasets: list[tuple[Dataset, str]], *, end: str = "release") -> list[int]:
    """C-STORE each dataset in its transfer syntax, in one association; the statuses. ``end``: how the association
    ends once every C-STORE is answered: ``release`` (A-RELEASE), ``abort`` (an A-ABORT from the sender, as some
    modalities and routers end every association) or ``drop`` (the connection closed with neither: a sender that
    crashed or lost the network)."""
    import socket

    from pynetdicom import AE

    ae = AE(ae_title="MODALITY")
    for syntax in dict.fromkeys(ts for _, ts in datasets):
        ae.add_requested_context("1.2.840.10008.5.1.4.1.1.2", [syntax])
    assoc = ae.associate(HOST, port, ae_title=AET)
    assert assoc.is_established
    try:
        statuses = []
        for read, syntax in datasets:
            ds = Dataset()  # the elements alone, encoded by pynetdicom in ``syntax``
            ds.update(read)
            ds.file_meta = FileMetaDataset()
            ds.file_meta.TransferSyntaxUID = syntax
            statuses.append(int(assoc.send_c_store(ds).Status))
        return statuses
    finally:
        if end == "release":
            assoc.release()
        elif end == "abort":
            assoc.abort()
        else:  # the TCP connection closed under the association, no PDU sent
            assoc.dul.socket.socket.shutdown(socket.SHUT_RDWR)
            assoc.kill()
        ae.shutdown()


def _abort_mid_instance(port: int, datasets: list[Dataset]) -> None:
    """C-STORE each of ``datasets`` but the last, in explicit VR little endian, in one association; then the last
    one's command and the first fragments of its dataset only, and the sender's A-ABORT (an A-ABORT in the middle of
    an instance: the sender was cut off, it did not end its sending)."""
    import time
    from io import BytesIO

    from pynetdicom import AE
    from pynetdicom.dimse_messages import C_STORE_RQ
    from pynetdicom.dimse_primitives import C_STORE
    from pynetdicom.dsutils import encode
    from pynetdicom.pdu import P_DATA_TF

    ae = AE(ae_title="MODALITY")
    ae.add_requested_context("1.2.840.10008.5.1.4.1.1.2", ["1.2.840.10008.1.2.1"])
    assoc = ae.associate(HOST, port, ae_title=AET)
    assert assoc.is_established
    try:
        for read in datasets[:-1]:
            assert int(assoc.send_c_store(read).Status) == 0
        ds = datasets[-1]
        req = C_STORE()
        req.MessageID, req.Priority = 99, 2
        req.AffectedSOPClassUID, req.AffectedSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
        req.DataSet = BytesIO(encode(ds, False, True))
        msg = C_STORE_RQ()
        msg.primitive_to_message(req)
        fragments = list(msg.encode_msg(assoc.accepted_contexts[0].context_id, 4096))
        assert len(fragments) > 2
        for fragment in fragments[:2]:
            assoc.dul.socket.send(P_DATA_TF(fragment).encode())
        time.sleep(0.3)
    finally:
        assoc.abort()
        ae.shutdown()


def _with_sequence(ds: Dataset) -> Dataset:
    """``ds`` with a Referenced Image Sequence of undefined length, its items too, before the UIDs."""
    item = Dataset()
    item.ReferencedSOPClassUID = ds.SOPClassUID
    item.ReferencedSOPInstanceUID = "1.2.3.999"
    item.SeriesInstanceUID = "1.2.3.998"  # inside an item: not the instance's series
    ds.ReferencedImageSequence = Sequence([item])
    ds["ReferencedImageSequence"].is_undefined_length = True
    item.is_undefined_length_sequence_item = True
    return ds


def test_instances_filed_under_their_uids_in_every_syntax_without_decoding_the_dataset(series, tmp_path, monkeypatch):
    import pynetdicom.events

    uid, files = series
    decoded: list[int] = []
    real_decode = pynetdicom.events.decode

    def counting_decode(*args, **kwargs):  # pynetdicom's own decode, counted
        decoded.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(pynetdicom.events, "decode", counting_decode)
    datasets = [(_with_sequence(pydicom.dcmread(f)), SYNTAXES[i % len(SYNTAXES)]) for i, f in enumerate(files)]
    study = str(datasets[0][0].StudyInstanceUID)
    run = tmp_path / "run"
    with _listener(run) as lst:
        assert _send(lst.port, datasets) == [0] * len(files)
    assert decoded == []  # the UIDs came from the encoded dataset
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT series_uid, study_uid, n_instances FROM series").fetchall() == [(uid, study, len(files))]
        assert db.execute("SELECT COUNT(*) FROM instances WHERE series_uid = ?", (uid,)).fetchone()[0] == len(files)
    stored = sorted((run / "pacs" / "incoming" / uid / "g1").glob("*.dcm"))
    assert len(stored) == len(files)
    for path in stored:
        ds = pydicom.dcmread(path)
        assert str(ds.SeriesInstanceUID) == uid and ds.file_meta.TransferSyntaxUID in SYNTAXES


def test_duplicates_summarised_in_one_info_line_per_series_and_association(series, tmp_path, caplog):
    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    run = tmp_path / "run"
    with caplog.at_level(logging.DEBUG, logger="pipeline.pacs.listener"), _listener(run) as lst:
        assert _send(lst.port, datasets) == [0] * len(files)
        assert _send(lst.port, datasets) == [0] * len(files)  # sent again: answered success, not stored again
    dup = [r for r in caplog.records if getattr(r, "event", None) == "listen_duplicate"]
    info = [r for r in dup if r.levelno == logging.INFO]
    assert len(info) == 1, [r.getMessage() for r in info]
    line = info[0].getMessage()
    assert f"{len(files)} instance(s) of series {uid}" in line and "MODALITY" in line and "not stored again" in line
    detail = [r for r in caplog.records if getattr(r, "event", None) == "listen_duplicate_instance"]
    assert len(detail) == len(files) and all(r.levelno == logging.DEBUG for r in detail)


def _mismatched_file(read: Dataset, path: Path, *, sop_class: str | None = None, sop_uid: str | None = None) -> Path:
    """``read`` written as a Part 10 file whose File Meta names another SOP class or instance than the dataset (an
    edit of the dataset that left the meta behind): pynetdicom, sending the file as it is, puts the meta's UIDs in the
    C-STORE request (Affected SOP Class / Instance UID) and the dataset's bytes unchanged after it."""
    from pydicom.filebase import DicomFileLike
    from pydicom.filewriter import write_dataset, write_file_meta_info

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class or read.SOPClassUID
    meta.MediaStorageSOPInstanceUID = sop_uid or read.SOPInstanceUID
    meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
    with path.open("wb") as fh:  # written element by element: pydicom's save_as would put the dataset's UIDs in the meta
        fh.write(b"\x00" * 128 + b"DICM")
        out = DicomFileLike(fh)
        write_file_meta_info(out, meta)
        out.is_little_endian, out.is_implicit_VR = True, False
        write_dataset(out, read)
    return path


def _send_files(port: int, paths: list[Path]) -> list[Dataset]:
    """C-STORE each file as it is (pynetdicom's chunked sending: the request's UIDs from its File Meta); the
    responses."""
    from pynetdicom import AE, _config

    ae = AE(ae_title="MODALITY")
    for cls in ("1.2.840.10008.5.1.4.1.1.2", "1.2.840.10008.5.1.4.1.1.2.1"):
        ae.add_requested_context(cls, ["1.2.840.10008.1.2.1"])
    was, _config.STORE_SEND_CHUNKED_DATASET = _config.STORE_SEND_CHUNKED_DATASET, True
    assoc = ae.associate(HOST, port, ae_title=AET)
    assert assoc.is_established
    try:
        return [assoc.send_c_store(p) for p in paths]
    finally:
        _config.STORE_SEND_CHUNKED_DATASET = was
        assoc.release()
        ae.shutdown()


@pytest.mark.parametrize("decode", [False, True], ids=["scan", "full-decode"])
def test_an_instance_whose_dataset_does_not_match_the_request_is_refused_and_not_spooled(
    series, tmp_path, caplog, monkeypatch, decode
):
    """As dcmtk's storescp: a dataset whose SOP Instance UID or SOP Class UID is not the C-STORE request's Affected
    one is answered 0xA900 (Data Set does not match SOP Class), naming the element, and nothing of it is kept; the
    warning names both UIDs and the sender. The instances that match are stored as usual."""
    if decode:  # the dataset the scan of the encoded bytes cannot read: decoded in full, checked the same
        monkeypatch.setattr("pipeline.pacs.listener.read_uids", lambda raw, ts: None)
    uid, files = series
    good, wrong_uid, wrong_class = (pydicom.dcmread(f) for f in files[:3])
    paths = [
        _mismatched_file(good, tmp_path / "good.dcm"),
        _mismatched_file(wrong_uid, tmp_path / "uid.dcm", sop_uid="1.2.826.0.1.3680043.8.498.1"),
        _mismatched_file(wrong_class, tmp_path / "class.dcm", sop_class="1.2.840.10008.5.1.4.1.1.2.1"),
    ]
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="pipeline.pacs.listener"), _listener(run) as lst:
        answers = _send_files(lst.port, paths)
    assert [int(a.Status) for a in answers] == [0x0000, 0xA900, 0xA900]
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        kept = [r[0] for r in db.execute("SELECT sop_uid FROM instances")]
    assert kept == [str(good.SOPInstanceUID)]
    stored = [p.name for p in (run / "pacs" / "incoming").rglob("*.dcm")]
    assert stored == [f"{good.SOPInstanceUID}.dcm"]
    lines = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "listen_mismatch"]
    assert len(lines) == 2, lines
    assert "1.2.826.0.1.3680043.8.498.1" in lines[0] and str(wrong_uid.SOPInstanceUID) in lines[0]
    assert "SOPInstanceUID" in lines[0] and "MODALITY" in lines[0] and "0xA900" in lines[0]
    assert "SOPClassUID 1.2.840.10008.5.1.4.1.1.2," in lines[1] and "Class UID 1.2.840.10008.5.1.4.1.1.2.1;" in lines[1]
    assert [r.get("OffendingElement") for r in answers[1:]] == [0x00080018, 0x00080016]
    assert "SOPInstanceUID" in answers[1].ErrorComment and len(answers[1].ErrorComment) <= 64


def test_a_series_whose_sender_was_cut_off_is_not_taken_as_complete_when_quiet(series, tmp_path, caplog):
    """A sender whose association ends without a release (it stopped or lost the network) after the first slices of
    a series: what it sent has no gap, yet it is not the whole series. The listener says so (sender, series, count)
    and waits for the rest instead of handing the series on after the quiet period; once the sender sends the series
    again on an association it releases, the series is handed on."""
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    run = tmp_path / "run"
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 3600.0, "ingest.min_slices": 3}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        assert _send(lst.port, datasets[:4], end="drop") == [0] * 4
        deadline = time.monotonic() + 60
        while not [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # past the quiet period
        assert lst.step() == []  # not handed on: the sender was cut off
        cut = [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
        assert len(cut) == 1 and cut[0].levelno == logging.WARNING
        line = cut[0].getMessage()
        assert "MODALITY" in line and uid in line and "4 instance(s)" in line and "pacs.series_limit_s" in line
        assert _send(lst.port, datasets) == [0] * len(files)  # sent again, whole, and released
        deadline = time.monotonic() + 60
        while not (handed := lst.step()) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert [r["series_uid"] for r in handed] == [uid]
    assert len([r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]) == 1


def test_a_cut_off_series_never_sent_again_is_quarantined_not_published_and_a_full_resend_is_processed(series, tmp_path, caplog):
    """A sender cut off after the first slices of a series (no gap in what arrived) that never sends it again: after
    pacs.series_limit_s the series is not published as a done case but quarantined, the reason (sender, instances
    received, when it was cut off, the fix) in the listener's outcome, the run's quarantine file and the listener's
    ledger; the whole series sent later is processed as a done case."""
    import json
    import time

    from pipeline.runner import open_run

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    run = tmp_path / "run"
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 1.0, "ingest.min_slices": 3}
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(run, **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets[:4], end="drop") == [0] * 4
        assert "cut off" in _until_cut(run, uid)
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
        assert len(outcomes) == 1, outcomes
        first = outcomes[0]
        assert first.status == "quarantined", first.line()
        for part in ("PartialSeriesError", "MODALITY", "4 instance(s)", "cut off", "UTC", "send the series again"):
            assert part in str(first.reason), (part, first.reason)
        quarantine = json.dumps(json.loads((run / "quarantine" / f"{first.case_id}.json").read_text()))
        assert "PartialSeriesError" in quarantine and "4 instance(s)" in quarantine
        assert not (run / "cases" / str(first.case_id)).exists()  # nothing of it published
        assert _send(lst.port, datasets) == [0] * len(files)  # the whole series, released
        deadline = time.monotonic() + 60
        while len(outcomes) < 2 and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert len(outcomes) == 2, [o.line() for o in outcomes]
    assert outcomes[1].status == "done" and outcomes[1].n_instances == len(files), outcomes[1].line()
    cases = open_run(run).cases
    assert cases.set_index("case_id").loc[outcomes[1].case_id, "status"] == "done"
    with sqlite3.connect(f"file:{run / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT generation, outcome, note FROM series WHERE series_uid = ? ORDER BY generation", (uid,))
        ledger = rows.fetchall()
    assert ledger[0][1] == "failed" and "cut off" in ledger[0][2] and "4 instance(s)" in ledger[0][2], ledger
    assert ledger[-1][1] == "done", ledger


def test_a_series_cut_off_after_its_last_instance_and_sent_again_whole_is_processed(series, tmp_path):
    """The connection dropped without a release after every instance had been stored (a network drop before the
    release): quarantined after pacs.series_limit_s, as it is not known whole.
    The sender sends it again on an association it releases: every instance is a duplicate (nothing new is stored),
    and the series, now known whole, is processed as a done case (was: quarantined for good)."""
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 1.0, "ingest.min_slices": 3}
    outcomes: list = []
    with _listener(tmp_path / "run", **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets, end="drop") == [0] * len(files)
        assert "cut off" in _until_cut(tmp_path / "run", uid)
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
        assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
        assert _send(lst.port, datasets) == [0] * len(files)  # every one received before, released this time
        deadline = time.monotonic() + 60
        while len(outcomes) < 2 and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert len(outcomes) == 2, [o.line() for o in outcomes]
    assert outcomes[1].status == "done" and outcomes[1].case_id == outcomes[0].case_id, outcomes[1].line()


def test_a_whole_series_from_a_sender_that_ends_every_association_with_an_abort_is_processed(series, tmp_path, caplog):
    """Some modalities and routers end every association with an A-ABORT once each C-STORE has been answered, never
    an A-RELEASE. The series they send whole (quiet for pacs.quiet_period_s, no gap) is processed as a done case, not
    held as cut off and quarantined after pacs.series_limit_s (was: every series of such a sender quarantined unless
    it was sent again with a release). The abort is said at INFO, not as a cut-off warning."""
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 1.0, "ingest.min_slices": 3}
    outcomes: list = []
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(tmp_path / "run", **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, datasets, end="abort") == [0] * len(files)
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
    assert not [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
    ended = [r for r in caplog.records if getattr(r, "event", None) == "listen_aborted"]
    assert len(ended) == 1 and "A-ABORT" in ended[0].getMessage() and "MODALITY" in ended[0].getMessage(), ended
    with sqlite3.connect(f"file:{tmp_path / 'run' / 'pacs' / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT outcome FROM series WHERE series_uid = ?", (uid,)).fetchall() == [("done",)]


def test_a_sender_that_aborts_mid_instance_leaves_its_series_held_as_cut_off(series, tmp_path, caplog):
    """An A-ABORT that arrives while an instance is still being received (its first PDU in, the rest never sent): the
    sender did not end its sending after the last answered instance, it was cut off; the series is held as cut off,
    not processed when quiet."""
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 3600.0, "ingest.min_slices": 3}
    with caplog.at_level(logging.INFO, logger="pipeline.pacs.listener"), _listener(tmp_path / "run", **opts) as lst:
        _abort_mid_instance(lst.port, [ds for ds, _ in datasets[:5]])
        deadline = time.monotonic() + 60
        while not [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # past the quiet period
        assert lst.step() == []
    cut = [r for r in caplog.records if getattr(r, "event", None) == "listen_cut"]
    assert len(cut) == 1 and "4 instance(s)" in cut[0].getMessage(), [r.getMessage() for r in cut]


def test_a_cut_off_series_with_a_gap_keeps_both_facts_in_its_note_and_quarantine_reason(series, tmp_path, monkeypatch):
    """A sender cut off mid-series after sending slices with one missing between them: the series' note in the
    listener's ledger says both that the sender was cut off (who, when, how many) and that slices are missing (was:
    the gap's note replaced the cut-off one), before and after it is quarantined once pacs.series_limit_s is over."""
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    sent = datasets[:3] + datasets[4:6]  # the fourth slice never sent
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 3600.0, "ingest.min_slices": 3}
    ledger = tmp_path / "run" / "pacs" / "ledger.sqlite"
    clock = _limit_clock(monkeypatch)

    def note() -> str:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
            return str(db.execute("SELECT note FROM series WHERE series_uid = ?", (uid,)).fetchone()[0])

    outcomes: list = []
    with _listener(tmp_path / "run", **opts) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, sent, end="drop") == [0] * len(sent)
        deadline = time.monotonic() + 60
        while "cut off" not in (note() or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)  # past the quiet period, before the limit
        assert lst.step() == []
        waiting = note()
        assert "sender cut off" in waiting and "5 instance(s)" in waiting, waiting
        assert "MissingSliceError" in waiting, waiting
        clock["ahead"] = 3600.0  # the limit is over
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    final = note()
    assert "sender cut off" in final and "MissingSliceError" in final, final


def test_a_cut_off_series_with_a_gap_is_quarantined_with_both_facts_in_its_outcome_and_quarantine_file(series, tmp_path):
    """The runner's quarantine of a cut-off series whose slices also have a gap says both facts, as the listener's
    ledger does: the gap discovery found (MissingSliceError, which slices) and that the sender was cut off (who, how
    many instances, when; fix: send the series again), in the listener's outcome line and RUN_DIR/quarantine/ (was:
    the gap alone, the cut-off lost, so the fix read as a modality that skipped a slice)."""
    import json
    import time

    uid, files = series
    datasets = [(pydicom.dcmread(f), "1.2.840.10008.1.2.1") for f in files]
    sent = datasets[:3] + datasets[4:6]  # the fourth slice never sent
    run = tmp_path / "run"
    outcomes: list = []
    with _listener(run, **{"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 1.0, "ingest.min_slices": 3}) as lst:
        lst.on_series = outcomes.append
        assert _send(lst.port, sent, end="drop") == [0] * len(sent)
        assert "cut off" in _until_cut(run, uid)
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert [o.status for o in outcomes] == ["quarantined"], [o.line() for o in outcomes]
    line = outcomes[0].line()
    record = json.loads((run / "quarantine" / f"{outcomes[0].case_id}.json").read_text())
    for text in (line, json.dumps(record)):
        for part in ("MissingSliceError", "cut off", "MODALITY", "5 instance(s)", "UTC", "send the series again"):
            assert part in text, (part, text)


def test_dcmtk_storescu_ending_with_an_abort_has_its_series_processed(series, tmp_path):
    """dcmtk's ``storescu --abort`` (every instance sent, then an A-ABORT instead of a release), as some modalities
    and routers end their associations: the series is processed as a done case once quiet."""
    import shutil
    import subprocess
    import time

    exe = shutil.which("storescu")
    if exe is None:
        pytest.skip("dcmtk's storescu not installed: run `bash scripts/install_pacs_tools.sh`")
    uid, files = series
    opts = {"pacs.quiet_period_s": 0.2, "pacs.series_limit_s": 1.0, "ingest.min_slices": 3}
    outcomes: list = []
    with _listener(tmp_path / "run", **opts) as lst:
        lst.on_series = outcomes.append
        cmd = [exe, "--abort", "-aet", "MODALITY", "-aec", AET, HOST, str(lst.port), *map(str, files)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 60
        while not outcomes and time.monotonic() < deadline:
            lst.step()
            time.sleep(0.1)
    assert [(o.status, o.n_instances) for o in outcomes] == [("done", len(files))], [o.line() for o in outcomes]
