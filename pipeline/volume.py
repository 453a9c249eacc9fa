"""Volumes whose geometry travels with the array: :class:`CTVolume` (HU) and :class:`LabelMap` (masks).

``array`` is indexed ``[k, j, i]`` = ``[slice, row, column]`` on a :class:`~pipeline.geometry.Geometry`
(LPS, mm; the conventions are in :mod:`pipeline.geometry`). Also here: the DICOM metadata rules that travel
with a volume (:data:`PATIENT_IDENTIFIERS`, :data:`PER_SLICE_METADATA`, thick slices, lossy compression).

Objects are valid once constructed and immutable in their geometry: every
spatial operation (:meth:`CTVolume.resample`, :meth:`CTVolume.crop`) returns a new object.
The grid (:mod:`pipeline.geometry`) and resampling (:mod:`pipeline.resample`) are importable from here too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .errors import GeometryError, NotAVolumeError, described
from .geometry import LPS_TO_RAS, Geometry, bool3, clip_box, float3, int3
from .resample import default_device, resample_array

if TYPE_CHECKING:  # pragma: no cover
    import SimpleITK as sitk

__all__ = [
    "COARSE_PIXEL_MM",
    "COARSE_PIXEL_NOTE",
    "LOSSY_NOTE",
    "LPS_TO_RAS",
    "PATIENT_IDENTIFIERS",
    "PER_SLICE_METADATA",
    "THICK_SLICE_MM",
    "THICK_SLICE_NOTE",
    "CTVolume",
    "Geometry",
    "LabelMap",
    "bool3",
    "coarse_pixel_detail",
    "default_device",
    "float3",
    "int3",
    "lossy_detail",
    "require_volume",
    "resample_array",
    "slice_thickness_mm",
    "thick_slice_detail",
    "without_identifiers",
]

log = logging.getLogger(__name__)


#: metadata lists with one entry per slice k that ingest records (the source image of each slice): a crop keeps
#: the kept slices' entries, a resampled volume has none
PER_SLICE_METADATA = ("InstanceNumbers", "SOPInstanceUIDs", "FrameNumbers")

#: DICOM attributes that identify a patient or a visit (from the PS3.15 Basic Application Level
#: Confidentiality Profile). They stay out of everything ctpipe writes outside DICOM (cache sidecars,
#: ``volume.json``) unless a caller opts in (``keep_identifiers=True``). UIDs (study, series, frame of
#: reference) and the study date are not among them: outputs need them to refer to the images.
PATIENT_IDENTIFIERS = frozenset(
    {
        "PatientName",
        "PatientID",
        "IssuerOfPatientID",
        "OtherPatientIDs",
        "OtherPatientIDsSequence",
        "OtherPatientNames",
        "PatientBirthDate",
        "PatientBirthTime",
        "PatientBirthName",
        "PatientMotherBirthName",
        "PatientAddress",
        "PatientTelephoneNumbers",
        "MedicalRecordLocator",
        "AccessionNumber",
        "StudyID",
        "ReferringPhysicianName",
        "PerformingPhysicianName",
        "OperatorsName",
        "InstitutionName",
        "InstitutionAddress",
        "StationName",
        "PatientComments",
        "AdditionalPatientHistory",
        "RequestingPhysician",
        "PhysiciansOfRecord",
        "NameOfPhysiciansReadingStudy",
    }
)


#: Slices thicker than this (mm) are "thick": LUNA16's limit, above which small nodules are unreliable (the
#: reconstruction's ``thick_slices`` quality flag; the detector's thick-slice score calibration)
THICK_SLICE_MM = 2.5
#: What a reader is told about a series whose slices are thicker than :data:`THICK_SLICE_MM`.
THICK_SLICE_NOTE = "thick slices: small nodules unreliable"


def thick_slice_detail(thickness_mm: float) -> str | None:
    """For slices ``thickness_mm`` thick: "3.00 mm > 2.5 mm" when they are thicker than :data:`THICK_SLICE_MM` (the
    figure the ``thick_slices`` flag states), else ``None``."""
    return f"{thickness_mm:.2f} mm > {THICK_SLICE_MM} mm" if thickness_mm > THICK_SLICE_MM else None


#: Pixels (in-plane, mm) coarser than this are "coarse": a diagnostic chest series has 0.5–1 mm pixels, and the demo
#: detector learned from 0.8–2.25 mm ones; a small nodule is then a pixel or two (the ``coarse_pixels`` quality flag)
COARSE_PIXEL_MM = 2.5
#: What a reader is told about a series whose pixels are coarser than :data:`COARSE_PIXEL_MM`.
COARSE_PIXEL_NOTE = "coarse pixels: small nodules unreliable"


def coarse_pixel_detail(geometry: Geometry) -> str | None:
    """For a series on ``geometry``: "4.17 x 4.17 mm pixels > 2.5 mm" when its pixels (spacing along LPS x and y, mm)
    are coarser than :data:`COARSE_PIXEL_MM` along either (the figure the ``coarse_pixels`` flag states), else
    ``None``."""
    sx, sy, _ = geometry.spacing_lps()
    if max(sx, sy) <= COARSE_PIXEL_MM:
        return None
    return f"{sx:.2f} x {sy:.2f} mm pixels > {COARSE_PIXEL_MM} mm"


#: What a reader is told about a series stored with lossy compression (ingest's ``LossyImageCompression`` "01").
LOSSY_NOTE = "lossy compressed: HU values and small nodules unreliable"


def lossy_detail(metadata: Mapping[str, Any]) -> str | None:
    """For a series whose metadata says ``LossyImageCompression`` "01" (set by ingest,
    :mod:`pipeline.ingest.lossy`): its ratio and method, e.g. "ratio 10:1 by ISO_10918_1" ("estimated ratio 10:1"
    when ingest estimated it; successive compressions joined by ", then"; "ratio and method not stated" when the
    files state neither), the figure the
    ``lossy_compressed`` flag states; else ``None``."""
    if str(metadata.get("LossyImageCompression") or "").strip() != "01":
        return None

    def listed(key: str) -> list[Any]:
        value = metadata.get(key)
        return [] if value in (None, "") else list(value) if isinstance(value, (list, tuple)) else [value]

    ratios, methods = listed("LossyImageCompressionRatio"), listed("LossyImageCompressionMethod")
    estimated = "estimated " if metadata.get("LossyImageCompressionRatioEstimated") else ""
    steps = []
    for n in range(max(len(ratios), len(methods))):
        ratio = f"{estimated}ratio {float(ratios[n]):g}:1" if n < len(ratios) else ""
        method = f"by {methods[n]}" if n < len(methods) else ""
        steps.append(" ".join(p for p in (ratio, method) if p))
    return ", then ".join(steps) or "ratio and method not stated"


def slice_thickness_mm(geometry: Geometry, metadata: Mapping[str, Any]) -> float:
    """A series' slice thickness (mm): its SliceThickness when the metadata holds a positive one, else the spacing
    along the patient's long axis (S in LPS)."""
    value = metadata.get("SliceThickness")
    try:
        thickness = float(value) if value not in (None, "") else float("nan")
    except (TypeError, ValueError):
        thickness = float("nan")
    spacing_z = geometry.spacing_lps()[2]
    return thickness if np.isfinite(thickness) and thickness > 0 else spacing_z


