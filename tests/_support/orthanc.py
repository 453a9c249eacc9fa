"""A real PACS for the tests: Debian's Orthanc with its DICOMweb plugin, run as a plain process.

:func:`orthanc_binary` finds ``Orthanc`` and its plugin or skips the test, naming
``scripts/install_pacs_tools.sh`` (which ``scripts/test.sh`` runs before pytest). :class:`OrthancServer`
writes a config (free ports on 127.0.0.1, storage in a temporary folder, one test user with a random
password, ``DicomModalities`` naming ctpipe's AE titles, ``DicomCheckCalledAet`` on as at a hospital archive, so
that a wrong AE title in a ``dimse://`` address is refused here too; Orthanc's own default answers any), starts Orthanc, polls ``/system`` until it
answers, and terminates it by PID (or kills it, once what it stored is thrown away). Orthanc listens on every
interface (1.10 has no bind setting): the ports are free ephemeral ones, HTTP remote access is off and every
request needs the test user. All traffic stays on 127.0.0.1.

The session fixture ``orthanc`` reaches a test module through ``pytest_plugins =
["tests._support.orthanc"]``. Test modules also import the helpers directly, so pytest is told not
to rewrite this module: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner.stage import Stage
from tests._support.processes import terminate

PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
HOST = "127.0.0.1"


def orthanc_binary() -> str:
    """The Orthanc executable, or skip (naming the install script) when it or its DICOMweb plugin is missing."""
    exe = shutil.which("Orthanc")
    if exe is None:
        pytest.skip("Orthanc not installed: run `bash scripts/install_pacs_tools.sh`")
    if not PLUGIN.is_file():
        pytest.skip(f"Orthanc's DICOMweb plugin ({PLUGIN}) not installed: run `bash scripts/install_pacs_tools.sh`")
    return exe


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS's choice of an ephemeral port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class OrthancServer:
    """One Orthanc process with a generated configuration (see the module docstring)."""

    aet = "ORTHANC"
    user = "ctpipe-test"

    def __init__(
        self,
        root: Path,
        *,
        modalities: dict[str, tuple[str, int]] | None = None,
        move_port: int | None = None,
        check_called_aet: bool = True,
    ):
        self.root = root
        self.check_called_aet = check_called_aet  # False: answers any called AE title (Orthanc's default)
        self.move_port = move_port or free_port()  # where ctpipe's C-MOVE storage SCP (AE CTPIPE) listens
        self.password = secrets.token_hex(12)
        self.http_port = free_port()
        self.dicom_port = free_port()
        self.modalities = {"ctpipe": ("CTPIPE", self.move_port), **(modalities or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "orthanc.log"

    # -- addresses -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def dicomweb(self) -> str:
        """The DICOMweb base URL as a ctpipe source/destination address (without a query)."""
        return f"dicomweb+{self.url}/dicom-web"

    @property
    def dimse(self) -> str:
        return f"dimse://{self.aet}@{HOST}:{self.dicom_port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment variables that give ctpipe the test user's credentials."""
        return {"CTPIPE_DICOMWEB_USER": self.user, "CTPIPE_DICOMWEB_PASSWORD": self.password}

    # -- process ---------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {
            "Name": "ctpipe-test",
            "StorageDirectory": str(self.root / "storage"),
            "IndexDirectory": str(self.root / "index"),
            "DicomAet": self.aet,
            "DicomPort": self.dicom_port,
            "HttpPort": self.http_port,
            "RemoteAccessAllowed": False,
            "AuthenticationEnabled": True,
            "RegisteredUsers": {self.user: self.password},
            "DicomModalities": {name: [aet, HOST, port] for name, (aet, port) in self.modalities.items()},
            "DicomCheckCalledAet": self.check_called_aet,
            "DicomAlwaysAllowEcho": True,
            "DicomScuTimeout": 10,
            "Plugins": [str(PLUGIN)],
            "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "EnableWado": False},
            "StableAge": 1,
            "SaveJobs": False,
            "ConcurrentJobs": 2,
            "HttpServerEnabled": True,
            "LogExportedResources": False,
        }

    def start(self, timeout_s: float = 30.0) -> OrthancServer:
        exe = orthanc_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "orthanc.json"
        cfg.write_text(json.dumps(self.config(), indent=1))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([exe, str(cfg)], stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Orthanc exited with status {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                if self.get("/system").status_code == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Orthanc did not answer /system within {timeout_s} s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        """Terminate the Orthanc process started here (by its PID), letting it shut down in order: what it stored
        is there for the next :meth:`start`. Orthanc 1.10 takes some 3 s to stop (its HTTP server, then its DICOM
        server, each on its own poll)."""
        terminate(self.proc)
        self.proc = None

    def discard(self) -> None:
        """Kill the Orthanc process started here (SIGKILL, by its PID) once what it stored is thrown away (the end of
        the test or fixture that owns it, or before its storage is deleted): no orderly shutdown to wait for."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    # -- REST ------------------------------------------------------------------------------
    def _session(self) -> Any:
        import requests

        s = requests.Session()
        s.auth = (self.user, self.password)
        s.trust_env = False
        return s

    def get(self, path: str) -> Any:
        import requests

        try:
            with self._session() as s:
                return s.get(self.url + path, timeout=5)
        except requests.exceptions.ConnectionError as exc:
            raise OSError(str(exc)) from exc

    def rest(self, method: str, path: str, body: Any = None, *, data: bytes | None = None, timeout: float = 60) -> Any:
        with self._session() as s:
            r = s.request(method, self.url + path, json=body if data is None else None, data=data, timeout=timeout)
        r.raise_for_status()
        return r.json() if r.content else None

    def upload(self, files: Iterable[Path]) -> int:
        """Store DICOM files through the REST API; the number stored."""
        n = 0
        for f in files:
            self.rest("POST", "/instances", data=Path(f).read_bytes())
            n += 1
        return n

    def clear(self) -> None:
        """Delete every patient (and so every study, series and instance)."""
        for pid in self.rest("GET", "/patients"):
            self.rest("DELETE", f"/patients/{pid}")

    def series_id(self, series_uid: str) -> str:
        hits = [h for h in self.rest("POST", "/tools/lookup", data=series_uid.encode()) if h["Type"] == "Series"]
        assert hits, f"Orthanc does not hold series {series_uid}"
        return str(hits[0]["ID"])

    def instances_of(self, series_uid: str) -> list[str]:
        """SOPInstanceUIDs Orthanc holds for a series."""
        tags = self.rest("GET", f"/series/{self.series_id(series_uid)}/instances")
        return sorted(i["MainDicomTags"]["SOPInstanceUID"] for i in tags)

    def holds(self, sop_instance_uid: str) -> bool:
        return any(h["Type"] == "Instance" for h in self.rest("POST", "/tools/lookup", data=sop_instance_uid.encode()))

    def add_modality(self, name: str, aet: str, port: int) -> None:
        self.rest("PUT", f"/modalities/{name}", {"AET": aet, "Host": HOST, "Port": port})

    def push(self, series_uid: str, modality: str, *, asynchronous: bool = False, timeout: float = 120) -> Any:
        """C-STORE a series to a modality (Orthanc as the SCU); the job id when ``asynchronous``."""
        body = {"Resources": [self.series_id(series_uid)], "Synchronous": not asynchronous}
        out = self.rest("POST", f"/modalities/{modality}/store", body, timeout=timeout)
        return out.get("ID") if asynchronous else out


def write_phantom_series(root: Path, seed: int, **options: Any) -> tuple[str, list[Path]]:
    """A small phantom CT series (64×64×16, 2 mm pixels, 5 mm slices) as DICOM; its SeriesInstanceUID and files."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    opts = {"matrix": 64, "slices": 16, "pixel_spacing": 2.0, "slice_spacing": 5.0, **options}
    ph = generate_phantom(seed, **opts)
    write_phantom_case(ph, root)
    files = sorted(p for p in (root / "dicom").rglob("*") if p.is_file())
    return ph.volume.series_uid, files


@pytest.fixture(scope="session")
def orthanc(tmp_path_factory) -> Any:
    """One Orthanc (DICOMweb on, ctpipe's AE CTPIPE as a known modality) for the whole test session."""
    srv = OrthancServer(tmp_path_factory.mktemp("orthanc"))
    srv.start()
    try:
        yield srv
    finally:
        srv.discard()


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a PACS that hangs."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        for c in self.accepted:
            c.close()
        self.sock.close()

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cstore(files: Iterable[Path], port: int, *, calling: str = "ORTHANC", called: str = "CTPIPE") -> list[int] | None:
    """C-STORE files to 127.0.0.1:port with pynetdicom; the status of each, or None when the association was rejected."""
    import pydicom
    from pynetdicom import AE

    datasets = [pydicom.dcmread(f) for f in files]
    ae = AE(ae_title=calling)
    for cls in dict.fromkeys(str(ds.SOPClassUID) for ds in datasets):
        ae.add_requested_context(cls, ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])
    assoc = ae.associate(HOST, port, ae_title=called)
    if not assoc.is_established:
        return None
    try:
        return [int(assoc.send_c_store(ds).Status) for ds in datasets]
    finally:
        assoc.release()
        ae.shutdown()


class SetupCountingStage(Stage):
    """A model-group runner stage that does no work and appends its process id to ``marker`` each time it is
    set up (as loading the detector would be): how often a listener started its model worker."""

    name = "count_setups"
    group = "model"
    preload: tuple[str, ...] = ()

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def setup(self, worker: Any) -> None:
        import os

        with open(self.marker, "a") as fh:
            fh.write(f"{os.getpid()}\n")

    def process(self, ctx: Any) -> dict[str, Any]:
        return {}

    def setups(self) -> list[int]:
        """The process ids of every setup so far."""
        p = Path(self.marker)
        return [int(x) for x in p.read_text().split()] if p.is_file() else []
