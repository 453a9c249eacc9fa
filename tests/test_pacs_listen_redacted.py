"""``ctpipe listen`` tells each received series' outcome by the case the runner made of its spool folder, whatever
the run store shows that folder as: a spool folder is named by the SeriesInstanceUID, and a site whose UIDs embed
the PatientID has its folders stored as ``<patient:xxxxxx>`` tokens; the series is still said done with its case,
not "not selected" by the localizer stored among its slices."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pydicom
import pytest

from pipeline.config import load_config
from pipeline.pacs import Listener
from pipeline.runner import open_run
from pipeline.runner.stages import IngestStage, WriteStage
from tests._support.orthanc import cstore, free_port, write_phantom_series

pytestmark = pytest.mark.pacs

AET = "CTPIPE_L"


def _with_patient_id_in_uids(files: list[Path], root: Path) -> tuple[str, str, list[Path]]:
    """The series' files rewritten with a PatientID that its SeriesInstanceUID holds (a site building UIDs from the
    patient's ID), plus a localizer image stored among its slices (a part of the series of its own, not selected):
    (SeriesInstanceUID, PatientID, files)."""
    root.mkdir(parents=True)
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).SeriesInstanceUID)
    patient_id = max(re.findall(r"\d{6,}", uid), key=len)[:8]
    out = []
    for n, f in enumerate(files):
        ds = pydicom.dcmread(f)
        ds.PatientID = patient_id
        out.append(root / f"{n:03d}.dcm")
        ds.save_as(out[-1])
    scout = pydicom.dcmread(files[0])
    scout.PatientID = patient_id
    scout.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    scout.SOPInstanceUID = scout.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    out.append(root / "scout.dcm")
    scout.save_as(out[-1])
    return uid, patient_id, out


def test_a_series_in_a_patient_named_spool_folder_is_said_done_with_its_case(tmp_path):
    _, plain = write_phantom_series(tmp_path / "case", 9)
    uid, patient_id, files = _with_patient_id_in_uids(plain, tmp_path / "sent")
    opts = {
        "pacs.ae_title": AET,
        "pacs.port": free_port(),
        "pacs.allowed_aets": ["ORTHANC"],
        "pacs.quiet_period_s": 0.5,
        "report.enabled": False,
        "workers": 0,
    }
    outcomes = []
    run = tmp_path / "run"
    cfg = load_config(overrides=opts, environ={})
    lst = Listener(run, cfg, stages=[IngestStage(), WriteStage()], poll_s=0.1, on_series=outcomes.append)
    with lst:
        assert cstore(files, lst.port, called=AET) == [0] * len(files)
        deadline = time.monotonic() + 60
        while not lst.step():
            assert time.monotonic() < deadline, "no series was handed to the runner in time"
            time.sleep(0.2)
    cases = open_run(run).cases
    done = cases[cases.status == "done"]
    assert len(done) == 1, cases
    # the store shows the spool folder by its token: the PatientID is not written there
    assert patient_id not in str(done.source.iloc[0]) and "<patient:" in str(done.source.iloc[0])
    (outcome,) = outcomes
    assert (outcome.series_uid, outcome.status, outcome.case_id) == (uid, "done", done.case_id.iloc[0]), outcome
