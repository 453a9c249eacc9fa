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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
from pydicom.datadict import dictionary_VR
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.filewriter import dcmwrite
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    UID,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    generate_uid,
)
from pydicom.valuerep import format_number_as_ds

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
QUIRKS = ("shuffled_names", "reversed_order", "gantry_tilt", "missing_slice", "duplicate_slice", "localizer", "second_series")
ENHANCED_QUIRKS = ("shuffled_names", "localizer", "second_series")
GANTRY_TILT_DEG = 15.0
THICK_SLICE_MM = 5.0
AIR_HU = -1000.0
UNSIGNED_INTERCEPT = -1024
J2K_MIN_SIZE = 32


@dataclass
class _Stack:
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


def _ds(value: float) -> str:
    return format_number_as_ds(float(value) + 0.0)


def _ds_list(values: Iterable[float]) -> list[str]:
    return [_ds(v) for v in values]


def _uid(seed: int, *parts: object) -> UID:
    return generate_uid(entropy_srcs=["ctpipe-phantom", str(int(seed)), *(str(p) for p in parts)])


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


def _storage(unsigned: bool) -> tuple[np.dtype, int, int]:
    """(stored dtype, RescaleIntercept, PixelRepresentation)."""
    return (np.dtype("<u2"), UNSIGNED_INTERCEPT, 0) if unsigned else (np.dtype("<i2"), 0, 1)


def _to_stored(hu: np.ndarray, unsigned: bool) -> np.ndarray:
    """round(HU) - intercept, clipped to the storage range (see the module docstring)."""
    dtype, intercept, _ = _storage(unsigned)
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


def _meta(volume: CTVolume, key: str, default: Any) -> Any:
    value = volume.metadata.get(key)
    return default if value in (None, "") else value


def _base_dataset(volume: CTVolume, *, seed: int, unsigned: bool, study_uid: str, frame_uid: str) -> Dataset:
    """Patient, study, equipment and pixel-description attributes shared by every instance."""
    _, intercept, pixel_rep = _storage(unsigned)
    day = 1 + int(seed) % 28
    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.StudyDate = str(_meta(volume, "StudyDate", f"202501{day:02d}"))
    ds.SeriesDate = ds.StudyDate
    ds.ContentDate = ds.StudyDate
    ds.StudyTime = str(_meta(volume, "StudyTime", "120000"))
    ds.SeriesTime = ds.StudyTime
    ds.ContentTime = ds.StudyTime
    ds.AccessionNumber = f"ACC{int(seed):07d}"[:16]
    ds.Modality = "CT"
    ds.Manufacturer = str(_meta(volume, "Manufacturer", "CTPIPE"))
    ds.ReferringPhysicianName = ""
    ds.StudyDescription = "Chest CT phantom"
    ds.ManufacturerModelName = str(_meta(volume, "ManufacturerModelName", "PHANTOM"))
    ds.DeviceSerialNumber = "0001"
    ds.SoftwareVersions = "ctpipe-phantom-1"
    ds.PatientName = str(_meta(volume, "PatientName", f"PHANTOM^{int(seed)}"))
    ds.PatientID = str(_meta(volume, "PatientID", f"PHANTOM{int(seed):05d}"))
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"
    ds.BodyPartExamined = str(_meta(volume, "BodyPartExamined", "CHEST"))
    ds.KVP = _ds(float(_meta(volume, "KVP", 120)))
    ds.PatientPosition = str(_meta(volume, "PatientPosition", "HFS"))
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
    ds.RescaleIntercept = _ds(intercept)
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.WindowCenter = ["-600", "40"]
    ds.WindowWidth = ["1500", "400"]
    ds.ConvolutionKernel = str(_meta(volume, "ConvolutionKernel", "STANDARD"))
    return ds


def _volume_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> _Stack:
    g = volume.geometry
    si, sj, sk = g.spacing
    d = g.direction
    ks = np.arange(g.shape[0], dtype=np.float64)
    positions = np.asarray(g.origin)[None, :] + (ks * sk)[:, None] * d[:, 2][None, :]
    return _Stack(
        hu=volume.array,
        positions=positions,
        row_dir=d[:, 0].copy(),
        col_dir=d[:, 1].copy(),
        pixel_spacing=(sj, si),
        spacing_between=sk,
        thickness=float(_meta(volume, "SliceThickness", sk)),
        instance_numbers=list(range(1, g.shape[0] + 1)),
        image_type=["ORIGINAL", "PRIMARY", "AXIAL"],
        series_uid=series_uid,
        series_number=series_number,
        description=str(_meta(volume, "SeriesDescription", "Chest phantom")),
    )


