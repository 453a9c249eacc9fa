"""The case's structured report: a Comprehensive 3D SR with a TID 1500 Measurement Report (highdicom).

Content (codes in :mod:`.codes`; coordinates are DICOM patient coordinates, LPS mm, in the source
series' frame of reference):

* observation context: the device observer ctpipe (name ``ctpipe <version>``, model name and
  version of the detector), UID derived from those;
* one TID 1411 volumetric group per reported finding (:func:`.model.reported_findings`): tracking
  identifier ``Nodule <rank>`` and UID (the same as the SEG segment's), finding type Nodule, finding
  site (lung or lobe, with laterality when known), a SCOORD3D ELLIPSOID centred on the finding (axes
  along LPS x, y, z, longest first; around the nodule's segmentation when it was segmented, else the
  detector's box; a POINT when the box has no extent) referencing the source image
  nearest the centre (for a volume corrected for a gantry tilt, the image in whose plane that slice lies: the
  coordinates stay LPS, unaffected by the slice's in-plane shift), and the measurements Volume-equivalent sphere diameter (mm; ctpipe's code: no standard one names it), Maximum
  3D extent (mm, ctpipe's code), Long axis and Short axis (mm, on the slice where the segmented nodule is largest: that
  image referenced), their mean (Mean diameter in image plane, mm, ctpipe's
  code; all three in the plane of that image, as acquired: an oblique acquisition's axes are not those of a true
  axial plane) and Volume (mm³) when the
  nodule was segmented (never a detector box's size stated as a measurement: the ellipsoid then shows the box),
  Certainty of Finding (the detector score, unit 1) and the composition when known (positions to 0.01 mm, diameters and
  long axes to 0.1 mm, volumes to 1 mm³, the score to 0.001: :data:`.model.MM_DECIMALS`, :data:`.model.LENGTH_DECIMALS`);
  every group carries the algorithm identification (detector name, version, parameters
  ``score_threshold=<operating point>`` and ``ctpipe=<version>``);
* after each segmented nodule's group, its Long axis and Short axis drawn on the image they are measured on, as a
  reader's own measurement is and a viewer shows it (OHIF's SR viewport reads a TID 1410 group's SCOORD): one TID
  1410 Planar ROI group per axis, with the nodule's tracking identifier and UID, finding type and site, an SCOORD
  POLYLINE of the axis' two endpoints in that image's pixel coordinates (column, row, from its own position,
  orientation and pixel spacing: :mod:`.image_plane`; a multi-frame image's frame referenced) and the axis' length
  (mm, to 0.1);
* one TID 1501 case group: Nodule Present/Absent (the explicit no-findings statement; no statement in
  a report of a reconstruction that no detector ran on, whose algorithm is then the reconstruction and
  names no operating point), lung volumes (ml to 0.1, per side and both) and the emphysema index (% to 0.1) where the quality report does not mark them
  unreliable, and the quality assessment as coded evaluations: lung coverage, contrast phase, one "Quality Finding"
  (DCM 111052, a deficiency of the images) per flag that is one (a lung end cut by the scan range: DCM 130576
  "Anatomy coverage incomplete" with the finding site Lung, Apical or Basal), and the informational flags once each
  under a concept that fits (the contrast phase flags: the contrast phase item alone; one_lung: "Left lung: Absent" or
  "Right lung: Absent", or, where the field of view cuts that side off, Anatomy coverage incomplete at the Lung with
  that laterality; airway_not_in_scan: "Airway coverage: Absent").
"""

from __future__ import annotations

import datetime
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..atomic import atomic_open
from ..errors import DicomOutputError
from . import codes as C
from .image_plane import image_coordinates, image_geometry
from .model import LENGTH_DECIMALS, ReportedFinding
from .source_headers import limit_to_filing
from .sources import SourceSeries
from .sr_case import case_group
from .uids import stable_uid

log = logging.getLogger(__name__)