def without_identifiers(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` less the keys in :data:`PATIENT_IDENTIFIERS` (a new dict)."""
    return {k: v for k, v in values.items() if k not in PATIENT_IDENTIFIERS}


class _SpatialArray:
    """Shared behaviour of :class:`CTVolume` and :class:`LabelMap`."""

    array: np.ndarray
    geometry: Geometry

    def _check(self) -> None:
        if not isinstance(self.geometry, Geometry):
            build = "build one: Geometry(shape=array.shape, spacing=(i, j, k) mm, origin=(x, y, z) LPS mm)"
            if getattr(self.geometry, "shape", None) == (4, 4):  # an affine matrix (nibabel, MONAI)
                build = (
                    f"a 4x4 affine (a NIfTI's is RAS): read the file with load_series(path), which converts it to LPS, or {build}"
                )
            raise GeometryError(f"geometry must be a Geometry, got {described(self.geometry)}", fix=build)
        if self.array.ndim != 3:
            raise GeometryError(
                f"array must be 3-D [k, j, i], got shape {self.array.shape}",
                fix="pass one volume indexed [k, j, i] (slices, rows, columns); a MONAI channel-first array "
                "(1, i, j, k) is array[0].transpose(2, 1, 0)",
            )
        shape = tuple(self.array.shape)
        if shape != self.geometry.shape:
            if shape[::-1] == self.geometry.shape:  # nibabel's get_fdata(), MONAI and ITK's own index order
                fix = (
                    "the array is indexed [i, j, k] (as nibabel's get_fdata() and MONAI give it); ctpipe indexes "
                    "[k, j, i], as SimpleITK's GetArrayFromImage does: pass array.transpose(2, 1, 0)"
                )
            else:
                fix = "pass the array and the geometry of the same grid: Geometry(shape=array.shape, ...) is [k, j, i]"
            raise GeometryError(f"array shape {shape} differs from geometry shape {self.geometry.shape}", fix=fix)

    @property
    def shape(self) -> tuple[int, int, int]:
        """Array shape ``(nk, nj, ni)``: slices, rows, columns (the array is indexed ``[k, j, i]``)."""
        return self.geometry.shape

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size in mm along ``(i, j, k)``: the reverse of :attr:`shape`'s order."""
        return self.geometry.spacing

    @property
    def origin(self) -> tuple[float, float, float]:
        """LPS position (mm) of the centre of voxel ``(i, j, k) = (0, 0, 0)``."""
        return self.geometry.origin

    @property
    def direction(self) -> np.ndarray:
        """3×3 matrix whose column c is the LPS direction of index axis c (i, j, k)."""
        return self.geometry.direction

    def index_to_lps(self, ijk: np.ndarray | Sequence[float]) -> np.ndarray:
        """Voxel indices (i, j, k) → LPS mm. See :meth:`Geometry.index_to_lps`."""
        return self.geometry.index_to_lps(ijk)

    def lps_to_index(self, lps: np.ndarray | Sequence[float]) -> np.ndarray:
        """LPS mm → continuous voxel indices (i, j, k)."""
        return self.geometry.lps_to_index(lps)

    def to_sitk(self) -> sitk.Image:
        """A SimpleITK image with the same voxels and LPS geometry."""
        import SimpleITK as sitk

        img = sitk.GetImageFromArray(np.ascontiguousarray(self.array))
        img.SetSpacing(self.geometry.spacing)
        img.SetOrigin(self.geometry.origin)
        img.SetDirection(tuple(self.geometry.direction.reshape(-1)))
        return img

    def to_monai(self) -> tuple[np.ndarray, np.ndarray]:
        """MONAI's convention: channel-first array ``(1, i, j, k)`` and its 4×4 RAS affine.

        This is what ``LoadImage(reader="ITKReader", affine_lps_to_ras=True)`` followed
        by ``EnsureChannelFirst`` yields for the same series.
        """
        arr = np.ascontiguousarray(self.array.transpose(2, 1, 0))[None]
        return arr, self.geometry.affine_ras


class CTVolume(_SpatialArray):
    """A CT volume in Hounsfield units with its LPS geometry and DICOM metadata.

    Parameters
    ----------
    array: HU values indexed ``[k, j, i]`` (int16 or float32 are kept as they are, without a copy: the volume
        shares memory with the array passed, so change a copy, ``arr.copy()``, if the volume must not follow).
    geometry: the voxel grid (LPS, mm); its shape must equal ``array.shape``.
    metadata: DICOM attributes (StudyInstanceUID, SeriesInstanceUID, SliceThickness,
        ConvolutionKernel, KVP, Manufacturer, ...), kept read-only.
    """

    def __init__(self, array: np.ndarray, geometry: Geometry, *, metadata: Mapping[str, Any] | None = None):
        arr = np.asarray(array)
        if arr.dtype.kind not in "iuf":
            raise GeometryError(
                f"HU array must be numeric, got dtype {arr.dtype}",
                fix="pass the HU values (int16 or float32); a mask is a LabelMap(mask, geometry)"
                if arr.dtype == bool
                else "pass the HU values as numbers, e.g. array.astype(np.float32)",
            )
        self.array = arr
        self.geometry = geometry
        if metadata is not None and not isinstance(metadata, Mapping):
            raise GeometryError(
                f"must be a mapping of DICOM keywords to values, got {described(metadata)}",
                where="metadata",
                fix="pass a dict such as {'SeriesInstanceUID': '1.2.3', 'SliceThickness': 1.0}, or leave it out",
            )
        self.metadata: Mapping[str, Any] = MappingProxyType(dict(metadata or {}))
        self._check()

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (multiprocessing, joblib): the metadata as a plain dict
        return (_rebuild_volume, (self.array, self.geometry, dict(self.metadata)))

    def __repr__(self) -> str:
        uid = self.metadata.get("SeriesInstanceUID", "?")
        sp = ", ".join(f"{s:.3g}" for s in self.spacing)
        return f"CTVolume(shape={self.shape} [k,j,i], spacing=({sp}) mm [i,j,k], dtype={self.array.dtype}, series={uid})"

    @property
    def series_uid(self) -> str | None:
        """``metadata["SeriesInstanceUID"]`` as text (for an image file, its name without the ending); None when the
        metadata has none. Findings, reconstructions and tables are matched to the volume by it."""
        value = self.metadata.get("SeriesInstanceUID")
        return str(value) if value is not None else None

    def with_array(self, array: np.ndarray) -> CTVolume:
        """A new volume on the same grid with other voxel values."""
        return CTVolume(array, self.geometry, metadata=self.metadata)

    @classmethod
    def from_sitk(cls, image: sitk.Image, *, metadata: Mapping[str, Any] | None = None) -> CTVolume:
        """Build from a 3-D scalar SimpleITK image (whose geometry is LPS by ITK convention).

        Raises :class:`~pipeline.errors.GeometryError` for an image of another dimension or with several
        components per voxel, saying how to take one 3-D scalar volume out of it.
        """
        import SimpleITK as sitk

        dim, components = image.GetDimension(), image.GetNumberOfComponentsPerPixel()
        if dim != 3 or components != 1:
            size = "x".join(str(n) for n in image.GetSize())
            if dim == 2:
                fix = "stack the 2-D slices into one 3-D image first (sitk.JoinSeries)"
            elif dim > 3:
                fix = "take one 3-D volume out of it first, e.g. image[:, :, :, 0] (SimpleITK indexes x, y, z, t)"
            else:
                fix = "take one component first, e.g. sitk.VectorIndexSelectionCast(image, 0)"
            raise GeometryError(
                f"a CTVolume is a 3-D image of one value per voxel; this image is {dim}-D ({size}) with "
                f"{components} component(s) per voxel",
                fix=fix,
            )
        arr = sitk.GetArrayFromImage(image)
        geom = Geometry(
            shape=arr.shape,
            spacing=image.GetSpacing(),
            origin=image.GetOrigin(),
            direction=np.asarray(image.GetDirection()).reshape(3, 3),
        )
        return cls(arr, geom, metadata=metadata)

    def resample(
        self,
        spacing: float | Sequence[float],
        *,
        order: Literal["linear", "nearest"] = "linear",
        device: str | int | None = None,
    ) -> CTVolume:
        """Resample to ``spacing`` in mm: (i, j, k), or one number for isotropic voxels (``resample(2)`` is
        ``resample((2, 2, 2))``); trilinear by default, the grid's origin and direction (LPS) kept; ``device`` as
        :func:`~pipeline.detection.detect`'s (``None``: the GPU where torch sees one). See
        :func:`~pipeline.resample.resample_array`."""
        geom = self.geometry.resampled(spacing)
        out = resample_array(self.array, self.geometry, geom, order=order, device=device)
        if order == "linear" and self.array.dtype.kind in "iu":
            out = out.astype(np.float32)
        # the new slices are none of the source's: their per-slice references go
        metadata = {k: v for k, v in self.metadata.items() if k not in PER_SLICE_METADATA}
        measured = self._measured()
        if measured is not None:  # a tilt-corrected volume's unmeasured wedge stays unmeasured on the new grid
            from .ingest.measured import with_measured
            from .resample import resample_measured

            metadata = with_measured(metadata, resample_measured(measured, self.geometry, geom, order=order))
        return CTVolume(out, geom, metadata=metadata)

    def crop(self, lo_ijk: Sequence[int], hi_ijk: Sequence[int]) -> CTVolume:
        """The sub-volume ``lo <= (i, j, k) < hi`` with its own origin (a copy)."""
        geom = self.geometry.cropped(lo_ijk, hi_ijk)
        lo, _ = clip_box(self.geometry.size_ijk, lo_ijk, hi_ijk)
        k0, j0, i0 = lo[2], lo[1], lo[0]
        arr = self.array[k0 : k0 + geom.shape[0], j0 : j0 + geom.shape[1], i0 : i0 + geom.shape[2]].copy()
        metadata = dict(self.metadata)
        for key in PER_SLICE_METADATA:  # the kept slices' own source references
            values = metadata.get(key)
            if isinstance(values, (list, tuple)) and len(values) == self.shape[0]:
                metadata[key] = list(values[k0 : k0 + geom.shape[0]])
        measured = self._measured()
        if measured is not None:  # a tilt-corrected volume's unmeasured wedge stays unmeasured in the crop
            from .ingest.measured import with_measured

            kept = measured[k0 : k0 + geom.shape[0], j0 : j0 + geom.shape[1], i0 : i0 + geom.shape[2]]
            metadata = with_measured(metadata, kept)
        return CTVolume(arr, geom, metadata=metadata)

    def _measured(self) -> np.ndarray | None:
        """Bool ``[k, j, i]``: the voxels some image measured (a tilt-corrected grid's), None when all were
        (:func:`pipeline.ingest.measured.measured_mask`)."""
        from .ingest.measured import measured_mask

        return measured_mask(self.geometry, self.metadata)


class LabelMap(_SpatialArray):
    """An integer label volume (masks) on a :class:`Geometry` (LPS, mm).

    ``labels`` maps each non-zero value to an organ name, e.g. ``{1: "lung_left"}``.
    """

    def __init__(self, array: np.ndarray, geometry: Geometry, *, labels: Mapping[int, str] | None = None):
        arr = np.asarray(array)
        if arr.dtype == bool:
            arr = arr.astype(np.uint8)
        if arr.dtype.kind not in "iu":
            raise GeometryError(
                f"label array must be integer or bool, got dtype {arr.dtype}",
                fix="pass whole label values, e.g. LabelMap(np.rint(array).astype(np.uint16), geometry), or a bool mask "
                "(array > 0.5 for a probability map)",
            )
        self.array = arr
        self.geometry = geometry
        self.labels: Mapping[int, str] = MappingProxyType(_label_names(labels))
        self._check()

    def __reduce__(self) -> tuple[Any, ...]:  # picklable: the labels as a plain dict
        return (_rebuild_labels, (self.array, self.geometry, dict(self.labels)))

    def __repr__(self) -> str:
        return f"LabelMap(shape={self.shape} [k,j,i], labels={dict(self.labels)})"

    def mask(self, name: str) -> np.ndarray:
        """Boolean mask ``[k, j, i]`` of the label called ``name``."""
        for value, label in self.labels.items():
            if label == name:
                return self.array == value
        raise KeyError(f"no label named {name!r}; labels are {sorted(self.labels.values())}")

    def resample(self, spacing: float | Sequence[float], *, device: str | int | None = None) -> LabelMap:
        """Nearest-neighbour resampling to ``spacing`` in mm: (i, j, k), or one number for isotropic voxels."""
        geom = self.geometry.resampled(spacing)
        out = resample_array(self.array, self.geometry, geom, order="nearest", device=device)
        return LabelMap(out, geom, labels=self.labels)


def _label_names(labels: Mapping[Any, Any] | None) -> dict[int, str]:
    """``labels`` as ``{value: name}``; :class:`GeometryError` naming it when it is not a mapping of whole numbers
    to names (``{"lung_left": 1}``, the other way round, says so)."""
    if labels is None:
        return {}
    example = "{1: 'lung_left', 2: 'lung_right'}"
    if not isinstance(labels, Mapping):
        raise GeometryError(
            f"must map each label value to its name, got {described(labels)}", where="labels", fix=f"pass e.g. {example}"
        )
    names: dict[int, str] = {}
    for key, name in labels.items():
        whole = (isinstance(key, (int, np.integer)) and not isinstance(key, bool)) or (
            isinstance(key, str) and key.strip().isdigit()  # {"1": ...}: a label map's JSON keys
        )
        if not whole:
            swapped = isinstance(key, str) and isinstance(name, (int, np.integer)) and not isinstance(name, bool)
            fix = (
                "the mapping is the wrong way round: pass {value: name}, e.g. {v: k for k, v in labels.items()}"
                if swapped
                else f"map each whole-number label value to its name, e.g. {example}"
            )
            raise GeometryError(f"key {key!r} (-> {name!r}) is not a label value", where="labels", fix=fix)
        names[int(key)] = str(name)
    return names


def _rebuild_volume(array: np.ndarray, geometry: Geometry, metadata: dict[str, Any]) -> CTVolume:
    return CTVolume(array, geometry, metadata=metadata)


def _rebuild_labels(array: np.ndarray, geometry: Geometry, labels: dict[int, str]) -> LabelMap:
    return LabelMap(array, geometry, labels=labels)


#: File name endings read as images by SimpleITK (:func:`pipeline.ingest.load_series` takes them as volumes).
IMAGE_SUFFIXES = (".nii.gz", ".nii", ".mha", ".mhd", ".nrrd")


def image_suffix(path: str | os.PathLike[str]) -> str | None:
    """The ending of ``path``'s name among :data:`IMAGE_SUFFIXES` (``".nii.gz"``, ...), or None."""
    name = Path(path).name.lower()
    return next((s for s in IMAGE_SUFFIXES if name.endswith(s)), None)


#: How to make a volume of an HU array (the fix of errors given an array where a volume belongs).
WRAP_ARRAY_FIX = (
    "wrap the HU array [k, j, i] with its grid: CTVolume(array, Geometry(shape, spacing=(i, j, k) mm, origin=LPS mm))"
)


def require_volume(obj: Any, *, name: str = "volume") -> CTVolume:
    """``obj`` when it is a :class:`CTVolume`; else :class:`~pipeline.errors.NotAVolumeError` saying how to make one."""
    if isinstance(obj, CTVolume):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        what = "a NIfTI/MHA/NRRD image, read as LPS" if image_suffix(obj) else "a DICOM folder, or one file of an Enhanced CT"
        fix = f"load it first: volume = pipeline.load_series({str(obj)!r}) ({what}), then pass the volume"
    elif isinstance(obj, np.ndarray):
        fix = WRAP_ARRAY_FIX
    else:
        fix = "pass a CTVolume (pipeline.load_series(folder) returns one)"
    raise NotAVolumeError(f"must be a CTVolume, got {type(obj).__name__}", where=name, fix=fix)