def _tilt(stack: _Stack, volume: CTVolume, tilt_deg: float) -> _Stack:
    """Resample onto the grid of a gantry tilted by ``tilt_deg`` about the row axis.

    The column direction becomes ``cos(t) d1 + sin(t) d2``; the table still moves
    along ``d2`` by ``sk`` per slice, so successive positions are sheared along the
    tilted column direction instead of advancing along the slice normal. Each
    tilted plane passes through the centre row of the original slice k, where its
    values are the original voxels; other rows are bilinear in (j, k); points
    beyond the scanned slab are air (-1000 HU). Anatomy keeps its LPS position.
    """
    g = volume.geometry
    si, sj, sk = g.spacing
    nk, nj, _ = g.shape
    t = np.deg2rad(tilt_deg)
    d = g.direction
    col = np.cos(t) * d[:, 1] + np.sin(t) * d[:, 2]
    jc = (nj - 1) / 2.0
    rel = np.arange(nj, dtype=np.float64) - jc
    jj = jc + rel * np.cos(t)
    j0 = np.clip(np.floor(jj).astype(np.int64), 0, nj - 1)
    j1 = np.minimum(j0 + 1, nj - 1)
    wj = (jj - j0)[:, None].astype(np.float32)
    src = volume.array.astype(np.float32, copy=False)
    out = np.empty((nk, nj, g.shape[2]), dtype=np.float32)
    for k in range(nk):
        kk = k + rel * sj * np.sin(t) / sk
        inside = (kk >= -1e-6) & (kk <= nk - 1 + 1e-6)
        kc = np.clip(kk, 0, nk - 1)
        k0 = np.floor(kc).astype(np.int64)
        k1 = np.minimum(k0 + 1, nk - 1)
        wk = (kc - k0)[:, None].astype(np.float32)
        top = src[k0, j0] * (1 - wj) + src[k0, j1] * wj
        bottom = src[k1, j0] * (1 - wj) + src[k1, j1] * wj
        out[k] = np.where(inside[:, None], top * (1 - wk) + bottom * wk, np.float32(AIR_HU))
    shift = jc * sj * (d[:, 1] - col)
    stack.hu = out
    stack.positions = stack.positions + shift[None, :]
    stack.col_dir = col
    stack.spacing_between = sk * float(np.cos(t))
    stack.tilt_deg = tilt_deg
    return stack


