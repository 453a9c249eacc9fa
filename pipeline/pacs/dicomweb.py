"""DICOMweb archives: QIDO-RS search, WADO-RS retrieval and STOW-RS storage (with ``dicomweb-client``).

Series are retrieved in the transfer syntax the archive holds them in (``transfer-syntax=*``), so
the files ctpipe reads are the archive's own. Every request has the timeout ``pacs.timeout_s``;
connection errors, timeouts and HTTP 408/429/5xx raise :class:`~pipeline.errors.PacsUnavailableError`
(retried by :mod:`pipeline.pacs.retry`), other HTTP errors :class:`~pipeline.errors.PacsRequestError`. A retrieval
whose stream ends inside an instance (uncompressed pixel data shorter than its header says) raises
PacsUnavailableError too, rather than keeping the piece as if it were the instance.
"""

from __future__ import annotations

import functools
import io
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PacsRequestError, PacsUnavailableError
from ..volume import PATIENT_IDENTIFIERS
from .address import WITHHELD, Endpoint, Query, valid_uid, without_url_queries
from .archive import RemoteSeries, StoreOutcome, unverifiable
from .auth import http_session
from .retry import TRANSIENT_HTTP, with_retries
from .spool import write_instance

log = logging.getLogger(__name__)

T = TypeVar("T")

_STUDY_UID = "0020000D"
_SERIES_UID = "0020000E"
_MODALITY = "00080060"
_N_INSTANCES = "00201209"
_SOP_UID = "00080018"
PAGE = 500  # results asked for per QIDO-RS request

#: the loggers of the libraries under the client that name each request's URL (a search's filters in its query)
_URL_LOGGERS = ("dicomweb_client.web", "urllib3.connectionpool")
#: a ``Keyword=value`` filter of a request's query whose keyword is a patient identifier (``AccessionNumber=...``)
_IDENTIFYING_FILTER = re.compile(r"\b(" + "|".join(sorted(PATIENT_IDENTIFIERS)) + r")=[^&\s'\"]*")


class _WithholdIdentifiers(logging.Filter):
    """Rewrites a record that names a request's URL with the values of patient identifier filters as ``***``, unless
    ``keep`` (``privacy.keep_identifiers`` of the archive opened last)."""

    keep = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.keep:
            return True
        text = record.getMessage()
        shown = _IDENTIFYING_FILTER.sub(rf"\1={WITHHELD}", text)
        if shown != text:
            record.msg, record.args = shown, None
        return True


_WITHHOLD = _WithholdIdentifiers()


def _withhold_in_library_logs(keep_identifiers: bool) -> None:
    """The URLs the HTTP libraries log (``-vv``) hold no accession number, unless ``privacy.keep_identifiers``."""
    _WITHHOLD.keep = keep_identifiers
    for name in _URL_LOGGERS:
        logger = logging.getLogger(name)
        if _WITHHOLD not in logger.filters:
            logger.addFilter(_WITHHOLD)


def _value(item: dict[str, Any], tag: str) -> Any:
    values = (item.get(tag) or {}).get("Value") or []
    return values[0] if values else None


def _pixel_data_cut_short(ds: Any) -> tuple[int, int] | None:
    """``(bytes present, bytes expected)`` when an instance's native (uncompressed) pixel data is shorter than its
    Rows, Columns, SamplesPerPixel, NumberOfFrames and BitsAllocated say: the end of a transfer that was cut off. None
    otherwise, and for compressed pixel data, whose length its header does not give."""
    if "PixelData" not in ds:
        return None
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        if syntax is None or syntax.is_compressed or int(ds.BitsAllocated) % 8:
            return None
        frames = int(ds.get("NumberOfFrames") or 1)
        expected = int(ds.Rows) * int(ds.Columns) * int(ds.get("SamplesPerPixel") or 1) * frames * int(ds.BitsAllocated) // 8
    except (AttributeError, TypeError, ValueError):  # a header without those: left to ingest, which names what is wrong
        return None
    have = len(ds.PixelData)
    return (have, expected) if have < expected else None


