"""What every PACS client of ctpipe offers (DICOMweb, DIMSE), and the series it finds.

An archive finds studies and CT series (:meth:`Archive.find_studies`, :meth:`Archive.find_series`),
retrieves a series into a folder (:meth:`Archive.retrieve`: one ``<SOPInstanceUID>.dcm`` per
instance, each flushed to disk) and stores result files (:meth:`Archive.store`). Transient
failures raise :class:`~pipeline.errors.PacsUnavailableError` (retried by the callers, see
:mod:`pipeline.pacs.retry`); refusals raise :class:`~pipeline.errors.PacsRequestError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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

    def close(self) -> None: ...
