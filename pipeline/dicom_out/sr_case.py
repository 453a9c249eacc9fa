"""The SR's TID 1501 case group (:func:`.sr.build_sr`): Nodule Present/Absent, the lung volumes and emphysema index
where the quality report does not mark them unreliable, and the quality assessment as coded evaluations (lung
coverage, contrast phase, a Quality Finding per flag that is a deficiency of the images, the informational flags
under a concept that fits).

Volumes in mL, the emphysema index in %, each to the decimals of :data:`LUNG_MEASUREMENTS`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DicomOutputError
from . import codes as C
from .model import ReportedFinding
from .sources import SourceSeries
from .uids import stable_uid

log = logging.getLogger(__name__)


#: case measurements of the reconstruction's ``lungs`` section → (laterality, concept, unit, decimals stated: volumes
#: to 0.1 mL, the emphysema index to 0.1 %); in a one-lung case (``lungs_total_covers`` one side, or the quality flag
#: ``one_lung``) the lungs' totals are the remaining lung's figures: they are stated once, on its side, in place of
#: that lung's own (:func:`_lung_sides`)
LUNG_MEASUREMENTS: dict[str, tuple[str, Any, Any, int]] = {
    "lung_left_volume_ml": ("left", C.VOLUME, C.ML, 1),
    "lung_right_volume_ml": ("right", C.VOLUME, C.ML, 1),
    "lungs_total_volume_ml": ("both", C.VOLUME, C.ML, 1),
    "lung_left_emphysema_index_pct": ("left", C.EMPHYSEMA_INDEX, C.PERCENT, 1),
    "lung_right_emphysema_index_pct": ("right", C.EMPHYSEMA_INDEX, C.PERCENT, 1),
    "emphysema_index_pct": ("both", C.EMPHYSEMA_INDEX, C.PERCENT, 1),
}


def _quality_parts(quality: Any) -> tuple[str | None, str | None, list[tuple[str, str | None, bool]], set[str]]:
    """(lung coverage, contrast phase, (flag code, its side or None, whether the field of view cuts that side off),
    unreliable measurement names) of a QualityReport or its JSON."""
    if quality is None:
        return None, None, [], set()
    get = quality.get if isinstance(quality, Mapping) else lambda k, d=None: getattr(quality, k, d)
    flags = [
        (f["code"], f.get("side"), bool(f.get("beyond_field_of_view")))
        if isinstance(f, Mapping)
        else (f.code, getattr(f, "side", None), bool(getattr(f, "beyond_view", False)))
        for f in (get("flags", ()) or ())
    ]
    return get("lung_coverage"), get("contrast_phase"), flags, set(get("unreliable", ()) or ())


def _lung_sides(lungs: Mapping[str, Any], missing: str | None, unreliable: set[str]) -> dict[str, str | None]:
    """Per name of :data:`LUNG_MEASUREMENTS`, the laterality it is stated with in the SR, or None where it is not.

    The lungs' totals cover both lungs, or with one lung (``lungs_total_covers`` ``left`` or ``right``; in
    measurements written before it was recorded, the side the quality flag ``one_lung`` leaves, ``missing`` being the
    side without lung) the remaining lung alone: then they are that lung's own figures, stated once, on its side, and
    its own are left out where the total of the same concept is stated (not None nor ``unreliable``).
    """
    covers = lungs.get("lungs_total_covers")
    if covers not in ("both", "left", "right"):
        covers = {"left": "right", "right": "left"}.get(str(missing), "both")
    sides: dict[str, str | None] = {name: side for name, (side, *_) in LUNG_MEASUREMENTS.items()}
    if covers == "both":
        return sides
    for total, (side, concept, *_) in LUNG_MEASUREMENTS.items():
        if side != "both":
            continue
        sides[total] = covers
        if lungs.get(total) is not None and total not in unreliable:
            for own, (own_side, own_concept, *_) in LUNG_MEASUREMENTS.items():
                if own_side == covers and own_concept == concept:
                    sides[own] = None
    return sides


def _flag_evaluation(code: str, side: str | None, sentence: str, *, phase: str | None, beyond_view: bool = False) -> Any:
    """The case group's item stating quality flag ``code`` (``side``: one_lung's side without lung; ``beyond_view``:
    the field of view cuts that side off), or None where another item states it already (the contrast phase flags:
    the contrast phase item, the SR's ``phase``).

    A deficiency of the images is a Quality Finding (DCM 111052): a lung end cut by the scan range is Anatomy coverage
    incomplete (DCM 130576) with the finding site Lung, Apical or Basal, the field of view cutting the body off
    (fov_cuts_body) Poor FOV selection (DCM 130577), and so is a lung the field of view cuts off
    (one_lung with ``beyond_view``): the finding site Lung with the side's laterality, for the images do not show
    whether the patient has that lung; the others are ctpipe's code of the flag, its sentence as meaning. The
    informational flags are no Quality Finding: one_lung with the body whole on that side is "Left lung: Absent" or
    "Right lung: Absent" (CID 240), airway_not_in_scan "Airway coverage: Absent".
    """
    import highdicom as hd

    if code in ("contrast_arterial", "contrast_venous") and code == f"contrast_{phase}":
        return None
    if code == "one_lung" and side in C.ABSENT_LUNGS and beyond_view:
        evaluation = hd.sr.QualitativeEvaluation(C.QUALITY_FINDING, C.ANATOMY_COVERAGE_INCOMPLETE)
        site = hd.sr.FindingSite(anatomic_location=C.LUNG, laterality=C.LATERALITY[side])
        evaluation[0].ContentSequence = hd.sr.ContentSequence([site])
        return evaluation
    if code == "one_lung" and side in C.ABSENT_LUNGS:
        return hd.sr.QualitativeEvaluation(C.ABSENT_LUNGS[side], C.ABSENT)
    if code == "airway_not_in_scan":
        return hd.sr.QualitativeEvaluation(C.AIRWAY_COVERAGE, C.COVERAGES["absent"])
    if code in C.CUT_LUNG_ENDS:
        evaluation = hd.sr.QualitativeEvaluation(C.QUALITY_FINDING, C.ANATOMY_COVERAGE_INCOMPLETE)
        site = hd.sr.FindingSite(anatomic_location=C.LUNG, topographical_modifier=C.CUT_LUNG_ENDS[code])
        evaluation[0].ContentSequence = hd.sr.ContentSequence([site])
        return evaluation
    if code in C.STANDARD_QUALITY_FINDINGS:
        return hd.sr.QualitativeEvaluation(C.QUALITY_FINDING, C.STANDARD_QUALITY_FINDINGS[code])
    return hd.sr.QualitativeEvaluation(C.QUALITY_FINDING, C.quality_flag_code(code, sentence, side=side))


def case_group(
    findings: Sequence[ReportedFinding],
    measurements: Mapping[str, Any] | None,
    quality: Any,
    source: SourceSeries,
    algorithm: Any,
    nodules_assessed: bool = True,
) -> Any:
    import highdicom as hd

    from ..reconstruction.quality import FLAGS, flag_sentence

    coverage, phase, flags, unreliable = _quality_parts(quality)
    lungs = (measurements or {}).get("lungs") or {}
    missing = next((flag_side for code, flag_side, _ in flags if code == "one_lung"), None)
    sides = _lung_sides(lungs, missing, unreliable)
    items = []
    for name in LUNG_MEASUREMENTS:
        _, concept, unit, decimals = LUNG_MEASUREMENTS[name]
        value, side = lungs.get(name), sides.get(name)
        if value is None or side is None:
            continue
        if name in unreliable:
            log.info("%s not reported in the SR: the quality report marks it unreliable", name)
            continue
        site = hd.sr.FindingSite(anatomic_location=C.LUNG, laterality=C.LATERALITY[side])
        stated = round(float(value), decimals)
        items.append(hd.sr.Measurement(name=concept, value=stated, unit=unit, finding_sites=[site]))
    evaluations = []
    if nodules_assessed:
        evaluations.append(hd.sr.QualitativeEvaluation(C.NODULE, C.PRESENT if findings else C.ABSENT))
    if coverage in C.COVERAGES:
        evaluations.append(hd.sr.QualitativeEvaluation(C.LUNG_COVERAGE, C.COVERAGES[coverage]))
    if phase in C.PHASES:
        evaluations.append(hd.sr.QualitativeEvaluation(C.CONTRAST_PHASE, C.PHASES[phase]))
    for code, flag_side, beyond_view in flags:
        if code not in FLAGS:
            raise DicomOutputError(
                f"unknown quality flag {code!r}",
                where="quality",
                fix=f"flags come from pipeline.reconstruction.quality.FLAGS: {sorted(FLAGS)}",
            )
        stated_phase = phase if phase in C.PHASES else None
        sentence = flag_sentence(code, flag_side, beyond_view=beyond_view)
        evaluation = _flag_evaluation(code, flag_side, sentence, phase=stated_phase, beyond_view=beyond_view)
        if evaluation is not None:
            evaluations.append(evaluation)
    uid = stable_uid("ctpipe-case", source.series_instance_uid)
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(uid=uid, identifier="Case"),
        algorithm_id=algorithm,
        measurements=items or None,
        qualitative_evaluations=evaluations or None,
    )
