"""Pieces shared by ctpipe's DICOM service users and providers (``pynetdicom``): the application
entity, the CT storage presentation contexts, and writing a received C-STORE instance to disk.

Only CT images are taken (CT Image Storage, Enhanced CT Image Storage); any other SOP class sent
to ctpipe is answered with status 0x0122 ("SOP class not supported"), an instance whose UIDs are
not valid, or whose dataset names another SOP class or instance than the request (:func:`dataset_mismatch`), with
0xA900, a write failure with 0xA700 ("out of resources").
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .address import valid_uid
from .archive import CT_SOP_CLASSES
from .spool import write_instance

log = logging.getLogger(__name__)

STATUS_OK = 0x0000
STATUS_SOP_CLASS_NOT_SUPPORTED = 0x0122
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_DATASET_MISMATCH = 0xA900
STATUS_UNEXPECTED = 0xC000  # "cannot understand": an instance nobody asked for

# transfer syntaxes offered, one presentation context each, when ctpipe asks for CT instances (C-GET):
# uncompressed first, then the lossless compressed syntaxes archives keep CT in
_OFFERED = (
    ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"],  # explicit / implicit VR little endian
    ["1.2.840.10008.1.2.4.90"],  # JPEG 2000 lossless
    ["1.2.840.10008.1.2.4.70"],  # JPEG lossless, first-order prediction
    ["1.2.840.10008.1.2.5"],  # RLE lossless
    ["1.2.840.10008.1.2.4.80"],  # JPEG-LS lossless
)


def build_ae(cfg: Any) -> Any:
    """A pynetdicom ``AE`` titled ``pacs.ae_title`` with every timeout set to ``pacs.timeout_s``; pynetdicom's log
    shows the query and response identifiers only with ``privacy.keep_identifiers``, and goes through ctpipe's
    (:mod:`pipeline.pacs.netlog`)."""
    from pynetdicom import AE, _config

    from .netlog import route_pynetdicom_log

    route_pynetdicom_log()  # its ERROR lines and tracebacks of ordinary network events: below WARNING in ctpipe's log
    # pynetdicom logs each C-FIND, C-MOVE and C-GET identifier (AccessionNumber, PatientID, ...) at info level
    _config.LOG_REQUEST_IDENTIFIERS = _config.LOG_RESPONSE_IDENTIFIERS = bool(cfg.privacy.keep_identifiers)
    ae = AE(ae_title=cfg.pacs.ae_title)
    t = float(cfg.pacs.timeout_s)
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = ae.connection_timeout = t
    return ae


def ct_storage_contexts(*, accept_all: bool = False) -> list[tuple[str, list[str]]]:
    """``(SOP class, transfer syntaxes)`` pairs for CT storage: to offer (C-GET), or to accept (``accept_all``)."""
    if accept_all:
        from pynetdicom import ALL_TRANSFER_SYNTAXES

        return [(uid, list(ALL_TRANSFER_SYNTAXES)) for uid in CT_SOP_CLASSES]
    return [(uid, list(ts)) for uid in CT_SOP_CLASSES for ts in _OFFERED]


#: the transfer syntax accepted for the storage SOP classes ctpipe does not take: Implicit VR Little Endian, DICOM's
#: default, which every sender supports; enough to answer a non-CT instance with a refusal status
_REFUSAL_SYNTAXES = ["1.2.840.10008.1.2"]


def accepted_storage_contexts() -> list[tuple[str, list[str]]]:
    """The storage contexts accepted at association: CT with every transfer syntax, every other storage SOP class
    with DICOM's default syntax alone (:data:`_REFUSAL_SYNTAXES`), so that a non-CT instance gets a proper refusal
    status from :func:`check_instance` rather than no context at all (one a sender offers only compressed finds its
    context rejected instead). Not every syntax for every class: pynetdicom copies the accepted contexts for each
    association, and 170 classes × 45 syntaxes took about 110 ms more of each than this on 2 CPU cores: senders that
    open one association per instance got 4.4 instances/s instead of 12 (``scripts/bench_pacs.py``)."""
    from pynetdicom import AllStoragePresentationContexts

    seen = set(CT_SOP_CLASSES)
    extra = [str(c.abstract_syntax) for c in AllStoragePresentationContexts if str(c.abstract_syntax) not in seen]
    return ct_storage_contexts(accept_all=True) + [(uid, list(_REFUSAL_SYNTAXES)) for uid in extra]


def check_instance(event: Any) -> tuple[int, str, str]:
    """``(status, SOPClassUID, SOPInstanceUID)`` of a C-STORE request: STATUS_OK when ctpipe takes it."""
    req = event.request
    sop_class, sop_uid = str(req.AffectedSOPClassUID), str(req.AffectedSOPInstanceUID)
    if sop_class not in CT_SOP_CLASSES:
        return STATUS_SOP_CLASS_NOT_SUPPORTED, sop_class, sop_uid
    if not valid_uid(sop_uid):
        return STATUS_DATASET_MISMATCH, sop_class, sop_uid
    return STATUS_OK, sop_class, sop_uid


@dataclass(frozen=True)
class Mismatch:
    """A C-STORE dataset element that is not what the request says: ``keyword`` (``SOPInstanceUID`` or
    ``SOPClassUID``), its ``tag``, the request's Affected value (``requested``) and the dataset's (``found``, empty when
    the dataset has none)."""

    keyword: str
    tag: int
    requested: str
    found: str

    def response(self) -> Any:
        """The C-STORE response: status 0xA900 (Data Set does not match SOP Class, as dcmtk's storescp answers both
        mismatches), the Offending Element and an Error Comment (at most 64 characters: VR LO)."""
        from pydicom.dataset import Dataset

        rsp = Dataset()
        rsp.Status = STATUS_DATASET_MISMATCH
        rsp.OffendingElement = [self.tag]
        rsp.ErrorComment = f"dataset {self.keyword} differs from the request's"[:64]
        return rsp

    def problem(self) -> str:
        """``its dataset's SOPInstanceUID X is not the request's Affected SOP Instance UID Y``, for a log line."""
        what = "SOP Instance UID" if self.keyword == "SOPInstanceUID" else "SOP Class UID"
        found = f"{self.keyword} {self.found}" if self.found else f"no {self.keyword}"
        return f"its dataset has {found}, not the C-STORE request's Affected {what} {self.requested}"


def dataset_mismatch(*, sop_class: str, sop_uid: str, dataset_class: str | None, dataset_uid: str | None) -> Mismatch | None:
    """What of a C-STORE dataset's SOP Instance UID and SOP Class UID (``dataset_uid``, ``dataset_class``; None when
    absent) differs from the request's Affected ones (``sop_uid``, ``sop_class``), the instance first; None when both
    agree. Such an instance would be filed and deduplicated under a UID its file does not hold."""
    if (dataset_uid or "") != sop_uid:
        return Mismatch("SOPInstanceUID", 0x00080018, sop_uid, dataset_uid or "")
    if (dataset_class or "") != sop_class:
        return Mismatch("SOPClassUID", 0x00080016, sop_class, dataset_class or "")
    return None


def part10_header(*, sop_class: str, sop_instance: str, transfer_syntax: str) -> bytes:
    """The DICOM Part 10 preamble, ``DICM`` and File Meta Information (Explicit VR Little Endian) of a received
    instance, byte for byte what pynetdicom's ``event.encoded_dataset(include_meta=True)`` puts before the dataset
    (its implementation class UID and version name), encoded directly instead of through a pydicom dataset, which
    took about 0.4 ms of each instance's CPU time. The UIDs must be valid (:func:`check_instance`)."""
    from pynetdicom import PYNETDICOM_IMPLEMENTATION_UID, PYNETDICOM_IMPLEMENTATION_VERSION

    elements = b"".join(
        (
            _element(0x0001, b"OB", b"\x00\x01"),
            _element(0x0002, b"UI", _uid_bytes(sop_class)),
            _element(0x0003, b"UI", _uid_bytes(sop_instance)),
            _element(0x0010, b"UI", _uid_bytes(transfer_syntax)),
            _element(0x0012, b"UI", _uid_bytes(str(PYNETDICOM_IMPLEMENTATION_UID))),
            _element(0x0013, b"SH", _padded(PYNETDICOM_IMPLEMENTATION_VERSION.encode("ascii"), b" ")),
        )
    )
    return b"\x00" * 128 + b"DICM" + _element(0x0000, b"UL", struct.pack("<I", len(elements))) + elements


