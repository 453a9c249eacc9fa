"""DICOM results from the commands: ``ctpipe detect`` (SR), ``ctpipe reconstruct`` (SR + SEG), ``ctpipe run`` (per case
``<case>/dicom/sr.dcm`` and ``seg.dcm``, listed by ``open_run(...).dicom_outputs``), switched off by ``--no-dicom`` or
``outputs.dicom``; a source that no longer matches quarantines its case; sources without SeriesInstanceUID.

Small phantoms (64 × 64 pixels of 2 mm, 5 mm slices), renderings off. Positions are LPS mm.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pydicom
import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.dicom_out import read_source_series, read_sr_case, read_sr_findings, write_case_dicom
from pipeline.dicom_out.model import stated_score
from pipeline.errors import ConfigError, DicomOutputError
from pipeline.runner import open_run, run_batch
from pipeline.runner.stage import CaseContext, Stage
from pipeline.runner.stages import DicomStage, IngestStage, build_stages
from tests._support.runner import QUICK, mark_patient
from tests.test_dicom_out_sources import assert_valid, phantom_case, strip_attributes

#: centres in the SR equal the findings JSON's within this (mm)
CENTRE_TOL_MM = 0.01
ORGAN_LABELS = {"lung_left": "Left lung", "lung_right": "Right lung"}
#: the runs' throughput report (its plots are most of a tiny run's time) is not among what these tests check
NO_REPORT = {"report.enabled": False}


def _centres(rows: Any) -> np.ndarray:
    return np.array([[r["center_x"], r["center_y"], r["center_z"]] for r in rows], dtype=float).reshape(-1, 3)


def _assert_same_centres(sr_path: Path, findings_json: dict[str, Any]) -> None:
    """The SR reports exactly the JSON's reported findings, in rank order, centres within :data:`CENTRE_TOL_MM`."""
    table = read_sr_findings(sr_path)
    expected = np.array([f["center_lps"] for f in findings_json["findings"]], dtype=float).reshape(-1, 3)
    assert len(table) == len(expected)
    got = _centres(table.to_dict("records"))
    assert np.abs(got - expected).max(initial=0.0) <= CENTRE_TOL_MM
    assert table.score.tolist() == [stated_score(f["score"]) for f in findings_json["findings"]]  # to 0.001
    case = read_sr_case(sr_path)
    assert case["nodules_present"] is bool(len(expected))
    assert case["score_threshold"] == pytest.approx(findings_json["score_threshold"])


