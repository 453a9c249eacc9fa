"""A NIfTI file's NaN and infinite voxels, which SimpleITK's NIfTI reader gives as 0 (:func:`restore_nonfinite`).

SimpleITK (its ``nifti1_io``) replaces every NaN or infinite value of a float NIfTI file with 0 before applying the
file's ``scl_slope``/``scl_inter``: a missing-data region arrives as 0 HU (water, soft tissue) or as ``scl_inter``,
where the same array as an NRRD or MHA keeps its NaN voxels and ctpipe sets them to air or refuses the volume
(:func:`~pipeline.detection.infer_input.clean_volume`, :class:`~pipeline.cache.CaseCache`). The stored values are
read here again with nibabel, which keeps them, so that a NIfTI's NaN voxels reach those checks as the other
formats' do. An integer NIfTI cannot hold NaN (whatever its ``scl_slope``): nothing is read for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..errors import UnreadableFileError

__all__ = ["NIFTI_SUFFIXES", "is_nifti", "restore_nonfinite"]

log = logging.getLogger(__name__)

#: The endings of a NIfTI file's name (single-file NIfTI-1 or NIfTI-2, compressed or not).
NIFTI_SUFFIXES = (".nii", ".nii.gz")

#: Bytes of stored voxel values read at a time: the scan holds one such chunk, never a second copy of the volume.
CHUNK_BYTES = 16 << 20


def is_nifti(path: str | Path) -> bool:
    """Whether ``path``'s name ends as a NIfTI file's (:data:`NIFTI_SUFFIXES`, any case)."""
    return Path(path).name.lower().endswith(NIFTI_SUFFIXES)


def restore_nonfinite(array: np.ndarray, path: Path) -> int:
    """Put the NaN and infinite values that the NIfTI file ``path`` stores back into ``array``, in place; returns how
    many voxels were restored.

    ``array`` is the file's volume as SimpleITK read it: float, C-contiguous, writable, indexed ``[k, j, i]``
    (``GetArrayFromImage``), where those voxels hold 0 (or the file's ``scl_inter``). Its flat order is the file's
    voxel order (nibabel's ``[i, j, k]`` in Fortran order), so the file's n-th stored value is ``array``'s n-th
    voxel. A restored voxel holds the stored value scaled by ``scl_slope``/``scl_inter`` as nibabel applies them
    (NaN stays NaN; an infinity keeps the sign the slope gives it). The stored values are read in chunks of
    :data:`CHUNK_BYTES`. Nothing is read for integer data, which cannot hold NaN.

    Raises :class:`~pipeline.errors.UnreadableFileError` naming the file when nibabel cannot read it or finds
    another number of voxels than ``array`` holds.
    """
    import nibabel as nib
    from nibabel.arrayproxy import ArrayProxy
    from nibabel.filebasedimages import ImageFileError
    from nibabel.openers import ImageOpener
    from nibabel.spatialimages import HeaderDataError

    if array.dtype.kind != "f" or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(
            f"array must be a writable C-contiguous float array (SimpleITK's GetArrayFromImage), got {array.dtype} "
            f"(C-contiguous: {array.flags.c_contiguous}, writable: {array.flags.writeable})"
        )
    fix = "export the image again as NRRD or MHA (they keep NaN voxels), or check that the NIfTI file is complete"
    try:
        image = nib.load(path)
    except (ImageFileError, HeaderDataError, OSError, ValueError) as exc:
        raise UnreadableFileError(
            f"nibabel cannot read this NIfTI file to find its NaN voxels, which SimpleITK reads as 0 ({exc})",
            where=path,
            fix=fix,
        ) from exc
    proxy = getattr(image, "dataobj", None)
    if not isinstance(proxy, ArrayProxy):
        raise UnreadableFileError(
            f"nibabel reads this file as a {type(image).__name__} without stored voxel values, so its NaN voxels, "
            "which SimpleITK reads as 0, cannot be found",
            where=path,
            fix=fix,
        )
    stored = np.dtype(proxy.dtype)
    if stored.kind != "f":
        return 0
    n_voxels = int(np.prod(proxy.shape, dtype=np.int64))
    if n_voxels != array.size:
        raise UnreadableFileError(
            f"nibabel reads {n_voxels} voxels (shape {tuple(proxy.shape)}) where SimpleITK reads {array.size} "
            f"(shape {tuple(reversed(array.shape))}), so its NaN voxels cannot be placed",
            where=path,
            fix=fix,
        )
    flat = array.reshape(-1)  # a view: array is C-contiguous
    slope, inter = float(proxy.slope), float(proxy.inter)
    step = max(1, CHUNK_BYTES // stored.itemsize)
    restored = 0
    with ImageOpener(proxy.file_like, "rb") as fh:
        fh.seek(int(proxy.offset))
        for start in range(0, n_voxels, step):
            count = min(step, n_voxels - start)
            data = fh.read(count * stored.itemsize)
            if len(data) != count * stored.itemsize:
                raise UnreadableFileError(
                    f"the file ends after {start + len(data) // stored.itemsize} of its {n_voxels} voxels",
                    where=path,
                    fix=fix,
                )
            chunk = np.frombuffer(data, dtype=stored)
            bad = np.flatnonzero(~np.isfinite(chunk))
            if bad.size:
                flat[start + bad] = chunk[bad].astype(np.float64) * slope + inter
                restored += int(bad.size)
    if restored:
        log.debug("%s: %d NaN/infinite voxels that SimpleITK read as 0 restored from the file", path, restored)
    return restored
