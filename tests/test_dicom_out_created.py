"""The SR and the SEG state when they were made (now, or the time given), never when the source was acquired: a PACS
lists a report made today as made today. Their UIDs do not depend on that time."""

from __future__ import annotations

import datetime
from pathlib import Path

import pydicom

from pipeline.dicom_out import write_dicom_outputs
from tests._support.dicom_dates import assert_same_but_dates
from tests.test_dicom_out_sources import phantom_case

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)


def _made_at(ds: pydicom.Dataset) -> dict[str, str]:
    out = {
        "instance": f"{ds.InstanceCreationDate}{str(ds.InstanceCreationTime)[:6]}",
        "content": f"{ds.ContentDate}{str(ds.ContentTime)[:6]}",
        "series": f"{ds.SeriesDate}{str(ds.SeriesTime)[:6]}",
    }
    for n, item in enumerate(ds.get("ContributingEquipmentSequence", [])):
        if "ContributionDateTime" in item:
            out[f"contribution {n}"] = str(item.ContributionDateTime)[:14]
    return out


def test_results_state_when_they_were_made_not_when_the_scan_was(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    scan = case.source.acquired()
    assert scan is not None and scan.date() != datetime.date.today()  # the phantom's series date
    options = dict(
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        nodules=case.nodules,
        organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        stable_uids=True,
        **MODEL,
    )
    before = datetime.datetime.now().replace(microsecond=0)
    a = write_dicom_outputs(tmp_path / "a", **options)
    after = datetime.datetime.now()
    assert sorted(a) == ["seg", "sr"]
    for kind, path in a.items():
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        for what, value in _made_at(ds).items():
            made = datetime.datetime.strptime(value, "%Y%m%d%H%M%S")
            assert before <= made <= after, (kind, what, value, scan)
    # a given time is stated as it is; the UIDs and the content stay those of the same results
    given = datetime.datetime(2031, 5, 6, 7, 8, 9)
    b = write_dicom_outputs(tmp_path / "b", created=given, **options)
    for kind, path in b.items():
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert set(_made_at(ds).values()) == {"20310506070809"}, kind
        assert_same_but_dates(a[kind], path)


def test_an_instance_made_again_at_another_time_is_a_new_instance_of_the_same_series(tmp_path: Path) -> None:
    """One SOP Instance UID, one content: the same results made at another time (a case processed again) state that
    time under an instance UID of their own, in the same series, so a viewer never shows two versions of one
    instance; made at the same time, they are the same file."""
    case = phantom_case(tmp_path / "case", n_nodules=1)
    options = dict(
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        nodules=case.nodules,
        organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        stable_uids=True,
        **MODEL,
    )
    first, later = datetime.datetime(2031, 5, 6, 7, 8, 9), datetime.datetime(2031, 5, 7, 7, 8, 9)
    a = write_dicom_outputs(tmp_path / "a", created=first, **options)
    b = write_dicom_outputs(tmp_path / "b", created=later, **options)
    again = write_dicom_outputs(tmp_path / "c", created=first, **options)
    for kind in ("sr", "seg"):
        da, db = (pydicom.dcmread(p, stop_before_pixels=True) for p in (a[kind], b[kind]))
        assert da.SeriesInstanceUID == db.SeriesInstanceUID, kind
        assert da.SOPInstanceUID != db.SOPInstanceUID, kind
        assert db.file_meta.MediaStorageSOPInstanceUID == db.SOPInstanceUID
        assert_same_but_dates(a[kind], b[kind])
        assert again[kind].read_bytes() == a[kind].read_bytes(), kind
