"""What every PACS client of ctpipe offers (DICOMweb, DIMSE), and the series it finds.

An archive finds studies and CT series (:meth:`Archive.find_studies`, :meth:`Archive.find_series`),
retrieves a series into a folder (:meth:`Archive.retrieve`: one ``<SOPInstanceUID>.dcm`` per
instance, each flushed to disk), stores result files (:meth:`Archive.store`) and says which instances of a
study it holds (:meth:`Archive.held`, or by series: :meth:`Archive.held_series`, to confirm what it answered success for was kept). Transient
failures raise :class:`~pipeline.errors.PacsUnavailableError` (retried by the callers, see
:mod:`pipeline.pacs.retry`); refusals raise :class:`~pipeline.errors.PacsRequestError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import PacsRequestError
from .address import Endpoint, Query

#: SOP classes of CT images (retrieved, and accepted by the listener)
CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
ENHANCED_CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2.1"
CT_SOP_CLASSES = (CT_IMAGE_STORAGE, ENHANCED_CT_IMAGE_STORAGE)


@dataclass(frozen=True)
class RemoteSeries:
    """A series the archive listed: UIDs, modality and (when the archive says) its number of instances."""

    study_uid: str
    series_uid: str
    modality: str
    n_instances: int | None = None


@dataclass(frozen=True)
class StoreOutcome:
    """What the destination said about one file sent to it."""

    path: Path
    sop_instance_uid: str
    ok: bool
    detail: str = ""


class Archive(Protocol):
    """A PACS client (see the module docstring)."""

    endpoint: Endpoint

    def find_studies(self, query: Query) -> list[str]: ...

    def find_series(
        self, study_uid: str | None, *, series_uid: str | None = None, modality: str = "CT"
    ) -> list[RemoteSeries]: ...

    def retrieve(self, series: RemoteSeries, dest: Path) -> int: ...

    def store(self, paths: Sequence[Path]) -> list[StoreOutcome]: ...

    def held(self, study_uid: str, sop_uids: Sequence[str]) -> set[str]:
        """Which of the instances ``sop_uids`` (SOPInstanceUIDs) of study ``study_uid`` the archive holds now (one
        IMAGE-level query); raises :class:`~pipeline.errors.PacsRequestError` naming ``pacs.verify_sent`` when the
        archive does not answer such queries."""
        ...

    def held_series(self, study_uid: str, series_uids: Sequence[str]) -> dict[str, int | None]:
        """Which of the series ``series_uids`` of study ``study_uid`` the archive lists, with the number of instances
        it says each has (None when it does not say): one SERIES-level query, for an archive that answers no
        IMAGE-level query; raises like :meth:`held`."""
        ...

    def close(self) -> None: ...


def unverifiable(exc: PacsRequestError, query: str) -> PacsRequestError:
    """The error for a destination that refused the query confirming that it holds the results sent (``query``:
    what kind of query, e.g. "C-FIND at IMAGE level"): it may not answer such queries, or not to ctpipe."""
    return PacsRequestError(
        f"cannot confirm that the results sent were kept: the destination refused the query ({exc.problem})",
        where=exc.where,
        fix=f"{exc.fix}; if the archive does not answer {query} (or not to ctpipe's AE title or user), set "
        "pacs.verify_sent: false to record results sent on the archive's success answer alone",
    )
