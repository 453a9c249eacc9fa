"""Read a ctpipe structured report back: the findings table and the case-level content.

:func:`read_sr_findings` returns one row per nodule's volumetric measurement group (LPS mm; the TID 1410 groups that
draw its axes on their image, in SRs since they were added, are no rows of their own), the columns named
as in the run store's findings table (``center_x/y/z``, ``diameter_mm``, ``score``);
:func:`read_sr_case` the case group (lung volumes, emphysema index, quality assessment) and the
detector named in the algorithm identification.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DicomOutputError
from . import codes as C

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

FINDING_COLUMNS = [
    "rank",
    "tracking_id",
    "tracking_uid",
    "center_x",
    "center_y",
    "center_z",
    "box_min_x",
    "box_min_y",
    "box_min_z",
    "box_max_x",
    "box_max_y",
    "box_max_z",
    "diameter_mm",
    "max_extent_mm",
    "long_axis_mm",
    "short_axis_mm",
    "mean_diameter_mm",
    "volume_mm3",
    "score",
    "side",
    "lobe",
    "composition",
    "graphic_type",
    "frame_of_reference_uid",
    "sop_instance_uid",
    "frame_number",
    "series_uid",
]
# decimals (mm) the coordinates are given to: the SR's GraphicData is FL (float32), exact to better than 0.0005 mm
# anywhere within ±4 m of the origin, so a centre written as -21.81 reads back as -21.81, not -21.809999
COORDINATE_DECIMALS = 3
_ALGORITHM_NAME = ("111001", "DCM")
_ALGORITHM_VERSION = ("111003", "DCM")
_ALGORITHM_PARAMETERS = ("111002", "DCM")


def _key(code: Any) -> tuple[str, str]:
    return (str(code.value), str(code.scheme_designator))


def _report(path: str | os.PathLike[str], *, reader: str) -> Any:
    """The TID 1500 content of the SR at ``path``; :class:`DicomOutputError` when it is none."""
    return _read(path, reader=reader)[1]


def _sr_path(path: Any, *, reader: str) -> Path:
    """``path`` as the :class:`Path` of an existing file; :class:`DicomOutputError` for another value, a path that
    does not exist, or a folder (naming an SR in it, for the call of ``reader`` to make instead)."""
    from ..errors import require_path, unexpanded_home

    fix = "pass an SR written by ctpipe (write_sr; a run's are in open_run(...).dicom_outputs.sr)"
    where = "path" if not isinstance(path, (str, os.PathLike)) else str(path)
    sr_path = require_path(path, where=where, error=DicomOutputError, what="an SR file", fix=fix)
    if not sr_path.exists():
        raise DicomOutputError("no such file", where=sr_path, fix=unexpanded_home(sr_path) or f"check the path; {fix}")
    if sr_path.is_dir():
        found = sorted(sr_path.rglob("sr.dcm"))
        raise DicomOutputError(
            "not a readable structured report: a directory (folder), not an SR file",
            where=sr_path,
            fix=f"pass the SR file itself: {reader}({str(found[0])!r})" if found else fix,
        )
    return sr_path


def _read(path: str | os.PathLike[str], *, reader: str) -> tuple[Any, Any]:
    """The SR at ``path`` and its TID 1500 content; :class:`DicomOutputError` when it is none."""
    import highdicom as hd
    from pydicom.errors import InvalidDicomError

    path = _sr_path(path, reader=reader)
    try:
        sr = hd.sr.srread(path)
    except (ValueError, TypeError, AttributeError, OSError, RuntimeError, InvalidDicomError) as exc:
        # RuntimeError: another DICOM object (a CT image, a SEG) whose SOP class highdicom reads as no SR
        raise DicomOutputError(
            f"not a readable structured report ({type(exc).__name__}: {exc})",
            where=str(path),
            fix="pass an SR written by ctpipe (write_sr; a run's are in open_run(...).dicom_outputs.sr)",
        ) from exc
    content = getattr(sr, "content", None)
    if content is None or not hasattr(content, "get_volumetric_roi_measurement_groups"):
        raise DicomOutputError(
            "the SR holds no TID 1500 measurement report", where=str(path), fix="pass an SR written by ctpipe (write_sr)"
        )
    return sr, content


def _evidence_series(sr: Any) -> tuple[dict[str, str], str | None]:
    """The series of the images the SR refers to (its CurrentRequestedProcedureEvidenceSequence): each referenced SOP
    instance's SeriesInstanceUID, and the one series when the evidence names exactly one (None otherwise)."""
    by_instance: dict[str, str] = {}
    series: set[str] = set()
    for study in getattr(sr, "CurrentRequestedProcedureEvidenceSequence", None) or []:
        for ref in getattr(study, "ReferencedSeriesSequence", None) or []:
            uid = str(getattr(ref, "SeriesInstanceUID", "") or "")
            if not uid:
                continue
            series.add(uid)
            for item in getattr(ref, "ReferencedSOPSequence", None) or []:
                by_instance[str(item.ReferencedSOPInstanceUID)] = uid
    return by_instance, next(iter(series)) if len(series) == 1 else None