#: highdicom's warning about a person name of one component, which quotes the name
PERSON_NAME_WARNING = r"The string .* is unlikely to represent the intended person name"

SR_SERIES_DESCRIPTION = "ctpipe nodule report"
#: The layout of the SR's content tree: raise it with each change of which groups, items, codes or coordinates the SR
#: holds (the nodules' axis polylines, TID 1410, came with layout 2; the mean diameter in standard codes, SCT Diameter
#: with derivation Mean instead of 99CTPIPE mean_diameter, with layout 3; the contrast phase named 99CTPIPE
#: contrast_phase again instead of DCM 109058, a cardiac catheterization phase, and Absent SCT 272519000 of CID 240
#: instead of SCT 2667000, and the detector score DCM 111012 Certainty of Finding instead of DCM 122157 Probability,
#: with layout 4; the quality flags that are no deficiency of the images stated otherwise than as Quality Findings, the
#: contrast phase flags by the contrast phase item alone, and a lung end cut by the scan range as DCM 130576 Anatomy
#: coverage incomplete at the Lung, Apical or Basal, with layout 5; one_lung where the field of view cuts that side off
#: as Anatomy coverage incomplete at the Lung with that laterality, not Absent, with layout 6; the lung and airway
#: coverage values SCT Complete, Partial and Absent and the compositions SCT Solid and DCM Ground glass opacity instead
#: of ctpipe's codes, with layout 7; fov_cuts_body as the Quality Finding DCM 130577 Poor FOV selection, with layout 8).
#: It goes into the SR's instance UID
#: (:func:`~pipeline.dicom_out.api.write_dicom_outputs`): two builds that lay the same results out otherwise never
#: write two documents under one SOP Instance UID, even with the same version string and creation time.
SR_LAYOUT = "8"
#: The fingerprint of SR_LAYOUT's content tree (:func:`~pipeline.dicom_out.layout.sr_layout_fingerprint`: concept
#: names, value and relationship types, templates, graphic types and nesting; not values). A test compares it with an
#: SR built now: with a new layout, raise SR_LAYOUT and record the new fingerprint here.
SR_LAYOUT_FINGERPRINT = "1c0d390984396442"


def device_uid(model_name: str, model_version: str) -> str:
    """The device observer UID of ctpipe running model ``model_name`` ``model_version`` (deterministic)."""
    return stable_uid("ctpipe-device", __version__, model_name, model_version)


def algorithm_parameters(score_threshold: float | None) -> list[str]:
    """The TID 4019 algorithm parameters every group carries: the operating point (when a detector ran) and ctpipe's
    version."""
    threshold = [] if score_threshold is None else [f"score_threshold={score_threshold:.6g}"]
    return [*threshold, f"ctpipe={__version__}"]


def _finding_site(f: ReportedFinding) -> Any:
    import highdicom as hd

    location = C.LOBES.get((f.side or "", f.lobe or ""), C.LUNG)
    laterality = C.LATERALITY.get(f.side) if f.side else None
    return hd.sr.FindingSite(anatomic_location=location, laterality=laterality)


def _surface(f: ReportedFinding, source: SourceSeries) -> Any:
    import highdicom as hd

    k = f.slice_k
    frame = source.frame_of(k)
    frames = [frame] if frame is not None else None
    image = hd.sr.SourceImageForSegmentation(
        source.sop_class_uids[k], source.sop_instance_uids[k], referenced_frame_numbers=frames
    )
    c = np.asarray(f.center_lps, dtype=np.float64)
    half = np.asarray(f.half_axes_mm, dtype=np.float64)
    if half.min() <= 0:
        graphic_type, data = hd.sr.GraphicTypeValues3D.POINT, c[None, :]
    else:
        points = []
        for axis in np.argsort(-half, kind="stable"):
            step = np.zeros(3)
            step[axis] = half[axis]
            points += [c - step, c + step]
        graphic_type, data = hd.sr.GraphicTypeValues3D.ELLIPSOID, np.array(points)
    return hd.sr.VolumeSurface(
        graphic_type=graphic_type, graphic_data=data, frame_of_reference_uid=source.frame_of_reference_uid, source_images=[image]
    )