@pytest.fixture(scope="module")
def detected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One phantom (two nodules) run through ``ctpipe detect`` at score 0.5; its outputs and captured log."""
    root = tmp_path_factory.mktemp("detect")
    case = phantom_case(root / "case", n_nodules=2, matrix=64, slices=24)
    out = root / "out"
    rc = main(
        [
            "detect",
            str(case.dicom),
            "--out",
            str(out),
            "--case-id",
            "c1",
            "--no-png",
            "--score-threshold",
            "0.5",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    return {"case": case, "out": out, "json": json.loads((out / "c1.findings.json").read_text())}


# -- ctpipe detect -------------------------------------------------------------------------------------------------
def test_detect_writes_an_sr_of_the_reported_findings(detected):
    out, doc, case = detected["out"], detected["json"], detected["case"]
    assert len(doc["findings"]) >= 1 and doc["score_threshold"] == 0.5
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".dcm") == ["c1_sr.dcm"]  # detection has no masks: no SEG
    sr_path = out / "c1_sr.dcm"
    sr = hd.sr.srread(sr_path)
    assert sr.SOPClassUID == "1.2.840.10008.5.1.4.1.1.88.34"  # Comprehensive 3D SR
    assert sr.StudyInstanceUID == case.source.study_instance_uid
    _assert_same_centres(sr_path, doc)
    table = read_sr_findings(sr_path)
    assert set(table.sop_instance_uid) <= set(case.source.sop_instance_uids)
    assert table.sop_instance_uid.tolist() == [f["sop_instance_uid"] for f in doc["findings"]]
    # 5 mm slices: the findings and, without a reconstruction's quality report, the SR carry the thick-slice flag
    assert [f["code"] for f in doc["flags"]] == ["thick_slices"]
    assert read_sr_case(sr_path)["quality_flags"] == ["thick_slices"]
    assert_valid(sr_path)


def test_detect_says_why_there_is_no_seg_and_no_dicom_turns_it_off(detected, tmp_path, capsys):
    dicom = detected["case"].dicom
    rc = main(["-v", "detect", str(dicom), "--out", str(tmp_path / "a"), "--case-id", "c", "--no-png", "--no-dicom", "--raw"])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["c.findings.csv", "c.findings.json"]
    assert "no SEG: detection makes no masks" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an unknown output is refused by the parser, naming the choices
        main(["detect", str(dicom), "--out", str(tmp_path / "b"), "--dicom", "rtstruct"])
    assert "choose from sr, seg" in capsys.readouterr().err


# -- ctpipe reconstruct --------------------------------------------------------------------------------------------
def _reconstruct(src: Path, out: Path, *extra: str) -> int:
    return main(
        [
            "reconstruct",
            str(src),
            "--out",
            str(out),
            "--organs",
            "lung_left,lung_right",
            "--no-render",
            "--smoothing",
            "0",
            "--device",
            "cpu",
            *extra,
        ]
    )


def test_reconstruct_writes_sr_and_seg_with_the_nodules(detected, tmp_path):
    case, doc = detected["case"], detected["json"]
    out = tmp_path / "recon"
    assert _reconstruct(case.dicom, out, "--findings", str(detected["out"] / "c1.findings.json")) == 0
    stem = case.volume.series_uid
    sr_path, seg_path = out / f"{stem}_sr.dcm", out / f"{stem}_seg.dcm"
    measurements = json.loads((out / f"{stem}_measurements.json").read_text())
    assert (out / f"{stem}_lung_left.stl").is_file()  # the reconstruction's own outputs are all there
    _assert_same_centres(sr_path, doc)
    table = read_sr_findings(sr_path)
    volumes = {n["index"]: n["volume_mm3"] for n in measurements["nodules"]}
    for rank, row in enumerate(table.itertuples()):
        if volumes[rank] is None:
            assert np.isnan(row.volume_mm3)
        else:
            assert row.volume_mm3 == pytest.approx(volumes[rank], abs=0.5)  # stated to 1 mm³
    assert any(v is not None for v in volumes.values())
    content = read_sr_case(sr_path)
    assert content["quality_flags"] == [f["code"] for f in measurements["quality"]["flags"]]
    assert content["measurements"]["lungs_total_volume_ml"] == pytest.approx(
        measurements["lungs"]["lungs_total_volume_ml"], abs=0.05
    )  # stated to 0.1 mL
    # the SEG: both lungs voxel for voxel as the label map holds them, and a segment per segmented nodule
    seg = hd.seg.segread(seg_path)
    labels = [d.SegmentLabel for d in seg.SegmentSequence]
    source = read_source_series(case.dicom, case.volume)
    got = seg.get_pixels_by_source_instance(source_sop_instance_uids=list(source.sop_instance_uids))
    with np.load(out / f"{stem}_labels.npz") as npz:
        names = {v: int(k) for k, v in json.loads(str(npz["names"])).items()}
        label_map = npz["labels"]
    for organ, label in ORGAN_LABELS.items():
        assert np.array_equal(got[..., labels.index(label)].astype(bool), label_map == names[organ]), organ
    nodule_labels = [x for x in labels if x.startswith("Nodule ")]
    assert len(nodule_labels) == sum(v is not None for v in volumes.values())
    sr_uids = dict(zip(table.tracking_id, table.tracking_uid))
    for d in seg.SegmentSequence:
        if d.SegmentLabel.startswith("Nodule "):
            assert d.TrackingUID == sr_uids[d.SegmentLabel]  # SR and SEG name each nodule alike
    assert_valid(seg_path)
    assert_valid(sr_path)


def test_reconstruct_without_findings_and_output_choice(detected, tmp_path):
    case = detected["case"]
    stem = case.volume.series_uid
    assert _reconstruct(case.dicom, tmp_path / "a") == 0
    content = read_sr_case(tmp_path / "a" / f"{stem}_sr.dcm")
    assert content["nodules_present"] is None  # no detection ran: neither Present nor Absent
    assert content["score_threshold"] is None and content["model_name"] == "ctpipe reconstruction"
    assert read_sr_findings(tmp_path / "a" / f"{stem}_sr.dcm").empty
    assert (tmp_path / "a" / f"{stem}_seg.dcm").is_file()
    assert _reconstruct(case.dicom, tmp_path / "b", "--no-dicom") == 0
    assert not list((tmp_path / "b").glob("*.dcm")) and (tmp_path / "b" / f"{stem}_measurements.json").is_file()
    assert _reconstruct(case.dicom, tmp_path / "c", "--dicom", "seg") == 0
    assert sorted(p.name for p in (tmp_path / "c").glob("*.dcm")) == [f"{stem}_seg.dcm"]


def test_reconstruct_reports_a_dicom_failure_and_keeps_its_outputs(detected, tmp_path, capsys):
    """A cache entry whose DICOM source lost a slice since ingest: meshes and measurements written, SR/SEG not, exit 1."""
    import shutil

    src = tmp_path / "dicom"
    shutil.copytree(detected["case"].dicom, src)
    assert main(["ingest", str(src), "--out", str(tmp_path / "cache")]) == 0
    entry = next((tmp_path / "cache").glob("*.json"))
    sorted(src.rglob("*.dcm"))[5].unlink()
    capsys.readouterr()
    out = tmp_path / "out"
    assert _reconstruct(entry, out) == 1
    err = capsys.readouterr().err
    assert "the DICOM results were not written" in err and "have no source image" in err
    assert (out / f"{entry.stem}_measurements.json").is_file() and (out / f"{entry.stem}_lung_left.stl").is_file()
    assert not list(out.glob("*.dcm"))


# -- ctpipe run ---------------------------------------------------------------------------------------------------
class LoseSourceFile(Stage):
    """After ingest, delete one source file of the cases under a folder named ``broken`` (the source changed mid-run)."""

    name = "lose_source"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if "broken" in Path(ctx.case.source).parts:
            os.unlink(sorted(ctx.case.files)[4])
        return {}


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two good phantom cases (with patient identifiers) and one whose source loses a file after ingest, in one run."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    root = tmp_path_factory.mktemp("batch")
    for name, seed in (("case1", 11), ("case2", 12), ("broken", 13)):
        ph = generate_phantom(seed, n_nodules=1, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0)
        write_phantom_case(ph, root / "src" / name)
    mark_patient(sorted((root / "src").rglob("*.dcm")))
    cfg = load_config(overrides={**QUICK, **NO_REPORT}, environ={})
    stages = build_stages(cfg)
    assert isinstance(stages[-1], DicomStage) and isinstance(stages[0], IngestStage)
    stages.insert(1, LoseSourceFile())
    summary = run_batch([root / "src"], out=root / "run", config=cfg, stages=stages, workers=0)
    return {"root": root, "summary": summary, "run": open_run(root / "run")}


@pytest.mark.slow
def test_run_writes_sr_and_seg_per_case_listed_by_open_run(batch):
    run, summary = batch["run"], batch["summary"]
    assert summary.done == 2 and summary.exit_code == 3
    done = run.cases[run.cases.status == "done"]
    table = run.dicom_outputs
    assert sorted(table.case_id) == sorted(done.case_id)
    for row in table.itertuples():
        folder = batch["root"] / "run" / "cases" / row.case_id
        assert row.sr == folder / "dicom" / "sr.dcm" and row.seg == folder / "dicom" / "seg.dcm"
        doc = json.loads((folder / "findings.json").read_text())
        _assert_same_centres(row.sr, doc)
        manifest = json.loads((folder / "manifest.json").read_text())
        assert {"dicom/sr.dcm", "dicom/seg.dcm"} <= {f["path"] for f in manifest["files"]}
        seg = hd.seg.segread(row.seg)
        assert {"Left lung", "Right lung"} <= {d.SegmentLabel for d in seg.SegmentSequence}
        for path in (row.sr, row.seg):
            ds = pydicom.dcmread(path)
            # DICOM results are filed with their study: Patient copied from the source (the only files that carry it)
            assert ds.PatientID == "ZQX-PRIV-77310" and ds.AccessionNumber == "ACCZQ55213"
            assert ds.StudyInstanceUID == json.loads((folder / "volume.json").read_text())["metadata"]["StudyInstanceUID"]


@pytest.mark.slow
def test_a_source_that_changed_quarantines_its_case_only(batch):
    run = batch["run"]
    failed = run.failures
    assert len(failed) == 1
    row = failed.iloc[0]
    assert "broken" in row.source and row.failed_stage == "dicom" and row.error_class == "SourceMismatchError"
    assert "changed since they were ingested" in row.reason and "a file is gone" in row.reason
    quarantine = json.loads((batch["root"] / "run" / "quarantine" / f"{row.case_id}.json").read_text())
    assert quarantine["reason"] == row.reason
    assert not (batch["root"] / "run" / "cases" / row.case_id).exists()  # never published without its declared files
    assert row.case_id not in set(run.dicom_outputs.case_id)


@pytest.mark.slow
def test_config_off_writes_no_dicom(batch, tmp_path):
    src = batch["root"] / "src" / "case1"
    summary = run_batch([src], out=tmp_path / "run", workers=0, **QUICK, **NO_REPORT, **{"outputs.dicom": "none"})
    assert summary.done == 1
    assert not list((tmp_path / "run").rglob("*.dcm"))
    table = open_run(tmp_path / "run").dicom_outputs
    assert table.sr.isna().all() and table.seg.isna().all() and len(table) == 1
    assert "dicom" not in set(open_run(tmp_path / "run").stages.stage)


def test_outputs_config_is_validated():
    assert load_config(environ={}).outputs.dicom == ["sr", "seg"]
    assert load_config(environ={"CTPIPE_OUTPUTS_DICOM": "none"}).outputs.dicom == []
    assert load_config(overrides={"outputs.dicom": "seg"}, environ={}).outputs.dicom == ["seg"]
    with pytest.raises(ConfigError, match=r"outputs\.dicom.*rtstruct.*sr, seg"):
        load_config(overrides={"outputs.dicom": ["sr", "rtstruct"]}, environ={})
    assert not any(isinstance(s, DicomStage) for s in build_stages(load_config(overrides={"outputs.dicom": []}, environ={})))


# -- sources without SeriesInstanceUID -----------------------------------------------------------------------------
@pytest.mark.parametrize("recorded", [True, False], ids=["by-sop-uids", "by-position"])
def test_source_without_series_uid_uses_the_generated_id(tmp_path, caplog, recorded):
    from pipeline.ingest import load_series
    from pipeline.volume import CTVolume

    case = phantom_case(tmp_path / "case", n_nodules=1)
    strip_attributes(case.dicom, ("SeriesInstanceUID",))
    vol = load_series(case.dicom)
    assert vol.metadata.get("SeriesInstanceUIDGenerated") is True and vol.series_uid.startswith("2.25.")
    if not recorded:
        vol = CTVolume(vol.array, vol.geometry, metadata={k: v for k, v in vol.metadata.items() if k != "SOPInstanceUIDs"})
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        source = read_source_series(case.dicom, vol)
    assert "have no SeriesInstanceUID" in caplog.text and vol.series_uid in caplog.text
    assert source.series_instance_uid == vol.series_uid and "SeriesInstanceUID" in source.generated
    assert source.sop_instance_uids == case.source.sop_instance_uids  # the same images, slice by slice
    paths = write_case_dicom(
        tmp_path / "out",
        source=source,
        volume=vol,
        findings=None,
        outputs=["sr", "seg"],
        organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        stem="anon",
    )
    assert sorted(paths) == ["seg", "sr"]
    other = phantom_case(tmp_path / "other", seed=4)
    with pytest.raises(DicomOutputError, match="no source image without SeriesInstanceUID matches"):
        read_source_series(other.dicom, load_series(case.dicom))
    assert_valid(paths["seg"])  # last: it skips the test where dciodvfy is missing


def test_results_written_again_are_the_same_bytes(tmp_path):
    """With a UID seed and a given creation time the same results give the same files; without a seed, new UIDs (each
    call a new instance)."""
    case = phantom_case(tmp_path / "case", n_nodules=1)
    created = datetime.datetime(2031, 5, 6, 7, 8, 9)
    options: dict[str, Any] = dict(
        source=case.source,
        volume=case.volume,
        findings=None,
        outputs=["sr", "seg"],
        organ_masks={"lung_left": case.phantom.masks["lung_left"]},
        stem="x",
    )
    a = write_case_dicom(tmp_path / "a", uid_seed="case-1", created=created, **options)
    b = write_case_dicom(tmp_path / "b", uid_seed="case-1", created=created, **options)
    c = write_case_dicom(tmp_path / "c", uid_seed="case-2", created=created, **options)
    for kind in ("sr", "seg"):
        assert a[kind].read_bytes() == b[kind].read_bytes(), kind
        ds_a, ds_c = pydicom.dcmread(a[kind]), pydicom.dcmread(c[kind])
        assert ds_a.SOPInstanceUID != ds_c.SOPInstanceUID and ds_a.SeriesInstanceUID != ds_c.SeriesInstanceUID
        assert ds_a.ContentDate == created.strftime("%Y%m%d")
    fresh = write_case_dicom(tmp_path / "d", **options)
    assert pydicom.dcmread(fresh["sr"]).SOPInstanceUID != pydicom.dcmread(a["sr"]).SOPInstanceUID
