"""Detector behaviour: LPS positions, lung restriction, bad and big input, model loading errors, outputs."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from pipeline.cache import CaseCache
from pipeline.detection.bundle import load_bundle, load_model
from pipeline.detection.infer import Detector
from pipeline.detection.lungs import quick_lung_mask
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.detection.network import BUNDLE_ARCHITECTURE
from pipeline.errors import BundleError, InputTooSmallError, InvalidVolumeError, ModelError, WeightsMismatchError
from pipeline.volume import CTVolume
from tests._support.detection import SMALL_ARCH, bundle_state_dict, chest_volume, inference_json, small_model, write_bundle

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def demo():
    if not DEMO_MODEL_JSON.is_file():
        pytest.fail(f"demo model missing: {DEMO_MODEL_JSON} (run scripts/train_detector.py)")
    return Detector(device="cpu")


# --- positions in LPS --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFS", "FFS", "HFP"])
def test_demo_model_finds_phantom_nodules_in_lps(demo, position):
    from pipeline.phantom import generate_phantom

    ph = generate_phantom(
        3,
        matrix=160,
        pixel_spacing=1.8,
        slice_spacing=2.5,
        n_nodules=3,
        nodule_diameter_mm=(10.0, 20.0),
        patient_position=position,
    )
    res = demo.detect(ph.volume, lung_mask=ph.masks)
    top = [f for f in res if f.score > 0.5]
    assert top, "no confident finding"
    for nod in ph.nodules:
        d = [np.linalg.norm(np.subtract(f.center_lps, nod.center_lps)) for f in top]
        assert min(d) <= nod.diameter_mm / 2, (position, nod, d)
        best = top[int(np.argmin(d))]
        assert abs(best.diameter_mm - nod.diameter_mm) < 0.5 * nod.diameter_mm
        # the voxel index points at the nodule in the ORIGINAL series
        assert ph.nodule_labels[best.voxel_ijk[2], best.voxel_ijk[1], best.voxel_ijk[0]] > 0
        assert np.all(np.asarray(best.box_min_lps) <= best.center_lps) and np.all(np.asarray(best.center_lps) <= best.box_max_lps)


# --- lung restriction ----------------------------------------------------------------------
@pytest.mark.slow
def test_lung_crop_shrinks_input_and_filter_keeps_lung_findings(tmp_path):
    model = small_model(tmp_path)
    vol = chest_volume(shape_kji=(40, 96, 96), spacing=(2.0, 2.0, 2.5))
    det = Detector(model=model, device="cpu")
    full = det.detect(vol, restrict_to_lungs=False)
    region = quick_lung_mask(vol)
    crop = det.detect(vol, lung_mask=region)
    assert np.prod(crop.input_shape_xyz) < 0.8 * np.prod(full.input_shape_xyz)
    assert len(full) > 0
    ijk = np.array([vol.lps_to_index(f.center_lps) for f in crop]) if len(crop) else np.zeros((0, 3))
    assert np.all(region.near(ijk, det.config.lung_filter_margin_mm))
    # candidates far outside the lungs exist without the restriction and are gone with it
    far = [f for f in full if not region.near(vol.lps_to_index(f.center_lps), 20.0)[0]]
    assert far
    assert not any(np.allclose(f.center_lps, g.center_lps) for f in far for g in crop)


def test_quick_lung_mask_finds_both_lungs():
    vol = chest_volume(shape_kji=(40, 96, 96), spacing=(1.4, 1.4, 2.5), nodules=((0.42, 0.0, 0.0, 12.0),))
    region = quick_lung_mask(vol)
    lo, hi = region.bbox_ijk(0.0, vol.geometry.size_ijk)
    assert lo[0] < 30 and hi[0] > 66  # spans both lungs in i
    nod_ijk = vol.lps_to_index((0.42 * 96 * 1.4 / 2, 0.0, 0.0))
    assert region.near(nod_ijk, 0.0)[0]  # the nodule inside the lung is inside the (hole-filled) mask


def test_empty_lungs_give_no_findings_with_reason(tmp_path, caplog):
    model = small_model(tmp_path)
    vol = CTVolume(
        np.full((30, 64, 64), 40, np.int16),
        chest_volume().geometry.with_(shape=(30, 64, 64)),
        metadata={"SeriesInstanceUID": "9.9"},
    )
    res = Detector(model=model, device="cpu").detect(vol)
    assert len(res) == 0 and "no lung" in res.reason
    assert "no lung" in caplog.text
    assert "stored pixel values" in res.reason  # nothing near -1000 HU in it
    # the case's time (findings JSON timings_ms.total, printed by ctpipe detect) is the lung search it did, not 0 ms
    assert res.timings_ms["total"] >= res.timings_ms["lung_mask"] > 0.0
    # a chest given as stored values (unsigned, RescaleIntercept not applied): the reason says so
    chest = chest_volume()
    stored = CTVolume((np.asarray(chest.array) + 1024).clip(0).astype(np.uint16), chest.geometry)
    res = Detector(model=model, device="cpu").detect(stored)
    assert len(res) == 0 and "apply RescaleSlope/RescaleIntercept" in res.reason
    assert "stored pixel values" not in (Detector(model=model, device="cpu").detect(chest).reason or "")


def test_a_json_that_is_not_a_cache_sidecar_says_what_to_pass(tmp_path):
    from pipeline.errors import CacheError
    from pipeline.ingest.source import read_source

    (tmp_path / "ground_truth.json").write_text('{"format_version": 1}')
    (tmp_path / "ground_truth.npy").write_bytes(b"")
    with pytest.raises(CacheError, match=r"not a case-cache sidecar .* Fix: pass a \.json written by ctpipe ingest"):
        read_source(tmp_path / "ground_truth.json")


# --- bad input ------------------------------------------------------------------------------
def test_nan_voxels(tmp_path, caplog):
    model = small_model(tmp_path)
    det = Detector(model=model, device="cpu", restrict_to_lungs=False)
    vol = chest_volume(dtype=np.float32)
    arr = vol.array.copy()
    arr[5, 5, :10] = np.nan
    res = det.detect(vol.with_array(arr))
    assert res.input_shape_xyz is not None and "NaN" in caplog.text
    arr[:10] = np.nan
    with pytest.raises(InvalidVolumeError, match="1.2.3.0.*NaN"):
        det.detect(vol.with_array(arr))


def test_too_small_volume(tmp_path):
    det = Detector(model=small_model(tmp_path), device="cpu", restrict_to_lungs=False)
    vol = chest_volume(shape_kji=(3, 64, 64))
    with pytest.raises(InputTooSmallError, match="at least"):
        det.detect(vol)
    # small but above the minimum: padded to the network's divisibility and run
    res = det.detect(chest_volume(shape_kji=(8, 20, 20)))
    assert res.input_shape_xyz is not None
    # the runner's route (the lung box first, then the loader) refuses it as well, naming the series
    with pytest.raises(InputTooSmallError, match="covers only") as err:
        det.lung_roi(vol)
    assert str(vol.series_uid) in str(err.value)


@pytest.mark.slow
def test_long_series_runs_sliding_window_from_memmap(tmp_path):
    """A cheap analogue of 512×512×1000: a long memory-mapped int16 series, chunked preprocessing, sliding window."""
    model = small_model(tmp_path, roi=(64, 64, 64))
    vol = chest_volume(shape_kji=(420, 48, 48), spacing=(1.5, 1.5, 1.0))
    cache = CaseCache(tmp_path / "cache")
    cache.write("long", vol)
    mm = cache.read("long", mmap=True)
    assert not mm.array.flags.owndata  # memory-mapped, not read into memory
    res = Detector(model=model, device="cpu", restrict_to_lungs=False).detect(mm)
    assert res.sliding_window and res.input_shape_xyz[2] == 210


# --- model loading errors ----------------------------------------------------------------------
def test_missing_and_corrupt_weights(tmp_path):
    small_model(tmp_path)
    (tmp_path / "small.pt").write_bytes(b"not a torch file at all")
    with pytest.raises(ModelError, match="small.pt.*not a readable"):
        load_model(tmp_path / "small.json")
    (tmp_path / "small.pt").unlink()
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "small.json")


def test_mismatched_weights_list_keys(tmp_path):
    small_model(tmp_path)
    data = json.loads((tmp_path / "small.json").read_text())
    data["network"] = {**SMALL_ARCH, "fpn_channels": 32}
    (tmp_path / "small.json").write_text(json.dumps(data))
    with pytest.raises(WeightsMismatchError, match=r"mis-shaped key\(s\): .*classification_head"):
        load_model(tmp_path / "small.json")


def test_bundle_errors(tmp_path):
    tiny = {"w": torch.zeros(1)}
    with pytest.raises(BundleError, match="configs/inference.json"):
        load_bundle(tmp_path / "nothing")
    # weights that do not fit the bundle's network_def: every kind of mismatch is listed by key
    arch10 = {**BUNDLE_ARCHITECTURE, "depth": 10}
    state = dict(bundle_state_dict(arch=arch10))
    del state["feature_extractor.body.conv1.weight"]
    state["extra.weight"] = torch.zeros(2)
    state["classification_head.cls_logits.bias"] = torch.zeros(7)
    root = write_bundle(tmp_path / "b10", state=state, depth=10)
    with pytest.raises(WeightsMismatchError) as err:
        load_bundle(root)
    msg = str(err.value)
    assert "model.pt" in msg and "missing key(s): feature_extractor.body.conv1.weight" in msg
    assert "unexpected key(s): extra.weight" in msg and "classification_head.cls_logits.bias: file (7,) vs network (3,)" in msg
    cfg = inference_json()
    cfg["preprocessing"]["transforms"] = [t for t in cfg["preprocessing"]["transforms"] if t["_target_"] != "Spacingd"]
    with pytest.raises(BundleError, match="Spacingd"):
        load_bundle(write_bundle(tmp_path / "nospacing", config=cfg, state=tiny))
    cfg = inference_json()
    del cfg["anchor_generator"]
    with pytest.raises(BundleError, match="anchor_generator"):
        load_bundle(write_bundle(tmp_path / "noanchor", config=cfg, state=tiny))
    cfg = inference_json()
    cfg["network_def"]["_target_"] = "NoSuchNetwork"
    with pytest.raises(BundleError, match="network_def cannot be built"):
        load_bundle(write_bundle(tmp_path / "badnet", config=cfg, state=tiny))
    root = write_bundle(tmp_path / "noweights", state=tiny)
    (root / "models" / "model.pt").unlink()
    with pytest.raises(BundleError, match="neither models/model.pt nor models/model.ts"):
        load_bundle(root)


# --- outputs ----------------------------------------------------------------------------------
def test_cli_detect_writes_json_csv_png(tmp_path, capsys):
    import SimpleITK as sitk

    from pipeline.cli import main

    model_json = small_model(tmp_path).config.weights.parent / "small.json"
    vol = chest_volume(shape_kji=(40, 80, 80))
    sitk.WriteImage(vol.to_sitk(), str(tmp_path / "ct.nii.gz"))
    out = tmp_path / "out"
    rc = main(
        [
            "detect",
            str(tmp_path / "ct.nii.gz"),
            "--case-id",  # outputs named ct (by default: a digest of the image)
            "ct",
            "--out",
            str(out),
            "--bundle",
            str(model_json),
            "--device",
            "cpu",
            "--max-png",
            "2",
        ]
    )
    assert rc == 0
    data = json.loads((out / "ct.findings.json").read_text())
    assert data["restricted_to_lungs"] and "LPS" in data["coordinates"]
    n = len(data["findings"])
    assert n > 0
    with open(out / "ct.findings.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n and float(rows[0]["score"]) >= float(rows[-1]["score"])
    for rank, (row, f) in enumerate(zip(rows, data["findings"]), 1):  # the CSV says what the JSON says, in LPS mm
        assert int(row["rank"]) == rank and float(row["score"]) == pytest.approx(f["score"], abs=1e-5)
        xyz = [float(row[f"center_{a}_lps"]) for a in "xyz"]
        assert xyz == pytest.approx(f["center_lps"], abs=0.01)
        assert [float(row[f"box_min_{a}"]) for a in "xyz"] == pytest.approx(f["box_min_lps"], abs=0.01)
        assert [float(row[f"box_max_{a}"]) for a in "xyz"] == pytest.approx(f["box_max_lps"], abs=0.01)
        assert [int(row[f"voxel_{a}"]) for a in "ijk"] == f["voxel_ijk"] and int(row["slice_number"]) == f["slice_number"]
    f0 = data["findings"][0]
    ijk = vol.lps_to_index(f0["center_lps"])
    assert np.allclose(np.round(ijk), f0["voxel_ijk"]) and f0["slice_number"] == f0["voxel_ijk"][2] + 1
    pngs = sorted((out / "ct_png").glob("*.png"))
    assert len(pngs) == min(2, n) and pngs[0].read_bytes()[:4] == b"\x89PNG"
    assert "findings" in capsys.readouterr().out
    rc = main(["detect", str(tmp_path / "missing_dir"), "--out", str(out), "--bundle", str(model_json)])
    assert rc == 1


@pytest.mark.parametrize(
    ("spacing", "metadata", "flagged"),
    [
        ((1.4, 1.4, 2.5), {}, False),  # 2.5 mm: LUNA16's limit, not above it
        ((1.4, 1.4, 3.0), {}, True),
        ((1.4, 1.4, 2.0), {"SliceThickness": "5.0"}, True),  # thick slices reconstructed at a finer spacing
        ((1.4, 1.4, 3.0), {"SliceThickness": 1.0}, False),  # thin slices, spaced apart
    ],
)
def test_thick_slices_flag_the_findings(tmp_path, spacing, metadata, flagged):
    from pipeline.detection.findings import Findings

    det = Detector(model=small_model(tmp_path), device="cpu")
    base = chest_volume(shape_kji=(32, 80, 80), spacing=spacing)
    res = det.detect(CTVolume(base.array, base.geometry, metadata=metadata))
    assert ("thick_slices" in res.flags) is flagged, res.flags
    data = res.to_json()
    if flagged:
        assert res.flags["thick_slices"].startswith("thick slices: small nodules unreliable (")
        assert data["flags"] == [{"code": "thick_slices", "message": res.flags["thick_slices"]}]
        assert len(res) and all(row["flags"] == "thick_slices" for row in res.csv_rows())
    else:
        assert data["flags"] == [] and all(row["flags"] == "" for row in res.csv_rows())
    assert Findings.from_json(json.loads(json.dumps(data))).flags == res.flags


@pytest.mark.parametrize(("pixel_mm", "flagged"), [(2.2, False), (3.2, True)])
def test_coarse_pixels_flag_the_findings(tmp_path, pixel_mm, flagged):
    det = Detector(model=small_model(tmp_path), device="cpu")
    base = chest_volume(shape_kji=(40, 64, 64), spacing=(pixel_mm, pixel_mm, 2.0))
    res = det.detect(base)
    assert ("coarse_pixels" in res.flags) is flagged, res.flags
    if flagged:
        assert res.flags["coarse_pixels"] == "coarse pixels: small nodules unreliable (3.20 x 3.20 mm pixels > 2.5 mm)"
        assert {"code": "coarse_pixels", "message": res.flags["coarse_pixels"]} in res.to_json()["flags"]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            {"LossyImageCompression": "01", "LossyImageCompressionRatio": [10.0], "LossyImageCompressionMethod": ["ISO_10918_1"]},
            "lossy compressed: HU values and small nodules unreliable (ratio 10:1 by ISO_10918_1)",
        ),
        ({"LossyImageCompression": "00"}, None),
        ({}, None),
    ],
)
def test_lossy_compression_flags_the_findings(tmp_path, metadata, message):
    from pipeline.detection.findings import Findings

    det = Detector(model=small_model(tmp_path), device="cpu")
    base = chest_volume(shape_kji=(32, 80, 80), spacing=(1.4, 1.4, 2.0))
    res = det.detect(CTVolume(base.array, base.geometry, metadata=metadata))
    assert res.flags.get("lossy_compressed") == message, res.flags
    data = res.to_json()
    if message:
        assert data["flags"] == [{"code": "lossy_compressed", "message": message}]
        assert len(res) and all(row["flags"] == "lossy_compressed" for row in res.csv_rows())
    else:
        assert data["flags"] == []
    assert Findings.from_json(json.loads(json.dumps(data))).flags == res.flags


@pytest.mark.gpu
def test_cuda_amp_matches_cpu(tmp_path):
    model = small_model(tmp_path)
    vol = chest_volume(shape_kji=(40, 96, 96), spacing=(2.0, 2.0, 2.5))
    cpu = Detector(model=model, device="cpu", amp=False, restrict_to_lungs=False).detect(vol)
    gpu = Detector(model=model, device="cuda", amp=True, restrict_to_lungs=False).detect(vol)
    assert gpu.device.startswith("cuda") and gpu.timings_ms["model"] > 0
    top_cpu = [f for f in cpu if f.score > 0.6]
    assert top_cpu
    for f in top_cpu:  # every confident CPU finding has a GPU twin (AMP changes scores slightly)
        d = [np.linalg.norm(np.subtract(f.center_lps, g.center_lps)) for g in gpu]
        n = int(np.argmin(d))
        assert d[n] < 2.0 and abs(gpu[n].score - f.score) < 0.05


@pytest.mark.slow
def test_cli_detect_and_evaluate_from_dicom(tmp_path, capsys):
    """DICOM (feet-first, shuffled file names) → ctpipe detect → ctpipe evaluate: the big nodules are found in LPS."""
    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    if not DEMO_MODEL_JSON.is_file():
        pytest.fail(f"demo model missing: {DEMO_MODEL_JSON}")
    ph = generate_phantom(
        2, matrix=128, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=2, nodule_diameter_mm=(12.0, 20.0), patient_position="FFS"
    )
    case = write_phantom_case(ph, tmp_path / "case", quirks=("shuffled_names",))
    out = tmp_path / "out"
    assert main(["detect", str(case / "dicom"), "--out", str(out), "--case-id", "c2", "--device", "cpu", "--no-png"]) == 0
    # the summary line says the device and the number format the network ran in (bfloat16 on a CPU that runs it
    # natively, else float32), as the findings JSON records it
    summary = capsys.readouterr().out.splitlines()[0]
    assert f"cpu {json.loads((out / 'c2.findings.json').read_text())['precision']}," in summary, summary
    assert main(["evaluate", "--pred", str(out), "--truth", str(case), "--out", str(tmp_path / "eval"), "--bootstrap", "20"]) == 0
    res = json.loads((tmp_path / "eval" / "froc.json").read_text())
    assert res["n_nodules"] == 2 and res["sensitivity"][-1] == 1.0
    assert "CPM" in capsys.readouterr().out


def test_findings_repr_is_one_short_line():
    from pipeline.detection.findings import Finding, Findings

    items = [Finding((0.0, 0.0, 0.0), (-1.0, -1.0, -1.0), (1.0, 1.0, 1.0), 2.0, s, (0, 0, 0), 1) for s in np.linspace(1, 0, 400)]
    f = Findings(items[:3], series_uid="1.2.3", model="m", score_threshold=0.99, below_threshold=items[3:])
    text = repr(f)
    assert text.startswith("Findings(3 reported [1.00, 1.00, 0.99], 397 below 0.99, series=1.2.3") and len(text) < 200
    one = Finding((-86.11248, 82.4484, -9.1852), (-103.1, 67.4, -23.2), (-69.1, 97.4, 4.9), 30.6124, 0.99885, (168, 252, 78), 63)
    assert repr(one) == "Finding(score=0.999, center_lps=(-86.1, 82.4, -9.2) mm, box 30.6 mm, slice_number=63)"


def test_cli_detect_picks_one_series_of_a_study_folder(tmp_path, capsys):
    """A study folder with two CT series: ctpipe detect names both and the flag that picks one; --series-uid runs it."""
    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    uids = []
    for seed in (3, 4):
        vol = generate_phantom(seed, matrix=64, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=0).volume
        write_dicom_series(vol, tmp_path / "study" / f"series{seed}", seed=seed)
        uids.append(vol.series_uid)
    args = ["detect", str(tmp_path / "study"), "--out", str(tmp_path / "out"), "--no-png", "--no-dicom"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "2 CT series qualify" in err and all(u in err for u in uids) and "--series-uid" in err
    assert main([*args, "--series-uid", uids[1]]) == 0
    assert (tmp_path / "out" / f"{uids[1]}.findings.json").is_file()


# --- the scanner's slice numbers --------------------------------------------------------------
def _written_series(tmp_path, numbers=None, *, enhanced=False):
    """A small phantom written as DICOM (InstanceNumbers rewritten to ``numbers[k]`` when given), ingested again."""
    import pydicom

    from pipeline.ingest import load_series
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(5, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=1)
    paths = write_dicom_series(ph.volume, tmp_path / "dicom", enhanced=enhanced)
    if numbers is not None:
        for k, p in enumerate(paths):  # written in slice order k
            ds = pydicom.dcmread(p)
            ds.InstanceNumber = numbers[k]
            ds.save_as(p)
    return load_series(tmp_path / "dicom"), paths


def _check_findings_name_their_slices(findings, volume):
    md = volume.metadata
    assert len(findings.candidates) > 0
    for f in findings.candidates:
        k = f.voxel_ijk[2]
        assert f.slice_number == md["InstanceNumbers"][k] and f.sop_instance_uid == md["SOPInstanceUIDs"][k]


def test_ingest_records_instance_numbers_in_volume_order(tmp_path):
    from pipeline.ingest import load_series

    # reversed InstanceNumbers (data_samples/phantom_00003): slice k = 0 is InstanceNumber 64
    vol = load_series("data_samples/phantom_00003/dicom")
    assert vol.metadata["InstanceNumbers"] == list(range(64, 0, -1))
    assert len(set(vol.metadata["SOPInstanceUIDs"])) == 64
    # numbers that neither start at 1 nor run in steps of 1, backwards; the cache sidecar keeps them
    numbers = [300 - 5 * k for k in range(24)]
    vol, paths = _written_series(tmp_path, numbers)
    import pydicom

    assert vol.metadata["InstanceNumbers"] == numbers
    assert vol.metadata["SOPInstanceUIDs"] == [pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in paths]
    cache = CaseCache(tmp_path / "cache")
    cache.write("c", vol)
    back = cache.read("c", mmap=True).metadata
    assert back["InstanceNumbers"] == numbers and back["SOPInstanceUIDs"] == vol.metadata["SOPInstanceUIDs"]


def test_multiframe_slices_are_frames_of_one_instance(tmp_path):
    from pipeline.detection.findings import slice_number_source, slice_ref

    vol, paths = _written_series(tmp_path, enhanced=True)
    md = vol.metadata
    assert len(paths) == 1 and len(set(md["SOPInstanceUIDs"])) == 1 and len(md["SOPInstanceUIDs"]) == 24
    assert sorted(md["FrameNumbers"]) == list(range(1, 25)) and "InstanceNumbers" not in md
    assert slice_number_source(md, 24) == "FrameNumber"
    ref = slice_ref(3, md, 24)
    assert ref.number == md["FrameNumbers"][3] == ref.frame_number and ref.sop_instance_uid == md["SOPInstanceUIDs"][0]


def test_findings_give_instance_numbers_and_uids(tmp_path):
    from pipeline.detection.figures import write_finding_pngs

    numbers = [1000 - 3 * k for k in range(24)]
    vol, _ = _written_series(tmp_path, numbers)
    det = Detector(
        model=small_model(tmp_path, spacing=(2.0, 2.0, 4.0)), device="cpu", restrict_to_lungs=False, all_candidates=True
    )
    res = det.detect(vol, case_id="offset")
    assert res.slice_number_source == "InstanceNumber"
    _check_findings_name_their_slices(res, vol)
    doc = res.to_json()
    assert doc["slice_number_source"] == "InstanceNumber" and doc["findings"][0]["sop_instance_uid"].startswith("1.")
    res.write_csv(tmp_path / "f.csv")
    rows = list(csv.DictReader(open(tmp_path / "f.csv")))
    assert [int(r["slice_number"]) for r in rows] == [f.slice_number for f in res]
    assert all(int(r["slice_number"]) in numbers for r in rows)
    # the runner's path: metadata from the cache sidecar, the loader's input, then post-processing
    cache = CaseCache(tmp_path / "cache")
    cache.write("offset", vol)
    from pipeline.load import preprocess_volume

    case = preprocess_volume(cache.read("offset", mmap=True), det.spec, device="cpu", case_id="offset")
    loaded = det.detect_loaded(case, metadata=cache.entry("offset").sidecar["metadata"])
    _check_findings_name_their_slices(det.postprocess(cache.read("offset", mmap=True), loaded), vol)
    assert write_finding_pngs(vol, res, tmp_path / "png", max_findings=1)


@pytest.mark.slow
def test_real_series_slice_numbers(tmp_path):
    """The real RT-planning chest (InstanceNumber 1 at the top, so k = 0 is the last instance)."""
    import pydicom

    from tests._support.real_ct import require_real_ct, rt_planning_chest

    case = rt_planning_chest()  # skips with a reason when ../shared/real_ct is absent
    vol = case.volume
    md = vol.metadata
    nk = vol.shape[0]
    assert md["InstanceNumbers"][0] == nk and md["InstanceNumbers"][-1] == 1  # runs against k
    # each slice's numbers are those of the file at that slice's position
    by_z = {}
    for p in (require_real_ct() / "chest_ct_rt_planning_dicom").glob("*.dcm"):
        ds = pydicom.dcmread(p, stop_before_pixels=True)
        by_z[round(float(ds.ImagePositionPatient[2]), 2)] = (int(ds.InstanceNumber), str(ds.SOPInstanceUID))
    for k in (0, nk // 2, nk - 1):
        z = round(float(vol.geometry.index_to_lps([0, 0, k])[2]), 2)
        assert by_z[z] == (md["InstanceNumbers"][k], md["SOPInstanceUIDs"][k])
    det = Detector(model=small_model(tmp_path, spacing=(4.0, 4.0, 4.0)), device="cpu", all_candidates=True, postprocess=False)
    res = det.detect(vol, case_id="rt")
    assert res.slice_number_source == "InstanceNumber"
    _check_findings_name_their_slices(res, vol)


def test_detect_keeps_one_model_per_device_whatever_names_it(monkeypatch):
    """``detect(vol)`` and ``detect(vol, device="cpu")`` on a CPU machine run on one device: one model in memory."""
    import pipeline.detection.infer as infer

    monkeypatch.setattr(infer, "_DETECTORS", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    built: list[str | None] = []

    class Counting:
        def __init__(self, *, bundle=None, device=None):
            built.append(device)

        def detect(self, volume, **options):
            return []

    monkeypatch.setattr(infer, "Detector", Counting)
    vol = chest_volume()
    for device in (None, "cpu", None):
        infer.detect(vol, device=device)
    assert built == [None] and list(infer._DETECTORS) == [(None, "cpu")]


def test_the_findings_csv_names_each_findings_slice_by_its_sop_instance_uid(tmp_path):
    """The README: findings name the InstanceNumber and SOP Instance UID of their nearest slice. The JSON did; the CSV
    (what a PACS user opens to look a finding up) gave the InstanceNumber alone."""
    from pipeline.detection.findings import Findings
    from tests._support.detection import two_mm_finding

    f = two_mm_finding(sop_instance_uid="1.2.826.0.1.3680043.8.498.7")
    path = Findings([f], series_uid="1.2.3", score_threshold=0.5, model="demo").write_csv(tmp_path / "c.findings.csv")
    with open(path, newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["slice_number"] == "7" and row["sop_instance_uid"] == "1.2.826.0.1.3680043.8.498.7"
    assert row["frame_number"] == ""  # a single-frame series: no frame


def test_cli_detect_states_a_quality_flag_once(tmp_path, capsys):
    """The thick-slice warning under the summary line, not also as a log line on stderr (was: both)."""
    import logging

    import SimpleITK as sitk

    from pipeline.cli import main

    model_json = small_model(tmp_path).config.weights.parent / "small.json"
    vol = chest_volume(shape_kji=(32, 80, 80), spacing=(1.4, 1.4, 3.0))
    sitk.WriteImage(vol.to_sitk(), str(tmp_path / "ct.nii.gz"))
    argv = ["detect", str(tmp_path / "ct.nii.gz"), "--out", str(tmp_path / "out"), "--bundle", str(model_json)]
    assert main([*argv, "--device", "cpu", "--no-png"]) == 0
    out, err = capsys.readouterr()
    assert out.count("thick slices: small nodules unreliable") == 1, out
    assert "thick slices" not in err, err
    # notebooks (no ctpipe console) still get the warning through the pipeline loggers
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("pipeline").addHandler(handler)
    try:
        Detector(model=small_model(tmp_path), device="cpu").detect(vol)
    finally:
        logging.getLogger("pipeline").removeHandler(handler)
    assert any("thick slices" in r.getMessage() and r.levelno == logging.WARNING for r in records)
