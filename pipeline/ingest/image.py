"""NIfTI/MHA/NRRD image files as CT volumes: which names are images (:func:`image_suffix`) and :func:`read_image`.

SimpleITK reads the files (nibabel a NIfTI-2, which SimpleITK cannot read) and gives their geometry in DICOM patient
coordinates (LPS, mm), whatever the file's own convention (a NIfTI is RAS on disk: its affine is converted). Used by
:func:`~pipeline.ingest.load_series` and by the command-line sources (:mod:`pipeline.ingest.source`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import GeometryError, LabelMapError, UnreadableFileError
from ..volume import IMAGE_SUFFIXES, CTVolume, image_suffix
from .nifti import is_nifti, is_nifti2, read_nifti2, restore_nonfinite
from .rawheader import dicom_data_start

__all__ = [
    "IMAGE_SUFFIXES",
    "LABEL_MAP_NOTE",
    "archive_kind",
    "check_not_label_map",
    "image_suffix",
    "label_map_note",
    "label_map_text",
    "label_map_values",
    "label_map_warning",
    "read_image",
    "starts_like_dicom",
    "unpack_fix",
]

log = logging.getLogger(__name__)

# at most this many distinct non-negative integer values: a label map, not a CT (a CT has air at about -1000 HU and
# well over a thousand distinct values; TotalSegmentator's "total" task has 117 labels, a CIP labelmap a few dozen)
LABEL_MAP_MAX_VALUES = 256

#: what :func:`read_image` does with a file that looks like a label map
LabelMapPolicy = Literal["warn", "refuse", "load"]


def read_image(path: str | Path, *, keep_identifiers: bool = False, label_map: LabelMapPolicy = "warn") -> CTVolume:
    """A NIfTI/MHA/NRRD image file as a :class:`CTVolume`, its values as stored (HU for a CT image) in the types a
    DICOM series loads as: int16 when they are integers that fit it (an int32 or uint8 file), else float32.

    SimpleITK reads the file and gives its geometry in LPS (mm), whatever the file's convention (a NIfTI
    is RAS on disk; its affine is converted); a NIfTI-2 file, which it cannot read, is read with nibabel into the same
    image (:func:`~pipeline.ingest.nifti.read_nifti2`). A float NIfTI's NaN and infinite voxels, which SimpleITK reads as 0,
    are read again with nibabel and kept (:func:`~pipeline.ingest.nifti.restore_nonfinite`), as an NRRD's or MHA's
    are: the commands set a few of them to air and refuse a volume of many. ``metadata["SeriesInstanceUID"]`` is
    the file's name without the ending (``chest`` for ``chest.nii.gz``), the name a notebook's ``detect`` and
    ``reconstruct`` give the case's outputs; ``ctpipe detect`` and ``reconstruct`` name them otherwise unless asked for the file's name
    (:func:`pipeline.ingest.source.image_named`).
    A file that looks like a label map (:func:`label_map_warning`) loads as it is, with a warning logged and added
    to ``metadata["warnings"]``; it names the other image files beside it only with ``keep_identifiers``
    (``--keep-identifiers``). ``label_map="refuse"`` (the commands that compute from HU: ``ctpipe detect``,
    ``reconstruct``): such a file raises :class:`~pipeline.errors.LabelMapError` naming the file instead;
    ``"load"``: it loads as it is, nothing logged or added (the caller tells, e.g. with :func:`label_map_text`).
    Raises :class:`~pipeline.errors.UnreadableFileError` when SimpleITK (nibabel for a NIfTI-2) cannot read the file,
    :class:`~pipeline.errors.GeometryError` naming the file when it holds no 3-D scalar volume (a 2-D, 4-D or
    vector image).
    """
    import SimpleITK as sitk

    if label_map not in ("warn", "refuse", "load"):
        raise ValueError(f"label_map={label_map!r}: choose 'warn', 'refuse' or 'load'")
    path = Path(path)
    suffix = image_suffix(path) or path.suffix
    stem = path.name[: -len(suffix)] if suffix else path.name
    if starts_like_dicom(path):  # SimpleITK would read it as a one-slice image, whatever its name says
        raise UnreadableFileError(
            f"this is a DICOM file, not a NIfTI/MHA/NRRD image (its name ends in {suffix!r})",
            where=path,
            fix="pass the folder holding the whole DICOM series (rename the file to .dcm if the name is wrong)",
        )
    nifti2 = is_nifti(path) and is_nifti2(path)  # SimpleITK cannot read NIfTI-2: nibabel reads it the same way
    try:
        img = read_nifti2(path) if nifti2 else sitk.ReadImage(str(path))
    except RuntimeError as exc:
        raise UnreadableFileError(
            f"image cannot be read ({_sitk_reason(exc)})",
            where=path,
            fix="check that the file is a complete NIfTI/MHA/NRRD image (an .mhd needs its .raw/.zraw data file next to it)",
        ) from exc
    try:
        volume = CTVolume.from_sitk(img, metadata={"SeriesInstanceUID": stem})
    except GeometryError as exc:  # not one 3-D scalar volume: say which file
        raise GeometryError(exc.problem, where=path, fix=exc.fix) from exc
    dtype = _hu_dtype(volume.array)
    if dtype != volume.array.dtype:
        volume = volume.with_array(volume.array.astype(dtype))
    if is_nifti(path) and not nifti2 and dtype.kind == "f":  # SimpleITK reads a NIfTI's NaN and infinite voxels as 0
        restore_nonfinite(volume.array, path)  # GetArrayFromImage's own copy (or astype's): C-contiguous, writable
    if label_map == "refuse":
        check_not_label_map(volume.array, path, keep_identifiers=keep_identifiers)
    elif label_map == "warn" and (warning := label_map_warning(volume.array, path, keep_identifiers=keep_identifiers)):
        log.warning("%s", warning)
        volume = CTVolume(volume.array, volume.geometry, metadata={**volume.metadata, "warnings": [warning]})
    return volume


def label_map_values(values: np.ndarray) -> np.ndarray | None:
    """The distinct values (sorted) of ``values`` when they look like a label map (a segmentation) rather than a CT in
    HU, else None: integer voxel values, none negative, at most :data:`LABEL_MAP_MAX_VALUES` distinct ones (e.g.
    0..117 for a TotalSegmentator result, 0/1 for a mask). A CT in HU has air near -1000 and far more distinct values,
    so it never matches."""
    if values.dtype.kind not in "iub" or values.size == 0 or int(values.min()) < 0:
        return None
    top = int(values.max())
    if top <= np.iinfo(np.uint16).max:  # a count per value: linear time, at most 65536 counters
        distinct = np.flatnonzero(np.bincount(values.ravel().astype(np.intp, copy=False)))
    else:
        distinct = np.unique(values)
    return distinct if distinct.size <= LABEL_MAP_MAX_VALUES else None


def label_map_warning(values: np.ndarray, path: Path, *, keep_identifiers: bool = False) -> str | None:
    """What to tell a user whose image file ``path`` holds a label map (a segmentation) rather than a CT, or None.

    A label map as :func:`label_map_values` tells one. The text names the file, what it holds and the fix: the CT
    image to load (the other image files in the same folder: listed with ``keep_identifiers``, else counted, as a
    file's name may be a patient's and no header tells) and how to wrap the labels
    (:class:`~pipeline.volume.LabelMap`).
    """
    distinct = label_map_values(values)
    if distinct is None:
        return None
    return (
        f"{path}: {_label_map_problem(distinct)}; detect and reconstruct need HU values. Fix: load the CT image instead"
        f"{_others_beside(path, keep_identifiers=keep_identifiers)}; to use the labels, wrap the loaded arrays: "
        "LabelMap(vol.array, vol.geometry)"
    )


def check_not_label_map(
    values: np.ndarray, path: Path, *, keep_identifiers: bool = False, reader: str = "ctpipe detect and reconstruct"
) -> None:
    """:class:`~pipeline.errors.LabelMapError` naming the image file ``path`` when its ``values`` look like a label
    map (:func:`label_map_values`): ``reader`` (the commands that would read it) computes from HU and would measure
    the labels as HU. The fix names the CT image to give instead as :func:`label_map_warning` does."""
    distinct = label_map_values(values)
    if distinct is None:
        return
    raise LabelMapError(
        f"{_label_map_problem(distinct)}; {reader} compute from HU values and would take the labels for HU "
        "(a 'body' of label values, no lungs, findings of nothing)",
        where=path,
        fix=f"give the CT image the labels were made from{_others_beside(path, keep_identifiers=keep_identifiers)}; "
        "to look at the labels in Python: vol = load_series(path) (it warns and loads them), "
        "LabelMap(vol.array, vol.geometry)",
    )


def label_map_note(metadata: Mapping[str, object]) -> str | None:
    """The label-map warning :func:`read_image` added to a volume's ``metadata["warnings"]``, or None."""
    warnings = metadata.get("warnings")
    if not isinstance(warnings, (list, tuple)):
        return None
    return next((w for w in warnings if isinstance(w, str) and LABEL_MAP_NOTE in w), None)