def _axis_measurements(f: ReportedFinding, source: SourceSeries) -> list[Any]:
    """Long axis and Short axis (each referencing the image it is measured on) and their mean (Diameter, derivation
    Mean: the guidelines' "mean diameter"), to
    :data:`.model.LENGTH_DECIMALS` (mm); none without :attr:`ReportedFinding.axes`. TID 1411 holds no coordinates in
    a measurement: :func:`_axis_lines` draws the axes on their image, the reconstruction's nodule results give their
    endpoints (LPS mm)."""
    import highdicom as hd

    axes = f.axes
    if axes is None:
        return []
    k = axes.slice_k
    frame = source.frame_of(k)
    image = hd.sr.SourceImageForMeasurement(
        source.sop_class_uids[k], source.sop_instance_uids[k], referenced_frame_numbers=[frame] if frame is not None else None
    )
    out = []
    for name, length in ((C.LONG_AXIS, axes.long_mm), (C.SHORT_AXIS, axes.short_mm)):
        value = round(length, LENGTH_DECIMALS)
        out.append(hd.sr.Measurement(name=name, value=value, unit=C.MM, referenced_images=[image]))
    mean = round(axes.mean_mm, LENGTH_DECIMALS)
    out.append(hd.sr.Measurement(name=C.DIAMETER, value=mean, unit=C.MM, derivation=C.MEAN))
    return out


def _axis_lines(f: ReportedFinding, source: SourceSeries, algorithm: Any) -> list[Any]:
    """The nodule's Long axis and Short axis drawn on the image they are measured on, as a reader's own measurement:
    one TID 1410 Planar ROI group each, with the nodule's tracking identifier and UID, finding type and site, an
    SCOORD POLYLINE of the axis' two endpoints in that image's pixel coordinates (column, row; :mod:`.image_plane`)
    and the axis' length (mm, to :data:`.model.LENGTH_DECIMALS`). None without :attr:`ReportedFinding.axes`; an axis
    whose endpoints fall outside the image is left out, with a warning."""
    import highdicom as hd

    axes = f.axes
    if axes is None:
        return []
    k = axes.slice_k
    plane = image_geometry(source, k)
    frame = source.frame_of(k)
    columns, rows = plane.size_ijk[0], plane.size_ijk[1]
    groups = []
    for name, length, ends in ((C.LONG_AXIS, axes.long_mm, axes.long_lps), (C.SHORT_AXIS, axes.short_mm, axes.short_lps)):
        coordinates = image_coordinates(plane, ends)
        if np.any(coordinates < 0) or np.any(coordinates > [columns, rows]):
            log.warning(
                "%s: its %s (%s, column and row) lies outside its image (%d x %d) and is not drawn",
                f.tracking_id,
                name.meaning,
                np.round(coordinates, 1).tolist(),
                columns,
                rows,
            )
            continue
        image = hd.sr.SourceImageForRegion(
            source.sop_class_uids[k], source.sop_instance_uids[k], referenced_frame_numbers=[frame] if frame is not None else None
        )
        region = hd.sr.ImageRegion(graphic_type=hd.sr.GraphicTypeValues.POLYLINE, graphic_data=coordinates, source_image=image)
        groups.append(
            hd.sr.PlanarROIMeasurementsAndQualitativeEvaluations(
                tracking_identifier=hd.sr.TrackingIdentifier(uid=f.tracking_uid, identifier=f.tracking_id),
                referenced_region=region,
                finding_type=C.NODULE,
                algorithm_id=algorithm,
                finding_sites=[_finding_site(f)],
                measurements=[hd.sr.Measurement(name=name, value=round(length, LENGTH_DECIMALS), unit=C.MM)],
            )
        )
    return groups


