"""Write a :class:`~pipeline.volume.CTVolume` as a DICOM CT series (pydicom).

Geometry (DICOM patient coordinates, LPS, mm) is taken from the volume:

* slice ``k`` has ``ImagePositionPatient = origin + direction @ (spacing * (0, 0, k))``;
* ``ImageOrientationPatient`` is direction column 0 (along a row, index i) then
  column 1 (down a column, index j);
* ``PixelSpacing = [sj, si]`` (DICOM order: row spacing first), ``SpacingBetweenSlices = sk``.

A reader that sorts slices by position along the slice normal (row × column)
gets the volume back unchanged when ``direction[:, 2]`` equals that normal (any
proper rotation); otherwise it gets it with the k axis reversed.

Pixel values: HU are rounded to integers before storage, ``stored = round(HU) -
intercept`` clipped to the storage range, so the HU read back are ``round(HU)``
(``numpy.rint``, halves to even). Signed storage uses intercept 0 (int16);
unsigned storage uses intercept -1024 (uint16), so HU below -1024 read back as
-1024. Slope is 1, ``RescaleType`` HU.

UIDs are deterministic: the same volume metadata and ``seed`` give the same
Study/Series/SOP instance UIDs. Files appear atomically (written under a hidden
temporary name, then renamed).

The work is split by job: this module checks the options, writes the classic
one-file-per-slice series and applies the quirks; :mod:`.dicom_common` holds the
shared dataset, pixel-encoding, UID and atomic-save helpers; :mod:`.dicom_quirks`
the quirk resampling and file naming; :mod:`.dicom_enhanced` the Enhanced CT
multi-frame writer.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.dataset import Dataset
from pydicom.uid import UID, ExplicitVRLittleEndian, JPEG2000Lossless

from ..errors import DicomWriteError
from ..volume import CTVolume
from .dicom_common import (
    CT_IMAGE_STORAGE,
    ENHANCED_CT_IMAGE_STORAGE,
    J2K_MIN_SIZE,
    TRANSFER_SYNTAXES,
    UNSIGNED_INTERCEPT,
    Stack,
    base_dataset,
    fmt_ds,
    fmt_ds_list,
    make_file_meta,
    make_uid,
    meta_value,
    save_dataset,
    set_pixels,
    to_stored,
    volume_stack,
)
from .dicom_enhanced import write_enhanced
from .dicom_quirks import (
    AIR_HU,
    ENHANCED_QUIRKS,
    GANTRY_TILT_DEG,
    QUIRKS,
    THICK_SLICE_MM,
    FileNamer,
    localizer_stack,
    thick_stack,
    tilt_stack,
)

__all__ = [
    "AIR_HU",
    "CT_IMAGE_STORAGE",
    "ENHANCED_CT_IMAGE_STORAGE",
    "ENHANCED_QUIRKS",
    "GANTRY_TILT_DEG",
    "J2K_MIN_SIZE",
    "QUIRKS",
    "THICK_SLICE_MM",
    "TRANSFER_SYNTAXES",
    "UNSIGNED_INTERCEPT",
    "write_dicom_series",
    "write_phantom_case",
    "write_phantom_series",
]

log = logging.getLogger(__name__)


def _check_options(transfer_syntax: str, quirks: Sequence[str], enhanced: bool, volume: CTVolume, where: str) -> None:
    if not isinstance(volume, CTVolume):
        raise DicomWriteError(f"expected a CTVolume, got {type(volume).__name__}", where=where, fix="pass phantom.volume")
    if transfer_syntax not in TRANSFER_SYNTAXES:
        raise DicomWriteError(
            f"unknown transfer syntax {transfer_syntax!r}", where=where, fix=f"use one of {', '.join(TRANSFER_SYNTAXES)}"
        )
    unknown = [q for q in quirks if q not in QUIRKS]
    if unknown:
        raise DicomWriteError(f"unknown quirk(s) {unknown}", where=where, fix=f"use any of {', '.join(QUIRKS)}")
    if enhanced:
        bad = [q for q in quirks if q not in ENHANCED_QUIRKS]
        if bad:
            raise DicomWriteError(
                f"quirk(s) {bad} cannot be written into an enhanced multi-frame file",
                where=where,
                fix=f"with enhanced=True use only {', '.join(ENHANCED_QUIRKS)}",
            )
    nk, nj, ni = volume.shape
    if transfer_syntax == "jpeg2000" and min(nj, ni) < J2K_MIN_SIZE:
        raise DicomWriteError(
            f"JPEG 2000 needs rows and columns of at least {J2K_MIN_SIZE} (OpenJPEG's 6 resolution levels), "
            f"the slices are {nj} x {ni}",
            where=where,
            fix="use transfer_syntax='rle' for such small slices",
        )
    if ("missing_slice" in quirks or "duplicate_slice" in quirks) and nk < 3:
        raise DicomWriteError(
            f"missing_slice/duplicate_slice need at least 3 slices, the volume has {nk}", where=where, fix="use more slices"
        )
    if not np.all(np.isfinite(volume.array)):
        raise DicomWriteError("the HU array holds NaN or infinite values", where=where, fix="fill them before writing")


def _write_stack(
    stack: Stack,
    base: Dataset,
    *,
    seed: int,
    unsigned: bool,
    ts: UID,
    namer: FileNamer,
    order: Sequence[int] | None = None,
    extra: Sequence[tuple[int, int]] = (),
) -> list[Path]:
    """Write one classic CT Image Storage instance per slice (in ``order``) plus ``extra`` (slice, instance) copies."""
    normal = np.cross(stack.row_dir, stack.col_dir)
    orientation = fmt_ds_list(np.concatenate([stack.row_dir, stack.col_dir]))
    template = Dataset(dict(base._dict))  # shares the immutable elements of ``base``; new ones are added below
    template.ImageType = stack.image_type
    template.SOPClassUID = CT_IMAGE_STORAGE
    template.SeriesDescription = stack.description
    template.SeriesInstanceUID = stack.series_uid
    template.SeriesNumber = stack.series_number
    template.ImageOrientationPatient = orientation
    template.Rows, template.Columns = int(stack.hu.shape[1]), int(stack.hu.shape[2])
    template.PixelSpacing = fmt_ds_list(stack.pixel_spacing)
    if stack.thickness is not None:
        template.SliceThickness = fmt_ds(stack.thickness)
    if stack.spacing_between is not None:
        template.SpacingBetweenSlices = fmt_ds(stack.spacing_between)
    if "LOCALIZER" in stack.image_type:
        del template.RescaleType  # a projection image is not in HU
    if stack.tilt_deg:
        template.GantryDetectorTilt = fmt_ds(stack.tilt_deg)
    items = [(k, stack.instance_numbers[k]) for k in (order if order is not None else range(len(stack.hu)))]
    items += list(extra)
    paths = []
    for k, instance in items:
        sop_uid = make_uid(seed, stack.series_uid, "instance", instance)
        ds = Dataset(dict(template._dict))
        ds.file_meta = make_file_meta(CT_IMAGE_STORAGE, sop_uid, ts)
        ds.add_new(0x00080018, "UI", sop_uid)  # SOPInstanceUID
        ds.add_new(0x00200013, "IS", instance)  # InstanceNumber
        ds.add_new(0x00200032, "DS", fmt_ds_list(stack.positions[k]))  # ImagePositionPatient
        if stack.spacing_between is not None:
            ds.add_new(0x00201041, "DS", fmt_ds(float(stack.positions[k] @ normal)))  # SliceLocation
        set_pixels(ds, to_stored(stack.hu[k], unsigned), ts)
        paths.append(save_dataset(namer(stack.series_number, instance), ds))
    return paths


def write_dicom_series(
    volume: CTVolume,
    out_dir: str | os.PathLike[str],
    *,
    transfer_syntax: str = "explicit_le",
    unsigned: bool = False,
    quirks: Iterable[str] = (),
    seed: int = 0,
    series_number: int = 1,
    enhanced: bool = False,
) -> list[Path]:
    """Write ``volume`` (HU, LPS mm geometry) as a CT series into ``out_dir``; return the files written.

    Parameters
    ----------
    transfer_syntax: ``"explicit_le"`` (Explicit VR Little Endian), ``"rle"`` (RLE Lossless) or
        ``"jpeg2000"`` (JPEG 2000 Lossless, needs pylibjpeg-openjpeg).
    unsigned: store uint16 with RescaleIntercept -1024 instead of int16 with intercept 0.
    quirks: any of :data:`QUIRKS`, combinable:
        ``shuffled_names`` random hex names without extension, some in nested folders;
        ``reversed_order`` InstanceNumber runs against the slice position;
        ``gantry_tilt`` a 15° tilted acquisition (GantryDetectorTilt, tilted column direction, sheared positions);
        ``missing_slice`` the middle slice is left out; ``duplicate_slice`` the middle slice is written twice
        (another SOP instance, same position); ``localizer`` adds a coronal LOCALIZER image (its own series);
        ``second_series`` adds a ≈5 mm thick-slice series of the same volume (another SeriesInstanceUID).
        With JPEG 2000 a localizer of fewer than 32 rows (slices) is written uncompressed.
    seed: makes UIDs, dates and shuffled names deterministic.
    series_number: SeriesNumber of the main series (the localizer gets +100, the second series +1).
    enhanced: write one Enhanced CT Image Storage multi-frame file instead of one file per slice.

    Returns the paths of the main series (in slice order k, then any duplicate) followed by the extra series'.
    Other files already in ``out_dir`` are left alone (a file of the same name is replaced).
    """
    out = Path(out_dir)
    quirk_list = list(dict.fromkeys([quirks] if isinstance(quirks, str) else quirks))
    _check_options(transfer_syntax, quirk_list, enhanced, volume, str(out))
    ts = TRANSFER_SYNTAXES[transfer_syntax]
    ident = volume.series_uid or f"{volume.geometry.to_json()}|{volume.metadata.get('PatientID', '')}"
    study_uid = str(meta_value(volume, "StudyInstanceUID", make_uid(seed, ident, "study")))
    series_uid = str(volume.series_uid or make_uid(seed, ident, "series"))
    frame_uid = str(meta_value(volume, "FrameOfReferenceUID", make_uid(seed, ident, "frame")))
    base = base_dataset(volume, seed=seed, unsigned=unsigned, study_uid=study_uid, frame_uid=frame_uid)
    namer = FileNamer(out, "shuffled_names" in quirk_list, seed)
    stack = volume_stack(volume, series_uid=series_uid, series_number=series_number)
    if enhanced:
        paths = [write_enhanced(stack, base, seed=seed, unsigned=unsigned, ts=ts, path=namer(series_number, 1, "_mf"))]
    else:
        nk = volume.shape[0]
        if "gantry_tilt" in quirk_list:
            stack = tilt_stack(stack, volume, GANTRY_TILT_DEG)
        if "reversed_order" in quirk_list:
            stack.instance_numbers = list(range(nk, 0, -1))
        order = [k for k in range(nk) if not ("missing_slice" in quirk_list and k == nk // 2)]
        extra = [(nk // 2, nk + 1)] if "duplicate_slice" in quirk_list else []
        paths = _write_stack(stack, base, seed=seed, unsigned=unsigned, ts=ts, namer=namer, order=order, extra=extra)
    if "second_series" in quirk_list:
        thick = thick_stack(volume, series_uid=make_uid(seed, series_uid, "thick"), series_number=series_number + 1)
        paths += _write_stack(thick, base, seed=seed, unsigned=unsigned, ts=ts, namer=namer)
    if "localizer" in quirk_list:
        loc = localizer_stack(volume, series_uid=make_uid(seed, series_uid, "localizer"), series_number=series_number + 100)
        loc_ts = ts
        if ts == JPEG2000Lossless and volume.shape[0] < J2K_MIN_SIZE:
            loc_ts = ExplicitVRLittleEndian
            log.info("localizer has %d rows, too few for JPEG 2000: written uncompressed", volume.shape[0])
        paths += _write_stack(loc, base, seed=seed, unsigned=unsigned, ts=loc_ts, namer=namer)
    log.info("wrote %d DICOM files (%s, quirks=%s) to %s", len(paths), transfer_syntax, quirk_list or "none", out)
    return paths


def write_phantom_case(phantom: Any, out_dir: str | os.PathLike[str], **options: Any) -> Path:
    """Write a phantom case: its DICOM series into ``out_dir/dicom/`` and ground truth into ``out_dir``.

    ``options`` are those of :func:`write_dicom_series`; ``seed`` defaults to ``phantom.seed``.
    Ground truth (``ground_truth.json`` with nodule centres in LPS mm, ``masks.npz``) comes from
    ``phantom.save_ground_truth``; masks stay on the phantom grid (with ``gantry_tilt`` the DICOM grid
    is the tilted one, and the two agree in LPS). Returns ``out_dir``.

    Written again into the same folder (a notebook cell run again with other options), the case holds the new
    phantom alone: the DICOM files of the earlier write that this one does not replace are removed from
    ``out_dir/dicom/`` (other files there are left as they are), so that no slice of the earlier phantom is
    read with the new one's ground truth.

    Raises :class:`~pipeline.errors.DicomWriteError` for a ``phantom`` that is not one (a :class:`CTVolume` is
    written by :func:`write_dicom_series`), an option :func:`write_dicom_series` does not take, or an ``out_dir``
    (or its ``dicom``) that is a file, before anything is written.
    """
    from .model import Phantom

    if not isinstance(phantom, Phantom):
        fix = (
            f"write a volume without ground truth with write_dicom_series(volume, {str(out_dir)!r}) "
            "(pipeline.phantom.write_dicom_series)"
            if isinstance(phantom, CTVolume)
            else "pass what generate_phantom(seed, ...) returns"
        )
        raise DicomWriteError(
            f"must be a Phantom (a volume with its ground truth), got {type(phantom).__name__}", where="phantom", fix=fix
        )
    case = Path(out_dir)
    _check_case_options(options, case)
    options.setdefault("seed", int(getattr(phantom, "seed", 0)))
    dicom_dir = case / "dicom"
    earlier = [p for p in dicom_dir.rglob("*") if p.is_file()] if dicom_dir.is_dir() else []
    written = write_dicom_series(phantom.volume, dicom_dir, **options)
    _remove_earlier_slices(dicom_dir, earlier, keep=written)
    phantom.save_ground_truth(case)
    return case


def _check_case_options(options: dict[str, Any], case: Path) -> None:
    """Refuse, before anything is written, an option :func:`write_dicom_series` does not take and a case folder
    that is a file."""
    allowed = [name for name in inspect.signature(write_dicom_series).parameters if name not in ("volume", "out_dir")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise DicomWriteError(
            f"unknown option(s) {unknown}",
            where="write_phantom_series",
            fix=f"use the options of write_dicom_series: {', '.join(allowed)}",
        )
    for folder in (case, case / "dicom"):
        if folder.exists() and not folder.is_dir():
            raise DicomWriteError(
                "is a file, not a folder: a phantom case is a folder (its series in dicom/, its ground truth beside it)",
                where=folder,
                fix="pass the folder to write the case into, e.g. one named after the case",
            )


def _remove_earlier_slices(dicom_dir: Path, earlier: Sequence[Path], *, keep: Sequence[Path]) -> None:
    """Remove the DICOM files an earlier write left in ``dicom_dir`` that this one did not replace (a phantom of
    other slices or options), so the case's folder holds its series alone and matches its ground truth; files that
    are no DICOM file are left as they are."""
    kept = {p.resolve() for p in keep}
    removed = 0
    for path in earlier:
        if path.resolve() in kept or not _is_dicom_file(path):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    for folder in sorted((d for d in dicom_dir.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if removed:
        log.info("removed %d DICOM file(s) of an earlier write from %s", removed, dicom_dir)


def _is_dicom_file(path: Path) -> bool:
    """Whether ``path`` is a DICOM file with its preamble and 'DICM' marker, as this module writes them."""
    from ..ingest.rawheader import dicom_data_start

    try:
        with open(path, "rb") as f:
            return dicom_data_start(f.read(132)) == 132
    except OSError:
        return False


write_phantom_series = write_phantom_case
