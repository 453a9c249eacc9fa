"""PACS sources of ctpipe run against a real Orthanc: DICOMweb and DIMSE retrieval into the spool, reruns,
partial series, an archive that is down or hangs, and runs whose findings match the folder run; the run store
records each case's origin, the spool is emptied once cases are processed, and a rerun skips by remote UID."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pydicom
import pytest

from pipeline.config import load_config
from pipeline.errors import PacsRequestError, PacsUnavailableError, PartialSeriesError
from pipeline.pacs import fetch_sources
from pipeline.pacs.address import parse_source
from pipeline.pacs.connect import open_archive
from pipeline.pacs.fetch import release_spool
from pipeline.pacs.ledger import Ledger
from pipeline.pacs.sender import result_files
from pipeline.runner import open_run, run_batch
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import OrthancServer, SilentServer, free_port, write_phantom_series

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs


def _cfg(orthanc, **extra):
    opts = {"pacs.move_port": orthanc.move_port, "pacs.timeout_s": 10.0, "pacs.retries": 1, "pacs.backoff_s": 0.05}
    opts.update(extra)
    return load_config(overrides=opts, environ={})


@pytest.fixture(scope="module")
def stored(orthanc, tmp_path_factory):
    """Two phantom series in Orthanc; {seed: (SeriesInstanceUID, files)}."""
    root = tmp_path_factory.mktemp("stored")
    out = {}
    for seed in (1, 2):
        uid, files = write_phantom_series(root / f"case{seed}", seed)
        orthanc.upload(files)
        out[seed] = (uid, files)
    return out


@pytest.fixture
def creds(orthanc, monkeypatch):
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)


def _same_instances(folder: Path, files: list[Path]) -> None:
    got = {pydicom.dcmread(p).SOPInstanceUID: pydicom.dcmread(p) for p in folder.glob("*.dcm")}
    want = {pydicom.dcmread(p).SOPInstanceUID: pydicom.dcmread(p) for p in files}
    assert set(got) == set(want)
    for uid, ds in want.items():
        assert got[uid].PixelData == ds.PixelData
        assert got[uid].ImagePositionPatient == ds.ImagePositionPatient


@pytest.mark.parametrize("how", ["dicomweb", "move", "get"])
def test_series_retrieved_into_the_spool_once(orthanc, stored, creds, tmp_path, how):
    uid, files = stored[1]
    if how == "dicomweb":
        src = f"{orthanc.dicomweb}?series={uid}"
    else:
        src = f"{orthanc.dimse}?studydate=19000101-29991231&retrieve={how}"
    run = tmp_path / "run"
    res = fetch_sources([src], run_dir=run, cfg=_cfg(orthanc))
    assert not res.failures, res.lines()
    folders = {f.name: f for f in res.folders}
    assert uid in folders and res.fetched == len(res.folders)
    _same_instances(folders[uid], files)
    assert not any((run / "pacs" / "partial").iterdir())
    again = fetch_sources([src], run_dir=run, cfg=_cfg(orthanc))
    assert again.fetched == 0 and again.reused == res.fetched and again.folders == res.folders
    row = Ledger(run).fetched(uid)
    assert row["state"] == "fetched" and row["attempts"] == 1 and row["n_files"] == len(files)
    assert "password" not in json.dumps(row) and orthanc.password not in (run / "pacs" / "ledger.sqlite").read_bytes().decode(
        "latin-1"
    )


def test_run_store_records_origins_spool_emptied_and_rerun_skips_by_remote_uid(orthanc, stored, creds, tmp_path):
    """Retrieve two series, run them (one quarantined), empty the spool; the rerun retrieves nothing."""
    (uid1, files1), (uid2, _) = stored[1], stored[2]
    study1 = str(pydicom.dcmread(files1[0]).StudyInstanceUID)
    run = tmp_path / "run"
    cfg = _cfg(orthanc, **{"report.enabled": False, "workers": 0, "pacs.keep_received": "failed"})
    src = f"{orthanc.dicomweb}?series={uid1},{uid2}"
    res = fetch_sources([src], run_dir=run, cfg=cfg)
    assert res.fetched == 2 and set(res.origins) == {str(f) for f in res.folders}
    slices = sorted(
        (run / "pacs" / "spool" / uid2).glob("*.dcm"), key=lambda f: float(pydicom.dcmread(f).ImagePositionPatient[2])
    )
    slices[len(slices) // 2].write_bytes(b"not DICOM any more")  # a middle slice damaged on disk: the case is quarantined
    run_batch(res.folders, out=run, config=cfg, stages=[IngestStage(), WriteStage()], origins=res.origins)
    cases = open_run(run).cases.set_index("origin_series_uid")
    assert dict(cases.status) == {uid1: "done", uid2: "failed"}
    assert cases.loc[uid1, "origin"] == orthanc.dicomweb and cases.loc[uid1, "origin_via"] == "wado-rs"
    assert cases.loc[uid1, "origin_study_uid"] == study1
    store = (run / "runs.sqlite").read_bytes().decode("latin-1")
    assert orthanc.password not in store and orthanc.user not in store
    assert release_spool(run, cfg) == 1  # keep_received: failed keeps the quarantined series' files
    assert not (run / "pacs" / "spool" / uid1).exists() and (run / "pacs" / "spool" / uid2).is_dir()
    assert Ledger(run).fetched(uid1)["state"] == "removed"
    again = fetch_sources([src], run_dir=run, cfg=cfg)  # done and quarantined: neither retrieved nor handed on
    assert (again.fetched, again.reused, again.done_before, again.folders) == (0, 0, 2, [])
    assert "2 processed earlier" in again.lines()[0]
    retry = fetch_sources([src], run_dir=run, cfg=_cfg(orthanc, **{"runner.retry_failed": True}))
    assert [f.name for f in retry.folders] == [uid2] and retry.done_before == 1


def test_accession_and_worklist_queries(orthanc, stored, creds, tmp_path, caplog):
    uid1, files = stored[1]
    uid2, _ = stored[2]
    acc = str(pydicom.dcmread(files[0]).get("AccessionNumber", ""))
    wl = tmp_path / "wl.csv"
    wl.write_text(f"SeriesInstanceUID\n{uid2}\n")
    cfg = _cfg(orthanc)
    res = fetch_sources([f"{orthanc.dimse}?worklist={wl}&retrieve=get"], run_dir=tmp_path / "wl", cfg=cfg)
    assert [f.name for f in res.folders] == [uid2]
    assert acc, "the phantom writer sets AccessionNumber"
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        res = fetch_sources([f"{orthanc.dicomweb}?accession={acc}"], run_dir=tmp_path / "acc", cfg=cfg)
    assert uid1 in [f.name for f in res.folders] and uid2 not in [f.name for f in res.folders]
    # the accession number stays in the DICOM files: not in the logs, the summary or the PACS ledger
    assert acc not in caplog.text and acc not in "\n".join(res.lines())
    records = [p for p in (tmp_path / "acc").rglob("*") if p.is_file() and p.suffix != ".dcm" and "spool" not in p.parts]
    assert records and not [p for p in records if acc.encode() in p.read_bytes()], records
    res = fetch_sources([f"{orthanc.dicomweb}?series=1.2.3.999"], run_dir=tmp_path / "none", cfg=cfg)
    assert res.folders == [] and "not found" in res.failures[0][2]


def test_partial_series_is_not_handed_on_and_is_retried(orthanc, stored, creds, tmp_path, monkeypatch):
    """The archive loses 4 instances between the search and the retrieval: the series is recorded partial."""
    import pipeline.pacs.fetch as fetch

    uid, files = stored[2]
    real = fetch.select_series

    def losing(archive, query):
        found = real(archive, query)
        for sop in orthanc.instances_of(uid)[:4]:
            hit = [h for h in orthanc.rest("POST", "/tools/lookup", data=sop.encode()) if h["Type"] == "Instance"]
            orthanc.rest("DELETE", f"/instances/{hit[0]['ID']}")
        return found

    monkeypatch.setattr(fetch, "select_series", losing)
    run = tmp_path / "run"
    res = fetch_sources([f"{orthanc.dicomweb}?series={uid}"], run_dir=run, cfg=_cfg(orthanc))
    assert res.folders == [] and res.failures[0][1] == PartialSeriesError.__name__
    assert "12 of 16 instances" in res.failures[0][2]
    assert Ledger(run).fetched(uid)["state"] == "partial"
    assert not (run / "pacs" / "spool" / uid).exists()
    monkeypatch.setattr(fetch, "select_series", real)
    orthanc.upload(files)  # the archive has them all again: the next run takes the series
    res = fetch_sources([f"{orthanc.dicomweb}?series={uid}"], run_dir=run, cfg=_cfg(orthanc))
    assert [f.name for f in res.folders] == [uid] and res.fetched == 1
    assert len(list(res.folders[0].glob("*.dcm"))) == 16


def test_archive_down_retries_with_backoff_and_the_others_go_on(orthanc, stored, creds, tmp_path):
    uid, _ = stored[1]
    dead = free_port()
    cfg = _cfg(orthanc, **{"pacs.retries": 2, "pacs.backoff_s": 0.1})
    t0 = time.monotonic()
    res = fetch_sources(
        [
            f"dicomweb+http://127.0.0.1:{dead}/dicom-web?series={uid}",
            f"dimse://PACS@127.0.0.1:{dead}?series={uid}",
            f"{orthanc.dicomweb}?series={uid}",
        ],
        run_dir=tmp_path / "run",
        cfg=cfg,
    )
    assert time.monotonic() - t0 >= 2 * (0.1 + 0.2)  # two sources, backoff 0.1 s then 0.2 s each
    assert [f.name for f in res.folders] == [uid]
    assert len(res.failures) == 2
    for what, cls, msg in res.failures:
        assert cls == "PacsUnavailableError" and str(dead) in what
        assert "gave up after 3 attempts" in msg and "Fix:" in msg
        # a closed port refuses at once: not told as a timeout, and the fix is not a longer one
        if what.startswith("dimse"):
            assert "the connection was refused or dropped" in msg and "pacs.timeout_s" not in msg, msg
        else:
            assert "cannot connect" in msg and "timeout" not in msg and f"127.0.0.1:{dead}" in msg, msg


def test_archive_that_hangs_times_out(tmp_path):
    with SilentServer() as hang:
        cfg = load_config(overrides={"pacs.timeout_s": 0.5, "pacs.retries": 1, "pacs.backoff_s": 0.0}, environ={})
        for src in (
            f"dicomweb+http://127.0.0.1:{hang.port}/dw?studydate=today",
            f"dimse://PACS@127.0.0.1:{hang.port}?studydate=today",
        ):
            archive = open_archive(parse_source(src).endpoint, cfg)
            t0 = time.monotonic()
            with pytest.raises(PacsUnavailableError, match="gave up after 2 attempts") as ei:
                archive.find_studies(parse_source(src).query)
            archive.close()
            assert 0.9 <= time.monotonic() - t0 < 10
            said = str(ei.value)
            assert "timed out" in said if src.startswith("dicomweb") else "no answer within pacs.timeout_s = 0.5 s" in said


def test_unknown_calling_ae_title_and_bad_credentials_are_clear_errors(orthanc, stored, tmp_path, monkeypatch):
    uid, _ = stored[1]
    stranger = load_config(overrides={"pacs.ae_title": "STRANGER", "pacs.retries": 0}, environ={})
    archive = open_archive(parse_source(f"{orthanc.dimse}?series={uid}").endpoint, stranger)
    with pytest.raises(PacsRequestError, match="STRANGER|0x"):
        archive.find_series(None, series_uid=uid)
    monkeypatch.setenv("CTPIPE_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("CTPIPE_DICOMWEB_PASSWORD", "wrong")
    archive = open_archive(parse_source(f"{orthanc.dicomweb}?series={uid}").endpoint, load_config(environ={}))
    with pytest.raises(PacsRequestError, match="HTTP 401") as ei:
        archive.find_series(None, series_uid=uid)
    assert "CTPIPE_DICOMWEB_USER" in str(ei.value) and "wrong" not in str(ei.value)


@pytest.mark.slow
def test_runs_from_dicomweb_and_dimse_find_what_the_folder_run_finds(orthanc, creds, tmp_path, capsys):
    """ctpipe run on the folder, on DICOMweb and on DIMSE (C-MOVE): the same findings; a rerun retrieves and runs nothing."""
    from pipeline.cli import main

    uid, files = write_phantom_series(tmp_path / "case", 7)
    orthanc.upload(files)
    fast = [
        "--workers",
        "0",
        "--quiet",
        "--set",
        "reconstruct.enabled=false",
        "--set",
        "report.enabled=false",
        "--set",
        "detector.write_png=false",
        "--set",
        "detector.postprocess=false",
        "--set",
        f"pacs.move_port={orthanc.move_port}",
    ]
    sources = {
        "folder": str(tmp_path / "case" / "dicom"),
        "dicomweb": f"{orthanc.dicomweb}?series={uid}",
        "dimse": f"{orthanc.dimse}?series={uid}&retrieve=move",
    }
    findings = {}
    for name, src in sources.items():
        assert main(["run", src, "--out", str(tmp_path / name), *fast]) == 0
        (case,) = (tmp_path / name / "cases").iterdir()
        findings[name] = json.loads((case / "findings.json").read_text())
    assert findings["folder"]["findings"], "the phantom should give findings"
    for name in ("dicomweb", "dimse"):
        a, b = findings["folder"], findings[name]
        assert a["series_uid"] == b["series_uid"] == uid
        for key in ("findings", "below_threshold"):
            assert len(a[key]) == len(b[key])
            for fa, fb in zip(a[key], b[key]):
                assert fa["center_lps"] == pytest.approx(fb["center_lps"], abs=1e-6)
                assert fa["score"] == pytest.approx(fb["score"], abs=1e-6)
    for name, via in (("dicomweb", "wado-rs"), ("dimse", "c-move")):
        (case,) = open_run(tmp_path / name).cases.itertuples()
        assert (case.origin_series_uid, case.origin_via) == (uid, via)
        assert not (tmp_path / name / "pacs" / "spool" / uid).exists()  # processed: removed from the spool
    capsys.readouterr()
    send = ["--set", f"pacs.send_to={orthanc.dicomweb}"]
    assert main(["run", sources["dicomweb"], "--out", str(tmp_path / "dicomweb"), *fast, *send]) == 0
    out = capsys.readouterr().out
    assert "0 series retrieved, 0 retrieved earlier, 1 processed earlier" in out and "nothing to run" in out
    # the case's DICOM results (SR, SEG: whatever the pipeline wrote) went to Orthanc in the background
    (sent_case,) = (tmp_path / "dicomweb" / "cases").iterdir()
    results = result_files(sent_case)
    assert f"results to {orthanc.dicomweb}: {len(results)} sent, 0 pending, 0 failed" in out
    assert all(orthanc.holds(uid) for _, uid, _ in results)
    deliveries = open_run(tmp_path / "dicomweb").deliveries  # recorded in the run store too
    assert sorted(deliveries.sop_uid) == sorted(uid for _, uid, _ in results) and set(deliveries.state) == {"sent"}
    log = (tmp_path / "dicomweb" / "run.log").read_text()
    assert orthanc.password not in log
    shutil.rmtree(tmp_path / "case")


def test_named_study_accession_or_non_ct_series_that_select_nothing_are_failures(orthanc, stored, creds, tmp_path):
    """A study UID or accession number that matches nothing, and a series of another modality, are reported."""
    uid, files = stored[1]
    study = str(pydicom.dcmread(files[0]).StudyInstanceUID)
    cfg = _cfg(orthanc)
    for base in (orthanc.dicomweb, orthanc.dimse):
        res = fetch_sources([f"{base}?study=1.2.3.998&accession=NO-SUCH-ACC"], run_dir=tmp_path / "none", cfg=cfg)
        assert res.folders == [] and len(res.failures) == 2, res.failures
        failures = {what: msg for what, _, msg in res.failures}
        assert "not found" in failures["1.2.3.998"]
        assert "no study" in failures["accession NO-SUCH-ACC"]
    res = fetch_sources([f"{orthanc.dicomweb}?series={uid}&modality=MR"], run_dir=tmp_path / "mr", cfg=cfg)
    assert res.folders == [] and "its modality is CT, not MR" in res.failures[0][2]
    res = fetch_sources([f"{orthanc.dimse}?study={study}&modality=MR"], run_dir=tmp_path / "mr", cfg=cfg)
    assert res.folders == [] and "its series are CT" in res.failures[0][2]


def test_c_move_the_archive_cannot_deliver_names_the_move_destination(orthanc, stored, creds, tmp_path):
    """The archive knows ctpipe's C-MOVE receiver at another port than pacs.move_port: nothing arrives."""
    uid, _ = stored[1]
    cfg = _cfg(orthanc, **{"pacs.move_port": free_port(), "pacs.retries": 0})
    res = fetch_sources([f"{orthanc.dimse}?series={uid}"], run_dir=tmp_path / "run", cfg=cfg)
    assert res.folders == [] and res.failures[0][1] == "PacsRequestError"
    msg = res.failures[0][2]
    assert "no instance reached ctpipe's C-MOVE receiver" in msg
    assert f"port {cfg.pacs.move_port} (pacs.move_port)" in msg and "retrieve=get" in msg