def _thick_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> _Stack:
    """A thick-slice (≈5 mm) reconstruction: means of consecutive slices, same plane orientation.

    Like a scanner's second reconstruction of one acquisition it is ORIGINAL/PRIMARY/AXIAL.
    """
    g = volume.geometry
    nk = g.shape[0]
    sk = g.spacing[2]
    factor = max(1, min(int(round(THICK_SLICE_MM / sk)), nk // 2 if nk >= 2 else 1))
    n = nk // factor
    hu = volume.array[: n * factor].astype(np.float32).reshape(n, factor, *g.shape[1:]).mean(axis=1)
    stack = _volume_stack(volume, series_uid=series_uid, series_number=series_number)
    centres = np.arange(n) * factor + (factor - 1) / 2.0
    stack.hu = hu
    stack.positions = np.asarray(g.origin)[None, :] + (centres * sk)[:, None] * g.direction[:, 2][None, :]
    stack.spacing_between = sk * factor
    stack.thickness = sk * factor
    stack.instance_numbers = list(range(1, n + 1))
    stack.description = f"Chest phantom {sk * factor:g} mm"
    return stack


def _localizer_stack(volume: CTVolume, *, series_uid: str, series_number: int) -> _Stack:
    """One coronal projection image (mean HU along j), superior slice at the top."""
    g = volume.geometry
    si, sj, sk = g.spacing
    nk, nj, _ = g.shape
    d = g.direction
    proj = volume.array.astype(np.float32).mean(axis=1)[::-1]  # [rows = k from last to first, cols = i]
    top_left = np.asarray(g.origin) + (nk - 1) * sk * d[:, 2] + (nj - 1) / 2.0 * sj * d[:, 1]
    return _Stack(
        hu=proj[None],
        positions=top_left[None],
        row_dir=d[:, 0].copy(),
        col_dir=-d[:, 2],
        pixel_spacing=(sk, si),
        spacing_between=None,
        thickness=sk,  # detector row width of the scout
        instance_numbers=[1],
        image_type=["ORIGINAL", "PRIMARY", "LOCALIZER"],
        series_uid=series_uid,
        series_number=series_number,
        description="Scout",
    )


class _Namer:
    """File names: ``CT<series>_<instance>.dcm``, or random hex names in nested folders."""

    def __init__(self, out_dir: Path, shuffled: bool, seed: int):
        self.out_dir = out_dir
        self.shuffled = shuffled
        self.rng = np.random.default_rng([int(seed), 0x5EED])
        self.used: set[Path] = set()

    def __call__(self, series_number: int, instance: int, tag: str = "") -> Path:
        if not self.shuffled:
            return self.out_dir / f"CT{series_number:03d}_{instance:05d}{tag}.dcm"
        while True:
            depth = int(self.rng.integers(0, 3))
            parts = [self.rng.bytes(1).hex() for _ in range(depth)]
            path = self.out_dir.joinpath(*parts, self.rng.bytes(8).hex().upper())
            if path not in self.used:
                self.used.add(path)
                return path


def _file_meta(sop_class: str, sop_uid: str, ts: UID) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = UID(sop_uid)
    meta.TransferSyntaxUID = ts
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.ImplementationVersionName = "CTPIPE_010"
    return meta


def _set_pixels(ds: Dataset, stored: np.ndarray, ts: UID) -> None:
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


def _save(path: Path, ds: Dataset) -> Path:
    """Write ``ds`` to ``path`` atomically (temporary name in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = BytesIO()
    dcmwrite(buf, ds, enforce_file_format=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(buf.getbuffer())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_stack(stack: _Stack, base: Dataset, *, seed: int, unsigned: bool, ts: UID, namer: _Namer,
                 order: Sequence[int] | None = None, extra: Sequence[tuple[int, int]] = ()) -> list[Path]:
    """Write one classic CT Image Storage instance per slice (in ``order``) plus ``extra`` (slice, instance) copies."""
    normal = np.cross(stack.row_dir, stack.col_dir)
    orientation = _ds_list(np.concatenate([stack.row_dir, stack.col_dir]))
    template = Dataset(dict(base._dict))  # shares the immutable elements of ``base``; new ones are added below
    template.ImageType = stack.image_type
    template.SOPClassUID = CT_IMAGE_STORAGE
    template.SeriesDescription = stack.description
    template.SeriesInstanceUID = stack.series_uid
    template.SeriesNumber = stack.series_number
    template.ImageOrientationPatient = orientation
    template.Rows, template.Columns = int(stack.hu.shape[1]), int(stack.hu.shape[2])
    template.PixelSpacing = _ds_list(stack.pixel_spacing)
    if stack.thickness is not None:
        template.SliceThickness = _ds(stack.thickness)
    if stack.spacing_between is not None:
        template.SpacingBetweenSlices = _ds(stack.spacing_between)
    if "LOCALIZER" in stack.image_type:
        del template.RescaleType  # a projection image is not in HU
    if stack.tilt_deg:
        template.GantryDetectorTilt = _ds(stack.tilt_deg)
    items = [(k, stack.instance_numbers[k]) for k in (order if order is not None else range(len(stack.hu)))]
    items += list(extra)
    paths = []
    for k, instance in items:
        sop_uid = _uid(seed, stack.series_uid, "instance", instance)
        ds = Dataset(dict(template._dict))
        ds.file_meta = _file_meta(CT_IMAGE_STORAGE, sop_uid, ts)
        ds.add_new(0x00080018, "UI", sop_uid)  # SOPInstanceUID
        ds.add_new(0x00200013, "IS", instance)  # InstanceNumber
        ds.add_new(0x00200032, "DS", _ds_list(stack.positions[k]))  # ImagePositionPatient
        if stack.spacing_between is not None:
            ds.add_new(0x00201041, "DS", _ds(float(stack.positions[k] @ normal)))  # SliceLocation
        _set_pixels(ds, _to_stored(stack.hu[k], unsigned), ts)
        paths.append(_save(namer(stack.series_number, instance), ds))
    return paths


def _item(**attrs: Any) -> Dataset:
    """A sequence item; numbers go to DS elements as formatted strings and to FD elements as floats."""
    item = Dataset()
    for key, value in attrs.items():
        vr = dictionary_VR(key)
        if vr in ("DS", "FD") and not isinstance(value, str):
            conv = _ds if vr == "DS" else float
            value = [conv(v) for v in value] if np.ndim(value) else conv(value)
        setattr(item, key, value)
    return item


def _seq(**attrs: Any) -> DicomSequence:
    """A one-item DICOM sequence holding ``attrs``."""
    return DicomSequence([_item(**attrs)])


def _write_enhanced(stack: _Stack, base: Dataset, *, seed: int, unsigned: bool, ts: UID, path: Path) -> Path:
    """One Enhanced CT Image Storage multi-frame instance holding every slice of ``stack`` (frame n = slice k)."""
    n, rows, cols = stack.hu.shape
    sop_uid = _uid(seed, stack.series_uid, "enhanced")
    dim_uid = _uid(seed, stack.series_uid, "dimensions")
    _, intercept, _ = _storage(unsigned)
    when = f"{base.StudyDate}{base.StudyTime}"
    fov = max(rows * stack.pixel_spacing[0], cols * stack.pixel_spacing[1])
    centre = stack.positions.mean(axis=0) + stack.row_dir * (cols - 1) / 2 * stack.pixel_spacing[1]
    centre = centre + stack.col_dir * (rows - 1) / 2 * stack.pixel_spacing[0]
    image_type = ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"]
    ds = Dataset(dict(base._dict))
    for keyword in ("RescaleIntercept", "RescaleSlope", "RescaleType", "WindowCenter", "WindowWidth", "KVP",
                    "ConvolutionKernel"):
        del ds[keyword]  # these live in the functional groups of the enhanced IOD
    ds.file_meta = _file_meta(ENHANCED_CT_IMAGE_STORAGE, sop_uid, ts)
    ds.SOPClassUID, ds.SOPInstanceUID, ds.ImageType = ENHANCED_CT_IMAGE_STORAGE, sop_uid, image_type
    ds.AcquisitionDateTime = when
    ds.AcquisitionDuration = 0.5 * n
    ds.AcquisitionContextSequence = DicomSequence([])
    ds.PixelPresentation, ds.VolumetricProperties, ds.VolumeBasedCalculationTechnique = "MONOCHROME", "VOLUME", "NONE"
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.SeriesDescription = stack.series_uid, stack.series_number, stack.description
    ds.InstanceNumber = 1
    ds.ContentQualification = "RESEARCH"
    ds.BurnedInAnnotation = "NO"
    ds.LossyImageCompression = "00"
    ds.PresentationLUTShape = "IDENTITY"
    ds.NumberOfFrames = n
    ds.Rows, ds.Columns = int(rows), int(cols)
    ds.DimensionOrganizationSequence = _seq(DimensionOrganizationUID=dim_uid)
    ds.DimensionIndexSequence = DicomSequence(
        [
            _item(DimensionOrganizationUID=dim_uid, DimensionIndexPointer=0x00209056, FunctionalGroupPointer=0x00209111,
                  DimensionDescriptionLabel="Stack ID"),
            _item(DimensionOrganizationUID=dim_uid, DimensionIndexPointer=0x00209057, FunctionalGroupPointer=0x00209111,
                  DimensionDescriptionLabel="In-Stack Position Number"),
        ]
    )
    ds.SharedFunctionalGroupsSequence = _seq(
        PixelMeasuresSequence=_seq(PixelSpacing=_ds_list(stack.pixel_spacing), SliceThickness=_ds(stack.thickness or 0.0),
                                   SpacingBetweenSlices=_ds(stack.spacing_between or 0.0)),
        PlaneOrientationSequence=_seq(ImageOrientationPatient=_ds_list(np.concatenate([stack.row_dir, stack.col_dir]))),
        PixelValueTransformationSequence=_seq(RescaleIntercept=_ds(intercept), RescaleSlope="1", RescaleType="HU"),
        FrameVOILUTSequence=_seq(WindowCenter=["-600", "40"], WindowWidth=["1500", "400"]),
        FrameAnatomySequence=_seq(FrameLaterality="U", AnatomicRegionSequence=_seq(
            CodeValue="51185008", CodingSchemeDesignator="SCT", CodeMeaning="Chest")),
        IrradiationEventIdentificationSequence=_seq(IrradiationEventUID=_uid(seed, stack.series_uid, "irradiation")),
        CTImageFrameTypeSequence=_seq(FrameType=image_type, PixelPresentation="MONOCHROME", VolumetricProperties="VOLUME",
                                      VolumeBasedCalculationTechnique="NONE"),
        CTAcquisitionTypeSequence=_seq(AcquisitionType="SPIRAL", ConstantVolumeFlag="NO", FluoroscopyFlag="NO"),
        CTAcquisitionDetailsSequence=_seq(DataCollectionDiameter=fov, GantryDetectorTilt=0.0,
                                          TotalCollimationWidth=40.0, SingleCollimationWidth=0.625, TableHeight=150.0,
                                          RotationDirection="CW", RevolutionTime=0.5),
        CTTableDynamicsSequence=_seq(TableSpeed=80.0, TableFeedPerRotation=40.0, SpiralPitchFactor=1.0),
        CTGeometrySequence=_seq(DistanceSourceToDetector=1040.0, DistanceSourceToDataCollectionCenter=570.0),
        CTReconstructionSequence=_seq(ReconstructionAlgorithm="FILTER_BACK_PROJ", ConvolutionKernel=base.ConvolutionKernel,
                                      ConvolutionKernelGroup="LUNG", ReconstructionDiameter=fov,
                                      ReconstructionPixelSpacing=stack.pixel_spacing, ReconstructionAngle=0.0,
                                      ImageFilter="NONE"),
        CTExposureSequence=_seq(ExposureTimeInms=500.0, XRayTubeCurrentInmA=200.0, ExposureInmAs=100.0,
                                ExposureModulationType="NONE"),
        CTXRayDetailsSequence=_seq(KVP=base.KVP, FocalSpots=[1.2], FilterType="BODY", FilterMaterial=["ALUMINUM"]),
    )
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(
        [
            _item(
                PlanePositionSequence=_seq(ImagePositionPatient=_ds_list(stack.positions[k])),
                FrameContentSequence=_seq(FrameAcquisitionNumber=1, FrameReferenceDateTime=when,
                                          FrameAcquisitionDateTime=when, FrameAcquisitionDuration=500.0, StackID="1",
                                          InStackPositionNumber=k + 1, DimensionIndexValues=[1, k + 1]),
                CTPositionSequence=_seq(TablePosition=-stack.positions[k][2],
                                        ReconstructionTargetCenterPatient=centre,
                                        DataCollectionCenterPatient=centre),
            )
            for k in range(n)
        ]
    )
    _set_pixels(ds, _to_stored(stack.hu, unsigned), ts)
    return _save(path, ds)


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
    study_uid = str(_meta(volume, "StudyInstanceUID", _uid(seed, ident, "study")))
    series_uid = str(volume.series_uid or _uid(seed, ident, "series"))
    frame_uid = str(_meta(volume, "FrameOfReferenceUID", _uid(seed, ident, "frame")))
    base = _base_dataset(volume, seed=seed, unsigned=unsigned, study_uid=study_uid, frame_uid=frame_uid)
    namer = _Namer(out, "shuffled_names" in quirk_list, seed)
    stack = _volume_stack(volume, series_uid=series_uid, series_number=series_number)
    if enhanced:
        paths = [_write_enhanced(stack, base, seed=seed, unsigned=unsigned, ts=ts, path=namer(series_number, 1, "_mf"))]
    else:
        nk = volume.shape[0]
        if "gantry_tilt" in quirk_list:
            stack = _tilt(stack, volume, GANTRY_TILT_DEG)
        if "reversed_order" in quirk_list:
            stack.instance_numbers = list(range(nk, 0, -1))
        order = [k for k in range(nk) if not ("missing_slice" in quirk_list and k == nk // 2)]
        extra = [(nk // 2, nk + 1)] if "duplicate_slice" in quirk_list else []
        paths = _write_stack(stack, base, seed=seed, unsigned=unsigned, ts=ts, namer=namer, order=order, extra=extra)
    if "second_series" in quirk_list:
        thick = _thick_stack(volume, series_uid=_uid(seed, series_uid, "thick"), series_number=series_number + 1)
        paths += _write_stack(thick, base, seed=seed, unsigned=unsigned, ts=ts, namer=namer)
    if "localizer" in quirk_list:
        loc = _localizer_stack(volume, series_uid=_uid(seed, series_uid, "localizer"), series_number=series_number + 100)
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
    """
    case = Path(out_dir)
    options.setdefault("seed", int(getattr(phantom, "seed", 0)))
    write_dicom_series(phantom.volume, case / "dicom", **options)
    phantom.save_ground_truth(case)
    return case


write_phantom_series = write_phantom_case
