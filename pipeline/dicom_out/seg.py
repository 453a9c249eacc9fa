"""The case's segmentation: a binary DICOM SEG of the organ masks and the nodule masks.

One segment per organ (codes in :data:`.codes.ORGAN_SEGMENTS`) and one per reported finding that
has a nodule mask (label and tracking identifier ``Nodule <rank>``, tracking UID shared with the SR;
anatomic region the lung, or lobe, of the finding, with its laterality as a modifier: CID 7151 and CID 4 name the
Lung and the Upper and Lower lobe of lung, not a left or right one). Each segment's recommended display colour is the one ctpipe's
PNGs outline it in (:func:`~pipeline.reconstruction.organs.organ_colours`; nodules magenta, as the renderings
outline them). Segment descriptions,
algorithm identification (ctpipe and its version), pixel measures and plane orientation are built with highdicom;
the frames are encoded by :mod:`.seg_encode`.

Frames. With ``omit_empty_frames=True`` (the default, as highdicom's and dcmqi's: OHIF and 3D Slicer place each
frame by its source image and position) only the slices a segment touches are stored, so a viewer paging through a
segment's frames is not shown hundreds of blank ones (an empty segment keeps one empty frame); with ``False`` every
segment has one frame per source slice, in slice order, for viewers that map a segment's frames to the source images
by order. Either way each frame names its source image (and frame, for
a multi-frame source) and carries that image's ImagePositionPatient. A volume corrected for a gantry tilt has its
slices in the planes of its source images, shifted in-plane on a grid grown to hold them: its frames (the grid's
rows and columns) carry each slice's own position in its image's plane (LPS mm) and state the image's spatial
locations not preserved (SpatialLocationsPreserved ``NO``), so viewers place them by position, not pixel by pixel. Patient and study attributes
are copied from the source; the series, instance and frame-of-reference links point to the source
series.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import DicomOutputError
from ..ingest.lossy import LOSSY_TRANSFER_SYNTAXES, is_lossy
from ..reconstruction.organs import organ_colours
from ..volume import CTVolume, LabelMap
from . import codes as C
from .model import ReportedFinding, as_bool_mask
from .seg_encode import (
    FrameSource,
    SegmentFrames,
    element,
    instance_refs,
    pack_frames,
    per_frame_groups,
    raw_sequence,
    sequence,
    text,
    write_seg_file,
)
from .source_headers import limit_to_filing
from .sources import INPLANE_TOLERANCE, SourceSeries, check_source, frame_positions
from .uids import stable_uid

log = logging.getLogger(__name__)

#: The layout of the SEG (its segments, their codes and order, how frames are encoded): raise it with each such change
#: (the lungs' type SCT Lung with a laterality modifier instead of SCT Left lung / Right lung, and the nodules' anatomic
#: region the Lung or the Upper / Lower lobe of lung with a laterality modifier, with layout 2).
#: It goes into the SEG's instance UID, as :data:`~pipeline.dicom_out.sr.SR_LAYOUT` into the SR's.
SEG_LAYOUT = "2"
#: The fingerprint of SEG_LAYOUT (:func:`~pipeline.dicom_out.layout.seg_layout_fingerprint`: segment codes and order,
#: segmentation type, the attributes at every level; not values). A test compares it with a SEG built now: with a new
#: layout, raise SEG_LAYOUT and record the new fingerprint here.
SEG_LAYOUT_FINGERPRINT = "1fb3d354f01b2c8d"

SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.4"
SEG_SERIES_DESCRIPTION = "ctpipe segmentation"
ORGAN_LABELS = {"body": "Body", "lung_left": "Left lung", "lung_right": "Right lung", "airway": "Airway", "bone": "Bone"}
MORPHOLOGICAL_OPERATIONS = ("123104", "DCM", "Morphological Operations")
EDGE_DETECTION = ("123103", "DCM", "Edge Detection")
#: the SEG's dimensions: (index pointer, functional group pointer, label), the frames' Dimension Index Values in order
DIMENSIONS = ((0x0062000B, 0x0062000A, "Referenced Segment Number"), (0x00200032, 0x00209113, "Image Position Patient"))


def _ds(value: float) -> str:
    from pydicom.valuerep import format_number_as_ds

    return format_number_as_ds(float(value))


def _frame_sources(source: SourceSeries, volume: CTVolume) -> list[FrameSource]:
    """What each slice's frames reference and where they lie (LPS mm): the source image's own position, copied as it
    is written; for a tilt-corrected volume whose grid starts elsewhere in the image's plane, the grid's
    (:func:`.sources.frame_positions`), its spatial locations then not preserved (the frame's pixels are not the
    image's)."""
    g = volume.geometry
    planes = frame_positions(source, volume)
    near = np.linalg.norm(planes - source.positions, axis=1) <= INPLANE_TOLERANCE * min(g.spacing[:2])
    out = []
    for k in range(len(source)):
        ds = source.dataset_of(k)
        ipp = ds.get("ImagePositionPatient") if not source.multiframe else None
        if not near[k]:
            pos = tuple(_ds(v) for v in planes[k])
        elif ipp is not None and all(getattr(v, "original_string", None) for v in ipp):
            pos = tuple(str(v.original_string).strip() for v in ipp)
        else:
            pos = tuple(_ds(v) for v in source.positions[k])
        same_size = (ds.get("Rows"), ds.get("Columns")) == (g.shape[1], g.shape[2])
        out.append(
            FrameSource(
                source.sop_class_uids[k],
                source.sop_instance_uids[k],
                source.frame_of(k),
                (pos[0], pos[1], pos[2]),
                locations_preserved=bool(near[k]) and same_size,
            )
        )
    return out


def _slice_thickness(source: SourceSeries, volume: CTVolume) -> float:
    ds = source.datasets[0]
    value = ds.get("SliceThickness")
    if value in (None, "") and source.multiframe:
        shared = ds.get("SharedFunctionalGroupsSequence")
        measures = shared[0].get("PixelMeasuresSequence") if shared else None
        value = measures[0].get("SliceThickness") if measures else None
    try:
        thickness = float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        thickness = 0.0
    return thickness if thickness > 0 else float(volume.geometry.spacing[2])


def _description(
    number: int,
    label: str,
    category: Any,
    kind: Any,
    family: tuple[str, str, str],
    rgb: tuple[int, int, int],
    *,
    tracking: tuple[str, str] | None = None,
    regions: Sequence[tuple[Any, Any | None]] | None = None,
    type_modifier: Any | None = None,
) -> Any:
    """A segment's description; ``type_modifier`` (a laterality) modifies its type
    (SegmentedPropertyTypeModifierCodeSequence), each of ``regions`` is (anatomic region, its laterality or None)
    (AnatomicRegionModifierSequence)."""
    import highdicom as hd

    def coded(code: Any) -> Any:
        return hd.sr.CodedConcept(code.value, code.scheme_designator, code.meaning)

    algorithm = hd.AlgorithmIdentificationSequence(name="ctpipe", family=hd.sr.CodedConcept(*family), version=__version__)
    description = hd.seg.SegmentDescription(
        segment_number=number,
        segment_label=label,
        segmented_property_category=category,
        segmented_property_type=kind,
        algorithm_type="AUTOMATIC",
        algorithm_identification=algorithm,
        tracking_uid=tracking[1] if tracking else None,
        tracking_id=tracking[0] if tracking else None,
        anatomic_regions=[region for region, _ in regions] if regions else None,
        display_color=hd.color.CIELabColor.from_rgb(*rgb),
    )
    if type_modifier is not None:
        description.SegmentedPropertyTypeCodeSequence[0].SegmentedPropertyTypeModifierCodeSequence = [coded(type_modifier)]
    for item, (_, laterality) in zip(description.get("AnatomicRegionSequence", []), regions or []):
        if laterality is not None:
            item.AnatomicRegionModifierSequence = [coded(laterality)]
    return description


def _nodule_region(f: ReportedFinding) -> list[tuple[Any, Any | None]]:
    """The nodule's anatomic region and its laterality (CID 4, CID 244): its lobe where known, else its lung."""
    lobe = C.SEG_LOBES.get((f.side or "", f.lobe or ""))
    if lobe is not None:
        return [lobe]
    return [(C.LUNG, C.LATERALITY.get(f.side) if f.side in ("left", "right") else None)]


def _dimension(organisation_uid: str, pointer: int, group: int, label: str) -> Any:
    from pydicom.dataset import Dataset

    item = Dataset()
    item.DimensionOrganizationUID = organisation_uid
    item.DimensionIndexPointer = pointer
    item.FunctionalGroupPointer = group
    item.DimensionDescriptionLabel = label
    return item


def _values(value: Any) -> list[Any]:
    """The values of a pydicom element value: one (text, number) or several (MultiValue)."""
    return [value] if isinstance(value, (str, bytes, int, float)) else list(value)


def lossy_attributes(source: SourceSeries, volume: CTVolume) -> dict[str, Any]:
    """LossyImageCompression (0028,2110) of the SEG, with its ratio and method (0028,2112)/(0028,2114) when known.

    PS3.3 C.7.6.1.1.5: an image derived from a lossy compressed image states ``01``. The source is lossy when ingest
    recorded it (the volume's ``LossyImageCompression``, :mod:`pipeline.ingest.lossy`) or when a source header says
    so (its LossyImageCompression or a lossy transfer syntax). The ratio and method are the source's: ingest's, else
    those of the first lossy source header that states them, else the method of its transfer syntax.
    """
    md = volume.metadata
    lossy_sources = [
        ds
        for ds in source.datasets
        if is_lossy(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None), ds.get("LossyImageCompression"))
    ]
    if str(md.get("LossyImageCompression") or "").strip() != "01" and not lossy_sources:
        return {"LossyImageCompression": "00"}
    ratios = [f"{float(r):.6g}"[:16] for r in md.get("LossyImageCompressionRatio") or ()]
    methods = [str(m) for m in md.get("LossyImageCompressionMethod") or ()]
    for ds in lossy_sources:
        if not ratios and ds.get("LossyImageCompressionRatio"):
            ratios = [f"{float(r):.6g}"[:16] for r in _values(ds.LossyImageCompressionRatio)]
        if not methods and ds.get("LossyImageCompressionMethod"):
            methods = [str(m) for m in _values(ds.LossyImageCompressionMethod)]
        syntax = str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", ""))
        if not methods and syntax in LOSSY_TRANSFER_SYNTAXES:
            methods = [LOSSY_TRANSFER_SYNTAXES[syntax][1]]
    out: dict[str, Any] = {"LossyImageCompression": "01"}
    if ratios:
        out["LossyImageCompressionRatio"] = ratios
    else:
        log.warning("SEG: the lossy compressed source states no LossyImageCompressionRatio (0028,2112); none written")
    if methods:
        out["LossyImageCompressionMethod"] = methods
    return out