def test_c_move_sent_from_another_ae_title_than_the_addresss_names_the_one_that_came(stored, tmp_path):
    """The address names an AE title the archive answers to (an Orthanc that does not check the called AE title, its
    own default) but is not the one it sends from: ctpipe's C-MOVE receiver turns its association away, and the error
    names the AE title that came (was: only the one expected, with no word of what the receiver turned away)."""
    uid, files = stored[1]
    lax = OrthancServer(tmp_path / "lax_orthanc", check_called_aet=False).start()
    try:
        lax.upload(files)
        cfg = _cfg(lax, **{"pacs.retries": 0})
        src = f"dimse://ALIAS@127.0.0.1:{lax.dicom_port}?series={uid}"
        res = fetch_sources([src], run_dir=tmp_path / "run", cfg=cfg)
    finally:
        lax.discard()
    assert res.folders == [] and res.failures[0][1] == "PacsRequestError"
    msg = res.failures[0][2]
    assert f"turned away an association from calling AE title '{lax.aet}'" in msg, msg
    assert f"dimse://{lax.aet}@127.0.0.1:{lax.dicom_port}" in msg, msg


def test_wrong_credentials_are_told_apart_from_none(orthanc, stored, tmp_path, monkeypatch):
    uid, _ = stored[1]
    monkeypatch.setenv("CTPIPE_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("CTPIPE_DICOMWEB_PASSWORD", "not-the-password")
    archive = open_archive(parse_source(f"{orthanc.dicomweb}?series={uid}").endpoint, load_config(environ={}))
    with pytest.raises(PacsRequestError, match="HTTP 401") as ei:
        archive.find_series(None, series_uid=uid)
    archive.close()
    assert f"credentials of user '{orthanc.user}' sent; the archive refused them" in str(ei.value)
    assert "correct CTPIPE_DICOMWEB_USER" in str(ei.value) and "not-the-password" not in str(ei.value)
    monkeypatch.delenv("CTPIPE_DICOMWEB_USER")
    monkeypatch.delenv("CTPIPE_DICOMWEB_PASSWORD")
    cfg = load_config(overrides={"pacs.netrc": None}, environ={})
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    archive = open_archive(parse_source(f"{orthanc.dicomweb}?series={uid}").endpoint, cfg)
    with pytest.raises(PacsRequestError, match="no credentials were sent"):
        archive.find_series(None, series_uid=uid)
    archive.close()


@pytest.mark.parametrize("how", ["dicomweb", "get"])
def test_accession_number_stays_out_of_the_network_libraries_log(orthanc, stored, creds, tmp_path, caplog, how):
    """With -v or -vv the log shows pynetdicom's, dicomweb-client's and urllib3's records: the query's accession
    number and those of the studies found are not among them, unless privacy.keep_identifiers."""
    uid1, files = stored[1]
    acc = str(pydicom.dcmread(files[0]).AccessionNumber)
    base = orthanc.dicomweb if how == "dicomweb" else orthanc.dimse
    src = f"{base}?accession={acc}" + ("&retrieve=get" if how == "get" else "")
    for keep in (False, True):
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            res = fetch_sources([src], run_dir=tmp_path / f"run{keep}", cfg=_cfg(orthanc, **{"privacy.keep_identifiers": keep}))
        assert [f.name for f in res.folders] == [uid1], res.lines()
        libraries = [r for r in caplog.records if r.name.split(".")[0] in ("pynetdicom", "dicomweb_client", "urllib3")]
        assert libraries, "the libraries' records reach the log"
        assert (acc in caplog.text) is keep


def test_https_to_an_archive_serving_plain_http_says_so_not_to_add_a_ca(orthanc, stored, creds, tmp_path):
    """``dicomweb+https://`` written for an archive that serves plain HTTP on that port: the error says the port answered
    in plain HTTP and gives the http:// address (was: "TLS failed (SSLError). Fix: give the archive's CA in
    pacs.ca_bundle", which cannot help)."""
    plain = orthanc.dicomweb.replace("dicomweb+http://", "dicomweb+https://")
    res = fetch_sources([f"{plain}?studydate=20250102"], run_dir=tmp_path / "run", cfg=_cfg(orthanc, **{"pacs.retries": 0}))
    assert res.folders == [] and len(res.failures) == 1
    _, cls, msg = res.failures[0]
    assert cls == "PacsRequestError", msg
    assert "plain HTTP" in msg and orthanc.dicomweb in msg, msg
    assert "pacs.ca_bundle" not in msg, msg


def test_a_dimse_address_with_the_archives_http_port_names_the_port_to_check(orthanc, stored, tmp_path):
    """``dimse://AET@HOST:PORT`` given the archive's HTTP port (a running, reachable server that does not speak DICOM):
    the error says that port answers HTTP and gives the DICOM port to use (was: only "check that the archive is
    running and reachable", which it is, then a guess that the port might be the HTTP one)."""
    src = f"dimse://{orthanc.aet}@127.0.0.1:{orthanc.http_port}?studydate=20250102"
    res = fetch_sources([src], run_dir=tmp_path / "run", cfg=_cfg(orthanc, **{"pacs.retries": 0}))
    assert res.folders == [] and len(res.failures) == 1
    _, cls, msg = res.failures[0]
    assert cls == "PacsUnavailableError", msg
    assert f"port {orthanc.http_port} answers HTTP, not DICOM" in msg and "4242" in msg, msg


@pytest.mark.parametrize("how", ["dicomweb", "move"])
def test_a_series_still_arriving_at_the_archive_is_not_handed_on(orthanc, creds, tmp_path, monkeypatch, how):
    """A modality still sending a series to the archive while ctpipe retrieves it: what was listed is retrieved, but
    more instances arrived meanwhile. The series is not handed on as if it were the whole scan (its results would go
    back to the PACS as those of the study); the next run takes it whole."""
    from pipeline.pacs.dicomweb import DicomWebArchive
    from pipeline.pacs.dimse import DimseArchive

    uid, files = write_phantom_series(tmp_path / "arriving", {"dicomweb": 21, "move": 22}[how])
    orthanc.upload(files[:10])
    cls = DicomWebArchive if how == "dicomweb" else DimseArchive
    real = cls.retrieve

    def retrieve_while_the_rest_arrives(self, series, dest):
        n = real(self, series, dest)
        orthanc.upload(files[10:])  # the modality goes on sending while ctpipe retrieves
        return n

    monkeypatch.setattr(cls, "retrieve", retrieve_while_the_rest_arrives)
    src = f"{orthanc.dicomweb}?series={uid}" if how == "dicomweb" else f"{orthanc.dimse}?series={uid}&retrieve=move"
    run = tmp_path / "run"
    res = fetch_sources([src], run_dir=run, cfg=_cfg(orthanc))
    assert res.folders == [] and [c for _, c, _ in res.failures] == ["PartialSeriesError"], res.lines()
    msg = res.failures[0][2]
    assert "still arriving" in msg and f"now lists {len(files)}" in msg and uid in msg, msg
    assert not any((run / "pacs").rglob("*.dcm"))
    monkeypatch.setattr(cls, "retrieve", real)
    res = fetch_sources([src], run_dir=run, cfg=_cfg(orthanc))  # the next run: the archive has all of it
    assert res.fetched == 1 and len(list(res.folders[0].glob("*.dcm"))) == len(files)


class _CutShortWado:
    """An HTTP server on 127.0.0.1 that answers a WADO-RS series retrieval with the given instances as a multipart
    response, then closes the connection halfway through the last one (an archive that stops mid-transfer)."""

    def __init__(self, files: list[Path]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        boundary = b"ctpipe-test-boundary"
        parts = [b"--" + boundary + b"\r\nContent-Type: application/dicom\r\n\r\n" + f.read_bytes() + b"\r\n" for f in files]
        body = b"".join(parts)
        body = body[: len(body) - len(parts[-1]) // 2]  # cut in the middle of the last instance's pixel data

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", f'multipart/related; type="application/dicom"; boundary={boundary.decode()}')
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_instance_cut_short_by_a_dropped_wado_rs_transfer_is_not_kept(stored, tmp_path):
    """The connection to a DICOMweb archive drops in the middle of an instance's pixel data: that instance is not
    written as if whole (the series' count would match and the run would quarantine the series as damaged, though the
    archive's copy is sound); the retrieval fails as a lost connection, to be tried again."""
    from pipeline.pacs.archive import RemoteSeries

    uid, files = stored[1]
    files = sorted(files)[:3]
    server = _CutShortWado(files)
    try:
        src = f"dicomweb+http://127.0.0.1:{server.port}/dicom-web?series={uid}"
        cfg = load_config(overrides={"pacs.timeout_s": 10.0, "pacs.retries": 0}, environ={})
        archive = open_archive(parse_source(src).endpoint, cfg)
        dest = tmp_path / "dest"
        dest.mkdir()
        with pytest.raises(PacsUnavailableError, match="cut short") as ei:
            archive.retrieve(RemoteSeries("1.2.3", uid, "CT", len(files)), dest)
        archive.close()
    finally:
        server.close()
    assert "dropped" in str(ei.value) and f"127.0.0.1:{server.port}" in str(ei.value)
    for p in dest.glob("*.dcm"):  # what was written is whole
        ds = pydicom.dcmread(p)
        assert len(ds.PixelData) == ds.Rows * ds.Columns * ds.BitsAllocated // 8


def test_a_run_whose_archive_failed_says_nothing_was_retrieved_not_that_nothing_was_selected(tmp_path, capsys):
    """The only PACS source is down: the run says that no series could be retrieved, for the failure it lists, and
    that the next run tries again, with exit status 3 (was: "nothing to run: the PACS sources selected no series to
    retrieve or process", as if the query had matched nothing)."""
    from pipeline.cli import main

    dead = f"dicomweb+http://127.0.0.1:{free_port()}/dicom-web?studydate=20250102"
    rc = main(["run", dead, "--out", str(tmp_path / "run"), "--set", "pacs.retries=0", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 3
    assert "PACS failure" in err and "selected no series" not in out, out
    assert "nothing to run: no series retrieved (1 PACS failure, listed above; the next run tries again)" in out, out
