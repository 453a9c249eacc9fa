"""Deterministic UIDs: the same inputs give the same UID, so objects written apart refer to one another alike."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The measurements the SR reports: the parts of a case's measurements its results' UIDs derive from.
REPORTED_MEASUREMENTS = ("lungs", "nodules")


def stable_uid(*parts: str) -> str:
    """A ``2.25.<integer>`` UID (PS3.5 §B.2) from the SHA-256 digest of ``parts``, 128 bits."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return f"2.25.{int.from_bytes(digest[:16], 'big')}"


def source_images(source: Any) -> list[Any]:
    """What identifies a result's source images (a :class:`~pipeline.dicom_out.sources.SourceSeries`): its
    SeriesInstanceUID, the SOP Instance UID of each slice and, in a multi-frame source, their frame numbers. Not the
    files' names, sizes or transfer syntax: the same series retrieved by DICOMweb, C-MOVE or C-GET, or pushed to the
    listener, gives the results the same UIDs where they hold the same."""
    return [source.series_instance_uid, list(source.sop_instance_uids), list(source.frame_numbers or ())]


def reported_measurements(measurements: Mapping[str, Any] | None) -> dict[str, Any]:
    """The :data:`REPORTED_MEASUREMENTS` of ``measurements`` (None where absent)."""
    return {k: (measurements or {}).get(k) for k in REPORTED_MEASUREMENTS}


def add_mask(digest: Any, label: str, mask: np.ndarray) -> None:
    """Feed a binary mask to ``digest`` (a hashlib object): its label, shape and packed bits."""
    mask = np.asarray(mask, dtype=bool)
    digest.update(f"{label}:{mask.shape}".encode())
    digest.update(np.packbits(mask).tobytes())
