"""DICOM building blocks shared by the phantom's classic and enhanced CT writers.

A :class:`Stack` is one series to write: HU slices with their LPS (mm) positions
and orientation. This module turns stacks into pydicom datasets and files:

* pixel values: HU are rounded to integers before storage, ``stored = round(HU) -
  intercept`` clipped to the storage range, so the HU read back are ``round(HU)``
  (``numpy.rint``, halves to even). Signed storage uses intercept 0 (int16);
  unsigned storage uses intercept -1024 (uint16), so HU below -1024 read back as
  -1024. Slope is 1, ``RescaleType`` HU;
* UIDs are deterministic (:func:`make_uid`): the same inputs and seed give the same UID;
* files appear atomically (:func:`save_dataset`: written under a hidden temporary
  name, then renamed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filewriter import dcmwrite
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    UID,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    generate_uid,
)
from pydicom.valuerep import format_number_as_ds

from ..atomic import atomic_open
from ..errors import DicomWriteError
from ..volume import CTVolume

log = logging.getLogger(__name__)

CT_IMAGE_STORAGE = UID("1.2.840.10008.5.1.4.1.1.2")
ENHANCED_CT_IMAGE_STORAGE = UID("1.2.840.10008.5.1.4.1.1.2.1")
TRANSFER_SYNTAXES: Mapping[str, UID] = {
    "explicit_le": ExplicitVRLittleEndian,
    "rle": RLELossless,
    "jpeg2000": JPEG2000Lossless,
}
UNSIGNED_INTERCEPT = -1024
J2K_MIN_SIZE = 32


@dataclass
class Stack:
    """One series to write: HU slices, their LPS positions and orientation."""

    hu: np.ndarray  # [n, rows, cols], HU
    positions: np.ndarray  # [n, 3] LPS mm
    row_dir: np.ndarray  # LPS unit vector along a row (increasing column index)
    col_dir: np.ndarray  # LPS unit vector down a column (increasing row index)
    pixel_spacing: tuple[float, float]  # (row spacing, column spacing) mm, DICOM order
    spacing_between: float | None
    thickness: float | None
    instance_numbers: list[int]
    image_type: list[str]
    series_uid: str
    series_number: int
    description: str
    tilt_deg: float = 0.0


def fmt_ds(value: float) -> str:
    """``value`` as a DICOM decimal string (at most 16 characters; -0 written as 0)."""
    return format_number_as_ds(float(value) + 0.0)


def fmt_ds_list(values: Iterable[float]) -> list[str]:
    """Each of ``values`` as a DICOM decimal string (a multi-valued DS element)."""
    return [fmt_ds(v) for v in values]


def make_uid(seed: int, *parts: object) -> UID:
    """A UID that depends only on ``seed`` and ``parts`` (deterministic)."""
    return generate_uid(entropy_srcs=["ctpipe-phantom", str(int(seed)), *(str(p) for p in parts)])


def storage_format(unsigned: bool) -> tuple[np.dtype, int, int]:
    """(stored dtype, RescaleIntercept, PixelRepresentation)."""
    return (np.dtype("<u2"), UNSIGNED_INTERCEPT, 0) if unsigned else (np.dtype("<i2"), 0, 1)


def to_stored(hu: np.ndarray, unsigned: bool) -> np.ndarray:
    """round(HU) - intercept, clipped to the storage range (see the module docstring)."""
    dtype, intercept, _ = storage_format(unsigned)
    info = np.iinfo(dtype)
    values: np.ndarray
    if hu.dtype.kind in "iu" and hu.dtype.itemsize <= 2:
        values = hu.astype(np.int32)
    else:  # float32 is exact for integers below 2**24, far beyond the storage range
        values = np.rint(hu.astype(np.float32 if hu.dtype == np.float32 else np.float64))
    np.subtract(values, intercept, out=values)
    clipped = np.clip(values, info.min, info.max)
    n_clipped = int(np.count_nonzero(clipped != values))
    if n_clipped:
        log.debug("%d voxels clipped to the %s storage range", n_clipped, dtype)
    return clipped.astype(dtype)


def meta_value(volume: CTVolume, key: str, default: Any) -> Any:
    """``volume.metadata[key]``, or ``default`` when it is missing or empty."""
    value = volume.metadata.get(key)
    return default if value in (None, "") else value


def phantom_patient_name(seed: int) -> str:
    """The PatientName of the phantom of ``seed``: ``PHANTOM000007^SEED7`` (``PHANTOMM000007^SEEDM7`` for -7), parts
    that hold digits, so that none is a word of the phantom's descriptions ("Chest phantom") or of the folders a demo
    writes, which would then be redacted as the patient's name wherever ctpipe shows them; two components, as a
    DICOM Person Name is written (one without ``^`` is the retired form validators warn about)."""
    return f"PHANTOM{seed:06d}^SEED{seed}" if seed >= 0 else f"PHANTOMM{-seed:06d}^SEEDM{-seed}"


def base_dataset(volume: CTVolume, *, seed: int, unsigned: bool, study_uid: str, frame_uid: str) -> Dataset:
    """Patient, study, equipment and pixel-description attributes shared by every instance."""
    _, intercept, pixel_rep = storage_format(unsigned)
    day = 1 + int(seed) % 28
    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.StudyDate = str(meta_value(volume, "StudyDate", f"202501{day:02d}"))
    ds.SeriesDate = ds.StudyDate
    ds.ContentDate = ds.StudyDate
    ds.StudyTime = str(meta_value(volume, "StudyTime", "120000"))
    ds.SeriesTime = ds.StudyTime
    ds.ContentTime = ds.StudyTime
    ds.AccessionNumber = f"ACC{int(seed):07d}"[:16]
    ds.Modality = "CT"
    ds.Manufacturer = str(meta_value(volume, "Manufacturer", "CTPIPE"))
    ds.ReferringPhysicianName = ""
    ds.StudyDescription = "Chest CT phantom"
    ds.ManufacturerModelName = str(meta_value(volume, "ManufacturerModelName", "PHANTOM"))
    ds.DeviceSerialNumber = "0001"
    ds.SoftwareVersions = "ctpipe-phantom-1"
    ds.PatientName = str(meta_value(volume, "PatientName", phantom_patient_name(int(seed))))
    ds.PatientID = str(meta_value(volume, "PatientID", f"PHANTOM{int(seed):05d}"))
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"
    ds.BodyPartExamined = str(meta_value(volume, "BodyPartExamined", "CHEST"))
    ds.KVP = fmt_ds(float(meta_value(volume, "KVP", 120)))
    ds.PatientPosition = str(meta_value(volume, "PatientPosition", "HFS"))
    ds.StudyInstanceUID = study_uid
    ds.StudyID = str(int(seed) % 10**8)
    ds.AcquisitionNumber = 1
    ds.FrameOfReferenceUID = frame_uid
    ds.PositionReferenceIndicator = ""
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = pixel_rep
    ds.RescaleIntercept = fmt_ds(intercept)
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.WindowCenter = ["-600", "40"]
    ds.WindowWidth = ["1500", "400"]
    ds.ConvolutionKernel = str(meta_value(volume, "ConvolutionKernel", "STANDARD"))
    agent = meta_value(volume, "ContrastBolusAgent", None)
    if agent is not None:
        ds.ContrastBolusAgent = str(agent)
    return ds


def volume_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> Stack:
    """The slices of ``volume`` as they lie (slice k at ``origin + direction @ (0, 0, k * sk)``, LPS mm)."""
    g = volume.geometry
    si, sj, sk = g.spacing
    d = g.direction
    ks = np.arange(g.shape[0], dtype=np.float64)
    positions = np.asarray(g.origin)[None, :] + (ks * sk)[:, None] * d[:, 2][None, :]
    return Stack(
        hu=volume.array,
        positions=positions,
        row_dir=d[:, 0].copy(),
        col_dir=d[:, 1].copy(),
        pixel_spacing=(sj, si),
        spacing_between=sk,
        thickness=float(meta_value(volume, "SliceThickness", sk)),
        instance_numbers=list(range(1, g.shape[0] + 1)),
        image_type=["ORIGINAL", "PRIMARY", "AXIAL"],
        series_uid=series_uid,
        series_number=series_number,
        description=str(meta_value(volume, "SeriesDescription", "Chest phantom")),
    )


def make_file_meta(sop_class: str, sop_uid: str, ts: UID) -> FileMetaDataset:
    """The file meta information (group 0002) of one instance."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = UID(sop_uid)
    meta.TransferSyntaxUID = ts
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.ImplementationVersionName = "CTPIPE_010"
    return meta