def _text(group: Any, code: tuple[str, str]) -> list[str]:
    """The TEXT values of the group's container items named ``code``."""
    items = [child for container in group for child in container.get("ContentSequence", [])]
    return [
        str(item.TextValue)
        for item in items
        if "ConceptNameCodeSequence" in item
        and (str(item.ConceptNameCodeSequence[0].CodeValue), str(item.ConceptNameCodeSequence[0].CodingSchemeDesignator)) == code
        and "TextValue" in item
    ]


def _site(group: Any) -> tuple[str | None, str | None]:
    side = lobe = None
    sides = {_key(v): k for k, v in C.LATERALITY.items()}
    lobes = {_key(v): k for k, v in C.LOBES.items()}
    for site in group.finding_sites:
        loc = _key(site.value)
        if loc in lobes:
            side, lobe = lobes[loc]
        if site.laterality is not None:
            side = sides.get(_key(site.laterality), side)
    return side, lobe


def _geometry(roi: Any) -> dict[str, Any]:
    """Centre and box bounds (LPS mm, rounded to :data:`COORDINATE_DECIMALS`) of the ROI's SCOORD3D, its graphic type,
    frame of reference and referenced source image."""
    data = np.asarray(roi.graphic_data, dtype=np.float64).reshape(-1, 3)
    center = data.mean(axis=0)
    out: dict[str, Any] = {
        "center_x": round(float(center[0]), COORDINATE_DECIMALS),
        "center_y": round(float(center[1]), COORDINATE_DECIMALS),
        "center_z": round(float(center[2]), COORDINATE_DECIMALS),
        "graphic_type": str(roi.graphic_type.value),
        "frame_of_reference_uid": str(roi.frame_of_reference_uid),
    }
    half = np.full(3, np.nan)
    if len(data) == 6:
        half = np.zeros(3)
        for a, b in data.reshape(3, 2, 3):
            v = (b - a) / 2
            half[int(np.argmax(np.abs(v)))] = float(np.linalg.norm(v))
    for axis, name in enumerate("xyz"):
        out[f"box_min_{name}"] = round(float(center[axis] - half[axis]), COORDINATE_DECIMALS)
        out[f"box_max_{name}"] = round(float(center[axis] + half[axis]), COORDINATE_DECIMALS)
    images = roi.source_images_for_segmentation if roi.has_source_images else []
    if images:
        ref = images[0]
        out["sop_instance_uid"] = str(ref.referenced_sop_instance_uid)
        frames = ref.referenced_frame_numbers
        out["frame_number"] = int(frames[0]) if frames else None
    return out


def _measurements(group: Any) -> dict[str, float]:
    names = {
        _key(C.EQUIVALENT_DIAMETER): "diameter_mm",
        _key(C.DIAMETER): "diameter_mm",  # SRs of earlier versions
        _key(C.MAX_EXTENT): "max_extent_mm",
        _key(C.LONG_AXIS): "long_axis_mm",
        _key(C.SHORT_AXIS): "short_axis_mm",
        _key(C.MEAN_DIAMETER): "mean_diameter_mm",  # SRs of earlier versions
        _key(C.VOLUME): "volume_mm3",
        _key(C.CERTAINTY_OF_FINDING): "score",
        _key(C.PROBABILITY): "score",  # SR layouts 1-3
    }
    out = {}
    for m in group.get_measurements():
        column = names.get(_key(m.name))
        if _key(m.name) == _key(C.DIAMETER) and m.derivation is not None and _key(m.derivation) == _key(C.MEAN):
            column = "mean_diameter_mm"  # Diameter without derivation: an earlier version's equivalent diameter
        if column is not None:
            out[column] = float(m.value)
    if "long_axis_mm" in out and "max_extent_mm" not in out:  # SRs of earlier versions: "Long axis" was the 3-D extent
        out["max_extent_mm"] = out.pop("long_axis_mm")
    return out


