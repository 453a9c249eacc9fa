"""The CT volume a command-line source names: a DICOM folder or file, a case-cache entry, or a NIfTI/MHA/NRRD image.

``ctpipe detect`` and ``ctpipe reconstruct`` take the same sources through :func:`read_source`;
:func:`~pipeline.ingest.load_series` reads an image file as they do (:func:`~pipeline.ingest.image.read_image`).
Volumes are HU with their geometry in DICOM patient coordinates (LPS, mm); SimpleITK reads the image files in
LPS (a NIfTI stored RAS on disk included).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import CtpipeError
from ..volume import CTVolume
from .image import IMAGE_SUFFIXES, image_suffix, read_image

__all__ = ["IMAGE_SUFFIXES", "SOURCE_KINDS", "image_named", "image_suffix", "read_image", "read_source", "source_shown"]

log = logging.getLogger(__name__)

#: what a source may be, for error messages
SOURCE_KINDS = "a DICOM folder or file, a case-cache .json/.npy file (ctpipe ingest) or a NIfTI/MHA/NRRD image"


def read_source(
    src: str | Path,
    *,
    series_uid: str | None = None,
    mmap: bool = False,
    allow_gantry_tilt: bool = False,
    keep_identifiers: bool = False,
) -> tuple[CTVolume, str]:
    """The volume at ``src`` and a name for its outputs (the series UID, the cache entry's or the image's name).

    ``series_uid`` picks one series of a DICOM folder holding several (a SeriesInstanceUID or ingest's
    ``<uid>#<part>`` key); ``mmap``: a case-cache entry's array is memory-mapped (read-only) instead of read;
    ``allow_gantry_tilt``: a tilted-gantry DICOM series is resampled onto an orthogonal grid (see
    :func:`~pipeline.ingest.api.load_series`) instead of refused; a cache entry holds what ingest made of it.
    ``keep_identifiers`` (``--keep-identifiers``, as ``privacy.keep_identifiers`` of ``ctpipe run``): a DICOM
    series' patient identifiers and SeriesDescription are kept as the files hold them, in the volume's metadata and
    in the error listing a folder's series; without it each identifier in a description reads ``<patient>``.
    """
    src = Path(src)
    if not src.exists():
        raise CtpipeError(f"no such file or folder; a source is {SOURCE_KINDS}", where=src, fix="check the path")
    image = src.is_file() and image_suffix(src) is not None
    cache_entry = src.is_file() and src.suffix in (".npy", ".json")
    if series_uid is not None and (image or cache_entry):
        raise CtpipeError(
            f"a series UID ({series_uid}) picks a series of a DICOM folder; this source holds one volume",
            where=src,
            fix="leave out --series-uid",
        )
    if cache_entry:
        from ..cache import CaseCache

        return CaseCache(src.parent).read(src.stem, mmap=mmap), src.stem
    if image:
        vol = read_image(src)
        return vol, str(vol.series_uid)
    from ..errors import NoSeriesFoundError, NotDicomError
    from .api import load_series

    try:
        vol = load_series(src, series_uid=series_uid, allow_gantry_tilt=allow_gantry_tilt, keep_identifiers=keep_identifiers)
    except (NoSeriesFoundError, NotDicomError) as exc:
        images = sorted(p.name for p in src.iterdir() if p.is_file() and image_suffix(p)) if src.is_dir() else []
        if not images:
            raise
        raise NoSeriesFoundError(
            f"the folder holds no DICOM series but {len(images)} image file(s): {', '.join(images[:5])}"
            + (", ..." if len(images) > 5 else ""),
            where=src,
            fix=f"pass one image file, e.g. {src / images[0]}",
        ) from exc
    return vol, (vol.series_uid or src.name)


def image_named(volume: CTVolume, src: str | Path, *, case_id: str | None) -> CTVolume:
    """``volume`` as read from ``src`` by :func:`read_source`, named for a command's outputs.

    An image file (NIfTI, MHA, NRRD) has no patient header to tell a patient's name by, so its name (which
    :func:`read_image` makes the volume's SeriesInstanceUID) cannot be redacted as a patient-named DICOM folder is:
    with ``case_id`` (``--case-id``) the volume's SeriesInstanceUID is ``case_id``, so nothing of the file's name
    reaches the outputs (their names, the series the findings and measurements name, PNG titles); without one, one
    warning says that the file's name names them, and how to avoid it. Any other source's volume is returned as it
    is (its SeriesInstanceUID is the series'). The voxels and geometry (LPS, mm) are shared, not copied."""
    src = Path(src)
    if not (src.is_file() and image_suffix(src) is not None):
        return volume
    if case_id is None:
        log.warning(
            "%s is an image file, which has no patient header to tell a patient's name by: its name is written as it "
            "is, naming the outputs (%s_*, %s.*) and the series in them; if it holds a patient's name or ID, pass "
            "--case-id NAME to name them by NAME alone, or give the file a neutral name",
            src.name,
            volume.series_uid,
            volume.series_uid,
        )
        return volume
    return CTVolume(volume.array, volume.geometry, metadata={**volume.metadata, "SeriesInstanceUID": case_id})


def source_shown(src: str | Path, *, case_id: str | None) -> str:
    """How a command's messages name its source: ``case <case_id>`` with ``--case-id`` (nothing of a file's name,
    which may be a patient's: DOE_JANE_MRN12345.nii.gz), else the path as given (a patient-named DICOM folder is
    redacted on the console by :func:`~pipeline.runner.redact.redacting_sources`)."""
    return f"case {case_id}" if case_id is not None else str(src)