def _finding_group(f: ReportedFinding, source: SourceSeries, algorithm: Any) -> Any:
    import highdicom as hd

    site = _finding_site(f)
    measurements = []
    if f.measured:  # from the nodule's segmentation; a detector box's size is not stated as a measurement
        measurements += [
            hd.sr.Measurement(name=C.EQUIVALENT_DIAMETER, value=f.diameter_mm, unit=C.MM),
            hd.sr.Measurement(name=C.MAX_EXTENT, value=f.max_extent_mm, unit=C.MM),
        ]
        measurements += _axis_measurements(f, source)
    if f.volume_mm3 is not None:
        measurements.append(hd.sr.Measurement(name=C.VOLUME, value=int(round(f.volume_mm3)), unit=C.MM3))
    measurements.append(hd.sr.Measurement(name=C.CERTAINTY_OF_FINDING, value=f.score, unit=C.NO_UNITS))
    evaluations = []
    if f.composition is not None:
        evaluations.append(hd.sr.QualitativeEvaluation(C.COMPOSITION, C.COMPOSITIONS[f.composition]))
    return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(uid=f.tracking_uid, identifier=f.tracking_id),
        referenced_volume_surface=_surface(f, source),
        finding_type=C.NODULE,
        algorithm_id=algorithm,
        finding_sites=[site],
        measurements=measurements,
        qualitative_evaluations=evaluations or None,
    )


