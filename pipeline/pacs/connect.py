"""Opening a PACS client for an address: DICOMweb or DIMSE (kept apart from the clients' shared types)."""

from __future__ import annotations

from typing import Any

from .address import Endpoint
from .archive import Archive


def open_archive(endpoint: Endpoint, cfg: Any, *, mode: str | None = None) -> Archive:
    """The client for ``endpoint``: :class:`~pipeline.pacs.dicomweb.DicomWebArchive` or
    :class:`~pipeline.pacs.dimse.DimseArchive` (``mode`` "move" or "get"; default ``pacs.retrieve``)."""
    if endpoint.kind == "dicomweb":
        from .dicomweb import DicomWebArchive

        return DicomWebArchive(endpoint, cfg)
    from .dimse import DimseArchive

    return DimseArchive(endpoint, cfg, mode=mode or cfg.pacs.retrieve)