def read_sr_findings(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The nodule findings of a ctpipe SR as a table, one row per finding, by rank.

    Columns (:data:`FINDING_COLUMNS`): ``center_x/y/z`` (centre of the ellipsoid or the point, LPS mm),
    ``box_min/max_x/y/z`` (the ellipsoid's extent, NaN for a point: around the segmented nodule when it was
    segmented, else the detector's box); these coordinates are stored in the SR as single-precision floats (FL) and
    given rounded to 0.001 mm (:data:`COORDINATE_DECIMALS`), what the SR holds, so that they equal the findings'
    values to that precision (``-21.81``, not the float32 ``-21.809999``); ``diameter_mm`` (the segmented nodule's equivalent diameter, not the detector
    box's ``diameter_mm`` of ``open_run(...).findings``), ``max_extent_mm`` (its longest 3-D extent; an earlier
    version's "Long axis"), ``long_axis_mm`` and ``short_axis_mm`` (on the slice where the nodule is largest; NaN in SRs
    of earlier versions), ``mean_diameter_mm`` (their mean, Fleischner's and Lung-RADS' "mean diameter"),
    ``volume_mm3`` (all NaN when the nodule was not segmented, as in ``ctpipe detect``'s SR), ``score``, ``side``, ``lobe``, ``composition``, the referenced
    source image's ``sop_instance_uid`` (and ``frame_number`` in a multi-frame source), and the ``series_uid`` of the
    images the findings are on (from the SR's evidence: the series holding the referenced image, else the one series
    the evidence names; None when it cannot tell), so that :func:`~pipeline.show` and
    :func:`~pipeline.reconstruct` can check the table against a volume. A no-findings report gives an empty table with
    these columns.
    """
    import pandas as pd

    sr, report = _read(path, reader="read_sr_findings")
    by_instance, only_series = _evidence_series(sr)
    compositions = {_key(v): k for k, v in (*C.COMPOSITIONS_EARLIER.items(), *C.COMPOSITIONS.items())}
    rows = []
    for group in report.get_volumetric_roi_measurement_groups():
        if group.finding_type is None or _key(group.finding_type) != _key(C.NODULE) or group.roi is None:
            continue
        ident = str(group.tracking_identifier or "")
        match = re.fullmatch(r"Nodule (\d+)", ident)
        row: dict[str, Any] = {
            "rank": int(match.group(1)) if match else None,
            "tracking_id": ident,
            "tracking_uid": str(group.tracking_uid or ""),
        }
        row.update(_geometry(group.roi))
        row["series_uid"] = by_instance.get(str(row.get("sop_instance_uid")), only_series)
        row.update(_measurements(group))
        row["side"], row["lobe"] = _site(group)
        for q in group.get_qualitative_evaluations():
            if _key(q.name) == _key(C.COMPOSITION):
                row["composition"] = compositions.get(_key(q.value))
        rows.append(row)
    table = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    return table.sort_values("rank", kind="stable").reset_index(drop=True) if rows else table


def _cut_lung_ends(group: Any) -> list[str | None]:
    """Per "Anatomy coverage incomplete" Quality Finding of the group's container, in order, the quality flag it states
    (lungs_apex_cut, lungs_base_cut) by the topographical modifier of its finding site (Apical, Basal), or one_lung by
    its laterality (a lung the field of view cuts off); None for another. Read from the content items: highdicom's
    evaluations do not keep their concept modifiers."""
    ends = {_key(v): flag for flag, v in C.CUT_LUNG_ENDS.items()}
    ends.update({_key(v): "one_lung" for side, v in C.LATERALITY.items() if side in C.ABSENT_LUNGS})
    finding, incomplete = _key(C.QUALITY_FINDING), _key(C.ANATOMY_COVERAGE_INCOMPLETE)
    modifiers = {_key(C.TOPOGRAPHICAL_MODIFIER), _key(C.LATERALITY_MODIFIER)}
    out: list[str | None] = []
    for item in (child for container in group for child in container.get("ContentSequence", [])):
        name, value = item.get("ConceptNameCodeSequence"), item.get("ConceptCodeSequence")
        if not (name and value and _code_key(name[0]) == finding and _code_key(value[0]) == incomplete):
            continue
        stated = [
            ends.get(_code_key(m.ConceptCodeSequence[0]))
            for m in _nested(item)
            if m.get("ConceptNameCodeSequence")
            and "ConceptCodeSequence" in m
            and _code_key(m.ConceptNameCodeSequence[0]) in modifiers
        ]
        out.append(stated[0] if stated else None)
    return out


def _nested(item: Any) -> list[Any]:
    out = []
    for child in item.get("ContentSequence", []):
        out += [child, *_nested(child)]
    return out


def _code_key(code: Any) -> tuple[str, str]:
    """(value, scheme) of a code sequence item, its value as CodeValue or LongCodeValue."""
    return (str(code.get("CodeValue", code.get("LongCodeValue", ""))), str(code.get("CodingSchemeDesignator", "")))


def read_sr_case(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The case-level content of a ctpipe SR.

    Keys: ``model_name``, ``model_version``, ``score_threshold``, ``ctpipe_version`` (from the algorithm
    identification), ``nodules_present`` (bool), ``measurements`` (names as in the reconstruction's ``lungs``
    section → value; volumes in ml, emphysema index in %; with the quality flag ``one_lung`` the lungs' totals are the
    remaining lung's figures, stated once on its side), ``lung_coverage``, ``contrast_phase`` and ``quality_flags``
    (flag codes).
    """
    from ..reconstruction.quality import FLAGS
    from .sr_case import LUNG_MEASUREMENTS

    report = _report(path, reader="read_sr_case")
    groups = report.get_image_measurement_groups()
    case = next((g for g in groups if str(g.tracking_identifier or "") == "Case"), None)
    if case is None:
        raise DicomOutputError(
            "the SR has no case measurement group", where=str(path), fix="pass an SR written by ctpipe (write_sr)"
        )
    out: dict[str, Any] = {
        "measurements": {},
        "quality_flags": [],
        "lung_coverage": None,
        "contrast_phase": None,
        "nodules_present": None,
    }
    names = _text(case, _ALGORITHM_NAME)
    versions = _text(case, _ALGORITHM_VERSION)
    out["model_name"] = names[0] if names else None
    out["model_version"] = versions[0] if versions else None
    params = dict(p.split("=", 1) for p in _text(case, _ALGORITHM_PARAMETERS) if "=" in p)
    out["score_threshold"] = float(params["score_threshold"]) if "score_threshold" in params else None
    out["ctpipe_version"] = params.get("ctpipe")
    sides = {_key(v): k for k, v in C.LATERALITY.items()}
    by_key: dict[tuple[tuple[str, str], str | None], str] = {
        (_key(concept), side): name for name, (side, concept, _, _) in LUNG_MEASUREMENTS.items()
    }
    for m in case.get_measurements():
        side: str | None = None
        for site in m.finding_sites:
            side = sides.get(_key(site.laterality)) if site.laterality is not None else None
        measured = by_key.get((_key(m.name), side))
        if measured is not None:
            out["measurements"][measured] = float(m.value)
    coverages = {_key(v): k for k, v in (*C.COVERAGES_EARLIER.items(), *C.COVERAGES.items())}
    phases = {_key(v): k for k, v in C.PHASES.items()}
    absent_lungs = {_key(v) for v in C.ABSENT_LUNGS.values()}
    standard_findings = {_key(v): flag for flag, v in C.STANDARD_QUALITY_FINDINGS.items()}
    cut_ends = iter(_cut_lung_ends(case))
    for q in case.get_qualitative_evaluations():
        concept, value = _key(q.name), _key(q.value)
        if concept == _key(C.NODULE):
            absent = value in (_key(C.ABSENT), _key(C.ABSENT_EARLIER))  # the latter: SR layouts 1-3
            out["nodules_present"] = True if value == _key(C.PRESENT) else False if absent else None
        elif concept == _key(C.LUNG_COVERAGE):
            out["lung_coverage"] = coverages.get(value)
        elif concept in (_key(C.CONTRAST_PHASE), _key(C.CONTRAST_PHASE_CATHETERIZATION)):  # the latter: SR layout 3
            out["contrast_phase"] = phases.get(value)
        elif concept == _key(C.QUALITY_FINDING) and value == _key(C.ANATOMY_COVERAGE_INCOMPLETE):
            cut = next(cut_ends, None)
            if cut is not None:
                out["quality_flags"].append(cut)
        elif concept == _key(C.QUALITY_FINDING) and value in standard_findings:
            out["quality_flags"].append(standard_findings[value])
        elif concept == _key(C.QUALITY_FINDING) and value[1] == C.PRIVATE_SCHEME:  # and every flag in layouts 1-4
            out["quality_flags"].append(C.quality_flag_of(value[0]))
        elif concept in absent_lungs and value == _key(C.ABSENT):
            out["quality_flags"].append("one_lung")
        elif concept == _key(C.AIRWAY_COVERAGE) and coverages.get(value) == "absent":
            out["quality_flags"].append("airway_not_in_scan")
    phase_flag = f"contrast_{out['contrast_phase']}"
    if phase_flag in FLAGS and phase_flag not in out["quality_flags"]:  # stated once, by the contrast phase (layout 5)
        flags = out["quality_flags"]
        at = flags.index("airway_not_in_scan") if "airway_not_in_scan" in flags else len(flags)
        flags.insert(at, phase_flag)  # where the quality report lists it
    if "one_lung" in out["quality_flags"]:  # the lungs' totals, stated once on the remaining lung's side, are its figures
        stated = out["measurements"]
        for total, (side, concept, _, _) in LUNG_MEASUREMENTS.items():
            own = [n for n, (s, c, _, _) in LUNG_MEASUREMENTS.items() if s != "both" and c == concept and n in stated]
            if side == "both" and total not in stated and len(own) == 1:
                stated[total] = stated[own[0]]
    return out