def build_sr(
    findings: Sequence[ReportedFinding],
    source: SourceSeries,
    *,
    model_name: str,
    model_version: str,
    score_threshold: float | None,
    measurements: Mapping[str, Any] | None = None,
    quality: Any = None,
    series_number: int = 901,
    series_uid: str | None = None,
    sop_instance_uid: str | None = None,
    image_library: bool = False,
    nodules_assessed: bool = True,
    created: datetime.datetime | None = None,
) -> Any:
    """The Comprehensive 3D SR dataset (a ``highdicom.sr.Comprehensive3DSR``) of one case; see the module notes.

    findings: the reported findings (LPS mm), highest score first; empty for a no-findings report.
    measurements: the reconstruction's measurements (its ``lungs`` section is reported). quality: a
    ``QualityReport`` (or its JSON). New UIDs are made for the series and instance unless given.
    image_library: add a TID 1600 Image Library describing the referenced images (optional in TID 1500; a
    single-frame source only; about 0.2 s more for five findings).
    created: the instance's creation, content and series date and time, and highdicom's contribution date and time
    (default: now).
    nodules_assessed: False when no detector ran (a reconstruction alone): the report then makes no statement on
    nodules (neither Present nor Absent) and names no operating point; ``findings`` must be empty.
    """
    import highdicom as hd
    from pydicom.dataset import Dataset
    from pydicom.uid import generate_uid

    if not model_name or not model_version:
        raise DicomOutputError(
            f"model name {model_name!r} and version {model_version!r} must both be given",
            where="write_sr",
            fix="pass the detector's name and version",
        )
    if not nodules_assessed and findings:
        raise DicomOutputError(
            f"{len(findings)} finding(s) given with nodules_assessed=False",
            where="write_sr",
            fix="pass the findings with nodules_assessed=True, or none",
        )
    if nodules_assessed and score_threshold is None:
        raise DicomOutputError(
            "no score threshold given for the findings",
            where="write_sr",
            fix="pass the operating point the findings were reported at",
        )
    algorithm = hd.sr.AlgorithmIdentification(
        name=model_name, version=model_version, parameters=algorithm_parameters(score_threshold if nodules_assessed else None)
    )
    observer = hd.sr.ObserverContext(
        observer_type=hd.sr.CodedConcept("121007", "DCM", "Device"),
        observer_identifying_attributes=hd.sr.DeviceObserverIdentifyingAttributes(
            uid=device_uid(model_name, model_version),
            name=f"ctpipe {__version__}"[:64],
            manufacturer_name="ctpipe",
            model_name=f"{model_name} {model_version}"[:64],
        ),
    )
    groups: list[Any] = []
    for f in findings:  # each nodule's volumetric group, then its axes drawn on their image
        groups += [_finding_group(f, source, algorithm), *_axis_lines(f, source, algorithm)]
    groups.append(case_group(findings, measurements, quality, source, algorithm, nodules_assessed))
    # the images the content references: each finding's slice and the slice its axes are measured on
    referenced = sorted({f.slice_k for f in findings} | {f.axes.slice_k for f in findings if f.axes is not None})
    library = None
    if image_library and referenced and not source.multiframe:
        library = [source.datasets[k] for k in referenced]
    report = hd.sr.MeasurementReport(
        observation_context=hd.sr.ObservationContext(observer_device_context=observer),
        procedure_reported=C.CT_CHEST,
        imaging_measurements=groups,
        referenced_images=library,
    )
    # evidence: the images the content references (the first slice for a no-findings report, naming the series)
    evidence = [source.datasets[0]] if source.multiframe else [source.datasets[k] for k in referenced or [0]]
    with warnings.catch_warnings():
        # highdicom warns about a one-component person name of the source (copied as it is, as results must) and
        # quotes it: a patient's name in the console and the logs
        warnings.filterwarnings("ignore", message=PERSON_NAME_WARNING, category=UserWarning)
        sr = hd.sr.Comprehensive3DSR(
            evidence=evidence,
            content=report,
            series_instance_uid=series_uid or generate_uid(),
            series_number=series_number,
            sop_instance_uid=sop_instance_uid or generate_uid(),
            instance_number=1,
            manufacturer="ctpipe",
            is_complete=True,
            is_final=False,
            is_verified=False,
        )
    limit_to_filing(sr)  # highdicom copies the source's whole patient and study modules and its equipment's site
    sr.SeriesDescription = SR_SERIES_DESCRIPTION
    if created is not None:
        from pydicom.valuerep import DA, DT, TM

        sr.InstanceCreationDate = sr.ContentDate = DA(created.strftime("%Y%m%d"))
        sr.InstanceCreationTime = sr.ContentTime = TM(created.strftime("%H%M%S"))
        for item in sr.get("ContributingEquipmentSequence", []):  # highdicom stamps its own contribution
            if "ContributionDateTime" in item:
                item.ContributionDateTime = DT(created.strftime("%Y%m%d%H%M%S"))
    sr.SoftwareVersions = __version__
    sr.ManufacturerModelName = "ctpipe"
    # the date and time a PACS lists the series by: its content's, as the SEG's (highdicom leaves them out)
    sr.SeriesDate, sr.SeriesTime = sr.ContentDate, sr.ContentTime
    # ctpipe's private scheme is declared where the content uses one of its codes (a validator warns about the
    # designator it does not know: an SR of standard codes only, as ctpipe detect's, is then free of warnings)
    if any(e.keyword == "CodingSchemeDesignator" and e.value == C.PRIVATE_SCHEME for e in sr.iterall()):
        scheme = Dataset()
        scheme.CodingSchemeDesignator = C.PRIVATE_SCHEME
        scheme.CodingSchemeName = C.PRIVATE_SCHEME_NAME
        scheme.CodingSchemeVersion = C.PRIVATE_SCHEME_VERSION
        scheme.CodingSchemeResponsibleOrganization = C.PRIVATE_SCHEME_ORGANIZATION
        sr.CodingSchemeIdentificationSequence = [scheme]
    return sr


def save(dataset: Any, path: str | Path) -> Path:
    """Write a pydicom dataset as a DICOM Part 10 file, atomically (complete at ``path`` or absent)."""
    from pydicom import dcmwrite

    path = Path(path)
    with atomic_open(path) as fh:
        dcmwrite(fh, dataset, enforce_file_format=True)
    return path
