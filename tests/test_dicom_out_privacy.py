"""What of the source's patient, study and equipment the DICOM results repeat: what a PACS files them by, no more."""

from __future__ import annotations

from pathlib import Path

import pydicom
from pydicom.dataset import Dataset

from pipeline.dicom_out import write_dicom_outputs
from pipeline.dicom_out.source_headers import PATIENT_STUDY_KEYWORDS
from tests.test_dicom_out_sources import assert_valid, phantom_case

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)

#: what the results must repeat for a PACS to file them with the patient's study
FILING = {
    "PatientName": "Quillfeather^Zenobia",
    "PatientID": "ZQX-PRIV-77310",
    "PatientBirthDate": "19600102",
    "PatientSex": "F",
    "AccessionNumber": "ACC-5521",
    "StudyID": "ST-88",
    "ReferringPhysicianName": "Referrer^Ruth",
}
#: what they must not: more of the patient, the visit, the staff and the place
EXTRA = {
    "PatientComments": "comment-xq1",
    "AdditionalPatientHistory": "history-xq2",
    "PatientAddress": "address-xq3",
    "PatientTelephoneNumbers": "phone-xq4",
    "PatientAge": "046Y",
    "PatientWeight": "71.5",
    "EthnicGroup": "ethnic-xq5",
    "MedicalAlerts": "alert-xq6",
    "StudyDescription": "description-xq7",
    "PhysiciansOfRecord": "Record^xq8",
    "NameOfPhysiciansReadingStudy": "Reader^xq9",
    "AdmissionID": "admission-xr1",
    "InstitutionName": "institution-xr2",
    "InstitutionAddress": "institution-address-xr3",
    "InstitutionalDepartmentName": "department-xr4",
    "StationName": "station-xr5",
    "DeviceSerialNumber": "serial-xr6",
    "OperatorsName": "Operator^xr7",
    "PerformingPhysicianName": "Performer^xr8",
}
OTHER_ID = "other-id-xr9"


def _values(ds: Dataset) -> set[str]:
    """Every text value in ``ds``, nested sequences included."""
    return {str(v) for e in ds.iterall() if e.VR not in ("SQ", "OB", "OW", "UN") for v in (e.value if e.VM > 1 else [e.value])}


def test_results_repeat_only_what_files_them_with_the_study(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    for ds in case.source.datasets:
        for keyword, value in {**FILING, **EXTRA}.items():
            setattr(ds, keyword, value)
        other = Dataset()
        other.PatientID = OTHER_ID
        ds.OtherPatientIDsSequence = [other]
    paths = write_dicom_outputs(
        tmp_path / "out",
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        nodules=case.nodules,
        organ_masks=case.organ_masks,
        **MODEL,
    )
    assert sorted(paths) == ["seg", "sr"]
    for kind, path in paths.items():
        ds = pydicom.dcmread(path)
        for keyword, value in FILING.items():
            assert str(ds.get(keyword)) == value, (kind, keyword)
        leaked = sorted(k for k, v in EXTRA.items() if v in _values(ds)) + ([OTHER_ID] if OTHER_ID in _values(ds) else [])
        assert leaked == [], (kind, leaked)
        patient = [e.keyword for e in ds if e.tag.group in (0x0010, 0x0012, 0x0038)]
        assert set(patient) <= set(PATIENT_STUDY_KEYWORDS), (kind, patient)
        assert not [e.tag for e in ds.iterall() if e.tag.is_private], kind
    for path in paths.values():  # last: it skips the test where dciodvfy is missing
        assert_valid(path)
