"""How many instances a received series says it has, from the counts its own instances carry.

A C-STORE sender that ends its association with an A-ABORT between two instances may have finished (some
modalities and routers end every association so) or been stopped by its operator part-way: the association alone
cannot tell. The instances sometimes can: Number of Series Related Instances (0020,1209), which some archives and
routers put in what they forward, and Images in Acquisition (0020,1002), which many CT scanners write (the images of
one acquisition, per Acquisition Number (0020,0012)). :func:`count_check` says when fewer instances arrived than those
counts give; a series whose instances carry neither cannot be told from a whole one this way. :func:`hold_short`
holds such a series as cut off (:data:`~pipeline.pacs.journal.CUT_NOTE`): it waits for the rest up to
``pacs.series_limit_s``, then is quarantined, never published. Records are logged as ``pipeline.pacs.listener``'s.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .journal import CUT_NOTE, ReceiveJournal
from .ledger import Ledger

log = logging.getLogger("pipeline.pacs.listener")

_TAGS = ["NumberOfSeriesRelatedInstances", "ImagesInAcquisition", "AcquisitionNumber"]


def _count(value: object) -> int | None:
    """A count element's value as a positive int, or None (absent, empty, not a number)."""
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _read(path: Path) -> Any:
    """The count elements of one received instance (None when it cannot be read)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_TAGS)
    except (InvalidDicomError, OSError, ValueError) as exc:
        log.debug("%s: its instance counts not read (%s)", path, exc)
        return None


def _acquisition(ds: Any) -> str:
    acq = ds.get("AcquisitionNumber")
    return "" if acq is None else str(acq).strip()


def _which(acq: str) -> str:
    return f"acquisition {acq}" if acq else "its acquisition"


@dataclass(frozen=True)
class CountCheck:
    """The instances received of one series against the counts they carry.

    ``received``: how many arrived; ``short``: why they are known to be fewer than the series has (``'5 of 8 image(s) of
    acquisition 1 received (ImagesInAcquisition 8 in its instances)'``), or None; ``counted``: the count they were all
    found to reach (``'ImagesInAcquisition 8'``), or None when they carry none (or are short)."""

    received: int
    short: str | None = None
    counted: str | None = None


def count_check(folder: Path) -> CountCheck:
    """The instances received in ``folder`` (``*.dcm``, one series) against the counts they carry: the Number of
    Series Related Instances they give, and, for each Acquisition Number (or none), the Images in Acquisition its
    instances give (see :class:`CountCheck`; a series whose instances carry no count may still be short: they cannot
    say). One instance is read while the count is not reached (a sender may end an association after each instance),
    each of them once it is, to count by acquisition."""
    files = sorted(folder.glob("*.dcm"))
    received = len(files)
    first = _read(files[0]) if files else None
    if first is None:
        return CountCheck(received)
    counted = None
    series_n = _count(first.get("NumberOfSeriesRelatedInstances"))
    if series_n is not None:
        if received < series_n:
            why = f"{received} of {series_n} instance(s) received (NumberOfSeriesRelatedInstances {series_n} in its instances)"
            return CountCheck(received, short=why)
        counted = f"NumberOfSeriesRelatedInstances {series_n}"
    acq_n = _count(first.get("ImagesInAcquisition"))
    if acq_n is None:
        return CountCheck(received, counted=counted)
    if received < acq_n:
        acq = _which(_acquisition(first))
        why = f"{received} of {acq_n} image(s) of {acq} received (ImagesInAcquisition {acq_n} in its instances)"
        return CountCheck(received, short=why)
    by_acq: dict[str, list[int | None]] = defaultdict(list)
    for ds in (_read(p) for p in files):
        if ds is not None:
            by_acq[_acquisition(ds)].append(_count(ds.get("ImagesInAcquisition")))
    reached = []
    for acq, counts in sorted(by_acq.items()):
        expected = max((c for c in counts if c is not None), default=None)
        if expected is not None and len(counts) < expected:
            why = (
                f"{len(counts)} of {expected} image(s) of {_which(acq)} received (ImagesInAcquisition {expected} in its "
                "instances)"
            )
            return CountCheck(received, short=why)
        if expected is not None:
            reached.append(f"{expected}" if len(by_acq) == 1 else f"{expected} of {_which(acq)}")
    if reached:
        counted = ", ".join(([counted] if counted else []) + [f"ImagesInAcquisition {', '.join(reached)}"])
    return CountCheck(received, counted=counted)


def shortfall(folder: Path) -> str | None:
    """Why the instances received in ``folder`` are known to be fewer than the series has (:func:`count_check`), or
    None."""
    return count_check(folder).short


def latest_count_check(ledger: Ledger, series_uid: str) -> CountCheck | None:
    """:func:`count_check` of the series' latest generation in the listener's ledger (None when its files are gone)."""
    row = ledger.one("SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (series_uid,))
    if row is None or row["removed_at"] is not None or not row["folder"]:
        return None
    return count_check(Path(row["folder"]))


def hold_short(journal: ReceiveJournal, row: dict[str, Any], *, sender: str, n: int, short: str, at: str, cfg: Any) -> None:
    """Hold the open generation ``row`` as cut off: its ``sender`` (calling AE title and address) ended its association
    with an A-ABORT between instances at ``at`` (UTC) after ``n`` instance(s), and fewer arrived than the series' own
    count (``short``, from :func:`count_check`), as when its operator stopped it part-way."""
    journal.note(
        row,
        f"{CUT_NOTE} {sender} ended its association with an A-ABORT at {at} after {n} instance(s), short of the "
        f"series' count: {short}",
    )
    log.warning(
        "the association from %s ended by the sender's A-ABORT after %d instance(s) of series %s: %s, held as cut off "
        "(the sender was stopped before the end); what arrived is kept, and the series waits for the rest (the "
        "instances already received are not stored twice) up to pacs.series_limit_s = %g s after its first instance, "
        "then is quarantined (not published); fix: send the series again",
        sender,
        n,
        row["series_uid"],
        short,
        cfg.pacs.series_limit_s,
        extra={"event": "listen_cut", "series_uid": row["series_uid"]},
    )