def set_pixels(ds: Dataset, stored: np.ndarray, ts: UID) -> None:
    """Put ``stored`` (one frame [rows, cols] or frames [n, rows, cols]) into ``ds``, encoded in transfer syntax ``ts``."""
    if ts == ExplicitVRLittleEndian:
        ds.PixelData = np.ascontiguousarray(stored).tobytes()
        ds["PixelData"].VR = "OW"
        return
    plugin = "pylibjpeg" if ts in (RLELossless, JPEG2000Lossless) else ""
    try:
        ds.compress(ts, np.ascontiguousarray(stored), encoding_plugin=plugin, generate_instance_uid=False)
    except (RuntimeError, ValueError) as exc:
        if ts != RLELossless:
            raise DicomWriteError(
                f"cannot encode {ts.name}: {exc}", fix="install pylibjpeg-openjpeg, or use transfer_syntax='rle'"
            ) from exc
        ds.compress(ts, np.ascontiguousarray(stored), encoding_plugin="pydicom", generate_instance_uid=False)


def save_dataset(path: Path, ds: Dataset) -> Path:
    """Write ``ds`` to ``path`` atomically (temporary name in the same folder, then rename)."""
    with atomic_open(path) as fh:
        dcmwrite(fh, ds, enforce_file_format=True)
    return path
