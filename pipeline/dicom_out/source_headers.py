"""Source headers made fit for the results written from them (in memory, never on disk), each repair logged.

:func:`repair_headers` generates a missing StudyInstanceUID or FrameOfReferenceUID, writes the missing type 2
patient and study attributes (:data:`TYPE2_KEYWORDS`) empty, names the default character repertoire where a header
leaves it implicit, and empties (or, where optional, removes) the patient and study values the results cannot
repeat (:func:`valid_value`), naming the attribute, never the value. :func:`clear_attributes` empties or removes
attributes by keyword (e.g. the patient identifiers). :func:`limit_to_filing` takes out of a result what it would
repeat of its source beyond what files it with the patient's study (:data:`PATIENT_STUDY_KEYWORDS`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..errors import SourceMismatchError
from ..volume import CTVolume
from .uids import stable_uid

log = logging.getLogger(__name__)

#: the source's patient and study attributes the results repeat: what a PACS files a result with the patient's study
#: by (the Patient and General Study modules' type 1 and 2 attributes), the issuers that qualify those identifiers, and
#: a de-identified source's statement that it is; nothing else of the patient, the visit or the study
PATIENT_STUDY_KEYWORDS = (
    "PatientName",
    "PatientID",
    "IssuerOfPatientID",
    "IssuerOfPatientIDQualifiersSequence",
    "PatientBirthDate",
    "PatientSex",
    "PatientIdentityRemoved",
    "DeidentificationMethod",
    "DeidentificationMethodCodeSequence",
    "StudyInstanceUID",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
    "StudyID",
    "AccessionNumber",
    "IssuerOfAccessionNumberSequence",
)
#: element groups of patient, clinical trial, visit and request attributes: a result holds none of them beyond
#: :data:`PATIENT_STUDY_KEYWORDS`
PATIENT_GROUPS = (0x0010, 0x0012, 0x0032, 0x0038)
#: study and staff attributes of other groups that a result never repeats from its source (they say more of the patient
#: or name people, and filing needs none of them)
NOT_REPEATED = (
    "StudyDescription",
    "ProcedureCodeSequence",
    "ReasonForPerformedProcedureCodeSequence",
    "ReferencedStudySequence",
    "ReferencedPatientSequence",
    "ReferringPhysicianAddress",
    "ReferringPhysicianTelephoneNumbers",
    "ReferringPhysicianIdentificationSequence",
    "ConsultingPhysicianName",
    "ConsultingPhysicianIdentificationSequence",
    "PhysiciansOfRecord",
    "PhysiciansOfRecordIdentificationSequence",
    "NameOfPhysiciansReadingStudy",
    "PhysiciansReadingStudyIdentificationSequence",
    "AdmittingDiagnosesDescription",
    "AdmittingDiagnosesCodeSequence",
    "PerformingPhysicianName",
    "PerformingPhysicianIdentificationSequence",
    "OperatorsName",
    "OperatorIdentificationSequence",
    "RequestAttributesSequence",
)
#: the site and the device of the source's acquisition: a result names its source's equipment (Contributing Equipment)
#: by manufacturer, model and software versions only
EQUIPMENT_SITE = (
    "InstitutionName",
    "InstitutionAddress",
    "InstitutionCodeSequence",
    "InstitutionalDepartmentName",
    "InstitutionalDepartmentTypeCodeSequence",
    "StationName",
    "DeviceSerialNumber",
    "DeviceUID",
)
#: type 2 attributes (present, possibly empty) that the results need from the source
TYPE2_KEYWORDS = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
    "StudyID",
    "AccessionNumber",
)


def uid_text(value: Any) -> str:
    """A header's UID value as text, stripped; empty when it is missing or empty."""
    return str(value).strip() if value not in (None, "") else ""