def _header(
    source: SourceSeries,
    volume: CTVolume,
    descriptions: list[Any],
    n_frames: int,
    *,
    series_uid: str,
    sop_uid: str,
    series_number: int,
    created: datetime.datetime | None = None,
) -> Any:
    import highdicom as hd
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import PYDICOM_IMPLEMENTATION_UID, UID, ExplicitVRLittleEndian

    first = source.datasets[0]
    g = volume.geometry
    now = created or datetime.datetime.now()
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = UID(SEG_STORAGE)
    ds.file_meta.MediaStorageSOPInstanceUID = UID(sop_uid)
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    ds.file_meta.ImplementationVersionName = "CTPIPE_" + __version__.replace(".", "")[:9]
    if "SpecificCharacterSet" in first:
        ds.SpecificCharacterSet = first.SpecificCharacterSet
    for keyword, value in source.patient_study().items():
        setattr(ds, keyword, value)
    ds.SOPClassUID = SEG_STORAGE
    ds.SOPInstanceUID = sop_uid
    ds.InstanceCreationDate = ds.ContentDate = ds.SeriesDate = now.strftime("%Y%m%d")
    ds.InstanceCreationTime = ds.ContentTime = ds.SeriesTime = now.strftime("%H%M%S")
    ds.Modality = "SEG"
    ds.SeriesInstanceUID = series_uid
    ds.SeriesNumber = series_number
    ds.SeriesDescription = SEG_SERIES_DESCRIPTION
    ds.InstanceNumber = 1
    ds.Manufacturer = "ctpipe"
    ds.ManufacturerModelName = "ctpipe"
    ds.DeviceSerialNumber = "0"
    ds.SoftwareVersions = __version__
    ds.FrameOfReferenceUID = source.frame_of_reference_uid
    ds.PositionReferenceIndicator = first.get("PositionReferenceIndicator", "")
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.ContentLabel = "CTPIPE_SEG"
    ds.ContentDescription = "ctpipe organ and nodule segmentation"
    ds.ContentCreatorName = ""
    ds.SegmentationType = "BINARY"
    ds.SegmentSequence = descriptions
    ds.SegmentsOverlap = "UNDEFINED"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.PresentationLUTShape = "IDENTITY"
    ds.NumberOfFrames = n_frames
    ds.Rows, ds.Columns = int(g.shape[1]), int(g.shape[2])
    ds.BitsAllocated = ds.BitsStored = 1
    ds.HighBit = 0
    ds.PixelRepresentation = 0
    for keyword, value in lossy_attributes(source, volume).items():
        setattr(ds, keyword, value)
    organisation = Dataset()
    # the series' frames are organised alike, whenever an instance of it was made
    organisation.DimensionOrganizationUID = stable_uid("ctpipe-seg-dimensions", series_uid)
    ds.DimensionOrganizationSequence = [organisation]
    ds.DimensionIndexSequence = [_dimension(organisation.DimensionOrganizationUID, *d) for d in DIMENSIONS]
    shared = Dataset()
    si, sj, sk = g.spacing
    shared.PixelMeasuresSequence = hd.PixelMeasuresSequence(
        pixel_spacing=(sj, si), slice_thickness=_slice_thickness(source, volume), spacing_between_slices=sk
    )
    orientation = np.concatenate([g.direction[:, 0], g.direction[:, 1]])
    shared.PlaneOrientationSequence = hd.PlaneOrientationSequence(
        coordinate_system="PATIENT", image_orientation=[float(v) for v in orientation]
    )
    ds.SharedFunctionalGroupsSequence = [shared]
    refs = instance_refs(dict.fromkeys(zip(source.sop_class_uids, source.sop_instance_uids)))
    series = sequence(0x0008114A, refs) + element(0x0020000E, "UI", text(source.series_instance_uid, uid=True))
    ds[0x00081115] = raw_sequence(0x00081115, [series])  # ReferencedSeriesSequence
    ds[0x00082112] = raw_sequence(0x00082112, refs)  # SourceImageSequence
    limit_to_filing(ds)
    return ds


