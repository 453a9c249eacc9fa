"""write_dicom_outputs on ctpipe's own results (reconstruction, nodule segmentation, quality report), and on a real scan."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import highdicom as hd
import numpy as np
import pytest

from pipeline.detection.findings import Finding, Findings
from pipeline.dicom_out import read_source_series, read_sr_case, read_sr_findings, write_dicom_outputs
from pipeline.errors import DicomOutputError
from pipeline.reconstruction import reconstruct, segment_findings
from pipeline.reconstruction.quality import assess_quality
from tests._support.real_ct import require_real_ct
from tests.test_dicom_out_sources import assert_valid, phantom_case

MODEL = dict(model_name="demo_phantom_retinanet", model_version="1", score_threshold=0.5)


def test_outputs_from_ctpipe_results(tmp_path, one_torch_thread):
    case = phantom_case(tmp_path / "case", n_nodules=2, matrix=96, slices=40, pixel_spacing=1.25, slice_spacing=2.5)
    vol = case.volume
    findings = Findings(case.findings, case_id="case", series_uid=vol.series_uid, model="demo")
    rec = reconstruct(vol, findings=case.findings, render=False, smoothing=0, device="cpu")
    lungs = rec.mask("lung_left") | rec.mask("lung_right")
    nodules = segment_findings(vol, case.findings, lung_mask=lungs)
    assert [r.mask is not None for r in nodules[:2]] == [True, True]  # the phantom's two nodules are segmented
    quality = assess_quality(np.asarray(vol.array), vol.geometry, {o: rec.mask(o) for o in rec.masks}, metadata=vol.metadata)
    out = tmp_path / "out"
    paths = write_dicom_outputs(
        out,
        source=case.dicom,
        volume=vol,
        findings=findings,
        reconstruction=rec,
        nodules=nodules,
        quality=quality,
        stem="case1",
        **MODEL,
    )
    assert paths == {"sr": out / "case1_sr.dcm", "seg": out / "case1_seg.dcm"}
    assert sorted(p.name for p in out.iterdir()) == ["case1_seg.dcm", "case1_sr.dcm"]  # no temporary files left
    table = read_sr_findings(paths["sr"])
    assert len(table) == 2
    for row in table.itertuples():
        result = nodules[row.rank - 1]  # ranks follow the scores 0.9, 0.8: the findings' order
        if result.volume_mm3 is None:
            assert np.isnan(row.volume_mm3)
        else:
            assert row.volume_mm3 == pytest.approx(result.volume_mm3, abs=0.5)  # stated to 1 mm³
    content = read_sr_case(paths["sr"])
    lung_meas = rec.measurements["lungs"]
    assert content["measurements"], "the SR holds no lung measurement"
    for name, value in content["measurements"].items():
        assert value == pytest.approx(lung_meas[name], abs=0.05), name  # stated to 0.1 mL and 0.1 %
    assert content["quality_flags"] == list(quality.codes)
    assert content["lung_coverage"] == quality.lung_coverage
    seg = hd.seg.segread(paths["seg"])
    got = seg.get_pixels_by_source_instance(source_sop_instance_uids=list(read_source_series(case.dicom, vol).sop_instance_uids))
    labels = [d.SegmentLabel for d in seg.SegmentSequence]
    organ_labels = {"body": "Body", "lung_left": "Left lung", "lung_right": "Right lung", "airway": "Airway", "bone": "Bone"}
    for organ in rec.masks:
        assert np.array_equal(got[..., labels.index(organ_labels[organ])].astype(bool), rec.mask(organ)), organ
    assert "Nodule 3" not in labels  # the third finding (score 0.2) is below the operating point
    for n, result in enumerate(nodules[:2]):
        full = np.zeros(vol.shape, dtype=bool)
        i0, j0, k0 = (int(v) for v in np.rint(vol.geometry.lps_to_index(result.geometry.origin)))
        nk, nj, ni = result.mask.shape
        full[k0 : k0 + nk, j0 : j0 + nj, i0 : i0 + ni] = result.mask
        assert np.array_equal(got[..., labels.index(f"Nodule {n + 1}")].astype(bool), full)
    for path in paths.values():  # last: it skips the test where dciodvfy is missing
        assert_valid(path)


def test_output_selection(tmp_path, caplog):
    case = phantom_case(tmp_path / "case")
    paths = write_dicom_outputs(
        tmp_path / "a", source=case.source, volume=case.volume, findings=case.findings, outputs=["sr"], **MODEL
    )
    assert list(paths) == ["sr"] and paths["sr"].name.endswith("_sr.dcm")
    with caplog.at_level(logging.WARNING, logger="pipeline.dicom_out"):
        paths = write_dicom_outputs(tmp_path / "b", source=case.source, volume=case.volume, findings=case.findings, **MODEL)
    assert list(paths) == ["sr"] and "no SEG written" in caplog.text  # detection only: nothing to segment
    with pytest.raises(DicomOutputError, match=r"unknown DICOM output\(s\) \['rtstruct'\]"):
        write_dicom_outputs(
            tmp_path / "c", source=case.source, volume=case.volume, findings=case.findings, outputs=["sr", "rtstruct"], **MODEL
        )
    other = Findings(case.findings, series_uid="1.2.3")
    with pytest.raises(DicomOutputError, match="the findings belong to series 1.2.3"):
        write_dicom_outputs(tmp_path / "d", source=case.source, volume=case.volume, findings=other, **MODEL)


def test_reading_a_file_that_is_no_sr_names_it_and_what_it_is(tmp_path):
    from tests._support.dicom import write_series

    ct_slice = write_series(tmp_path / "ct", n=2)[0]
    text = tmp_path / "ground_truth.json"
    text.write_text('{"nodules": []}\n' * 20)
    for path, what in ((ct_slice, r"CT Image Storage"), (text, r"InvalidDicomError"), (tmp_path / "ct", r"directory")):
        for read in (read_sr_findings, read_sr_case):
            with pytest.raises(DicomOutputError, match=f"not a readable structured report.*{what}") as err:
                read(path)
            assert str(err.value).startswith(f"{path}: ") and "dicom_outputs.sr" in (err.value.fix or "")


def test_reading_a_path_that_does_not_exist_or_a_folder_says_so(tmp_path):
    missing = tmp_path / "cases" / "c1" / "dicom" / "sr.dcm"
    for read in (read_sr_findings, read_sr_case):
        with pytest.raises(DicomOutputError) as err:
            read(missing)
        assert str(err.value).startswith(f"{missing}: no such file") and "FileNotFoundError" not in str(err.value)
        with pytest.raises(DicomOutputError) as err:
            read(5)
        assert "must be an SR file (a str or a pathlib.Path), got int 5" in str(err.value)
    folder = tmp_path / "cases" / "c1" / "dicom"
    folder.mkdir(parents=True)
    (folder / "sr.dcm").write_bytes(b"")
    with pytest.raises(DicomOutputError) as err:
        read_sr_findings(folder)
    assert "a directory (folder), not an SR file" in str(err.value)
    assert f"read_sr_findings({str(folder / 'sr.dcm')!r})" in (err.value.fix or "")


@pytest.mark.slow
def test_real_series(tmp_path):
    """The RT-planning chest (512×512×141, InstanceNumbers against the slice order): headers matched, SR and SEG
    valid and read back."""
    from pipeline.ingest import load_series

    folder = require_real_ct() / "chest_ct_rt_planning_dicom"
    vol = load_series(folder)
    source = read_source_series(folder, vol)
    g = vol.geometry
    hu = np.asarray(vol.array)
    body = hu > -500
    lungs = np.zeros(vol.shape, dtype=bool)
    lungs[:, 100:400, 80:430] = hu[:, 100:400, 80:430] < -600
    half = g.shape[2] // 2
    masks = {
        "body": body,
        "lung_right": lungs & (np.arange(g.shape[2]) < half),
        "lung_left": lungs & (np.arange(g.shape[2]) >= half),
    }
    c = g.index_to_lps([150, 200, 100])  # the patient's right lung, upper half
    finding = Finding(tuple(c), tuple(c - 8), tuple(c + 8), 16.0, 0.93, (150, 200, 100), 101)
    nodule_mask = np.zeros((5, 9, 9), dtype=bool)
    nodule_mask[1:4, 2:7, 2:7] = True
    nodule = SimpleNamespace(
        index=0,
        mask=nodule_mask,
        geometry=g.cropped([146, 196, 98], [155, 205, 103]),
        volume_mm3=float(nodule_mask.sum() * np.prod(g.spacing)),
    )
    recon = SimpleNamespace(masks=masks, measurements={"lungs": {"lungs_total_volume_ml": 4321.0}})
    paths = write_dicom_outputs(
        tmp_path, source=source, volume=vol, findings=[finding], reconstruction=recon, nodules=[nodule], **MODEL
    )
    row = read_sr_findings(paths["sr"]).iloc[0]
    assert np.abs(np.array([row.center_x, row.center_y, row.center_z]) - c).max() < 0.01
    assert row.sop_instance_uid == source.sop_instance_uids[100] and row.side == "right"
    seg = hd.seg.segread(paths["seg"])
    got = seg.get_pixels_by_source_instance(source_sop_instance_uids=list(source.sop_instance_uids)).astype(bool)
    for s, name in enumerate(("body", "lung_left", "lung_right")):
        assert np.array_equal(got[..., s], masks[name]), name
    full = np.zeros(vol.shape, dtype=bool)
    full[98:103, 196:205, 146:155] = nodule_mask
    assert np.array_equal(got[..., 3], full)
    uids = vol.metadata.get("SOPInstanceUIDs")
    if uids is not None:  # the ingest's own slice order, when it records one
        assert list(source.sop_instance_uids) == list(uids)
    for path in paths.values():  # last: it skips the test where dciodvfy is missing
        assert_valid(path, allowed_warnings=("<99CTPIPE>", "needed to build DICOMDIR"))  # the source has no PatientName
