"""The UIDs of a case's DICOM results in ``ctpipe run``: derived from what the results hold, not from options that
leave them unchanged, so that a case processed again sends an archive the same series, never a second one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from pipeline.config import load_config
from pipeline.runner.dicom_stage import _uid_seed

FINDINGS = {"findings": [{"center_lps": [-86.46, 82.39, -9.07], "score": 0.99}], "score_threshold": 0.4}
MEASUREMENTS = {
    "lungs": {"lung_left_volume_ml": 2423.3, "lung_right_volume_ml": 2986.0},
    "nodules": [{"index": 0, "volume_mm3": 7345.2}],
    "organs": {"body": {"voxels": 14283291, "mesh_volume_ml": 27242.6294}},
    "files": {"mesh": ["case_body.stl"]},
}
#: the source images the results are of (the attributes of a SourceSeries their UIDs derive from)
SOURCE = SimpleNamespace(series_instance_uid="1.2.3", sop_instance_uids=("1.2.3.1", "1.2.3.2"), frame_numbers=None)


def _ctx(overrides: dict[str, Any], findings: dict[str, Any] = FINDINGS) -> Any:
    return SimpleNamespace(
        config=load_config(overrides=overrides, environ={}),
        case=SimpleNamespace(case_key="1.2.3:abc", case_id="1.2.3"),
        state={"findings_doc": findings, "quality": {"lung_coverage": "complete", "flags": []}},
    )


def test_options_that_leave_the_results_unchanged_keep_their_uids() -> None:
    seed = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS)
    assert sorted(seed) == ["seg", "sr"] and seed["sr"] != seed["seg"]
    unchanged: list[dict[str, Any]] = [
        {"reconstruct.mesh_formats": "stl,glb"},
        {"reconstruct.renderings": False},
        {"privacy.keep_identifiers": True},
        {"detector.write_png": False},
    ]
    for overrides in unchanged:
        meshes = {**MEASUREMENTS, "files": {"mesh": ["case_body.stl", "case_body.glb"]}}
        assert _uid_seed(_ctx(overrides), SOURCE, meshes) == seed, overrides
    rescored = {**FINDINGS, "findings": [{"center_lps": [-86.46, 82.39, -9.07], "score": 0.98}]}
    assert _uid_seed(_ctx({}, rescored), SOURCE, MEASUREMENTS) == seed  # the same finding, measured again
    second = {"center_lps": [20.39, 5.55, -192.33], "score": 0.5}
    other_findings = {**FINDINGS, "findings": [*FINDINGS["findings"], second]}
    assert _uid_seed(_ctx({}, other_findings), SOURCE, MEASUREMENTS) != seed
    one_lung = _uid_seed(_ctx({}), SOURCE, {**MEASUREMENTS, "lungs": {"lung_left_volume_ml": 2400.0}})
    assert one_lung["sr"] != seed["sr"] and one_lung["seg"] == seed["seg"]  # the SEG holds no volumes
    omitted = _uid_seed(_ctx({"outputs.seg_omit_empty_frames": False}), SOURCE, MEASUREMENTS)
    assert omitted["seg"] != seed["seg"] and omitted["sr"] == seed["sr"]


def test_the_sr_keeps_its_uids_whether_or_not_a_seg_is_written_beside_it() -> None:
    """A site that adds the SEG later (``outputs.dicom: [sr]``, then ``[sr, seg]``) sends the archive the same SR."""
    sr_only = _uid_seed(_ctx({"outputs.dicom": ["sr"]}), SOURCE, MEASUREMENTS)
    both = _uid_seed(_ctx({"outputs.dicom": ["sr", "seg"]}), SOURCE, MEASUREMENTS)
    assert sr_only["sr"] == both["sr"]


def test_the_masks_of_the_seg_are_part_of_the_uids() -> None:
    lungs = np.zeros((4, 8, 8), dtype=bool)
    lungs[1:3, 2:6, 2:6] = True
    nodule = SimpleNamespace(index=0, mask=lungs[1:3, 2:4, 2:4], geometry=SimpleNamespace(origin=(0.0, 0.0, 0.0)))
    seed = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, {"lung_left": lungs}, [nodule])
    assert _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, {"lung_left": lungs.copy()}, [nodule]) == seed
    grown = lungs.copy()
    grown[0, 2, 2] = True
    assert _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, {"lung_left": grown}, [nodule]) != seed  # the SR's sides come from the lungs
    moved = SimpleNamespace(index=0, mask=nodule.mask, geometry=SimpleNamespace(origin=(2.0, 0.0, 0.0)))
    assert _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, {"lung_left": lungs}, [moved]) != seed
    # a body mask is the SEG's alone: the SR it leaves unchanged keeps its UIDs
    with_body = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, {"lung_left": lungs, "body": lungs}, [nodule])
    assert with_body["sr"] == seed["sr"] and with_body["seg"] != seed["seg"]


def test_a_corrected_patient_gives_new_uids_even_where_the_file_sizes_stay() -> None:
    """A patient merge (PatientID 12345678 → 87654321) leaves the files' sizes and SOP Instance UIDs as they were: the
    results written again carry the new patient and must not reuse the UIDs of those filed under the old one."""
    before = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, patient_study={"PatientID": "12345678", "PatientName": "Doe^Jon"})
    again = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, patient_study={"PatientID": "12345678", "PatientName": "Doe^Jon"})
    merged = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS, patient_study={"PatientID": "87654321", "PatientName": "Doe^Jon"})
    assert again == before
    assert merged["sr"] != before["sr"] and merged["seg"] != before["seg"]


def test_the_same_series_retrieved_another_way_gives_the_same_uids() -> None:
    """The series fetched by DICOMweb in one run folder and by C-MOVE in another (other file sizes and transfer
    syntax, so another case key) gives the same results the same UIDs: the archive keeps one SR and one SEG."""
    seed = _uid_seed(_ctx({}), SOURCE, MEASUREMENTS)
    other_files = _ctx({})
    other_files.case = SimpleNamespace(case_key="1.2.3:def", case_id="1.2.3")
    assert _uid_seed(other_files, SOURCE, MEASUREMENTS) == seed
    other_images = SimpleNamespace(series_instance_uid="1.2.3", sop_instance_uids=("1.2.3.1", "1.2.3.3"), frame_numbers=None)
    assert _uid_seed(_ctx({}), other_images, MEASUREMENTS) != seed
