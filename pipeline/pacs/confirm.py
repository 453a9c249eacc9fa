"""Whether a destination holds the results it answered success for (``pacs.verify_sent``), told apart from an
archive that cannot say.

The results of a case are asked for by SOPInstanceUID at IMAGE level (C-FIND, or QIDO-RS instance search), one
query per case. When that finds none of them (or the archive refuses it: then only a SERIES-level answer that lists
the results' or the source series lets confirming go on by series; otherwise the refusal is raised), it may be a drop (a filter or routing rule, storage failing after the
answer) or an archive that answers no IMAGE-level query (many PACS do not support or allow it): the same results are
then asked for by series (SERIES level, one more query), together with the source series they refer to. An archive
that lists the results' series does not answer IMAGE-level queries: this is said once (a warning, with the fix), and
the results of this case and the next are confirmed by series from then on (each of ctpipe's result series holds
that result alone; the series must list at least as many instances as were sent into it). One that lists the source
series but not the results' answers such queries: the results were dropped. One that lists neither is asked, with
the same SERIES-level query, for the series of a result it listed before (:attr:`Confirmer.known`: this sender's, or
the last one the ledger records sent there): listed, it answers these queries and dropped every result of the case;
not listed either, it has stopped answering ctpipe's queries or lost what it held, and as sending again mends
neither, the sender fails such results at once and says so once per destination. With no such earlier result, a drop
of everything cannot be told apart from an archive that answers no query, and the error says both. (A C-ECHO would
not tell them apart: the archive has just answered the C-STORE.)
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import PacsError, PacsRequestError
from .archive import Archive

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentResult:
    """A result file answered success for: its SOPInstanceUID, study, series and the source series it refers to."""

    sop_uid: str
    study_uid: str
    series_uid: str
    source_series: tuple[str, ...] = ()


def read_sent(path: Path) -> SentResult:
    """The UIDs of a result file (SR or SEG) that confirming it needs; raises ``OSError`` / ``InvalidDicomError``."""
    import pydicom

    tags = ["SOPInstanceUID", "StudyInstanceUID", "SeriesInstanceUID", "ReferencedSeriesSequence"]
    ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=[*tags, "CurrentRequestedProcedureEvidenceSequence"])
    refs = list(ds.get("ReferencedSeriesSequence", None) or [])  # SEG
    for study in ds.get("CurrentRequestedProcedureEvidenceSequence", None) or []:  # SR
        refs += list(study.get("ReferencedSeriesSequence", None) or [])
    sources = tuple(dict.fromkeys(str(r.SeriesInstanceUID) for r in refs if r.get("SeriesInstanceUID")))
    return SentResult(
        str(ds.get("SOPInstanceUID", "")), str(ds.get("StudyInstanceUID", "")), str(ds.get("SeriesInstanceUID", "")), sources
    )


class Confirmer:
    """Asks one destination which results it holds (see the module docstring); remembers, for the destination's
    later cases, that it answers by series only."""

    def __init__(self, destination: str, *, dicomweb: bool, known: SentResult | None = None):
        self.destination = destination
        self.by_series = False
        #: a result the destination listed (confirmed held): asked for again when it lists nothing of a case
        self.known = known
        self.image_query = "QIDO-RS instance searches" if dicomweb else "C-FIND at IMAGE level"
        self.series_query = "QIDO-RS series searches" if dicomweb else "C-FIND at SERIES level"

    def held(
        self, archive: Archive, study_uid: str, results: list[SentResult], *, asked: str = "right after the send"
    ) -> tuple[set[str], str, bool]:
        """``(SOPInstanceUIDs held, why the others count as not held, whether that is uncertain)`` of ``results`` (one
        study's): the second is what the queries said, for the error of each one not held; the third is True when
        the archive listed nothing at any level (a drop of everything, or an archive that answers no query: sending
        again mends neither). Raises what :meth:`Archive.held` / :meth:`Archive.held_series`
        raise. ``asked``: when the queries are asked, as the second says it (results stored unconfirmed are asked
        for again later)."""
        uids = [r.sop_uid for r in results]
        refused: PacsRequestError | None = None
        if not self.by_series:
            try:
                held = archive.held(study_uid, uids) & set(uids)
            except PacsRequestError as exc:  # refused at IMAGE level: it may still answer by series
                refused = exc
            else:
                if held:  # it answers IMAGE-level queries: the others are not there
                    self._remember(results, held)
                    return held, f"{self.image_query} {asked} finds no such SOPInstanceUID", False
        in_series = Counter(r.series_uid for r in results)
        sources = sorted({s for r in results for s in r.source_series} - set(in_series))
        try:
            listed = archive.held_series(study_uid, [*in_series, *sources])
        except PacsRequestError:
            if refused is not None:  # refused at both levels: the IMAGE-level refusal is the one to fix
                raise refused from None
            raise
        held = {
            r.sop_uid
            for r in results
            if r.series_uid in listed
            and (listed[r.series_uid] is None or int(listed[r.series_uid] or 0) >= in_series[r.series_uid])
        }
        self._remember(results, held)
        if refused is not None and not (held or any(s in listed for s in sources)):
            raise refused  # nothing it lists either: confirming by series cannot be told from a drop
        if (held or refused is not None) and not self.by_series:
            self.by_series = True
            how = f"refuses {self.image_query} ({refused.problem})" if refused else f"answers {self.image_query} with no match"
            log.warning(
                "%s %s for the results it holds, but lists their series: it does not answer per-instance queries (or "
                "not to ctpipe), so results sent to it are confirmed by series from now on. Fix: allow %s for "
                "ctpipe's AE title or user at the archive for per-instance confirmation, or set pacs.verify_sent: false "
                "to record results sent on its success answer alone",
                self.destination,
                how,
                self.image_query,
                extra={"event": "verify_by_series"},
            )
        if self.by_series:
            return held, f"{self.series_query} {asked} does not list the result's series", False
        first = f"{self.image_query} {asked} finds none of the case's results; {self.series_query}"
        if any(s in listed for s in sources):
            return held, f"{first} list the source series but not the result's: it answers these queries", False
        first += " list neither the result's series nor its source series"
        earlier = self._earlier_listed(archive)
        if earlier is not None:
            return (
                held,
                f"{first}, while it lists {earlier}: it answers these queries and dropped every result of this case",
                False,
            )
        if self.known is not None:
            return (
                held,
                (
                    f"{first}, nor now {self._known_text()}, which it listed before: it has stopped answering ctpipe's "
                    f"queries (check the archive's query permissions and filters for ctpipe's AE title or user, or set "
                    f"pacs.verify_sent: false) or lost what it held (check its storage and log)"
                ),
                True,
            )
        neither = (
            f"{first}, and no result was confirmed there earlier to ask for instead: either it dropped every result "
            f"of the case, or it answers neither query (then allow {self.image_query} for ctpipe at the archive, or "
            "set pacs.verify_sent: false)"
        )
        return held, neither, True

    def _remember(self, results: list[SentResult], held: set[str]) -> None:
        """Keep one of ``results`` the destination listed (``held``) as :attr:`known`."""
        self.known = next((r for r in results if r.sop_uid in held), self.known)

    def _known_text(self) -> str:
        assert self.known is not None
        return f"the series of a result confirmed there earlier ({self.known.series_uid} of study {self.known.study_uid})"

    def _earlier_listed(self, archive: Archive) -> str | None:
        """What the destination lists of :attr:`known` (its series, by the same SERIES-level query), for the error of a
        case it lists nothing of; None when it lists nothing of it either (or there is none, or the query failed)."""
        if self.known is None:
            return None
        try:
            listed = archive.held_series(self.known.study_uid, [self.known.series_uid])
        except PacsError as exc:
            log.info("%s: the series of an earlier result could not be asked for (%s)", self.destination, exc)
            return None
        return self._known_text() if self.known.series_uid in listed else None