#: how :func:`label_map_warning` and :func:`check_not_label_map` state the problem (:func:`label_map_note` finds it)
LABEL_MAP_NOTE = "this looks like a label map (a segmentation), not a CT in HU"


def label_map_text(values: np.ndarray) -> str | None:
    """What ``values`` hold when they look like a label map (:func:`label_map_values`), without a file's name or a fix
    (``this looks like a label map (a segmentation), not a CT in HU: 3 distinct integer values, 0..13``), else None."""
    distinct = label_map_values(values)
    return None if distinct is None else _label_map_problem(distinct)


def _label_map_problem(distinct: np.ndarray) -> str:
    return (
        f"{LABEL_MAP_NOTE}: {distinct.size} distinct integer value{'s' if distinct.size != 1 else ''}, "
        f"{int(distinct[0])}..{int(distinct[-1])}"
    )


#: at most this many other image files in a label map's folder are read whole to tell whether they are label maps too
#: (a folder of TotalSegmentator's per-organ masks holds over a hundred): those beyond are not suggested
_MAX_READ_BESIDE = 8


def _others_beside(path: Path, *, keep_identifiers: bool) -> str:
    """The other image files in ``path``'s folder that may be the CT (not label maps themselves, by the same test:
    :func:`label_map_values`), for a fix: named with ``keep_identifiers``, else counted; "" when there is none."""
    try:
        files = sorted(p for p in path.parent.iterdir() if p != path and p.is_file() and image_suffix(p))
    except OSError:
        return ""
    beside: list[str] = []
    reads = 0
    for other in files:
        floats = _float_pixels(other)  # a float image is no label map: no need to read it whole
        if not floats:
            if reads >= _MAX_READ_BESIDE:
                continue
            reads += 1
        if floats or _not_a_label_map(other):
            beside.append(other.name)
    if not beside:
        return ""
    if keep_identifiers:
        return f" (beside it: {', '.join(beside[:4])}{', ...' if len(beside) > 4 else ''})"
    return (
        f" ({len(beside)} other image file{'s' if len(beside) > 1 else ''} beside it that "
        f"{'are' if len(beside) > 1 else 'is'} no label map, named with keep_identifiers, "
        "--keep-identifiers on the command line: a file's name may be a patient's)"
    )


