"""DICOM results written again from the same results are the same series and instances (an archive keeps one copy);
results that differ get UIDs of their own. LPS mm throughout."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pydicom

from pipeline.detection.findings import Findings
from pipeline.dicom_out import write_dicom_outputs
from tests._support.dicom_dates import assert_same_but_dates
from tests.test_dicom_out_sources import phantom_case

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)


def _uids(path: Path) -> tuple[str, str]:
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    return str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)


def test_the_same_results_give_the_same_files_and_other_results_other_uids(tmp_path: Path) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=1)
    masks = {"lung_left": case.phantom.masks["lung_left"], "body": case.phantom.masks["body"]}
    options = dict(
        source=case.source, volume=case.volume, findings=case.findings, nodules=case.nodules, stable_uids=True, **MODEL
    )
    a = write_dicom_outputs(tmp_path / "a", organ_masks=masks, **options)
    b = write_dicom_outputs(tmp_path / "b", organ_masks={k: v.copy() for k, v in masks.items()}, **options)
    assert sorted(a) == ["seg", "sr"]
    for kind in a:  # the same UIDs and content; each states when it was made
        assert_same_but_dates(a[kind], b[kind])
    given = datetime.datetime(2031, 5, 6, 7, 8, 9)  # reproducible files: the same time given
    once, again = (write_dicom_outputs(tmp_path / n, organ_masks=masks, created=given, **options) for n in ("e", "f"))
    for kind in a:
        assert once[kind].read_bytes() == again[kind].read_bytes(), kind
    grown = {**masks, "body": masks["body"] | np.roll(masks["body"], 1, axis=2)}
    c = write_dicom_outputs(tmp_path / "c", organ_masks=grown, **options)
    assert _uids(c["seg"])[0] != _uids(a["seg"])[0]
    fewer = write_dicom_outputs(tmp_path / "d", **{**options, "findings": case.findings[1:]}, organ_masks=masks)
    assert _uids(fewer["sr"])[0] != _uids(a["sr"])[0]


def test_ctpipe_detect_twice_writes_the_same_sr(tmp_path: Path) -> None:
    from pipeline.detection.cli import _write_dicom

    case = phantom_case(tmp_path / "case", n_nodules=1)
    findings = Findings(case.findings, case_id="c", series_uid=case.volume.series_uid, model="demo", score_threshold=0.5)
    written: list[Path] = []
    for out in ("a", "b"):
        findings.timings_ms = {"detect": 100.0 + len(written)}  # each call takes its own time
        args = argparse.Namespace(dicom=["sr"], src=str(case.dicom), out=tmp_path / out)
        assert _write_dicom(args, case.volume, findings, "c") == 0
        written.append(tmp_path / out / "c_sr.dcm")
    assert_same_but_dates(written[0], written[1])


def test_each_result_keeps_its_uids_when_only_the_other_changes(tmp_path: Path) -> None:
    """The SR written alone or beside a SEG is the same file; a body mask that changes gives a new SEG, the same SR."""
    case = phantom_case(tmp_path / "case", n_nodules=1)
    masks = {"lung_left": case.phantom.masks["lung_left"], "body": case.phantom.masks["body"]}
    options = dict(
        source=case.source, volume=case.volume, findings=case.findings, nodules=case.nodules, stable_uids=True, **MODEL
    )
    both = write_dicom_outputs(tmp_path / "both", organ_masks=masks, **options)
    alone = write_dicom_outputs(tmp_path / "alone", organ_masks=masks, outputs=["sr"], **options)
    assert sorted(alone) == ["sr"]
    assert_same_but_dates(alone["sr"], both["sr"])
    grown = {**masks, "body": masks["body"] | np.roll(masks["body"], 1, axis=2)}
    other_body = write_dicom_outputs(tmp_path / "body", organ_masks=grown, **options)
    assert_same_but_dates(other_body["sr"], both["sr"])
    assert _uids(other_body["seg"]) != _uids(both["seg"])


def test_another_layout_of_the_same_results_is_another_instance(tmp_path: Path, monkeypatch: Any) -> None:
    """A build that lays the SR or SEG out otherwise (e.g. adds content groups) gives the same results, made at the
    same time, other instance UIDs: one instance UID never names two documents; the same layout gives the same UID."""
    from pipeline.dicom_out import seg, sr

    case = phantom_case(tmp_path / "case", n_nodules=1)
    masks = {"lung_left": case.phantom.masks["lung_left"], "body": case.phantom.masks["body"]}
    options = dict(
        source=case.source, volume=case.volume, findings=case.findings, nodules=case.nodules, stable_uids=True, **MODEL
    )
    given = datetime.datetime(2031, 5, 6, 7, 8, 9)
    before = write_dicom_outputs(tmp_path / "before", organ_masks=masks, created=given, **options)
    same = write_dicom_outputs(tmp_path / "same", organ_masks=masks, created=given, **options)
    for kind in ("sr", "seg"):
        assert _uids(same[kind]) == _uids(before[kind]), kind
    monkeypatch.setattr(sr, "SR_LAYOUT", f"{sr.SR_LAYOUT}+more-groups")
    monkeypatch.setattr(seg, "SEG_LAYOUT", f"{seg.SEG_LAYOUT}+more-segments")
    after = write_dicom_outputs(tmp_path / "after", organ_masks=masks, created=given, **options)
    for kind in ("sr", "seg"):
        assert _uids(after[kind])[1] != _uids(before[kind])[1], kind
    again = write_dicom_outputs(tmp_path / "again", organ_masks=masks, created=given, **options)
    for kind in ("sr", "seg"):
        assert _uids(again[kind]) == _uids(after[kind]), kind
