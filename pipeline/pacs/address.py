"""PACS addresses: the source syntax of ``ctpipe run`` and the destination syntax of ``pacs.send_to``.

Sources (one argument of ``ctpipe run`` each; quote them in a shell)::

    dicomweb+http://HOST:PORT/PATH?QUERY      a DICOMweb archive (QIDO-RS search, WADO-RS retrieve)
    dicomweb+https://HOST:PORT/PATH?QUERY     the same over TLS (certificates verified unless pacs.tls_verify: false)
    dimse://AET@HOST:PORT?QUERY               a DIMSE archive with AE title AET (C-FIND, then C-MOVE or C-GET)

QUERY selects the series (``&``-separated; lists comma-separated); at least one of studydate, accession,
study, series or worklist is required, so that a bare address never pulls a whole archive:

    studydate=YYYYMMDD | YYYYMMDD-YYYYMMDD | today | yesterday   study date or inclusive range (archive's local dates)
    accession=A1,A2           accession numbers
    study=UID,UID             StudyInstanceUIDs
    series=UID,UID            SeriesInstanceUIDs
    worklist=FILE.csv         a CSV with a StudyInstanceUID and/or SeriesInstanceUID column
    modality=CT               modality of the series to take (default CT)
    retrieve=move|get         DIMSE only: C-MOVE to ctpipe's storage SCP or C-GET (default: pacs.retrieve)

Destinations (``pacs.send_to``) use the same forms without a query. Addresses never carry credentials
(``user:password@`` is refused): DICOMweb credentials come from the environment or a netrc file
(:mod:`pipeline.pacs.auth`). :func:`redact` removes passwords; :func:`redact_identifiers` also withholds the
query values that identify a patient (accession numbers); :func:`for_records` gives the form logs, ledgers and
the run store keep (the second unless ``privacy.keep_identifiers``).
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from ..csvfile import read_table
from ..errors import PacsAddressError, PacsUnavailableError

SCHEMES = ("dicomweb+http", "dicomweb+https", "dimse")
QUERY_KEYS = ("studydate", "accession", "study", "series", "worklist", "modality", "retrieve")
_UID = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_AET = re.compile(r"^[\x21-\x7e]([\x20-\x7e]{0,14}[\x21-\x7e])?$")  # 1-16 printable characters, no backslash rule here
_DATE = re.compile(r"^\d{8}$")
#: query keys whose values identify a patient or a visit (AccessionNumber, see pipeline.volume.PATIENT_IDENTIFIERS);
#: study dates and UIDs are not among them (outputs need them to refer to the images)
IDENTIFYING_QUERY_KEYS = ("accession",)
WITHHELD = "***"
_ADDRESS = re.compile(r"(?i)(?:dicomweb\+https?|dimse)://[^\s'\"]*")


def is_pacs_address(text: str) -> bool:
    """True when ``text`` uses one of the PACS schemes (``dicomweb+http(s)://``, ``dimse://``)."""
    return any(str(text).lower().startswith(s + "://") for s in SCHEMES)


def valid_uid(uid: str) -> bool:
    """A DICOM UID: digits and dots, at most 64 characters (safe as a file or folder name)."""
    return 0 < len(uid) <= 64 and bool(_UID.match(uid))


def check_aet(aet: str, where: str) -> str:
    """An AE title: 1–16 printable ASCII characters, no backslash; returned stripped."""
    aet = aet.strip()
    if not _AET.match(aet) or "\\" in aet:
        raise PacsAddressError(
            f"AE title {aet!r} is not valid",
            where=where,
            fix="use 1 to 16 printable ASCII characters without a backslash, e.g. ORTHANC",
        )
    return aet


@dataclass(frozen=True)
class Endpoint:
    """Where a PACS is: ``kind`` "dicomweb" (``url`` is its http(s) base URL) or "dimse" (``aet``, ``host``, ``port``)."""

    kind: str
    host: str
    port: int
    url: str = ""
    aet: str = ""

    def redacted(self) -> str:
        """The address as written to logs and ledgers (it never holds credentials)."""
        return f"dicomweb+{self.url}" if self.kind == "dicomweb" else f"dimse://{self.aet}@{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.redacted()


@dataclass(frozen=True)
class Query:
    """Which series to take from a source (see the module docstring for the syntax)."""

    study_dates: tuple[str, str] | None = None  # inclusive (YYYYMMDD, YYYYMMDD)
    accessions: tuple[str, ...] = ()
    studies: tuple[str, ...] = ()
    series: tuple[tuple[str | None, str], ...] = ()  # (StudyInstanceUID or None, SeriesInstanceUID)
    modality: str = "CT"
    retrieve: str | None = None  # DIMSE: "move" | "get" | None = pacs.retrieve

    @property
    def date_range(self) -> str | None:
        """The DICOM range matching string of the study dates, e.g. ``20261130-20261130``."""
        return None if self.study_dates is None else f"{self.study_dates[0]}-{self.study_dates[1]}"


@dataclass(frozen=True)
class PacsSource:
    """One PACS source of a run: the archive and the query."""

    endpoint: Endpoint
    query: Query = field(default_factory=Query)
    text: str = ""  # the source as given (never holds credentials)

    def __str__(self) -> str:
        return self.text or self.endpoint.redacted()


def redact(text: str) -> str:
    """``text`` with the password of any ``user:password@`` part of a URL replaced by ``***``."""
    return re.sub(r"(://[^/@:\s]*):[^/@\s]*@", r"\1:***@", str(text))


def without_url_queries(text: str) -> str:
    """``text`` (e.g. an HTTP library's error message) as :func:`redact` gives it, with the query of every http(s)
    URL in it replaced by ``?***``: a QIDO-RS search puts its filters there, an ``AccessionNumber`` among them."""
    return re.sub(r"(https?://[^\s?#'\"]*)\?[^\s'\"]*", rf"\1?{WITHHELD}", redact(text))


def redact_identifiers(text: str) -> str:
    """``text`` (an address, or a command line holding addresses) as :func:`redact` gives it, with the values of
    the query keys that identify a patient (:data:`IDENTIFYING_QUERY_KEYS`: ``accession``) replaced by ``***``.

    ``dimse://PACS@host:104?accession=A123&modality=CT`` becomes ``dimse://PACS@host:104?accession=***&modality=CT``;
    text outside PACS addresses is left as it is.
    """

    def withhold(match: re.Match[str]) -> str:
        base, sep, query = match.group(0).partition("?")
        if not sep:
            return base
        pairs = []
        for pair in query.split("&"):
            key, eq, value = pair.partition("=")
            if eq and value and unquote_plus(key).strip().lower() in IDENTIFYING_QUERY_KEYS:
                pair = f"{key}={WITHHELD}"
            pairs.append(pair)
        return f"{base}?{'&'.join(pairs)}"

    return _ADDRESS.sub(withhold, redact(text))


def for_records(text: str, *, keep_identifiers: bool) -> str:
    """``text`` (an address, a command line) as logs, ledgers and the run store keep it: never a password
    (:func:`redact`), and the query values that identify a patient withheld (:func:`redact_identifiers`) unless
    ``keep_identifiers`` (``privacy.keep_identifiers``)."""
    return redact(text) if keep_identifiers else redact_identifiers(text)


def _endpoint(text: str, where: str) -> tuple[Endpoint, str]:
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise PacsAddressError(
            f"unknown scheme {parts.scheme!r} in {redact_identifiers(text)!r}",
            where=where,
            fix="use dicomweb+http://HOST:PORT/PATH, dicomweb+https://... or dimse://AET@HOST:PORT",
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise PacsAddressError(
            f"bad port in {redact_identifiers(text)!r} ({exc})", where=where, fix="give a port in 1..65535"
        ) from exc
    host = parts.hostname or ""
    if not host:
        raise PacsAddressError(
            f"no host in {redact_identifiers(text)!r}", where=where, fix="e.g. dimse://ORTHANC@pacs.example.org:104"
        )
    if parts.fragment:
        raise PacsAddressError(f"a '#' fragment is not allowed in {redact_identifiers(text)!r}", where=where, fix="remove it")
    if scheme == "dimse":
        if parts.password is not None or not parts.username:
            raise PacsAddressError(
                f"{redact_identifiers(text)!r} names no AE title (or holds a password)",
                where=where,
                fix="write the archive's AE title before '@': dimse://AET@HOST:PORT",
            )
        if port is None:
            raise PacsAddressError(
                f"no port in {redact_identifiers(text)!r}", where=where, fix="write dimse://AET@HOST:PORT (often 104 or 4242)"
            )
        if parts.path not in ("", "/"):
            raise PacsAddressError(
                f"a DIMSE address has no path (got {parts.path!r})", where=where, fix="dimse://AET@HOST:PORT?QUERY"
            )
        return Endpoint("dimse", host, port, aet=check_aet(parts.username, where)), parts.query
    if parts.username is not None or parts.password is not None:
        raise PacsAddressError(
            f"credentials in the address {redact_identifiers(text)!r} are refused",
            where=where,
            fix="remove 'user:password@' and set CTPIPE_DICOMWEB_USER / CTPIPE_DICOMWEB_PASSWORD or a netrc file",
        )
    http = scheme.split("+", 1)[1]
    netloc = host if port is None else f"{host}:{port}"
    if ":" in host:  # IPv6 literal
        netloc = f"[{host}]" + (f":{port}" if port is not None else "")
    url = f"{http}://{netloc}{parts.path.rstrip('/')}"
    return Endpoint("dicomweb", host, port or (443 if http == "https" else 80), url=url), parts.query


def parse_destination(text: str, *, where: str = "pacs.send_to") -> Endpoint:
    """A destination address (no query): where results are sent."""
    endpoint, query = _endpoint(text.strip(), where)
    if query:
        raise PacsAddressError(f"a destination takes no query (got '?{query}')", where=where, fix="remove the '?...' part")
    return endpoint


def _dates(value: str, where: str, today: dt.date | None = None) -> tuple[str, str]:
    day = today or dt.date.today()
    named = {"today": day, "yesterday": day - dt.timedelta(days=1)}
    if value.lower() in named:
        d = named[value.lower()].strftime("%Y%m%d")
        return d, d
    lo, _, hi = value.partition("-")
    hi = hi or lo
    for d in (lo, hi):
        try:
            ok = bool(_DATE.match(d)) and dt.datetime.strptime(d, "%Y%m%d") is not None
        except ValueError:
            ok = False
        if not ok:
            raise PacsAddressError(
                f"studydate={value!r} is not a date or range",
                where=where,
                fix="write YYYYMMDD, YYYYMMDD-YYYYMMDD, today or yesterday",
            )
    if lo > hi:
        raise PacsAddressError(f"studydate={value!r} ends before it starts", where=where, fix="write the earlier date first")
    return lo, hi


def _uids(value: str, key: str, where: str) -> tuple[str, ...]:
    out = tuple(u.strip() for u in value.split(",") if u.strip())
    bad = [u for u in out if not valid_uid(u)]
    if bad or not out:
        raise PacsAddressError(
            f"{key}={value!r} holds no valid UID list (bad: {bad[:3]})",
            where=where,
            fix="write UIDs of digits and dots, comma-separated",
        )
    return out


def read_uid_worklist(path: Path, where: str) -> tuple[tuple[str | None, str], ...] | tuple[str, ...]:
    """Rows of a UID worklist CSV: ``((study, series), ...)`` when it has a series column, else ``(study, ...)``."""
    try:
        rows = read_table(path).rows
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise PacsAddressError(
            f"cannot read the worklist {path} ({exc})",
            where=where,
            fix="give a CSV file with a StudyInstanceUID and/or SeriesInstanceUID column",
        ) from exc
    names = {n.lower().replace("_", ""): n for n in (rows[0].keys() if rows else [])}
    study_col = names.get("studyinstanceuid") or names.get("studyuid")
    series_col = names.get("seriesinstanceuid") or names.get("seriesuid")
    if rows and not (study_col or series_col):
        raise PacsAddressError(
            f"the worklist {path} has no StudyInstanceUID or SeriesInstanceUID column (columns: {', '.join(rows[0])})",
            where=where,
            fix="name a column StudyInstanceUID or SeriesInstanceUID",
        )
    pairs: list[tuple[str | None, str]] = []
    studies: list[str] = []
    for n, row in enumerate(rows, start=2):
        study = (row.get(study_col) or "").strip() if study_col else ""
        series = (row.get(series_col) or "").strip() if series_col else ""
        for uid in (study, series):
            if uid and not valid_uid(uid):
                raise PacsAddressError(
                    f"row {n} of {path} holds {uid!r}, not a UID", where=where, fix="correct or remove the row"
                )
        if series:
            pairs.append((study or None, series))
        elif study:
            studies.append(study)
    if series_col and studies:
        raise PacsAddressError(
            f"rows of {path} mix series rows and study-only rows",
            where=where,
            fix="give every row a SeriesInstanceUID, or use a study-only worklist",
        )
    return tuple(pairs) if series_col else tuple(studies)


def parse_source(text: str, *, base: Path | None = None, today: dt.date | None = None) -> PacsSource:
    """Parse a PACS source of ``ctpipe run`` (see the module docstring); relative worklists resolve against ``base``."""
    where = redact_identifiers(text)  # errors name the source without its accession numbers
    endpoint, raw_query = _endpoint(text.strip(), where)
    q: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True, strict_parsing=False):
        k = key.lower()
        if k not in QUERY_KEYS:
            raise PacsAddressError(f"unknown query key {key!r}", where=where, fix=f"use {', '.join(QUERY_KEYS)}")
        if k in q:
            raise PacsAddressError(
                f"query key {key!r} given twice", where=where, fix="give each key once; lists are comma-separated"
            )
        q[k] = value.strip()
    dates = _dates(q["studydate"], where, today) if "studydate" in q else None
    accessions = tuple(a.strip() for a in q.get("accession", "").split(",") if a.strip())
    studies = _uids(q["study"], "study", where) if "study" in q else ()
    series: tuple[tuple[str | None, str], ...] = (
        tuple((None, s) for s in _uids(q["series"], "series", where)) if "series" in q else ()
    )
    if "worklist" in q:
        wl = Path(q["worklist"]).expanduser()
        if not wl.is_absolute() and base is not None:
            wl = base / wl
        rows = read_uid_worklist(wl, where)
        if rows and isinstance(rows[0], tuple):
            series += tuple(r for r in rows if isinstance(r, tuple))
        else:
            studies += tuple(r for r in rows if isinstance(r, str))
        if not rows:
            raise PacsAddressError(f"the worklist {wl} has no rows", where=where, fix="list at least one study or series")
    retrieve = q.get("retrieve") or None
    if retrieve is not None:
        if endpoint.kind != "dimse":
            raise PacsAddressError("retrieve= applies to dimse:// sources only", where=where, fix="remove it")
        if retrieve not in ("move", "get"):
            raise PacsAddressError(
                f"retrieve={retrieve!r} is not move or get", where=where, fix="write retrieve=move or retrieve=get"
            )
    if not (dates or accessions or studies or series):
        raise PacsAddressError(
            "the source selects nothing (no studydate, accession, study, series or worklist)",
            where=where,
            fix="add e.g. ?studydate=20261130 or ?accession=A123 (a bare address would pull the whole archive)",
        )
    modality = q.get("modality", "CT").upper() or "CT"
    query = Query(dates, accessions, studies, series, modality, retrieve)
    return PacsSource(endpoint, query, text=redact(text))  # its accessions withheld as each record's rule says


def listen_error(exc: OSError, bind: str, port: int, *, port_key: str, port_fix: str) -> PacsUnavailableError:
    """The error of a server that cannot listen on ``bind:port``: the address (``pacs.bind``) when it is none of
    this machine's, else the port (``port_key``, with ``port_fix``)."""
    import errno
    import socket

    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return PacsUnavailableError(
            f"cannot listen on {bind}:{port}: {bind!r} is not an address of this machine ({exc.strerror})",
            where="pacs.bind",
            fix="give --bind an address of this machine: 127.0.0.1, 0.0.0.0 (every interface) or one of its own",
        )
    return PacsUnavailableError(f"cannot listen on {bind}:{port} ({exc.strerror})", where=port_key, fix=port_fix)
