"""Tiny DICOM series written with pydicom (single-frame and Enhanced CT), and SimpleITK's reading of them, for the tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian, generate_uid

CT_STORAGE = UID("1.2.840.10008.5.1.4.1.1.2")
ENHANCED_CT_STORAGE = UID("1.2.840.10008.5.1.4.1.1.2.1")


def hu_pattern(n: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A deterministic HU volume [k, j, i] with structure along every axis."""
    rng = np.random.default_rng(seed)
    k, j, i = np.meshgrid(np.arange(n), np.arange(rows), np.arange(cols), indexing="ij")
    base = -1000 + 40 * k + 7 * j + 3 * i
    return (base + rng.integers(-20, 20, size=base.shape)).astype(np.int16)


def write_series(
    folder: Path,
    *,
    n: int = 12,
    rows: int = 16,
    cols: int = 20,
    pixel_spacing: tuple[float, float] = (0.7, 0.8),
    step: float = 1.25,
    origin: Sequence[float] = (-10.0, -20.0, 30.0),
    orientation: Sequence[float] = (1, 0, 0, 0, 1, 0),
    positions: Sequence[Sequence[float]] | None = None,
    hu: np.ndarray | None = None,
    modality: str = "CT",
    series_uid: str | None = None,
    study_uid: str | None = None,
    description: str = "CHEST 1.25",
    image_type: str = "ORIGINAL\\PRIMARY\\AXIAL",
    implicit: bool = False,
    slope: float = 1.0,
    intercept: float = -1024.0,
    unsigned: bool = False,
    names: Callable[[int], str] | None = None,
    tweak: Callable[[int, Dataset], None] | None = None,
    instance_numbers: Sequence[int] | None = None,
    series_number: int = 2,
    seed: int = 0,
) -> list[Path]:
    """Write ``n`` single-frame CT files into ``folder``; returns their paths in slice order."""
    folder.mkdir(parents=True, exist_ok=True)
    series_uid = series_uid or generate_uid()
    study_uid = study_uid or "1.2.826.0.1.3680043.8.498.1"
    hu = hu_pattern(n, rows, cols, seed) if hu is None else hu
    row = np.asarray(orientation[:3], float)
    col = np.asarray(orientation[3:], float)
    normal = np.cross(row, col)
    if positions is None:
        positions = [(np.asarray(origin, float) + k * step * normal).tolist() for k in range(n)]
    stored = np.round((hu.astype(np.float64) - intercept) / slope)
    stored = stored.astype(np.uint16 if unsigned else np.int16)
    paths = []
    for k in range(n):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CT_STORAGE
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID = CT_STORAGE
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.ImageType = image_type
        ds.StudyDate = "20240102"
        ds.StudyTime = "101500"
        ds.StudyID = "1"
        ds.Modality = modality
        ds.Manufacturer = "ACME"
        ds.SeriesDescription = description
        ds.PatientID = "PAT-1"
        ds.PatientName = "Phantom^One"
        ds.SliceThickness = f"{step:g}"
        ds.KVP = "120"
        ds.ConvolutionKernel = "B30f"
        ds.PatientPosition = "HFS"
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = series_uid
        ds.SeriesNumber = series_number
        ds.AcquisitionNumber = 1
        ds.InstanceNumber = instance_numbers[k] if instance_numbers is not None else k + 1
        ds.ImagePositionPatient = [f"{v:.6f}" for v in positions[k]]
        ds.ImageOrientationPatient = [f"{v:.6f}" for v in orientation]
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.Rows = rows
        ds.Columns = cols
        ds.PixelSpacing = [f"{pixel_spacing[0]:g}", f"{pixel_spacing[1]:g}"]
        ds.BitsAllocated = 16
        ds.BitsStored = 16
        ds.HighBit = 15
        ds.PixelRepresentation = 0 if unsigned else 1
        ds.RescaleIntercept = f"{intercept:g}"
        ds.RescaleSlope = f"{slope:g}"
        ds.PixelData = stored[k].tobytes()
        if tweak is not None:
            tweak(k, ds)
        name = names(k) if names else f"slice_{k:04d}.dcm"
        path = folder / name
        ds.save_as(path, enforce_file_format=True, little_endian=True, implicit_vr=implicit)
        paths.append(path)
    return paths


def write_enhanced(
    path: Path,
    *,
    n: int = 12,
    rows: int = 16,
    cols: int = 20,
    pixel_spacing=(0.7, 0.8),
    step: float = 1.25,
    origin=(-10.0, -20.0, 30.0),
    hu: np.ndarray | None = None,
    shuffle: bool = True,
    slope: float = 1.0,
    intercept: float = -1024.0,
) -> tuple[Path, np.ndarray]:
    """One Enhanced CT file whose frames are stored in a shuffled order; returns (path, hu in slice order)."""
    hu = hu_pattern(n, rows, cols, 3) if hu is None else hu
    order = np.random.default_rng(5).permutation(n) if shuffle else np.arange(n)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ENHANCED_CT_STORAGE
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = ENHANCED_CT_STORAGE
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.ImageType = "ORIGINAL\\PRIMARY\\AXIAL\\NONE"
    ds.Modality = "CT"
    ds.SeriesDescription = "ENHANCED CHEST"
    ds.PatientID = "PAT-2"
    ds.StudyInstanceUID = "1.2.826.0.1.3680043.8.498.2"
    ds.SeriesInstanceUID = generate_uid()
    ds.SeriesNumber = 5
    ds.InstanceNumber = 1
    ds.NumberOfFrames = n
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows = rows
    ds.Columns = cols
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 1
    shared = Dataset()
    ori = Dataset()
    ori.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    meas = Dataset()
    meas.PixelSpacing = list(pixel_spacing)
    meas.SliceThickness = step
    trans = Dataset()
    trans.RescaleSlope = slope
    trans.RescaleIntercept = intercept
    trans.RescaleType = "HU"
    shared.PlaneOrientationSequence = DicomSequence([ori])
    shared.PixelMeasuresSequence = DicomSequence([meas])
    shared.PixelValueTransformationSequence = DicomSequence([trans])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    frames = []
    for k in order:
        item = Dataset()
        pos = Dataset()
        pos.ImagePositionPatient = [origin[0], origin[1], origin[2] + float(k) * step]
        item.PlanePositionSequence = DicomSequence([pos])
        frames.append(item)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(frames)
    stored = np.round((hu.astype(np.float64) - intercept) / slope).astype(np.int16)
    ds.PixelData = stored[order].tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path, hu


def read_sitk(folder: Path, uid: str | None = None):
    """SimpleITK ImageSeriesReader on the (only) series in ``folder``: (HU array [k,j,i], origin, spacing, direction)."""
    import SimpleITK as sitk

    ids = sitk.ImageSeriesReader.GetGDCMSeriesIDs(str(folder))
    assert len(ids) >= 1, ids
    if uid is not None:
        ids = [uid]
    files = sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(folder), ids[0], False, True)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(files)
    img = reader.Execute()
    return (
        sitk.GetArrayFromImage(img),
        np.array(img.GetOrigin()),
        np.array(img.GetSpacing()),
        np.array(img.GetDirection()).reshape(3, 3),
    )
