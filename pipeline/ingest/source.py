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

__all__ = [
    "IMAGE_CASE_PREFIX",
    "IMAGE_SUFFIXES",
    "SOURCE_KINDS",
    "image_case_id",
    "image_named",
    "image_suffix",
    "read_image",
    "read_source",
    "source_shown",
]

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
    refuse_label_map: bool = True,
) -> tuple[CTVolume, str]:
    """The volume at ``src`` and a name for its outputs (the series UID, the cache entry's or the image's name).

    ``series_uid`` picks one series of a DICOM folder holding several (a SeriesInstanceUID or ingest's
    ``<uid>#<part>`` key); ``mmap``: a case-cache entry's array is memory-mapped (read-only) instead of read;
    ``allow_gantry_tilt``: a tilted-gantry DICOM series is resampled onto an orthogonal grid (see
    :func:`~pipeline.ingest.api.load_series`) instead of refused; a cache entry holds what ingest made of it.
    ``keep_identifiers`` (``--keep-identifiers``, as ``privacy.keep_identifiers`` of ``ctpipe run``): a DICOM
    series' patient identifiers and SeriesDescription are kept as the files hold them, in the volume's metadata and
    in the error listing a folder's series; without it each identifier in a description reads ``<patient>``, and an
    image file's label-map error counts the other image files beside it instead of naming them.
    ``refuse_label_map``: an image file that looks like a label map (a segmentation, a mask:
    :func:`~pipeline.ingest.image.label_map_values`) raises :class:`~pipeline.errors.LabelMapError` naming the file,
    as the commands that compute from HU need (default); False loads it with the warning, as ``load_series`` does.
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
        vol = read_image(src, keep_identifiers=keep_identifiers, label_map="refuse" if refuse_label_map else "warn")
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


#: How the digest name of an image file's case begins (:func:`image_case_id`).
IMAGE_CASE_PREFIX = "image-"


def image_case_id(volume: CTVolume) -> str:
    """A name for an image file's case that holds nothing of the file's name: ``image-`` and the first 12 hex digits
    of a SHA-256 over the voxels (their type and shape) and the geometry (spacing in mm, LPS origin and direction), so
    that the same image file gets the same name wherever it lies, and findings ``ctpipe detect`` wrote of it are of
    the series ``ctpipe reconstruct`` reads from it. About 0.3 s for a 512 × 512 × 300 int16 image (157 MB)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    arr = np.ascontiguousarray(volume.array)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    g = volume.geometry
    for values in (g.spacing, g.origin, g.direction):
        h.update(np.asarray(values, dtype="<f8").round(6).tobytes())
    h.update(arr.data.cast("B"))
    return IMAGE_CASE_PREFIX + h.hexdigest()[:12]


def image_named(
    volume: CTVolume, name: str, src: str | Path, *, case_id: str | None, keep_identifiers: bool = False
) -> tuple[CTVolume, str]:
    """``volume`` and ``name`` as :func:`read_source` read them from ``src``, named for a command's outputs.

    An image file (NIfTI, MHA, NRRD) has no patient header to tell a patient's name by, so its name (which
    :func:`read_image` makes the volume's SeriesInstanceUID) may be a patient's (``DOE_JANE_MRN12345.nii.gz``) without
    anything to tell it by. Its volume's SeriesInstanceUID and the name returned, which name the outputs (their file
    names, the series the findings and measurements name, PNG titles), are ``case_id`` (``--case-id``) when given;
    else the file's name with ``keep_identifiers`` (``--keep-identifiers``: the user asked for identifiers); else
    :func:`image_case_id`, a digest of the image, with one log line saying so and how to name them otherwise. Any
    other source's volume and name are returned as they are (its SeriesInstanceUID is the series'). The voxels and
    geometry (LPS, mm) are shared, not copied."""
    src = Path(src)
    if not (src.is_file() and image_suffix(src) is not None):
        return volume, name
    if case_id is None and keep_identifiers:
        return volume, name
    if case_id is None:
        case_id = image_case_id(volume)
        log.info(
            "an image file has no patient header to tell whether its name is a patient's: its outputs and the series "
            "in them are named %s, a digest of the image (the same for the same image); pass --case-id NAME to name "
            "them NAME, or --keep-identifiers to name them by the file's name",
            case_id,
        )
    return CTVolume(volume.array, volume.geometry, metadata={**volume.metadata, "SeriesInstanceUID": case_id}), case_id


def source_shown(src: str | Path, *, case_id: str | None, name: str) -> str:
    """How a command's messages name its source: ``case <name>`` with ``--case-id`` (``case_id``) or for an image
    file (nothing of a file's name, which may be a patient's: DOE_JANE_MRN12345.nii.gz; ``name`` is what
    :func:`image_named` named it), else the path as given (a patient-named DICOM folder is redacted on the console by
    :func:`~pipeline.runner.redact_sources.redacting_sources`)."""
    path = Path(src)
    image = path.is_file() and image_suffix(path) is not None
    return f"case {name}" if case_id is not None or image else str(src)
