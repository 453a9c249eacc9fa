"""Enhanced CT Image Storage: a whole phantom series as one multi-frame DICOM file.

Frame n holds slice k = n - 1 of the stack; per-frame ``ImagePositionPatient``
(LPS, mm) and the shared functional groups (orientation, pixel measures, rescale to
HU) carry the geometry, so a reader rebuilds the same volume as from the classic
one-file-per-slice series.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydicom.datadict import dictionary_VR
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import UID

from .dicom_common import (
    ENHANCED_CT_IMAGE_STORAGE,
    Stack,
    fmt_ds,
    fmt_ds_list,
    make_file_meta,
    make_uid,
    save_dataset,
    set_pixels,
    storage_format,
    to_stored,
)


def _item(**attrs: Any) -> Dataset:
    """A sequence item; numbers go to DS elements as formatted strings and to FD elements as floats."""
    item = Dataset()
    for key, value in attrs.items():
        vr = dictionary_VR(key)
        if vr in ("DS", "FD") and not isinstance(value, str):
            conv = fmt_ds if vr == "DS" else float
            value = [conv(v) for v in value] if np.ndim(value) else conv(value)
        setattr(item, key, value)
    return item


def _seq(**attrs: Any) -> DicomSequence:
    """A one-item DICOM sequence holding ``attrs``."""
    return DicomSequence([_item(**attrs)])


def write_enhanced(stack: Stack, base: Dataset, *, seed: int, unsigned: bool, ts: UID, path: Path) -> Path:
    """One Enhanced CT Image Storage multi-frame instance holding every slice of ``stack`` (frame n = slice k)."""
    n, rows, cols = stack.hu.shape
    sop_uid = make_uid(seed, stack.series_uid, "enhanced")
    dim_uid = make_uid(seed, stack.series_uid, "dimensions")
    _, intercept, _ = storage_format(unsigned)
    when = f"{base.StudyDate}{base.StudyTime}"
    fov = max(rows * stack.pixel_spacing[0], cols * stack.pixel_spacing[1])
    centre = stack.positions.mean(axis=0) + stack.row_dir * (cols - 1) / 2 * stack.pixel_spacing[1]
    centre = centre + stack.col_dir * (rows - 1) / 2 * stack.pixel_spacing[0]
    image_type = ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"]
    ds = Dataset(dict(base._dict))
    for keyword in ("RescaleIntercept", "RescaleSlope", "RescaleType", "WindowCenter", "WindowWidth", "KVP", "ConvolutionKernel"):
        del ds[keyword]  # these live in the functional groups of the enhanced IOD
    ds.file_meta = make_file_meta(ENHANCED_CT_IMAGE_STORAGE, sop_uid, ts)
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
            _item(
                DimensionOrganizationUID=dim_uid,
                DimensionIndexPointer=0x00209056,
                FunctionalGroupPointer=0x00209111,
                DimensionDescriptionLabel="Stack ID",
            ),
            _item(
                DimensionOrganizationUID=dim_uid,
                DimensionIndexPointer=0x00209057,
                FunctionalGroupPointer=0x00209111,
                DimensionDescriptionLabel="In-Stack Position Number",
            ),
        ]
    )
    ds.SharedFunctionalGroupsSequence = _seq(
        PixelMeasuresSequence=_seq(
            PixelSpacing=fmt_ds_list(stack.pixel_spacing),
            SliceThickness=fmt_ds(stack.thickness or 0.0),
            SpacingBetweenSlices=fmt_ds(stack.spacing_between or 0.0),
        ),
        PlaneOrientationSequence=_seq(ImageOrientationPatient=fmt_ds_list(np.concatenate([stack.row_dir, stack.col_dir]))),
        PixelValueTransformationSequence=_seq(RescaleIntercept=fmt_ds(intercept), RescaleSlope="1", RescaleType="HU"),
        FrameVOILUTSequence=_seq(WindowCenter=["-600", "40"], WindowWidth=["1500", "400"]),
        FrameAnatomySequence=_seq(
            FrameLaterality="U",
            AnatomicRegionSequence=_seq(CodeValue="51185008", CodingSchemeDesignator="SCT", CodeMeaning="Chest"),
        ),
        IrradiationEventIdentificationSequence=_seq(IrradiationEventUID=make_uid(seed, stack.series_uid, "irradiation")),
        CTImageFrameTypeSequence=_seq(
            FrameType=image_type,
            PixelPresentation="MONOCHROME",
            VolumetricProperties="VOLUME",
            VolumeBasedCalculationTechnique="NONE",
        ),
        CTAcquisitionTypeSequence=_seq(AcquisitionType="SPIRAL", ConstantVolumeFlag="NO", FluoroscopyFlag="NO"),
        CTAcquisitionDetailsSequence=_seq(
            DataCollectionDiameter=fov,
            GantryDetectorTilt=0.0,
            TotalCollimationWidth=40.0,
            SingleCollimationWidth=0.625,
            TableHeight=150.0,
            RotationDirection="CW",
            RevolutionTime=0.5,
        ),
        CTTableDynamicsSequence=_seq(TableSpeed=80.0, TableFeedPerRotation=40.0, SpiralPitchFactor=1.0),
        CTGeometrySequence=_seq(DistanceSourceToDetector=1040.0, DistanceSourceToDataCollectionCenter=570.0),
        CTReconstructionSequence=_seq(
            ReconstructionAlgorithm="FILTER_BACK_PROJ",
            ConvolutionKernel=base.ConvolutionKernel,
            ConvolutionKernelGroup="LUNG",
            ReconstructionDiameter=fov,
            ReconstructionPixelSpacing=stack.pixel_spacing,
            ReconstructionAngle=0.0,
            ImageFilter="NONE",
        ),
        CTExposureSequence=_seq(
            ExposureTimeInms=500.0, XRayTubeCurrentInmA=200.0, ExposureInmAs=100.0, ExposureModulationType="NONE"
        ),
        CTXRayDetailsSequence=_seq(KVP=base.KVP, FocalSpots=[1.2], FilterType="BODY", FilterMaterial=["ALUMINUM"]),
    )
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(
        [
            _item(
                PlanePositionSequence=_seq(ImagePositionPatient=fmt_ds_list(stack.positions[k])),
                FrameContentSequence=_seq(
                    FrameAcquisitionNumber=1,
                    FrameReferenceDateTime=when,
                    FrameAcquisitionDateTime=when,
                    FrameAcquisitionDuration=500.0,
                    StackID="1",
                    InStackPositionNumber=k + 1,
                    DimensionIndexValues=[1, k + 1],
                ),
                CTPositionSequence=_seq(
                    TablePosition=-stack.positions[k][2],
                    ReconstructionTargetCenterPatient=centre,
                    DataCollectionCenterPatient=centre,
                ),
            )
            for k in range(n)
        ]
    )
    set_pixels(ds, to_stored(stack.hu, unsigned), ts)
    return save_dataset(path, ds)