def repair_headers(datasets: list[Any], volume: CTVolume, where: str) -> tuple[str, ...]:
    """Fill what the results need and the source lacks, in every header; returns the repaired attribute names."""
    first = datasets[0]
    seed = [uid_text(first.get("SeriesInstanceUID")) or where]
    repaired: list[str] = []
    for keyword, label in (("StudyInstanceUID", "study"), ("FrameOfReferenceUID", "frame of reference")):
        values = {uid_text(ds.get(keyword)) for ds in datasets}
        if values == {""}:
            uid = uid_text(volume.metadata.get(keyword)) or stable_uid(*seed, keyword)
            for ds in datasets:
                setattr(ds, keyword, uid)
            repaired.append(keyword)
            log.warning(
                "%s: the source has no %s; the results use %s (the %s cannot be matched to other objects)",
                where,
                keyword,
                uid,
                label,
            )
        elif len(values) > 1:
            raise SourceMismatchError(
                f"the source images disagree in {keyword}: {sorted(values)}", where=where, fix="pass the files of one series"
            )
    for ds in datasets:
        charset = ds.get("SpecificCharacterSet")
        if charset is not None and not isinstance(charset, str) and len(charset) > 1 and not charset[0]:
            # an empty first value is the default repertoire with code extensions (PS3.3 C.12.1.1.2), as Japanese
            # archives write it ("\ISO 2022 IR 87"); named, so that the results' writers accept it
            ds.SpecificCharacterSet = ["ISO 2022 IR 6", *charset[1:]]
    empty = [kw for kw in TYPE2_KEYWORDS if kw not in first]
    for ds in datasets:
        for kw in empty:
            setattr(ds, kw, "")
    if empty:
        repaired += empty
        log.warning("%s: the source has no %s; written empty in the results", where, ", ".join(empty))
    invalid = sorted({kw for ds in datasets for kw in PATIENT_STUDY_KEYWORDS if kw in ds and not valid_value(ds[kw])})
    clear_attributes(datasets, invalid)
    if invalid:
        repaired += invalid
        # the values themselves are not logged: most of them identify the patient
        log.warning(
            "%s: the source's %s %s not valid DICOM; written empty in the results (or left out where optional)",
            where,
            ", ".join(invalid),
            "is" if len(invalid) == 1 else "are",
        )
    return tuple(repaired)


def clear_attributes(datasets: Iterable[Any], keywords: Iterable[str]) -> None:
    """``keywords`` emptied in every header: written empty where the results must carry them (type 2), else left
    out."""
    for ds in datasets:
        for kw in keywords:
            if kw in TYPE2_KEYWORDS:
                setattr(ds, kw, "")
            elif kw in ds:
                delattr(ds, kw)


def limit_to_filing(dataset: Any) -> list[str]:
    """Remove from a result ``dataset`` what it repeats of its source beyond what files it with the patient's study:
    the patient, clinical trial, visit and request attributes outside :data:`PATIENT_STUDY_KEYWORDS` and those of
    :data:`NOT_REPEATED`, at its top level and in its Contributing Equipment items, and the site of the source's
    acquisition equipment (:data:`EQUIPMENT_SITE`) from those items (the result's own equipment, at its top level,
    stays). Returns the keywords removed."""
    keep = set(PATIENT_STUDY_KEYWORDS)
    top = set(NOT_REPEATED)
    contributing = top | set(EQUIPMENT_SITE)
    parts = [(dataset, top)] + [(item, contributing) for item in dataset.get("ContributingEquipmentSequence", [])]
    removed: list[str] = []
    for ds, drop in parts:
        for element in list(ds):
            keyword = element.keyword or str(element.tag)
            in_patient_group = element.tag.group in PATIENT_GROUPS and keyword not in keep
            if in_patient_group or keyword in drop:
                del ds[element.tag]
                removed.append(keyword)
    return removed


def valid_value(element: Any) -> bool:
    """Whether a copied patient or study attribute holds a value of its VR that the results can repeat: the VR's
    format and length (pydicom's validation), dates and times pydicom can parse, PatientSex M, F or O (or empty)."""
    from pydicom import config
    from pydicom.valuerep import DA, DT, TM, validate_value

    if element.VR == "SQ":
        return True
    value = element.value
    if value in (None, ""):
        return True
    values = list(value) if element.VM > 1 else [value]
    try:
        for v in values:
            validate_value(element.VR, v, config.RAISE)
            if element.VR in ("DA", "DT", "TM"):
                {"DA": DA, "DT": DT, "TM": TM}[element.VR](str(v))
    except (ValueError, TypeError):
        return False
    return element.keyword != "PatientSex" or str(value) in ("M", "F", "O")
