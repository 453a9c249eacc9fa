"""Deterministic UIDs: the same inputs give the same UID, so objects written apart refer to one another alike.

The UIDs of a case's results derive from what identifies them (the source images, the patient and study, the model and
its operating point, which findings are reported and what is said of each in words: side, lobe, composition; the
masks), never from measured numbers (positions, sizes, volumes, scores): a rerun with another worker count or on another
machine measures them again to within 1e-5 mm, and a stated value (0.01 mm) then rounds the other way now and again;
the results keep their UIDs, so that an archive files them as the same series, not a second SR and SEG."""

from __future__ import annotations

import hashlib
import json
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


def finding_uid(series_uid: str, index: int, images: str = "") -> str:
    """The tracking UID of finding ``index`` (its place in the detector's findings, highest score first) of series
    ``series_uid``, on the source images named by ``images`` (:func:`images_key`; the parts of a split series share
    their SeriesInstanceUID, not their images): the same in the SR and the SEG, and in every run on those images,
    whatever the finding's measured centre (LPS mm) to its last digits."""
    return stable_uid("ctpipe-finding", series_uid, images, str(int(index)))


def images_key(source: Any) -> str:
    """A SHA-256 digest of a source's :func:`source_images`."""
    return hashlib.sha256(json.dumps(source_images(source)).encode()).hexdigest()


#: what a reported finding's identity holds (:class:`~pipeline.dicom_out.model.ReportedFinding` fields): not its
#: centre, extents, diameter, long axis, volume, score or nearest slice, measured anew by each run
IDENTITY_FIELDS = ("rank", "index", "tracking_id", "tracking_uid", "side", "lobe", "composition", "measured")


def finding_identity(finding: Any) -> dict[str, Any]:
    """The :data:`IDENTITY_FIELDS` of a reported finding."""
    return {name: getattr(finding, name) for name in IDENTITY_FIELDS}


def without_measures(doc: Any) -> Any:
    """A JSON-like document with its measured numbers left out (each float and int, not bools, as None): what it
    reports, not the last digits runs differ in."""
    if isinstance(doc, Mapping):
        return {str(k): without_measures(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [without_measures(v) for v in doc]
    if isinstance(doc, (bool, np.bool_)) or not isinstance(doc, (int, float, np.number)):
        return doc
    return None


def reported_measurements(measurements: Mapping[str, Any] | None) -> dict[str, Any]:
    """The :data:`REPORTED_MEASUREMENTS` of ``measurements`` (None where absent)."""
    return {k: (measurements or {}).get(k) for k in REPORTED_MEASUREMENTS}


def add_mask(digest: Any, label: str, mask: np.ndarray) -> None:
    """Feed a binary mask to ``digest`` (a hashlib object): its label, shape and packed bits."""
    mask = np.asarray(mask, dtype=bool)
    digest.update(f"{label}:{mask.shape}".encode())
    digest.update(np.packbits(mask).tobytes())
