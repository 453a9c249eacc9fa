"""A NIfTI file's NaN and infinite voxels, which SimpleITK's NIfTI reader gives as 0 (:func:`restore_nonfinite`), and
NIfTI-2 files, which it cannot read (:func:`read_nifti2`).

SimpleITK (its ``nifti1_io``) replaces every NaN or infinite value of a float NIfTI file with 0 before applying the
file's ``scl_slope``/``scl_inter``: a missing-data region arrives as 0 HU (water, soft tissue) or as ``scl_inter``,
where the same array as an NRRD or MHA keeps its NaN voxels and ctpipe sets them to air or refuses the volume
(:func:`~pipeline.detection.infer_input.clean_volume`, :class:`~pipeline.cache.CaseCache`). The stored values are
read here again with nibabel, which keeps them, so that a NIfTI's NaN voxels reach those checks as the other
formats' do. An integer NIfTI cannot hold NaN (whatever its ``scl_slope``): nothing is read for it.

A NIfTI-2 file (a 540-byte header, as dcm2niix and nibabel write for large images) is read with nibabel into the image
SimpleITK gives for the same data saved as NIfTI-1: the same voxel order, spacing, origin and direction (LPS, mm),
its sform or qform chosen as ITK's ``NiftiImageIO`` chooses, its ``scl_slope``/``scl_inter`` applied as ITK applies
them, and its NaN voxels kept.
"""

from __future__ import annotations

import gzip
import logging
import math
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import GeometryError, UnreadableFileError
from ..geometry import LPS_TO_RAS

if TYPE_CHECKING:
    import SimpleITK as sitk
    from nibabel.nifti1 import Nifti1Header

__all__ = ["NIFTI2_HEADER_BYTES", "NIFTI_SUFFIXES", "is_nifti", "is_nifti2", "read_nifti2", "restore_nonfinite"]

log = logging.getLogger(__name__)

#: The endings of a NIfTI file's name (single-file NIfTI-1 or NIfTI-2, compressed or not).
NIFTI_SUFFIXES = (".nii", ".nii.gz")

#: Bytes of stored voxel values read at a time: the scan holds one such chunk, never a second copy of the volume.
CHUNK_BYTES = 16 << 20


def is_nifti(path: str | Path) -> bool:
    """Whether ``path``'s name ends as a NIfTI file's (:data:`NIFTI_SUFFIXES`, any case)."""
    return Path(path).name.lower().endswith(NIFTI_SUFFIXES)


#: A NIfTI-2 header's ``sizeof_hdr``, its first four bytes (a NIfTI-1 header's is 348).
NIFTI2_HEADER_BYTES = 540

#: NIfTI ``xform`` code of an unset qform or sform, and of a scanner-based one.
_XFORM_UNKNOWN, _XFORM_SCANNER_ANAT = 0, 1

#: NIfTI ``intent_code`` values that make ITK read a vector (1007) or symmetric-matrix (1005) pixel image.
_VECTOR_INTENTS = (1005, 1007)


