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
    """(SeriesInstanceUID, StudyInstanceUID) of two phantom series in two studies, stored in Orthanc."""
    import pydicom

    root = tmp_path_factory.mktemp("move-port")
    uids = []
    for seed in (11, 12):
        uid, files = write_phantom_series(root / f"s{seed}", seed)
        orthanc.upload(files)
        uids.append((uid, str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)))
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


def test_a_move_port_in_use_fails_the_run_once_not_once_per_source_and_c_get_sources_still_retrieved(
    orthanc, two_series, tmp_path, caplog
):
    """A nightly run naming one source per study: the port taken is found at the first C-MOVE and said once for the
    run (the later C-MOVE sources are not searched, nor reported each), while a C-GET source, needing no receiver
    port, is retrieved."""
    port = free_port()
    cfg = load_config(overrides={"pacs.move_port": port, "pacs.timeout_s": 10.0, "pacs.retries": 2}, environ={})
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind((cfg.pacs.bind, port))
    busy.listen(1)
    (_, study1), (series2, study2) = two_series
    moves = [f"{orthanc.dimse}?study={study}&retrieve=move" for study in (study1, study2, study1)]
    get = f"{orthanc.dimse}?study={study2}&retrieve=get"
    try:
        with caplog.at_level(logging.INFO):
            res = fetch_sources([*moves, get], run_dir=tmp_path / "run", cfg=cfg)
    finally:
        busy.close()
    assert len(res.failures) == 1, res.failures
    what, kind, msg = res.failures[0]
    assert what == moves[0] and kind == "PacsReceiverError"
    assert "2 later C-MOVE source(s) of this run not searched" in msg and f"{cfg.pacs.bind}:{port}" in msg
    assert "pacs.move_port" in msg and "retrieve=get" in msg
    said = [r for r in caplog.records if getattr(r, "event", "") == "pacs_receiver_failed"]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert res.fetched == 1 and [o["series_uid"] for o in res.origins.values()] == [series2]  # the C-GET source


@pytest.mark.parametrize(
    ("host", "bind", "said"),
    [("pacs.hospital.example", "127.0.0.1", True), ("127.0.0.1", "127.0.0.1", False), ("10.1.2.3", "0.0.0.0", False)],
)
def test_a_c_move_from_another_machine_to_a_receiver_on_loopback_names_pacs_bind(host, bind, said):
    """An archive on another machine cannot reach a receiver that listens on 127.0.0.1 (the default pacs.bind): the
    error of a C-MOVE that delivered nothing names pacs.bind, not only the archive's settings (no traffic here)."""
    from pipeline.errors import PacsRequestError
    from pipeline.pacs.address import parse_destination
    from pipeline.pacs.dimse import DimseArchive

    cfg = load_config(overrides={"pacs.bind": bind}, environ={})
    archive = DimseArchive(parse_destination(f"dimse://PACS@{host}:104"), cfg)
    refused = PacsRequestError("C-MOVE: failure status 0xA801", where=f"dimse://PACS@{host}:104", fix="see its log")
    msg = str(archive._nothing_arrived(refused))
    assert ("pacs.bind" in msg and f"listens on {bind}" in msg and "0.0.0.0" in msg) is said, msg
    assert "pacs.move_port" in msg and "retrieve=get" in msg


def test_a_retrieval_ends_only_once_the_receivers_writes_into_its_folder_are_done(tmp_path, monkeypatch):
    """An instance the archive sent just before a C-MOVE failed (the archive killed mid-series) is still being
    written when the retrieval gives up: leaving the route waits for that write, so that discarding the partial
    folder right after leaves nothing behind (no file landing in a folder being removed)."""
    import threading
    import time

    from pipeline.pacs import scp
    from pipeline.pacs.dimse import MoveReceiver
    from tests._support.orthanc import cstore

    uid, files = write_phantom_series(tmp_path / "src", 13, slices=8)
    writing = threading.Event()
    real_write = scp.write_instance

    def slow_write(*args, **kwargs):
        writing.set()
        time.sleep(0.5)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(scp, "write_instance", slow_write)
    cfg = load_config(overrides={"pacs.move_port": free_port(), "pacs.timeout_s": 10.0}, environ={})
    receiver = MoveReceiver(cfg, archive_aet="ORTHANC")
    dest = tmp_path / "partial"
    dest.mkdir()
    try:
        sender = threading.Thread(target=cstore, args=(files[:1], cfg.pacs.move_port))
        with receiver.route(uid, dest):
            sender.start()
            assert writing.wait(10)
        assert len(list(dest.glob("*.dcm"))) == 1  # written before the route was left, not after
        sender.join(10)
    finally:
        receiver.close()


def test_the_c_move_receiver_refuses_an_instance_whose_dataset_is_not_the_one_requested(tmp_path):
    """An archive whose copy of an instance names another SOP Instance UID in its dataset than in its C-STORE request:
    answered 0xA900, as ctpipe listen and dcmtk's storescp do, and nothing written into the retrieval's folder."""
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.filebase import DicomFileLike
    from pydicom.filewriter import write_dataset, write_file_meta_info
    from pynetdicom import AE, _config

    from pipeline.pacs.dimse import MoveReceiver
    from tests._support.orthanc import HOST

    uid, files = write_phantom_series(tmp_path / "src", 14, slices=8)
    good, bad = pydicom.dcmread(files[0]), pydicom.dcmread(files[1])
    paths = []
    for ds, sop_uid in ((good, good.SOPInstanceUID), (bad, "1.2.826.0.1.3680043.8.498.2")):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, sop_uid
        meta.TransferSyntaxUID = "1.2.840.10008.1.2.1"
        path = tmp_path / f"{len(paths)}.dcm"
        with path.open("wb") as fh:  # the meta as given (pydicom's save_as would put the dataset's UIDs in it)
            fh.write(b"\x00" * 128 + b"DICM")
            out = DicomFileLike(fh)
            write_file_meta_info(out, meta)
            out.is_little_endian, out.is_implicit_VR = True, False
            write_dataset(out, ds)
        paths.append(path)
    cfg = load_config(overrides={"pacs.move_port": free_port(), "pacs.timeout_s": 10.0}, environ={})
    receiver = MoveReceiver(cfg, archive_aet="ORTHANC")
    dest = tmp_path / "dest"
    dest.mkdir()
    ae = AE(ae_title="ORTHANC")
    ae.add_requested_context(str(good.SOPClassUID), ["1.2.840.10008.1.2.1"])
    was, _config.STORE_SEND_CHUNKED_DATASET = _config.STORE_SEND_CHUNKED_DATASET, True
    try:
        with receiver.route(uid, dest):
            assoc = ae.associate(HOST, cfg.pacs.move_port, ae_title=cfg.pacs.ae_title)
            assert assoc.is_established
            statuses = [int(assoc.send_c_store(p).Status) for p in paths]
            assoc.release()
    finally:
        _config.STORE_SEND_CHUNKED_DATASET = was
        ae.shutdown()
        receiver.close()
    assert statuses == [0x0000, 0xA900]
    assert [p.name for p in dest.glob("*.dcm")] == [f"{good.SOPInstanceUID}.dcm"]