def _uid_bytes(uid: str) -> bytes:
    return _padded(uid.encode("ascii"), b"\x00")


def _padded(value: bytes, pad: bytes) -> bytes:
    return value + pad if len(value) % 2 else value


def _element(element: int, vr: bytes, value: bytes) -> bytes:
    """One group 0002 element in Explicit VR Little Endian (OB: 2 reserved bytes and a 4-byte length)."""
    if vr == b"OB":
        return struct.pack("<HH", 0x0002, element) + vr + struct.pack("<HI", 0, len(value)) + value
    return struct.pack("<HH", 0x0002, element) + vr + struct.pack("<H", len(value)) + value


def store_event(event: Any, folder_for: Callable[[Any], Path | None], *, sync_dir: bool = False) -> Any:
    """Write a C-STORE request's instance into ``folder_for(dataset)`` (None: refused); returns the DIMSE status (a
    status dataset for a dataset that is not the one the request names: :func:`dataset_mismatch`)."""
    status, sop_class, sop_uid = check_instance(event)
    if status != STATUS_OK:
        log.warning(
            "refused an instance of SOP class %s from %s (status 0x%04X)", sop_class, event.assoc.requestor.ae_title, status
        )
        return status
    ds = event.dataset
    wrong = dataset_mismatch(
        sop_class=sop_class,
        sop_uid=sop_uid,
        dataset_class=str(ds.get("SOPClassUID", "")),
        dataset_uid=str(ds.get("SOPInstanceUID", "")),
    )
    if wrong is not None:
        log.warning(
            "refused an instance from %s (status 0x%04X, nothing written): %s; the archive's copy of it is inconsistent: "
            "check it at the archive",
            event.assoc.requestor.ae_title,
            STATUS_DATASET_MISMATCH,
            wrong.problem(),
            extra={"event": "retrieve_mismatch"},
        )
        return wrong.response()
    folder = folder_for(ds)
    if folder is None:
        log.warning("refused instance %s from %s: not part of a retrieval in progress", sop_uid, event.assoc.requestor.ae_title)
        return STATUS_UNEXPECTED
    write_instance(folder, sop_uid, event.encoded_dataset(include_meta=True), sync_dir=sync_dir)
    return STATUS_OK
