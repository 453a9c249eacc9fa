"""A DICOMweb retrieval checked against the number of instances the archive lists, when its series search gives none.

Some archives answer a QIDO-RS series search without NumberOfSeriesRelatedInstances. Here a real Orthanc (its DICOMweb
plugin) sits behind a small HTTP front on 127.0.0.1 that drops that attribute from QIDO-RS answers and ends WADO-RS
series retrievals after the first instances (a well-formed multipart answer, short: an archive whose retrieval returns
fewer instances than it holds). The series must not be taken as complete: the archive is asked, after the retrieval,
how many instances it lists (its instance search), and a short retrieval is recorded partial and retried.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pipeline.config import load_config
from pipeline.errors import PartialSeriesError
from pipeline.pacs.fetch import fetch_sources
from pipeline.pacs.ledger import Ledger
from tests._support.orthanc import HOST, write_phantom_series

pytest_plugins = ["tests._support.orthanc"]
pytestmark = pytest.mark.pacs


class _CountlessFront:
    """An HTTP front for ``target`` (Orthanc's base URL): QIDO-RS JSON answers lose NumberOfSeriesRelatedInstances
    (0020,1209); a multipart (WADO-RS) answer keeps its first ``keep`` instances (None: all); with ``instances``
    false, instance searches list nothing."""

    def __init__(self, target: str, keep: int | None, *, instances: bool = True) -> None:
        import requests

        front = self
        self.keep, self.instances = keep, instances

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "accept")}
                with requests.Session() as s:
                    s.trust_env = False
                    r = s.get(target + self.path, headers=headers, timeout=30)
                body, ctype = r.content, r.headers.get("Content-Type", "")
                if "json" in ctype and body:
                    items = json.loads(body)
                    for item in items if isinstance(items, list) else []:
                        item.pop("00201209", None)
                    if not front.instances and "/instances" in self.path.split("?")[0]:
                        items = []
                    body = json.dumps(items).encode()
                elif "multipart/related" in ctype and front.keep is not None:
                    boundary = ("--" + ctype.split("boundary=")[1].split(";")[0].strip('"')).encode()
                    parts = body.split(boundary)[1:-1]
                    body = boundary + boundary.join(parts[: front.keep]) + boundary + b"--\r\n"
                self.send_response(r.status_code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def creds(orthanc, monkeypatch):
    for k, v in orthanc.env.items():
        monkeypatch.setenv(k, v)


def test_a_short_retrieval_from_an_archive_that_lists_no_count_is_partial_not_complete(orthanc, creds, tmp_path):
    uid, files = write_phantom_series(tmp_path / "case", 7)
    orthanc.upload(files)
    cfg = load_config(overrides={"pacs.timeout_s": 10.0, "pacs.retries": 0}, environ={})
    front = _CountlessFront(orthanc.url, keep=10)
    try:
        src = f"dicomweb+http://{HOST}:{front.port}/dicom-web?series={uid}"
        run = tmp_path / "run"
        res = fetch_sources([src], run_dir=run, cfg=cfg)
        assert res.folders == [] and [f[1] for f in res.failures] == [PartialSeriesError.__name__], res.lines()
        assert f"10 of {len(files)} instances retrieved" in res.failures[0][2], res.failures
        assert Ledger(run).fetched(uid)["state"] == "partial"
        assert not (run / "pacs" / "spool" / uid).exists()
        front.keep = None  # the archive's retrieval is whole again: the next run takes the series
        res = fetch_sources([src], run_dir=run, cfg=cfg)
    finally:
        front.close()
    assert [f.name for f in res.folders] == [uid] and res.fetched == 1, res.lines()
    assert len(list(res.folders[0].glob("*.dcm"))) == len(files)
    assert Ledger(run).fetched(uid)["n_expected"] == len(files)


def test_a_retrieval_the_archive_gives_nothing_to_check_against_is_held_with_the_reason(orthanc, creds, tmp_path):
    """No count in the series search and nothing listed by the instance search: the retrieval cannot be checked, so
    the series is held as partial (retried by the next run), the reason naming what the archive should answer."""
    uid, files = write_phantom_series(tmp_path / "case", 8)
    orthanc.upload(files)
    cfg = load_config(overrides={"pacs.timeout_s": 10.0, "pacs.retries": 0}, environ={})
    front = _CountlessFront(orthanc.url, keep=None, instances=False)
    try:
        run = tmp_path / "run"
        res = fetch_sources([f"dicomweb+http://{HOST}:{front.port}/dicom-web?series={uid}"], run_dir=run, cfg=cfg)
    finally:
        front.close()
    assert res.folders == [] and [f[1] for f in res.failures] == [PartialSeriesError.__name__], res.lines()
    msg = res.failures[0][2]
    assert f"{len(files)} instance(s) retrieved" in msg and "cannot be checked" in msg and "00201209" in msg, msg
    assert Ledger(run).fetched(uid)["state"] == "partial"
