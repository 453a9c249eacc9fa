"""NIfTI/MHA/NRRD image files as CT volumes: which names are images (:func:`image_suffix`) and :func:`read_image`.

SimpleITK reads the files and gives their geometry in DICOM patient coordinates (LPS, mm), whatever the
file's own convention (a NIfTI is RAS on disk: its affine is converted). Used by
:func:`~pipeline.ingest.load_series` and by the command-line sources (:mod:`pipeline.ingest.source`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UnreadableFileError
from ..volume import CTVolume

#: file name endings read as images by SimpleITK
IMAGE_SUFFIXES = (".nii.gz", ".nii", ".mha", ".mhd", ".nrrd")


def image_suffix(path: str | Path) -> str | None:
    """The ending of ``path``'s name among :data:`IMAGE_SUFFIXES` (``".nii.gz"``, ...), or None."""
    name = Path(path).name.lower()
    return next((s for s in IMAGE_SUFFIXES if name.endswith(s)), None)


def read_image(path: str | Path) -> CTVolume:
    """A NIfTI/MHA/NRRD image file as a :class:`CTVolume`, its values as stored (HU for a CT image).

    SimpleITK reads the file and gives its geometry in LPS (mm), whatever the file's convention (a NIfTI
    is RAS on disk; its affine is converted). ``metadata["SeriesInstanceUID"]`` is the file's name without
    the ending (``chest`` for ``chest.nii.gz``), the name of the case's outputs.
    Raises :class:`~pipeline.errors.UnreadableFileError` when SimpleITK cannot read the file.
    """
    import SimpleITK as sitk

    path = Path(path)
    suffix = image_suffix(path) or path.suffix
    stem = path.name[: -len(suffix)] if suffix else path.name
    try:
        img = sitk.ReadImage(str(path))
    except RuntimeError as exc:
        raise UnreadableFileError(
            f"image cannot be read ({str(exc).strip().splitlines()[0]})",
            where=path,
            fix="check that the file is a complete NIfTI/MHA/NRRD image (an .mhd needs its .raw/.zraw data file next to it)",
        ) from exc
    return CTVolume.from_sitk(img, metadata={"SeriesInstanceUID": stem})
