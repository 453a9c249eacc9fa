"""DIMSE archives (``pynetdicom``): C-FIND, then C-MOVE to ctpipe's own storage SCP or C-GET; C-STORE of results.

ctpipe calls the archive as ``pacs.ae_title``; the archive must know that AE title (for C-MOVE, at
``pacs.bind``:``pacs.move_port``, where :class:`MoveReceiver` listens while a retrieval runs and
accepts instances from the archive's AE title only). Every association uses ``pacs.timeout_s`` for
connecting, negotiating and each DIMSE message. An association that cannot be set up or is aborted
raises :class:`~pipeline.errors.PacsUnavailableError` (retried), and so does one the archive rejects for now
(transient: congestion); a rejected association or a failure status raises
:class:`~pipeline.errors.PacsRequestError`, the rejection with the archive's reason and the AE title to correct (a
called AE title not recognised: the address's; a calling one: ``pacs.ae_title``, to be listed at the archive), and so
does an association the archive closes at the first request, unanswered (how archives such as Orthanc refuse a
calling AE title they do not list).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import PacsRequestError
from .address import Endpoint, Query, valid_uid
from .archive import CT_SOP_CLASSES, RemoteSeries
from .dimse_link import _UNCOMPRESSED, FIND, GET, MOVE
from .dimse_store import DimseStorer
from .move_receiver import MoveReceiver
from .scp import STATUS_OK, STATUS_UNEXPECTED, ct_storage_contexts, store_event

log = logging.getLogger(__name__)


class DimseArchive(DimseStorer):
    """A DIMSE archive at ``endpoint`` (AE title, host, port); ``mode`` "move" or "get" for retrievals. The
    associations: :mod:`pipeline.pacs.dimse_link`; storing results and confirming them: :mod:`pipeline.pacs.dimse_store`."""

    def __init__(self, endpoint: Endpoint, cfg: Any, *, mode: str = "move"):
        super().__init__(endpoint, cfg, mode=mode)
        self._receiver: MoveReceiver | None = None
        #: series UID → the sub-operations the archive's last C-MOVE or C-GET response said it completed
        self.completed: dict[str, int] = {}

    # -- search ----------------------------------------------------------------------------
    def find_studies(self, query: Query) -> list[str]:
        """StudyInstanceUIDs matching the query's dates, accession numbers and modality (C-FIND, STUDY level)."""
        from pydicom.dataset import Dataset

        out: list[str] = []
        for acc in query.accessions or [None]:
            ds = Dataset()
            ds.QueryRetrieveLevel = "STUDY"
            ds.StudyInstanceUID = ""
            ds.StudyDate = query.date_range or ""
            ds.AccessionNumber = acc or ""
            ds.ModalitiesInStudy = query.modality or ""

            def find(ds: Dataset = ds) -> list[str]:
                with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                    return [
                        str(i.StudyInstanceUID)
                        for i in self._responses("C-FIND (study)", assoc.send_c_find(ds, FIND))
                        if i is not None and i.get("StudyInstanceUID")
                    ]

            out.extend(self._call("C-FIND (study)", find))
        return list(dict.fromkeys(out))

    def find_series(self, study_uid: str | None, *, series_uid: str | None = None, modality: str = "CT") -> list[RemoteSeries]:
        """Series of a study (or the one series ``series_uid``, found at SERIES level) with the given modality."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = study_uid or ""
        ds.SeriesInstanceUID = series_uid or ""
        ds.Modality = modality or ""
        ds.NumberOfSeriesRelatedInstances = ""

        def find() -> list[RemoteSeries]:
            out = []
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                for i in self._responses("C-FIND (series)", assoc.send_c_find(ds, FIND)):
                    if i is None:
                        continue
                    study, series = str(i.get("StudyInstanceUID", "") or study_uid or ""), str(i.get("SeriesInstanceUID", ""))
                    if not (valid_uid(study) and valid_uid(series)):
                        log.warning("%s listed a series without valid UIDs (%r, %r); ignored", self._where(), study, series)
                        continue
                    n = i.get("NumberOfSeriesRelatedInstances")
                    out.append(
                        RemoteSeries(
                            study, series, str(i.get("Modality", "") or modality), int(n) if n not in (None, "") else None
                        )
                    )
            return out

        return self._call("C-FIND (series)", find)

    # -- retrieve --------------------------------------------------------------------------
    def retrieve(self, series: RemoteSeries, dest: Path) -> int:
        """C-MOVE (to :class:`MoveReceiver`) or C-GET the series into ``dest``; returns the number of files there."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = series.study_uid
        ds.SeriesInstanceUID = series.series_uid

        def once() -> int:
            for p in dest.glob("*.dcm"):  # a retry starts again from an empty folder
                p.unlink()
            if self.mode == "get":
                self._get(ds, dest)
            else:
                self._move(ds, series.series_uid, dest)
            return sum(1 for _ in dest.glob("*.dcm"))

        return self._call(f"C-{self.mode.upper()} of series {series.series_uid}", once)

    def _move(self, ds: Any, series_uid: str, dest: Path) -> None:

        if self._receiver is None:
            self._receiver = MoveReceiver(self.cfg, archive_aet=self.endpoint.aet)
        receiver = self._receiver
        turned_away = len(receiver.turned_away)
        with receiver.route(series_uid, dest), self._association([(MOVE, _UNCOMPRESSED)]) as assoc:
            try:
                moved = self._counted(series_uid, assoc.send_c_move(ds, self.cfg.pacs.ae_title, MOVE))
                for _ in self._responses("C-MOVE", moved, received=lambda: _count(dest)):
                    pass
            except PacsRequestError as exc:
                if any(dest.glob("*.dcm")):
                    raise
                seen = list(dict.fromkeys(receiver.turned_away[turned_away:]))
                came = [calling for calling, _ in seen if calling != self.endpoint.aet]
                addressed = [called for calling, called in seen if calling == self.endpoint.aet]
                if addressed:  # the archive sends to another AE title than ctpipe's
                    raise PacsRequestError(
                        f"{exc.problem}; ctpipe's C-MOVE receiver turned away the archive's association, addressed to AE "
                        f"title {addressed[0]!r}, not {self.cfg.pacs.ae_title!r} (pacs.ae_title)",
                        where=exc.where,
                        fix=f"the archive's entry for ctpipe must have AE title {self.cfg.pacs.ae_title!r}, or set "
                        "pacs.check_called_aet: false",
                    ) from exc
                if came:  # the archive reached the receiver, but sends from another AE title than the address names
                    raise PacsRequestError(
                        f"{exc.problem}; ctpipe's C-MOVE receiver turned away an association from calling AE title "
                        f"{came[0]!r}: it takes instances only from {self.endpoint.aet!r}, the AE title of the address",
                        where=exc.where,
                        fix=f"if {came[0]!r} is the archive's AE title, put it in the address "
                        f"(dimse://{came[0]}@{self.endpoint.host}:{self.endpoint.port}); an archive that sends from an AE "
                        "title of its own for C-MOVE needs C-GET instead (retrieve=get)",
                    ) from exc
                raise self._nothing_arrived(exc) from exc

    def _counted(self, series_uid: str, responses: Any) -> Iterator[Any]:
        """``responses`` of a C-MOVE or C-GET, noting in :attr:`completed` the Number of Completed Sub-operations the
        archive's responses give (the last one that gives it)."""
        self.completed.pop(series_uid, None)
        for status, identifier in responses:
            n = status.get("NumberOfCompletedSuboperations") if status else None
            if n not in (None, ""):
                self.completed[series_uid] = int(n)
            yield status, identifier

    def _nothing_arrived(self, exc: PacsRequestError) -> PacsRequestError:
        """The error of a C-MOVE the archive failed with no instance reaching ctpipe's receiver: most often the
        archive cannot reach it (the move destination). A receiver on a loopback address (the default ``pacs.bind``)
        cannot be reached from an archive on another machine: said first, with the setting to change."""
        me, bind, port = self.cfg.pacs.ae_title, str(self.cfg.pacs.bind), self.cfg.pacs.move_port
        listed = (
            f"the archive must list AE title {me!r} (pacs.ae_title) at this host and port {port} (pacs.move_port), and "
            f"send as {self.endpoint.aet!r} (the AE title of the address); or retrieve by C-GET (retrieve=get)"
        )
        problem = f"{exc.problem}; no instance reached ctpipe's C-MOVE receiver ({me} at {bind}:{port})"
        if _is_loopback(bind) and not _is_loopback(self.endpoint.host):
            return PacsRequestError(
                f"{problem}, which listens on {bind} (pacs.bind): an archive on another machine "
                f"({self.endpoint.host}) cannot reach it",
                where=exc.where,
                fix="set pacs.bind to 0.0.0.0 (every interface) or this machine's address on the archive's network; "
                f"then {listed}",
            )
        return PacsRequestError(problem, where=exc.where, fix=listed)

    def _get(self, ds: Any, dest: Path) -> None:
        from pynetdicom import build_role, evt

        roles = [build_role(uid, scp_role=True) for uid in CT_SOP_CLASSES]
        contexts = [(GET, _UNCOMPRESSED), *ct_storage_contexts()]
        handlers = [(evt.EVT_C_STORE, lambda event: store_event(event, lambda _ds: dest))]
        with self._association(contexts, ext_neg=roles, handlers=handlers) as assoc:
            got = self._counted(str(ds.SeriesInstanceUID), assoc.send_c_get(ds, GET))
            for _ in self._responses("C-GET", got, received=lambda: _count(dest)):
                pass

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, 127.0.0.0/8, ``::1``), without a
    name lookup."""
    import ipaddress

    if host.strip("[]").lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _count(folder: Path) -> int:
    """How many instances a retrieval has written into ``folder`` so far."""
    return sum(1 for _ in folder.glob("*.dcm"))


__all__ = ["STATUS_OK", "STATUS_UNEXPECTED", "DimseArchive", "MoveReceiver"]
