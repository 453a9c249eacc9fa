"""C-STORE of ctpipe's results to a DIMSE archive, and the C-FIND queries that confirm it holds them (the storing
half of :class:`~pipeline.pacs.dimse.DimseArchive`). A destination that closes the association at the first C-STORE,
unanswered, refuses ctpipe's calling AE title (:class:`~pipeline.errors.PacsRequestError`). Records are logged as
``pipeline.pacs.dimse``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import PacsRequestError, PacsUnavailableError
from .archive import StoreOutcome, unverifiable
from .dimse_link import _UNCOMPRESSED, FIND, DimseLink, _ended, _sop_name

log = logging.getLogger("pipeline.pacs.dimse")

_STORE_OK = (0x0000, 0xB000, 0xB006, 0xB007)


class DimseStorer(DimseLink):
    """Stores files at the DIMSE archive and asks which it holds."""

    def store(self, paths: Sequence[Path]) -> list[StoreOutcome]:
        """C-STORE the files on one association; the status of each."""
        import pydicom
        from pydicom.uid import ExplicitVRLittleEndian

        datasets = [pydicom.dcmread(p) for p in paths]
        wanted: dict[str, set[str]] = {}
        for ds in datasets:
            wanted.setdefault(str(ds.SOPClassUID), set()).update({str(ds.file_meta.TransferSyntaxUID), ExplicitVRLittleEndian})
        contexts = [(cls, sorted(ts)) for cls, ts in wanted.items()]

        def send() -> list[StoreOutcome]:
            out = []
            with self._association(contexts, storing=True) as assoc:
                accepted = {str(cx.abstract_syntax) for cx in assoc.accepted_contexts}
                answered = 0  # requests the destination answered on this association
                for n, (p, ds) in enumerate(zip(paths, datasets)):
                    cls = str(ds.SOPClassUID)
                    if cls not in accepted:
                        out.append(
                            StoreOutcome(p, str(ds.SOPInstanceUID), False, f"{_sop_name(cls)} not accepted by the destination")
                        )
                        continue
                    t0 = time.monotonic()
                    try:
                        status = assoc.send_c_store(ds) if assoc.is_established else None
                    except ValueError as exc:  # no accepted transfer syntax fits the file, or it cannot be encoded
                        out.append(StoreOutcome(p, str(ds.SOPInstanceUID), False, f"not sent: {exc}"))
                        continue
                    except RuntimeError:  # the association ended between two requests
                        status = None
                    answered_quickly = time.monotonic() - t0 < 0.9 * float(self.cfg.pacs.timeout_s)
                    if not status and answered == 0 and answered_quickly and _ended(assoc):
                        raise self._store_refused(len(paths))
                    if not status and _ended(assoc):  # aborted or released by the destination
                        why = f"the destination closed the association after {n} of {len(paths)} file(s): not sent"
                        out += [StoreOutcome(q, str(d.SOPInstanceUID), False, why) for q, d in zip(paths[n:], datasets[n:])]
                        log.warning("%s: %s", self._where(), why, extra={"event": "association_closed"})
                        break
                    if not status:
                        raise PacsUnavailableError(
                            f"C-STORE of {p.name}: no answer within {self.cfg.pacs.timeout_s:g} s",
                            where=self._where(),
                            fix="the destination is slow or stopped",
                        )
                    answered += 1
                    code = int(status.Status)
                    out.append(StoreOutcome(p, str(ds.SOPInstanceUID), code in _STORE_OK, _store_status(code)))
            return out

        return self._call(f"C-STORE of {len(paths)} instance(s)", send)

    def held(self, study_uid: str, sop_uids: Sequence[str]) -> set[str]:
        """Which of the instances ``sop_uids`` of study ``study_uid`` the archive holds: one C-FIND at IMAGE level
        whose SOPInstanceUID is the list of them (list of UID matching)."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "IMAGE"
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = ""
        ds.SOPInstanceUID = list(sop_uids) if len(sop_uids) > 1 else (sop_uids[0] if sop_uids else "")

        def find() -> set[str]:
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                return {
                    str(i.SOPInstanceUID)
                    for i in self._responses("C-FIND (image)", assoc.send_c_find(ds, FIND))
                    if i is not None and i.get("SOPInstanceUID")
                }

        try:
            return self._call("C-FIND (image) of the results sent", find)
        except PacsRequestError as exc:
            raise unverifiable(exc, "C-FIND at IMAGE level") from exc

    def held_series(self, study_uid: str, series_uids: Sequence[str]) -> dict[str, int | None]:
        """Which of the series ``series_uids`` of study ``study_uid`` the archive lists, and how many instances it
        says each has: one C-FIND at SERIES level (list of UID matching), NumberOfSeriesRelatedInstances asked for."""
        from pydicom.dataset import Dataset

        ds = Dataset()
        ds.QueryRetrieveLevel = "SERIES"
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = list(series_uids) if len(series_uids) > 1 else (series_uids[0] if series_uids else "")
        ds.NumberOfSeriesRelatedInstances = ""

        def find() -> dict[str, int | None]:
            out: dict[str, int | None] = {}
            with self._association([(FIND, _UNCOMPRESSED)]) as assoc:
                for i in self._responses("C-FIND (series)", assoc.send_c_find(ds, FIND)):
                    if i is not None and i.get("SeriesInstanceUID"):
                        n = i.get("NumberOfSeriesRelatedInstances")
                        out[str(i.SeriesInstanceUID)] = int(n) if n not in (None, "") else None
            return out

        try:
            return self._call("C-FIND (series) of the results sent", find)
        except PacsRequestError as exc:
            raise unverifiable(exc, "C-FIND at SERIES level") from exc

    def _store_refused(self, n_files: int) -> PacsRequestError:
        """The error for a destination that accepted the association, then closed it at the first C-STORE request
        without answering it: what an archive does (Orthanc among them) to a calling AE title it does not allow to
        store. A refusal, not a passing failure: waiting and sending again does not mend it."""
        me = self.cfg.pacs.ae_title
        return PacsRequestError(
            f"C-STORE: the destination closed the association at the first request, before taking any of {n_files} "
            f"file(s) (called AE title {self.endpoint.aet}, calling AE title {me})",
            where=self._where(),
            fix=f"archives do this to a calling AE title they do not allow to store: the archive must list ctpipe's AE "
            f"title {me!r} (pacs.ae_title) among its modalities, with this host; its log names the reason",
        )


def _store_status(code: int) -> str:
    """A C-STORE status as written to the ledger: the code and, for a refusal, what it means."""
    meaning = {
        0x0122: "SOP class not supported",
        0x0124: "not authorised",
        0x0210: "duplicate invocation",
        0x0211: "unrecognised operation",
        0x0212: "mistyped argument",
    }.get(code)
    if meaning is None and code >> 8 == 0xA7:
        meaning = "out of resources"
    elif meaning is None and code >> 8 == 0xA9:
        meaning = "data set does not match SOP class"
    elif meaning is None and code >> 12 == 0xC:
        meaning = "cannot understand"
    return f"status 0x{code:04X}" + (f" ({meaning})" if meaning and code not in _STORE_OK else "")