def _float_pixels(path: Path) -> bool | None:
    """Whether the image file ``path``'s header gives it floating-point scalar voxels (None: SimpleITK cannot read its
    header, as a NIfTI-2's)."""
    import SimpleITK as sitk

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError:
        return None
    kind = sitk.GetPixelIDValueAsString(reader.GetPixelID())
    return "float" in kind and "vector" not in kind and "complex" not in kind


def _not_a_label_map(path: Path) -> bool:
    """Whether the image file ``path`` reads as a volume that does not look like a label map (:func:`label_map_values`
    on its voxels as :func:`read_image` loads them); False when it cannot be read as one."""
    try:
        volume = read_image(path, label_map="load")
    except (UnreadableFileError, GeometryError, OSError):
        return False
    return label_map_values(volume.array) is None


def _hu_dtype(values: np.ndarray) -> np.dtype:
    """int16 for integer ``values`` that fit it, else float32 (what a DICOM series loads as)."""
    if values.dtype.kind in "iub":
        info = np.iinfo(np.int16)
        if values.size == 0 or (int(values.min()) >= info.min and int(values.max()) <= info.max):
            return np.dtype(np.int16)
    return np.dtype(np.float32)


#: How ZIP, gzip, bzip2 and xz files begin (a tar file says ``ustar`` at byte 257).
_ARCHIVE_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def archive_kind(path: str | Path) -> str | None:
    """``"ZIP"`` or ``"tar"`` (compressed or not) when ``path`` is such an archive (a downloaded data set), else None.

    An office document stored as a ZIP (Excel ``.xlsx``, Word, OpenDocument: it holds ``[Content_Types].xml`` or
    ``mimetype``) is not an archive to unpack: None."""
    import tarfile
    import zipfile

    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
        if not head.startswith(_ARCHIVE_MAGIC) and head[257:262] != b"ustar":  # cheap: most files are neither
            return None
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
            return None if names & {"[Content_Types].xml", "mimetype"} else "ZIP"
        return "tar" if tarfile.is_tarfile(path) else None
    except (OSError, zipfile.BadZipFile):
        return None


def unpack_fix(path: str | Path, reader: str) -> str:
    """The fix for an archive given where DICOM is read: unpack it, then give ``reader`` the folder."""
    return f"unpack it first, e.g. shutil.unpack_archive({str(path)!r}, 'folder'), and pass the folder to {reader}"


def starts_like_dicom(path: Path) -> bool:
    """Whether ``path`` starts like a DICOM file (:func:`.rawheader.dicom_data_start`); False when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return dicom_data_start(f.read(132)) is not None
    except OSError:
        return False


def _sitk_reason(exc: Exception) -> str:
    """SimpleITK's reason for a failed read, without its source-file prefix line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    detail = [line for line in lines if not line.startswith("Exception thrown in SimpleITK")]
    reason = (detail[-1] if detail else lines[0] if lines else type(exc).__name__).removeprefix("sitk::ERROR:").strip()
    if reason.startswith("Unable to determine ImageIO reader"):
        return "no NIfTI/MHA/NRRD reader recognises its content"
    return reason