def is_nifti2(path: str | Path) -> bool:
    """Whether the file ``path`` starts with a NIfTI-2 header (``sizeof_hdr`` :data:`NIFTI2_HEADER_BYTES`, in
    either byte order), gzip-compressed or not; False when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            if head[:2] == b"\x1f\x8b":
                fh.seek(0)
                with gzip.GzipFile(fileobj=fh) as gz:
                    head = gz.read(4)
    except (OSError, EOFError, zlib.error):
        return False
    return len(head) == 4 and NIFTI2_HEADER_BYTES in (int.from_bytes(head, "little"), int.from_bytes(head, "big"))


def read_nifti2(path: Path) -> sitk.Image:
    """The NIfTI-2 file ``path`` as the SimpleITK image its reader gives for the same data saved as NIfTI-1
    (SimpleITK's NIfTI reader does not read NIfTI-2), read with nibabel.

    The voxels in the file's order (``GetArrayFromImage`` gives them ``[k, j, i]``), its on-disk type, or float32
    (float64 for float64 data) where ``scl_slope``/``scl_inter`` scale them, as ITK applies them (a slope of 0 is 1);
    NaN and infinite voxels are kept, where SimpleITK would give a NIfTI-1's as 0. Spacing from ``pixdim`` (one of 0,
    NaN or infinite is 1, as niftilib makes it);
    origin and direction in LPS from the sform or the qform (RAS), chosen as ITK chooses (:func:`_itk_xform`);
    a malformed negative ``pixdim[1..3]`` (old converters write them) gives its magnitude as spacing and reverses
    that axis's direction, as ITK's reader does (the direction is then -i, -j or -k where neither form is set);
    both in mm (a file in metres or microns converted, as ITK converts them). Trailing axes of length 1 beyond the third are dropped, as ITK drops them; a 2-D or 4-D
    image is returned as one (:meth:`~pipeline.volume.CTVolume.from_sitk` says what to take from it).

    Raises :class:`~pipeline.errors.UnreadableFileError` naming the file when nibabel cannot read it either (its
    reason in the message), :class:`~pipeline.errors.GeometryError` naming it when it holds no image of one real
    value per voxel, or when neither its sform nor its qform gives orthonormal axes.
    """
    import nibabel as nib
    import SimpleITK as sitk
    from nibabel.arrayproxy import ArrayProxy
    from nibabel.filebasedimages import ImageFileError
    from nibabel.openers import ImageOpener
    from nibabel.spatialimages import HeaderDataError

    try:  # the header as stored: nib.load would move scl_slope/scl_inter out of it, a slope of 0 dropping both
        with ImageOpener(str(path), "rb") as fh:
            stored = nib.Nifti2Header.from_fileobj(fh, check=False)
        header = stored.copy()  # nibabel's checked one: its pixdim made positive, so its signs are read from `stored`
        header.check_fix()
        raw: np.ndarray = np.asarray(ArrayProxy(str(path), header).get_unscaled())  # nibabel's [i, j, k, ...], Fortran order
    except (ImageFileError, HeaderDataError, OSError, EOFError, ValueError, zlib.error) as exc:
        raise UnreadableFileError(
            f"this NIfTI-2 file cannot be read: nibabel, which reads NIfTI-2 where SimpleITK does not, says: {exc}",
            where=path,
            fix="check that the file is complete (copy or download it again), or export the image again as NIfTI-1, MHA or NRRD",
        ) from exc
    shape = raw.shape
    ndim = len(shape)
    while ndim > 3 and shape[ndim - 1] == 1:
        ndim -= 1
    intent = int(header["intent_code"])
    per_voxel = int(np.prod(shape[4:5])) if intent in _VECTOR_INTENTS else 1  # ITK reads dim[5] as components
    if per_voxel > 1 or ndim not in (2, 3, 4) or raw.dtype.kind not in "iuf" or raw.dtype.itemsize > 8:
        raise GeometryError(
            f"a CTVolume is a 3-D image of one value per voxel; this NIfTI-2 file holds a {'x'.join(map(str, shape))} "
            f"image of {raw.dtype} values" + (f" ({per_voxel} per voxel: intent code {intent})" if per_voxel > 1 else ""),
            where=path,
            fix="export one 3-D volume of one integer or float value per voxel (e.g. HU)",
        )
    raw = raw.reshape(shape[:ndim], order="F")
    if not raw.dtype.isnative:
        raw = raw.astype(raw.dtype.newbyteorder("="))
    eps = float(np.finfo(np.float64).eps)
    slope, inter = float(header["scl_slope"]), float(header["scl_inter"])
    slope = slope if math.isfinite(slope) and abs(slope) >= eps else 1.0  # niftilib: not finite is 0; ITK: 0 is 1
    inter = inter if math.isfinite(inter) else 0.0
    if abs(slope - 1.0) > eps or abs(inter) > eps:  # ITK's MustRescale: computed in float64, stored as float32
        scaled = np.empty(raw.shape, dtype=np.float64 if raw.dtype == np.float64 else np.float32, order="F")
        step = max(1, CHUNK_BYTES // max(1, 8 * raw[..., :1].size))
        for start in range(0, int(np.shape(raw)[-1]), step):
            scaled[..., start : start + step] = raw[..., start : start + step].astype(np.float64) * slope + inter
        raw = scaled
    img = sitk.GetImageFromArray(raw.T, isVector=False)  # [k, j, i] (C order) for a 3-D image
    del raw
    if ndim != 3:
        return img
    units = {"meter": 1e3, "micron": 1e-3}.get(header.get_xyzt_units()[0], 1.0)  # to mm, as ITK converts
    pixdim = _niftilib_pixdim(stored)
    signs = np.where(pixdim[1:4] < 0, -1.0, 1.0)
    if np.any(signs < 0):
        log.warning(
            "%s: its header has a negative voxel size (pixdim[1:4] = %s): each axis with one is read with the "
            "size's magnitude as spacing and its direction reversed, as ITK reads such a NIfTI-1 header",
            path,
            [float(d) for d in pixdim[1:4]],
        )
    img.SetSpacing([abs(float(d)) * units for d in pixdim[1:4]])
    ras = _itk_xform(stored, pixdim, path)  # its xform codes as stored: nibabel's check unsets a code it does not know
    axes = np.eye(3)
    if ras is not None:
        lps = LPS_TO_RAS @ ras  # its own inverse: negates the x and y rows
        axes = lps[:3, :3] / np.linalg.norm(lps[:3, :3], axis=0)
        img.SetOrigin([float(v) * units for v in lps[:3, 3]])
    img.SetDirection([float(v) for v in (axes * signs).reshape(-1)])  # ITK's reader: a negative spacing flips its axis
    return img


def _niftilib_pixdim(header: Nifti1Header) -> np.ndarray:
    """``pixdim[0:4]`` of the header ``header`` as stored (not checked by nibabel, which makes ``pixdim[1:4]`` positive
    and a ``pixdim[0]`` other than -1 or 1 into 1), as niftilib reads them: a voxel size of 0, NaN or infinite is 1
    (nibabel keeps NaN and infinite ones); signs kept (qfac is -1 for any negative ``pixdim[0]``; ITK's reader flips
    the axis of a negative voxel size)."""
    pixdim = np.array(header["pixdim"][:4], dtype=np.float64)
    bad = (pixdim[1:4] == 0) | ~np.isfinite(pixdim[1:4])
    pixdim[1:4][bad] = 1.0
    return pixdim


def _itk_xform(header: Nifti1Header, pixdim: np.ndarray, path: Path) -> np.ndarray | None:
    """The 4x4 RAS matrix (voxel index to mm) that ITK's ``NiftiImageIO`` takes a NIfTI header's origin and direction
    from: None when neither a qform nor an sform is set (origin 0, identity direction).

    As ITK decides: the sform when it equals the qform element by element (1e-5; its translation 1e-7), else the
    sform when it is an orthonormal rotation times scales (its normalised columns orthonormal to 1e-4) and the qform
    is unset, or its code is ``NIFTI_XFORM_SCANNER_ANAT``, or it has the qform's voxel sizes, axes and offset (1e-4;
    ITK compares their SVDs); else the qform when set. Raises :class:`~pipeline.errors.GeometryError` naming the
    file when neither gives orthonormal axes (ITK refuses the file too). ``header`` is the header as stored: niftilib
    takes any code above 0 as set, where nibabel's check makes a code it does not know 0. ``pixdim`` is its
    ``pixdim[0:4]`` as niftilib reads them (:func:`_niftilib_pixdim`). The qform is computed as niftilib does (a quaternion whose
    ``b*b + c*c + d*d`` reaches 1 is normalised; ``qfac`` is -1 for any negative ``pixdim[0]``; a negative voxel size
    counts as 1; an unset qform, which ITK compares the sform with, is the signed voxel sizes on its diagonal).
    """
    from nibabel.quaternions import quat2mat

    qcode, scode = int(header["qform_code"]), int(header["sform_code"])
    if qcode <= _XFORM_UNKNOWN and scode <= _XFORM_UNKNOWN:
        return None
    qform = np.diag([*pixdim[1:4], 1.0])  # niftilib's qto_xyz of an unset qform: the voxel sizes, signs kept
    if qcode > _XFORM_UNKNOWN:
        sizes = np.where(pixdim[1:4] > 0, pixdim[1:4], 1.0)  # niftilib: a negative voxel size is 1 in the qform
        bcd = np.array([float(header[f"quatern_{q}"]) for q in "bcd"])
        a = 1.0 - float(bcd @ bcd)
        if a < 1e-7:
            bcd, a = bcd / np.linalg.norm(bcd), 0.0
        qform[:3, :3] = quat2mat([math.sqrt(a), *bcd]) * (sizes * [1.0, 1.0, -1.0 if pixdim[0] < 0 else 1.0])
        qform[:3, 3] = [float(header[f"qoffset_{q}"]) for q in "xyz"]
    sform = np.zeros((4, 4))
    if scode > _XFORM_UNKNOWN:
        sform = np.vstack([header["srow_x"], header["srow_y"], header["srow_z"], [0.0, 0.0, 0.0, 1.0]]).astype(float)
    prefer_sform = bool(
        np.allclose(sform[:3, :3], qform[:3, :3], rtol=0, atol=1e-5)
        and np.abs(sform[:, 3] - qform[:, 3]).sum() <= 1e-7
        and np.abs(sform[3] - qform[3]).sum() <= 1e-7
    )
    if (not prefer_sform or scode > _XFORM_UNKNOWN) and _orthonormal_scaled(sform):
        if qcode <= _XFORM_UNKNOWN or scode == _XFORM_SCANNER_ANAT:
            prefer_sform = True
        else:  # both set: the sform only where it is the qform (to float precision)
            s_sizes, q_sizes = np.linalg.norm(sform[:3, :3], axis=0), np.linalg.norm(qform[:3, :3], axis=0)
            rotation = (sform[:3, :3] / s_sizes) @ (qform[:3, :3] / q_sizes).T
            prefer_sform = bool(
                np.allclose(np.sort(s_sizes), np.sort(q_sizes), rtol=0, atol=1e-4)
                and np.allclose(rotation, np.eye(3), rtol=0, atol=1e-4)
                and np.allclose(sform[:3, 3], qform[:3, 3], rtol=0, atol=1e-4)
            )
    if prefer_sform:
        return sform
    if qcode > _XFORM_UNKNOWN:
        return qform
    raise GeometryError(
        f"its sform (code {scode}) does not give orthonormal axes (it shears, or a voxel size is 0) and it has no qform, "
        "so the directions of its voxel axes are not defined",
        where=path,
        fix="write the file again with an orthonormal sform or a qform (e.g. nibabel: img.set_qform(img.affine, 1))",
    )


def _orthonormal_scaled(matrix: np.ndarray) -> bool:
    """Whether the 4x4 ``matrix`` is an invertible affine map whose 3x3 part is an orthonormal matrix times voxel sizes
    (its normalised columns orthonormal to 1e-4), as ITK tests an sform."""
    if np.abs(matrix[3] - [0.0, 0.0, 0.0, 1.0]).sum() > np.finfo(np.float32).eps:
        return False
    sizes = np.linalg.norm(matrix[:3, :3], axis=0)
    if not np.all(sizes > 0) or abs(np.linalg.det(matrix[:3, :3])) <= np.finfo(np.float64).eps:
        return False
    axes = matrix[:3, :3] / sizes
    return bool(np.allclose(axes @ axes.T, np.eye(3), rtol=0, atol=1e-4))


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