class DicomWebArchive:
    """A DICOMweb archive at ``endpoint.url`` (QIDO-RS, WADO-RS and STOW-RS under that base URL)."""

    def __init__(self, endpoint: Endpoint, cfg: Any):
        from dicomweb_client.api import DICOMwebClient

        self.endpoint = endpoint
        self.cfg = cfg
        self.session = http_session(endpoint, cfg)
        self.client = DICOMwebClient(endpoint.url, session=self.session, timeout=float(cfg.pacs.timeout_s))
        self.client.set_http_retry_params(retry=False)  # retries are ours (with_retries), for every transient failure
        _withhold_in_library_logs(bool(cfg.privacy.keep_identifiers))

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` with requests' errors turned into PACS errors, retried while transient."""

        def once() -> T:
            import requests

            try:
                return fn()
            except requests.exceptions.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else 0
                reason = exc.response.reason if exc.response is not None else ""
                if status in TRANSIENT_HTTP:
                    raise PacsUnavailableError(
                        f"{what}: HTTP {status} {reason}",
                        where=self.endpoint.redacted(),
                        fix="the archive is overloaded or down; try again later",
                    ) from exc
                problem, fix = f"{what}: HTTP {status} {reason}", "check the address and the query"
                if status in (401, 403) and self.session.auth:
                    user = self.session.auth[0]
                    problem += f" (credentials of user {user!r} sent; the archive " + (
                        "refused them)" if status == 401 else "does not allow this user the request)"
                    )
                    fix = (
                        "correct CTPIPE_DICOMWEB_USER and CTPIPE_DICOMWEB_PASSWORD (they come first) or the netrc entry "
                        f"for {self.endpoint.host}"
                        if status == 401
                        else f"ask the archive's administrators to give user {user!r} access to DICOMweb"
                    )
                elif status in (401, 403):
                    problem += " (no credentials were sent)"
                    fix = f"set CTPIPE_DICOMWEB_USER and CTPIPE_DICOMWEB_PASSWORD or a netrc entry for {self.endpoint.host}"
                raise PacsRequestError(problem, where=self.endpoint.redacted(), fix=fix) from exc
            except requests.exceptions.SSLError as exc:
                raise self._tls_error(what, exc) from exc
            except requests.exceptions.Timeout as exc:  # connecting or waiting for the answer took pacs.timeout_s
                raise PacsUnavailableError(
                    f"{what}: timed out ({type(exc).__name__}, timeout {self.cfg.pacs.timeout_s:g} s)",
                    where=self.endpoint.redacted(),
                    fix="check that the archive is running and reachable; raise pacs.timeout_s for a slow one",
                ) from exc
            except requests.exceptions.ConnectionError as exc:  # refused or dropped: no longer timeout would help
                from urllib3.exceptions import NameResolutionError

                if isinstance(getattr(exc.args[0] if exc.args else None, "reason", None), NameResolutionError):
                    raise PacsUnavailableError(
                        f"{what}: the host name {self.endpoint.host!r} is not known",
                        where=self.endpoint.redacted(),
                        fix="check the host in the address: a name this machine resolves, or the archive's IP address",
                    ) from exc
                raise PacsUnavailableError(
                    f"{what}: cannot connect to {self.endpoint.host}:{self.endpoint.port} (connection refused or dropped)",
                    where=self.endpoint.redacted(),
                    fix="check that the archive is running and that the address's host and port are its DICOMweb (HTTP) ones",
                ) from exc
            except (requests.exceptions.RequestException, ValueError) as exc:
                raise PacsRequestError(
                    f"{what}: {type(exc).__name__}: {without_url_queries(str(exc))}",  # its URL may hold a query
                    where=self.endpoint.redacted(),
                    fix="check that the address is the archive's DICOMweb base URL",
                ) from exc

        return with_retries(
            once, what=f"{what} at {self.endpoint.redacted()}", retries=self.cfg.pacs.retries, backoff_s=self.cfg.pacs.backoff_s
        )

    def _tls_error(self, what: str, exc: Exception) -> PacsRequestError:
        """The error for an HTTPS request whose TLS handshake failed: a port that answers in plain HTTP (an
        ``https`` address for an ``http`` archive), a certificate this machine does not trust, or another reason
        (OpenSSL's, as given)."""
        where = self.endpoint.redacted()
        said = str(exc)
        if "WRONG_VERSION_NUMBER" in said.upper() or "HTTP_REQUEST" in said.upper():
            plain = where.replace("dicomweb+https://", "dicomweb+http://", 1)
            return PacsRequestError(
                f"{what}: TLS failed: {self.endpoint.host}:{self.endpoint.port} answered in plain HTTP, not HTTPS",
                where=where,
                fix=f"if the archive serves DICOMweb over plain HTTP there, write the address as {plain}; otherwise "
                "give its HTTPS port",
            )
        if "CERTIFICATE_VERIFY_FAILED" in said.upper():
            return PacsRequestError(
                f"{what}: TLS failed: the archive's certificate is not trusted here",
                where=where,
                fix="give the archive's CA in pacs.ca_bundle (pacs.tls_verify: false only for a test server)",
            )
        return PacsRequestError(
            f"{what}: TLS failed ({without_url_queries(said)[:300]})",
            where=where,
            fix="check that the address's port is the archive's HTTPS port; for a certificate this machine does not "
            "trust, give the archive's CA in pacs.ca_bundle",
        )

    def _paged(self, what: str, search: Callable[[int, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Every result of a QIDO-RS search, a page of :data:`PAGE` at a time. Some archives ignore ``offset``
        when they filter after the search (Orthanc with ModalitiesInStudy): a page with nothing new ends it."""
        out: list[dict[str, Any]] = []
        seen: set[tuple[Any, Any]] = set()
        offset = 0
        while True:
            rows = self._call(what, functools.partial(search, PAGE, offset))
            new = [r for r in rows if (_value(r, _STUDY_UID), _value(r, _SERIES_UID)) not in seen]
            seen.update((_value(r, _STUDY_UID), _value(r, _SERIES_UID)) for r in rows)
            out += new
            if len(rows) < PAGE or not new:
                return out
            offset += len(rows)

    # -- search ----------------------------------------------------------------------------
    def find_studies(self, query: Query) -> list[str]:
        """StudyInstanceUIDs matching the query's dates, accession numbers and modality (QIDO-RS /studies)."""
        filters: dict[str, Any] = {}
        if query.date_range:
            filters["StudyDate"] = query.date_range
        if query.modality:
            filters["ModalitiesInStudy"] = query.modality
        accessions: Sequence[str | None] = query.accessions or [None]
        out: list[str] = []
        for acc in accessions:
            f = dict(filters)
            if acc:
                f["AccessionNumber"] = acc

            def search(limit: int, offset: int, f: dict[str, Any] = f) -> list[dict[str, Any]]:
                return self.client.search_for_studies(search_filters=f, limit=limit, offset=offset)

            rows = self._paged("QIDO-RS study search", search)
            out.extend(u for u in (_value(r, _STUDY_UID) for r in rows) if u)
        return list(dict.fromkeys(out))

    def find_series(self, study_uid: str | None, *, series_uid: str | None = None, modality: str = "CT") -> list[RemoteSeries]:
        """Series of a study (or the one series ``series_uid``) with the given modality (QIDO-RS series search)."""
        filters: dict[str, Any] = {}
        if modality:
            filters["Modality"] = modality
        if series_uid:
            filters["SeriesInstanceUID"] = series_uid
        fields = ["NumberOfSeriesRelatedInstances", "StudyInstanceUID"]

        def search(limit: int, offset: int) -> list[dict[str, Any]]:
            return self.client.search_for_series(
                study_instance_uid=study_uid, search_filters=filters, fields=fields, limit=limit, offset=offset
            )

        rows = self._paged("QIDO-RS series search", search)
        out = []
        for r in rows:
            study = _value(r, _STUDY_UID) or study_uid
            series = _value(r, _SERIES_UID)
            if not (study and series) or not (valid_uid(study) and valid_uid(series)):
                log.warning("DICOMweb %s listed a series without valid UIDs (%r, %r); ignored", self.endpoint, study, series)
                continue
            n = _value(r, _N_INSTANCES)
            out.append(RemoteSeries(study, series, str(_value(r, _MODALITY) or modality), int(n) if n is not None else None))
        return out

    def listed_instances(self, study_uid: str, series_uid: str) -> int | None:
        """How many instances the archive lists in a series now: the NumberOfSeriesRelatedInstances of a QIDO-RS
        series search, or, for an archive that gives none, the SOPInstanceUIDs its QIDO-RS instance search lists
        (``/studies/{study}/series/{series}/instances``, a page of :data:`PAGE` at a time). None when it lists none.
        What a retrieval is checked against when the search that found the series gave no count."""
        again = self.find_series(study_uid, series_uid=series_uid, modality="")
        counted = [s.n_instances for s in again if s.n_instances is not None]
        if counted:
            return max(counted)
        seen: set[str] = set()
        offset = 0
        while True:

            def search(limit: int = PAGE, offset: int = offset) -> list[dict[str, Any]]:
                return self.client.search_for_instances(
                    study_instance_uid=study_uid,
                    series_instance_uid=series_uid,
                    fields=["SOPInstanceUID"],
                    limit=limit,
                    offset=offset,
                )

            rows = self._call(f"QIDO-RS instance search of series {series_uid}", search)
            new = {str(u) for u in (_value(r, _SOP_UID) for r in rows) if u} - seen
            seen |= new
            if len(rows) < PAGE or not new:
                return len(seen) or None
            offset += len(rows)

    # -- retrieve --------------------------------------------------------------------------
    def retrieve(self, series: RemoteSeries, dest: Path) -> int:
        """WADO-RS the series into ``dest`` (one file per instance); returns the number of files written."""

        def fetch() -> int:
            import pydicom

            # a retry starts again from an empty folder
            for p in dest.glob("*.dcm"):
                p.unlink()
            n = 0
            for ds in self.client.iter_series(series.study_uid, series.series_uid, media_types=(("application/dicom", "*"),)):
                short = _pixel_data_cut_short(ds)
                if short is not None:  # the multipart client hands on the last part as it is when the stream ends
                    raise PacsUnavailableError(
                        f"WADO-RS retrieval of series {series.series_uid}: instance {ds.get('SOPInstanceUID', '?')} "
                        f"arrived cut short ({short[0]} of {short[1]} bytes of pixel data; {n} whole instance(s) before "
                        "it): the connection dropped mid-transfer (the archive stopped or the network dropped)",
                        where=self.endpoint.redacted(),
                        fix="check that the archive is running and reachable; what was received is discarded and the "
                        "series retrieved again whole (pacs.retries, or the next run)",
                    )
                buf = io.BytesIO()
                pydicom.dcmwrite(buf, ds, enforce_file_format=True)
                write_instance(dest, str(ds.SOPInstanceUID), buf.getvalue())
                n += 1
            return n

        return self._call(f"WADO-RS retrieval of series {series.series_uid}", fetch)

    # -- store -----------------------------------------------------------------------------
    def store(self, paths: Sequence[Path]) -> list[StoreOutcome]:
        """STOW-RS the files (one request); the outcome of each, as the archive's response lists it."""
        import pydicom

        datasets = [pydicom.dcmread(p) for p in paths]
        uids = [str(ds.SOPInstanceUID) for ds in datasets]
        resp = self._call(f"STOW-RS of {len(datasets)} instance(s)", lambda: self.client.store_instances(datasets))
        failed: dict[str, str] = {}
        for item in resp.get("FailedSOPSequence", []) if resp is not None else []:
            failed[str(item.get("ReferencedSOPInstanceUID", ""))] = f"failure reason {item.get('FailureReason', '?')}"
        return [StoreOutcome(p, u, u not in failed, failed.get(u, "")) for p, u in zip(paths, uids)]

    def held(self, study_uid: str, sop_uids: Sequence[str]) -> set[str]:
        """Which of the instances ``sop_uids`` of study ``study_uid`` the archive holds: one QIDO-RS request,
        ``/studies/{study}/instances?SOPInstanceUID=uid1,uid2,...`` (list of UID matching)."""
        if not sop_uids:
            return set()

        def search() -> list[dict[str, Any]]:
            return self.client.search_for_instances(
                study_instance_uid=study_uid,
                search_filters={"SOPInstanceUID": ",".join(sop_uids)},
                fields=["SOPInstanceUID"],
                limit=len(sop_uids),
            )

        try:
            rows = self._call("QIDO-RS instance search for the results sent", search)
        except PacsRequestError as exc:
            raise unverifiable(exc, "QIDO-RS instance searches") from exc
        return {str(u) for u in (_value(r, _SOP_UID) for r in rows) if u}

    def held_series(self, study_uid: str, series_uids: Sequence[str]) -> dict[str, int | None]:
        """Which of the series ``series_uids`` of study ``study_uid`` the archive lists, and how many instances it
        says each has: one QIDO-RS request, ``/studies/{study}/series?SeriesInstanceUID=uid1,uid2,...``."""
        if not series_uids:
            return {}

        def search() -> list[dict[str, Any]]:
            return self.client.search_for_series(
                study_instance_uid=study_uid,
                search_filters={"SeriesInstanceUID": ",".join(series_uids)},
                fields=["SeriesInstanceUID", "NumberOfSeriesRelatedInstances"],
                limit=len(series_uids),
            )

        try:
            rows = self._call("QIDO-RS series search for the results sent", search)
        except PacsRequestError as exc:
            raise unverifiable(exc, "QIDO-RS series searches") from exc
        out: dict[str, int | None] = {}
        for r in rows:
            uid, n = _value(r, _SERIES_UID), _value(r, _N_INSTANCES)
            if uid:
                out[str(uid)] = int(n) if n not in (None, "") else None
        return out

    def close(self) -> None:
        self.session.close()