def write_seg_object(
    path: str | Path,
    *,
    source: SourceSeries,
    volume: CTVolume,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None,
    findings: Sequence[ReportedFinding],
    omit_empty_frames: bool = True,
    series_number: int = 902,
    series_uid: str | None = None,
    sop_instance_uid: str | None = None,
    segment_codes: Mapping[str, tuple[Any, Any]] | None = None,
    created: datetime.datetime | None = None,
) -> Path:
    """Write the SEG of one case to ``path`` (atomically) and return it; see the module notes.

    organ_masks: organ name → bool ``[k, j, i]`` mask (or :class:`LabelMap`) on ``volume``'s grid; names outside
    :data:`.codes.ORGAN_SEGMENTS` need ``segment_codes`` (name → (category, type) codes) and are skipped without.
    findings: the reported findings; those with a nodule mask get a segment. series_uid, sop_instance_uid, created:
    the new series' and instance's UIDs (default: new ones) and creation date and time (default: now).
    """
    from pydicom.uid import generate_uid

    g = volume.geometry
    check_source(source, volume, where=str(path))
    known = {**C.ORGAN_SEGMENTS, **(segment_codes or {})}
    names = [n for n in C.ORGAN_SEGMENTS if n in (organ_masks or {})]
    names += [n for n in (organ_masks or {}) if n not in C.ORGAN_SEGMENTS and n in known]
    skipped = [n for n in (organ_masks or {}) if n not in known]
    if skipped:
        log.warning("%s: no codes for mask(s) %s; not written to the SEG (pass segment_codes to add them)", path, skipped)
    descriptions: list[Any] = []
    segments: list[SegmentFrames] = []
    all_k = list(range(g.shape[0]))

    def frames_of(present: Any, label: str) -> list[int]:
        ks = np.flatnonzero(present).tolist()
        if not ks:
            log.warning("%s: segment %r is empty", path, label)
            return [0] if omit_empty_frames else all_k
        return ks if omit_empty_frames else all_k

    colours = organ_colours(names, outline=True)  # each organ as the PNGs outline it
    for name in names:
        mask = as_bool_mask((organ_masks or {})[name], g, name)
        category, kind = known[name]
        label = ORGAN_LABELS.get(name, name)
        rgb = C.rgb255(colours[name])
        modifier = C.ORGAN_SEGMENT_LATERALITY.get(name) if name not in (segment_codes or {}) else None
        descriptions.append(
            _description(len(descriptions) + 1, label, category, kind, MORPHOLOGICAL_OPERATIONS, rgb, type_modifier=modifier)
        )
        segments.append(SegmentFrames(shape=g.shape, ks=frames_of(mask.any(axis=(1, 2)), label), full=mask))
    for f in findings:
        if f.mask is None:
            continue
        present = np.zeros(g.shape[0], dtype=bool)
        k0 = f.mask.offset_kji[0]
        present[k0 : k0 + f.mask.mask.shape[0]] = f.mask.mask.any(axis=(1, 2))
        descriptions.append(
            _description(
                len(descriptions) + 1,
                f.tracking_id,
                C.MORPHOLOGICALLY_ABNORMAL_STRUCTURE,
                C.NODULE,
                EDGE_DETECTION,
                C.ORGAN_COLOURS["nodule"],
                tracking=(f.tracking_id, f.tracking_uid),
                regions=_nodule_region(f),
            )
        )
        segments.append(
            SegmentFrames(shape=g.shape, ks=frames_of(present, f.tracking_id), crop=f.mask.mask, offset_kji=f.mask.offset_kji)
        )
    if not segments:
        raise DicomOutputError(
            "nothing to segment: no organ mask with a code and no nodule mask",
            where=str(path),
            fix="pass the reconstruction's organ masks or the nodule segmentations",
        )
    frames = [(s + 1, k) for s, seg in enumerate(segments) for k in seg.ks]
    sop_uid = sop_instance_uid or generate_uid()
    head = _header(
        source,
        volume,
        descriptions,
        len(frames),
        series_uid=series_uid or generate_uid(),
        sop_uid=sop_uid,
        series_number=series_number,
        created=created,
    )
    out = write_seg_file(Path(path), head, per_frame_groups(frames, _frame_sources(source, volume)), pack_frames(segments))
    log.info("SEG %s: %d segments, %d frames", out, len(segments), len(frames))
    return out
