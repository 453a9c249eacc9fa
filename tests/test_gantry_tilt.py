"""Tilted-gantry series resampled onto an orthogonal grid that covers every source voxel.

Each synthetic series is written with pydicom: tilted image planes whose ImagePositionPatient advances along the table
(not along the slice normal), holding bright balls near the field of view's edges at known LPS positions. After
ingest with ``allow_gantry_tilt`` every ball is there, whole, at its LPS position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import load_series
from pipeline.ingest.padding import PADDING_HU
from tests._support.dicom import write_series

BACKGROUND_HU = -1000.0
MARKER_HU = 1000.0
RADIUS_MM = 2.5
ROWS, COLS, N, STEP = 32, 28, 16, 2.0
SPACING = (1.0, 1.0)  # PixelSpacing (row spacing, column spacing), mm


@dataclass
class TiltedSeries:
    folder: Path
    row: np.ndarray
    col: np.ndarray
    positions: np.ndarray  # (N, 3) LPS mm, in file order
    markers: np.ndarray  # (m, 3) LPS mm
    source_counts: list[int]  # source pixels inside each marker
    normal_step: float


def _pixel_lps(position: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """LPS (mm) of every pixel centre of one image, ``[j, i, 3]``."""
    jj, ii = np.mgrid[:ROWS, :COLS]
    return position + ii[..., None] * SPACING[1] * row + jj[..., None] * SPACING[0] * col


def _write_tilted(folder: Path, *, tilt_deg: float, feet_first: bool, shear_along_rows: bool = False) -> TiltedSeries:
    """A series of tilted planes; the table moves along S (head first) or I (feet first).

    Head first: row cosine L (1, 0, 0); feet first: row cosine R (-1, 0, 0), as scanners write supine patients.
    The gantry tilts about the row axis (the column cosine leans towards S by ``tilt_deg``), or, with
    ``shear_along_rows``, the row cosine leans instead (the shear lies along the rows).
    """
    t = np.radians(tilt_deg)
    sign = -1.0 if feet_first else 1.0
    if shear_along_rows:
        row = np.array([sign * np.cos(t), 0.0, np.sin(t)])
        col = np.array([0.0, 1.0, 0.0])
    else:
        row = np.array([sign, 0.0, 0.0])
        col = np.array([0.0, np.cos(t), np.sin(t)])
    start = np.array([-14.0, -16.0, 40.0 if feet_first else -40.0])
    travel = np.array([0.0, 0.0, -STEP if feet_first else STEP])
    positions = np.array([start + k * travel for k in range(N)])
    # balls 3 pixels inside each edge of slices 3 and N - 4: where the shear moves them past the original grid's edge
    markers = np.array(
        [
            positions[k] + i * SPACING[1] * row + j * SPACING[0] * col
            for k in (3, N - 4)
            for i, j in ((3, 3), (COLS - 4, ROWS - 4), (3, ROWS - 4), (COLS - 4, 3))
        ]
    )
    hu = np.full((N, ROWS, COLS), BACKGROUND_HU)
    counts = [0] * len(markers)
    for k in range(N):
        lps = _pixel_lps(positions[k], row, col)
        for m, c in enumerate(markers):
            inside = np.linalg.norm(lps - c, axis=-1) <= RADIUS_MM
            hu[k][inside] = MARKER_HU
            counts[m] += int(inside.sum())
    write_series(
        folder,
        n=N,
        rows=ROWS,
        cols=COLS,
        pixel_spacing=SPACING,
        orientation=(*row, *col),
        positions=positions.tolist(),
        hu=hu.astype(np.int16),
        tweak=lambda k, ds: setattr(ds, "GantryDetectorTilt", f"{tilt_deg:g}"),
    )
    normal_step = abs(float(travel @ np.cross(row, col)))
    return TiltedSeries(folder, row, col, positions, markers, counts, normal_step)


CASES = [
    pytest.param(15.0, False, False, id="15deg-head-first"),
    pytest.param(-20.0, False, False, id="minus20deg-head-first"),
    pytest.param(15.0, True, False, id="15deg-feet-first"),
    pytest.param(-20.0, True, False, id="minus20deg-feet-first"),
    pytest.param(-20.0, False, True, id="minus20deg-shear-along-rows"),
]


@pytest.mark.parametrize(("tilt_deg", "feet_first", "along_rows"), CASES)
def test_tilt_correction_keeps_every_marker_whole_at_its_lps_position(tmp_path, tilt_deg, feet_first, along_rows):
    s = _write_tilted(tmp_path, tilt_deg=tilt_deg, feet_first=feet_first, shear_along_rows=along_rows)
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    g = vol.geometry
    assert vol.metadata["GantryTiltCorrectedDeg"] == pytest.approx(abs(tilt_deg), abs=1e-3)
    k, j, i = np.meshgrid(*(np.arange(n) for n in g.shape), indexing="ij")
    lps = g.index_to_lps(np.stack([i, j, k], axis=-1).reshape(-1, 3)).reshape(*g.shape, 3)
    voxel_mm3 = float(np.prod(g.spacing))
    for m, c in enumerate(s.markers):
        near = np.linalg.norm(lps - c, axis=-1) <= RADIUS_MM + 2.5
        values = vol.array[near]
        assert values.max() > 0.5 * MARKER_HU, f"marker {m} at {c.round(2).tolist()} mm is cut off"
        weight = np.clip(values - BACKGROUND_HU, 0, None)
        centroid_ijk = (np.stack([i[near], j[near], k[near]], axis=1) * weight[:, None]).sum(0) / weight.sum()
        want_ijk = g.lps_to_index(c)
        np.testing.assert_array_less(np.abs(centroid_ijk - want_ijk), 0.5, err_msg=f"marker {m}")
        volume = float((values > 0).sum()) * voxel_mm3
        source_volume = s.source_counts[m] * SPACING[0] * SPACING[1] * s.normal_step
        assert volume == pytest.approx(source_volume, rel=0.15), f"marker {m}"


@pytest.mark.parametrize(("tilt_deg", "feet_first", "along_rows"), CASES)
def test_tilt_corrected_grid_covers_every_source_pixel_and_pads_with_air(tmp_path, tilt_deg, feet_first, along_rows):
    s = _write_tilted(tmp_path, tilt_deg=tilt_deg, feet_first=feet_first, shear_along_rows=along_rows)
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    g = vol.geometry
    # the orthogonal grid: same pixel spacing, the slice normal as third axis, slices at the source slices
    assert g.spacing[:2] == pytest.approx((SPACING[1], SPACING[0]))
    assert g.spacing[2] == pytest.approx(s.normal_step)
    assert g.shape[0] == N
    covered = np.zeros(g.shape, dtype=bool)
    for pos in s.positions:
        ijk = g.lps_to_index(_pixel_lps(pos, s.row, s.col).reshape(-1, 3))
        # (ImagePositionPatient is written as decimal text: its last digits are rounded)
        assert np.all(ijk >= -1e-3), "a source pixel lies before the grid"
        assert np.all(ijk <= np.array(g.size_ijk) - 1 + 1e-3), "a source pixel lies beyond the grid"
        kk = int(round(float(ijk[0, 2])))
        assert np.allclose(ijk[:, 2], kk, atol=1e-3)  # each source slice is one slice of the grid
        lo = np.floor(ijk.min(axis=0) + 1e-3).astype(int)
        hi = np.ceil(ijk.max(axis=0) - 1e-3).astype(int)
        covered[kk, lo[1] : hi[1] + 1, lo[0] : hi[0] + 1] = True
    # enlarged along the shear only, by the drift (rounded up to whole pixels)
    drift = float(np.linalg.norm(s.positions[-1] - s.positions[0]) * abs(np.sin(np.radians(tilt_deg))))
    grown = np.array(g.size_ijk[:2]) - (COLS, ROWS)
    assert sorted(grown.tolist()) == [0, int(np.ceil(drift - 1e-3))]
    # what no source slice covers is air, exactly
    assert (~covered).any()
    assert np.all(vol.array[~covered] == PADDING_HU)
    (warning,) = [w for w in vol.metadata["warnings"] if "gantry tilt" in w]
    assert "cut" not in warning and f"{abs(tilt_deg):.2f} deg" in warning, warning


def _source_images(folder: Path) -> dict[str, object]:
    """The tilted series' files with their pixels, by SOPInstanceUID."""
    import pydicom

    return {str(ds.SOPInstanceUID): ds for p in sorted(folder.iterdir()) for ds in [pydicom.dcmread(p)]}


def _image_geometry(ds) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """An image's own geometry as its header states it: position, row and column cosines, column and row spacing."""
    iop = np.array([float(v) for v in ds.ImageOrientationPatient])
    dy, dx = (float(v) for v in ds.PixelSpacing)
    return np.array([float(v) for v in ds.ImagePositionPatient]), iop[:3], iop[3:], dx, dy


@pytest.mark.parametrize("tilt_deg", [15.0, -20.0])
def test_dicom_seg_and_sr_of_a_tilt_corrected_volume_point_at_each_marker_in_its_source_image(tmp_path, tilt_deg):
    """SEG and SR of a tilt-corrected volume: each slice lies in the plane of its source image, shifted in-plane on the
    grown grid. Each marker's SEG frame references the image the marker was drawn in and, placed by the frame's
    ImagePositionPatient and that image's orientation and pixel spacing, lies within half a pixel of the marker's LPS
    position, on the marker's pixels of that image; the SR's point (SCOORD3D, LPS) is the marker's, referencing that
    image. Both pass dciodvfy; highdicom reads the SEG back onto the volume's grid."""
    import pydicom
    from scipy import ndimage

    from pipeline.detection.findings import Finding
    from pipeline.dicom_out import read_source_series, read_sr_findings, write_seg, write_sr
    from tests.test_dicom_out_sources import assert_valid

    s = _write_tilted(tmp_path / "dicom", tilt_deg=tilt_deg, feet_first=False)
    vol = load_series(tmp_path / "dicom", allow_gantry_tilt=True)
    g = vol.geometry
    assert g.shape[1:] != (ROWS, COLS)  # the grid grew: the slices are shifted off their images
    source = read_source_series(tmp_path / "dicom", vol)
    images = _source_images(tmp_path / "dicom")
    mask = vol.array > 0
    seg_path = write_seg(  # every slice's frame, empty ones included: each names its image
        tmp_path / "seg.dcm",
        source=source,
        volume=vol,
        score_threshold=0.5,
        organ_masks={"lung_left": mask},
        omit_empty_frames=False,
    )
    seg = pydicom.dcmread(seg_path)
    pixels = seg.pixel_array.reshape(-1, *g.shape[1:]).astype(bool)
    frame_of = {}
    for n, item in enumerate(seg.PerFrameFunctionalGroupsSequence):
        ref = item.DerivationImageSequence[0].SourceImageSequence[0]
        assert ref.SpatialLocationsPreserved == "NO"
        frame_of[str(ref.ReferencedSOPInstanceUID)] = n
    assert set(frame_of) == set(images)  # every slice's frame references an image of the source
    # the markers' image: the one drawn at the marker's slice (its ImagePositionPatient)
    by_position = {tuple(np.round(_image_geometry(ds)[0], 3)): uid for uid, ds in images.items()}
    findings = []
    for m, c in enumerate(s.markers):
        k = (3, N - 4)[m // 4]
        uid = by_position[tuple(np.round(s.positions[k], 3))]
        item = seg.PerFrameFunctionalGroupsSequence[frame_of[uid]]
        frame_ipp = np.array([float(v) for v in item.PlanePositionSequence[0].ImagePositionPatient])
        ipp, row, col, dx, dy = _image_geometry(images[uid])
        # the frame lies in the image's plane
        assert abs(float((frame_ipp - ipp) @ np.cross(row, col))) < 1e-3
        labels, count = ndimage.label(pixels[frame_of[uid]])
        assert count == 4, f"marker {m}: {count} blobs in its frame"
        centres = np.array(ndimage.center_of_mass(labels > 0, labels, range(1, count + 1)))  # (r, c)
        lps = frame_ipp + centres[:, 1:2] * dx * row + centres[:, 0:1] * dy * col
        near = lps[np.argmin(np.linalg.norm(lps - c, axis=1))]
        assert np.linalg.norm(near - c) <= 0.5 * min(dx, dy), (m, near.round(2).tolist(), c.round(2).tolist())
        # and it is on the marker's pixels of the image it references
        i, j = (int(round(float((near - ipp) @ row) / dx)), int(round(float((near - ipp) @ col) / dy)))
        hu = images[uid].pixel_array[j, i] * float(images[uid].RescaleSlope) + float(images[uid].RescaleIntercept)
        assert hu == MARKER_HU, (m, i, j, hu)
        ijk = np.rint(g.lps_to_index(c)).astype(int)
        findings.append(Finding(tuple(c), tuple(c - 2.5), tuple(c + 2.5), 5.0, 0.9 - 0.01 * m, tuple(ijk), int(ijk[2]) + 1))
    # the SEG read back by highdicom (by position) is the mask on the volume's grid
    import highdicom as hd

    got = hd.seg.segread(seg_path).get_volume(segment_numbers=[1])
    on = np.argwhere(got.array[..., 0] > 0)
    got_lps = (got.affine @ np.c_[on, np.ones(len(on))].T).T[:, :3]
    want_lps = g.index_to_lps(np.argwhere(mask)[:, ::-1].astype(float))
    assert len(got_lps) == len(want_lps)
    np.testing.assert_allclose(np.sort(got_lps, axis=0), np.sort(want_lps, axis=0), atol=1e-3)
    sr_path = write_sr(
        tmp_path / "sr.dcm",
        source=source,
        volume=vol,
        findings=findings,
        model_name="test",
        model_version="1",
        score_threshold=0.5,
    )
    table = read_sr_findings(sr_path).sort_values("score", ascending=False)
    for m, (_, row_) in enumerate(table.iterrows()):
        c = s.markers[m]
        np.testing.assert_allclose(row_[["center_x", "center_y", "center_z"]].to_numpy(float), c, atol=1e-2)
        k = (3, N - 4)[m // 4]
        assert row_["sop_instance_uid"] == by_position[tuple(np.round(s.positions[k], 3))], m
    assert_valid(seg_path, allowed_warnings=())
    assert_valid(sr_path, allowed_warnings=())


def test_tilt_corrected_case_cache_entry_reads_back_exactly(tmp_path):
    """``ctpipe ingest --allow-gantry-tilt`` caches the grown grid: the entry reads back the same HU, LPS geometry and
    tilt metadata as loading the folder (what detection and reconstruction then read)."""
    from pipeline.cache import CaseCache
    from pipeline.cli import main

    _write_tilted(tmp_path / "dicom", tilt_deg=-20.0, feet_first=True)
    assert main(["ingest", str(tmp_path / "dicom"), "--allow-gantry-tilt", "--out", str(tmp_path / "cache")]) == 0
    (entry,) = (tmp_path / "cache").glob("*.json")
    cached = CaseCache(tmp_path / "cache").read(entry.stem, verify=True)
    loaded = load_series(tmp_path / "dicom", allow_gantry_tilt=True)
    assert cached.geometry == loaded.geometry and cached.shape[1:] != (ROWS, COLS)
    np.testing.assert_array_equal(cached.array, loaded.array)
    for key in ("GantryTiltCorrectedDeg", "GantryTiltGrownColumnsRows", "warnings"):
        assert cached.metadata[key] == loaded.metadata[key]


@pytest.mark.slow
def test_detection_and_reconstruction_of_a_tilted_series_find_the_anatomy_at_its_lps_position(tmp_path, capsys):
    """A phantom scanned with a 15 deg gantry tilt, ingested with the correction: detection reports its nodules at
    their LPS centres and writes the DICOM SR referencing the source images, reconstruction meshes the lungs."""
    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(11, matrix=64, slices=24, n_nodules=2, pixel_spacing=2.0, slice_spacing=5.0)
    write_dicom_series(ph.volume, tmp_path / "dicom", quirks=["gantry_tilt"])
    assert main(["ingest", str(tmp_path / "dicom"), "--allow-gantry-tilt", "--out", str(tmp_path / "cache")]) == 0
    (entry,) = (tmp_path / "cache").glob("*.json")
    det = ["detect", str(entry), "--out", str(tmp_path / "det"), "--no-png", "--device", "cpu", "--case-id", "c"]
    assert main([*det, "--score-threshold", "0.3"]) == 0
    err = capsys.readouterr().err
    assert "not written" not in err and "gantry tilt of 15.00 deg" in err, err
    assert any((tmp_path / "det").glob("*sr*.dcm")), sorted(p.name for p in (tmp_path / "det").iterdir())
    findings = json.loads((tmp_path / "det" / "c.findings.json").read_text())["findings"]
    centres = np.array([f["center_lps"] for f in findings]).reshape(-1, 1, 3)
    truth = np.array([n.center_lps for n in ph.nodules]).reshape(1, -1, 3)
    # a phantom nodule found within a voxel (2 mm pixels, 4.8 mm between the corrected slices) of its LPS centre
    hits = np.all(np.abs(centres - truth) <= (2.0, 2.0, 5.0), axis=2)
    assert hits.any(), (truth.round(1).tolist(), centres.round(1).tolist())
    rec = ["reconstruct", str(entry), "--out", str(tmp_path / "rec"), "--device", "cpu", "--no-render", "--no-dicom"]
    assert main(rec) == 0
    measured = json.loads(next((tmp_path / "rec").glob("*_measurements.json")).read_text())
    assert next((tmp_path / "rec").glob("*_lung_left.stl")).stat().st_size > 0, measured


def test_a_cache_entry_of_the_earlier_cutting_tilt_correction_is_refused(tmp_path):
    """An entry cached by an earlier ctpipe, whose tilt correction kept the images' size and cut what the shift moved
    past the field of view's edge (its metadata has the tilt but not the grown columns and rows), is refused: ingest
    the case again, rather than detect on a volume with anatomy missing."""
    from pipeline.cache import CaseCache
    from pipeline.cli import main
    from pipeline.errors import CacheError

    _write_tilted(tmp_path / "dicom", tilt_deg=15.0, feet_first=False)
    assert main(["ingest", str(tmp_path / "dicom"), "--allow-gantry-tilt", "--out", str(tmp_path / "cache")]) == 0
    (entry,) = (tmp_path / "cache").glob("*.json")
    sidecar = json.loads(entry.read_text())
    del sidecar["metadata"]["GantryTiltGrownColumnsRows"]
    entry.write_text(json.dumps(sidecar))
    with pytest.raises(CacheError) as err:
        CaseCache(tmp_path / "cache").read(entry.stem)
    text = str(err.value)
    assert "gantry tilt" in text and "cut" in text and "ingest the case again" in text and "--allow-gantry-tilt" in text


def test_a_tilted_enhanced_ct_file_is_corrected_onto_the_grown_grid_and_says_so(tmp_path):
    """An Enhanced CT (multi-frame) tilted series gets the same correction as single-frame files: the grown grid,
    the tilt in the metadata (which the DICOM results' refusal reads) and the warning."""
    import pydicom

    from tests._support.dicom import write_enhanced

    tilt = np.radians(15.0)
    path, _ = write_enhanced(tmp_path / "mf.dcm", n=12, rows=16, cols=20, pixel_spacing=(0.7, 0.8), step=1.25)
    ds = pydicom.dcmread(path)
    ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence[0].ImageOrientationPatient = [
        1,
        0,
        0,
        0,
        float(np.cos(tilt)),
        float(np.sin(tilt)),
    ]
    ds.save_as(path, enforce_file_format=True)
    vol = load_series(path, allow_gantry_tilt=True)
    # the table moves 11 × 1.25 mm along z: 13.75 mm × sin 15° = 3.56 mm = 5.1 rows of 0.7 mm, so 6 rows more
    assert vol.shape == (12, 16 + 6, 20)
    assert vol.metadata["GantryTiltCorrectedDeg"] == pytest.approx(15.0, abs=1e-3)
    assert vol.metadata["GantryTiltGrownColumnsRows"] == [0, 6]
    assert any("gantry tilt of 15.00 deg" in w for w in vol.metadata["warnings"])


@pytest.fixture(scope="module")
def tilted_real_chest(tmp_path_factory) -> dict:
    """The real planning chest (``chest``), written onto a 15 deg tilted gantry's planes by the phantom writer
    (``folder``, its files ``paths``) and read back corrected at ingest (``vol``): made once, read-only for the tests."""
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.real_ct import require_real_ct

    chest = load_series(require_real_ct() / "chest_ct_rt_planning_dicom")  # skips with a reason when absent
    folder = tmp_path_factory.mktemp("tilted_chest")
    paths = write_dicom_series(chest, folder, quirks=["gantry_tilt"])
    return {"chest": chest, "folder": folder, "paths": paths, "vol": load_series(folder, allow_gantry_tilt=True)}


@pytest.mark.slow
def test_a_real_chest_scanned_with_a_tilted_gantry_keeps_all_its_tissue(tilted_real_chest):
    """The real radiotherapy-planning chest resampled onto a 15 deg tilted gantry's planes (the phantom writer's tilt:
    the couch and the back reach the lower edge of the tilted images) and corrected at ingest: the tissue above
    -500 HU in the corrected volume is the tissue in the tilted images (the correction onto a grid of the images' size
    cut the 85 mL of it that the shift moved past the posterior edge: 0.37 % less tissue, net of the repeated edge)."""
    import pydicom

    chest = tilted_real_chest["chest"]
    tissue_pixels = 0
    for path in tilted_real_chest["paths"]:
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        tissue_pixels += int((hu > -500).sum())
    vol = tilted_real_chest["vol"]
    assert vol.shape[1] > chest.shape[1] and vol.shape[2] == chest.shape[2]
    tissue_voxels = int((vol.array > -500).sum())
    assert tissue_voxels == pytest.approx(tissue_pixels, rel=0.001)


@pytest.mark.parametrize("tilt_deg", [0.05, -0.05])
def test_a_sub_pixel_tilt_keeps_the_images_grid_and_its_dicom_seg(tmp_path, tilt_deg):
    """A tilt above the tolerance whose whole drift is a fraction of a pixel (0.05 deg over 30 mm: 0.03 px) keeps the
    images' grid, origin at the first image, with no row of air before the first one or after the last; the SEG is
    written, each frame at its source image's position."""
    import pydicom

    from pipeline.dicom_out.api import write_seg

    s = _write_tilted(tmp_path / "dicom", tilt_deg=tilt_deg, feet_first=False)
    vol = load_series(tmp_path / "dicom", allow_gantry_tilt=True)
    assert vol.metadata["GantryTiltCorrectedDeg"] == pytest.approx(abs(tilt_deg), abs=1e-3)
    assert vol.shape == (N, ROWS, COLS) and vol.metadata["GantryTiltGrownColumnsRows"] == [0, 0]
    np.testing.assert_allclose(vol.geometry.origin, s.positions[0], atol=1e-6)
    path = write_seg(
        tmp_path / "seg.dcm",
        source=tmp_path / "dicom",
        volume=vol,
        score_threshold=0.5,
        organ_masks={"lung_left": vol.array > 0},
        omit_empty_frames=False,  # a frame per slice, empty ones included: each at its image's position
    )
    ds = pydicom.dcmread(path)
    assert (int(ds.Rows), int(ds.Columns)) == (ROWS, COLS)
    frames = ds.PerFrameFunctionalGroupsSequence
    got = [[float(v) for v in f.PlanePositionSequence[0].ImagePositionPatient] for f in frames]
    np.testing.assert_allclose(got, s.positions, atol=1e-6)
    (warning,) = [w for w in vol.metadata["warnings"] if "gantry tilt" in w]
    assert f"{abs(tilt_deg):.2f} deg" in warning and "keeps the images' size" in warning, warning


def test_detect_on_a_tilted_dicom_folder_names_its_allow_gantry_tilt_option(tmp_path, capsys):
    """``ctpipe detect`` on a tilted-gantry DICOM folder without the correction is refused naming the option that
    corrects it in that command (not only ingest's and run's), before any model is loaded."""
    from pipeline.cli import main

    _write_tilted(tmp_path / "dicom", tilt_deg=15.0, feet_first=False)
    assert main(["detect", str(tmp_path / "dicom"), "--out", str(tmp_path / "det"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "gantry tilt" in err and "ctpipe detect --allow-gantry-tilt" in err, err


@pytest.mark.slow
def test_detect_corrects_a_tilted_dicom_folder_with_allow_gantry_tilt(tmp_path, capsys):
    """``ctpipe detect DICOM --allow-gantry-tilt`` detects a tilted series directly (as ``ctpipe ingest`` then detect
    on the cache entry): the nodules at their LPS centres, and the SR referencing the source images."""
    import pydicom

    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(11, matrix=64, slices=24, n_nodules=2, pixel_spacing=2.0, slice_spacing=5.0)
    paths = write_dicom_series(ph.volume, tmp_path / "dicom", quirks=["gantry_tilt"])
    det = ["detect", str(tmp_path / "dicom"), "--out", str(tmp_path / "det"), "--no-png", "--device", "cpu"]
    assert main([*det, "--case-id", "c", "--score-threshold", "0.3", "--allow-gantry-tilt"]) == 0
    err = capsys.readouterr().err
    assert "gantry tilt of 15.00 deg" in err and "not written" not in err, err
    findings = json.loads((tmp_path / "det" / "c.findings.json").read_text())["findings"]
    centres = np.array([f["center_lps"] for f in findings]).reshape(-1, 1, 3)
    truth = np.array([n.center_lps for n in ph.nodules]).reshape(1, -1, 3)
    assert np.all(np.abs(centres - truth) <= (2.0, 2.0, 5.0), axis=2).any(), (truth.round(1).tolist(), centres.round(1))
    (sr_path,) = (tmp_path / "det").glob("*.dcm")
    sources = {str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in paths}
    sr = pydicom.dcmread(sr_path)
    referenced = {
        str(r.ReferencedSOPInstanceUID)
        for e in sr.CurrentRequestedProcedureEvidenceSequence
        for s in e.ReferencedSeriesSequence
        for r in s.ReferencedSOPSequence
    }
    assert referenced and referenced <= sources


@pytest.mark.slow
def test_run_with_allow_gantry_tilt_completes_a_tilted_case_with_its_sr_and_seg(tmp_path):
    """``ctpipe run`` with ``ingest.allow_gantry_tilt`` and the default DICOM outputs completes a tilted phantom's
    case: findings, PNGs, SR and SEG, the SEG's frames each in the plane of the source image it references."""
    import pydicom

    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(11, matrix=64, slices=24, n_nodules=2, pixel_spacing=2.0, slice_spacing=5.0)
    paths = write_dicom_series(ph.volume, tmp_path / "src" / "dicom", quirks=["gantry_tilt"])
    run = ["run", str(tmp_path / "src"), "--out", str(tmp_path / "run"), "--device", "cpu", "--quiet"]
    # no recon renderings (the MPRs, MIPs and 3-D preview) and no throughput report: none of the results checked here
    off = ["--set", "reconstruct.renderings=false", "--set", "report.enabled=false"]
    assert main([*run, "--set", "ingest.allow_gantry_tilt=true", *off]) == 0
    (case,) = (tmp_path / "run" / "cases").iterdir()
    assert (case / "dicom" / "sr.dcm").is_file() and any((case / "findings_png").glob("*.png"))
    from pipeline.dicom_out.sr_read import read_sr_case

    sr_case = read_sr_case(case / "dicom" / "sr.dcm")  # the interpolated emphysema index is flagged, not reported
    assert "interpolated" in sr_case["quality_flags"]
    assert "emphysema_index_pct" not in sr_case["measurements"]
    images = {str(ds.SOPInstanceUID): ds for p in paths for ds in [pydicom.dcmread(p, stop_before_pixels=True)]}
    seg = pydicom.dcmread(case / "dicom" / "seg.dcm")
    for item in seg.PerFrameFunctionalGroupsSequence:
        ref = item.DerivationImageSequence[0].SourceImageSequence[0]
        ipp, row, col, _, _ = _image_geometry(images[str(ref.ReferencedSOPInstanceUID)])
        frame_ipp = np.array([float(v) for v in item.PlanePositionSequence[0].ImagePositionPatient])
        assert abs(float((frame_ipp - ipp) @ np.cross(row, col))) < 1e-3


def test_the_seg_of_a_tilted_enhanced_ct_file_references_each_frame_in_its_plane(tmp_path):
    """A tilted Enhanced CT (multi-frame) source: each SEG frame names the source frame of its slice and lies in that
    frame's plane, shifted in-plane onto the grown grid (spatial locations not preserved)."""
    import pydicom

    from pipeline.dicom_out import write_seg
    from pipeline.ingest.multiframe import read_frames
    from tests._support.dicom import write_enhanced

    tilt = np.radians(15.0)
    path, _ = write_enhanced(tmp_path / "mf.dcm", n=12, rows=16, cols=20, pixel_spacing=(0.7, 0.8), step=1.25)
    ds = pydicom.dcmread(path)
    orientation = [1.0, 0.0, 0.0, 0.0, float(np.cos(tilt)), float(np.sin(tilt))]
    ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence[0].ImageOrientationPatient = orientation
    ds.save_as(path, enforce_file_format=True)
    vol = load_series(path, allow_gantry_tilt=True)
    mask = np.zeros(vol.shape, dtype=bool)
    mask[:, 8:12, 5:9] = True
    seg = pydicom.dcmread(
        write_seg(tmp_path / "seg.dcm", source=path, volume=vol, score_threshold=0.5, organ_masks={"lung_left": mask})
    )
    assert (int(seg.Rows), int(seg.Columns)) == (16 + 6, 20)
    frames = {f.frame + 1: np.asarray(f.position, dtype=float) for f in read_frames(path, pydicom.dcmread(path))}
    normal = np.cross(orientation[:3], orientation[3:])
    seen = set()
    for item in seg.PerFrameFunctionalGroupsSequence:
        ref = item.DerivationImageSequence[0].SourceImageSequence[0]
        assert ref.SpatialLocationsPreserved == "NO"
        number = int(ref.ReferencedFrameNumber)
        frame_ipp = np.array([float(v) for v in item.PlanePositionSequence[0].ImagePositionPatient])
        assert abs(float((frame_ipp - frames[number]) @ normal)) < 1e-3, number
        seen.add(number)
    assert seen == set(frames)


def test_reconstruct_on_a_tilted_dicom_folder_names_its_allow_gantry_tilt_option(tmp_path, capsys):
    """``ctpipe reconstruct`` on a tilted-gantry DICOM folder without the correction is refused naming the option
    that corrects it in that command, and writes no --out folder."""
    from pipeline.cli import main

    _write_tilted(tmp_path / "dicom", tilt_deg=15.0, feet_first=False)
    rec = ["reconstruct", str(tmp_path / "dicom"), "--out", str(tmp_path / "rec"), "--device", "cpu", "--no-render"]
    assert main(rec) == 1
    err = capsys.readouterr().err
    assert "gantry tilt" in err and "ctpipe reconstruct --allow-gantry-tilt" in err, err
    assert not (tmp_path / "rec").exists()


@pytest.mark.slow
def test_reconstruct_corrects_a_tilted_dicom_folder_with_allow_gantry_tilt(tmp_path, capsys):
    """``ctpipe reconstruct DICOM --allow-gantry-tilt`` reconstructs a tilted series directly (as ``ctpipe ingest``
    then reconstruct on the cache entry): both lungs meshed, their volumes those of the untilted phantom's."""
    from pipeline.cli import main
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(11, matrix=64, slices=24, n_nodules=2, pixel_spacing=2.0, slice_spacing=5.0)
    write_dicom_series(ph.volume, tmp_path / "dicom", quirks=["gantry_tilt"])
    rec = ["reconstruct", str(tmp_path / "dicom"), "--out", str(tmp_path / "rec"), "--device", "cpu", "--no-render"]
    assert main([*rec, "--no-dicom", "--allow-gantry-tilt"]) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert "gantry tilt of 15.00 deg" in err, err
    # the interpolation smoothed the noise: the emphysema index is printed marked, with the flag that says why
    assert "[interpolated]" in captured.out, captured.out
    (line,) = [x for x in captured.out.splitlines() if x.startswith("lungs total")]
    assert "unreliable:" in line and "interpolated" in line, line
    assert next((tmp_path / "rec").glob("*_lung_left.stl")).stat().st_size > 0
    assert next((tmp_path / "rec").glob("*_lung_right.stl")).stat().st_size > 0


@pytest.mark.slow
def test_a_tilted_phantom_keeps_its_airway_and_its_lung_and_body_volumes(tmp_path):
    """A whole-chest phantom written with a 15 deg gantry tilt, corrected at ingest, is segmented as the untilted
    one: the airway is found (the tilted images once held air, not anatomy, where they reached past the phantom's
    slab, and through it the trachea joined the air around the body: "airway not in scan"), and the lungs, airway
    and body volumes are within a few percent of the untilted phantom's."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.reconstruction.segment import segment_organs

    ph = generate_phantom(3, matrix=96, n_nodules=0, pixel_spacing=2.0, slice_spacing=3.0)
    write_dicom_series(ph.volume, tmp_path, quirks=["gantry_tilt"])
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    organs = ["body", "lung_left", "lung_right", "airway"]
    tilted = segment_organs(vol, organs=organs, device="cpu")
    assert tilted.info.get("airway") == "found", (tilted.info, tilted.errors)
    straight = segment_organs(ph.volume, organs=organs, device="cpu")
    for organ in organs:
        ml = float(tilted.masks[organ].sum()) * float(np.prod(vol.geometry.spacing)) / 1000.0
        ml0 = float(straight.masks[organ].sum()) * float(np.prod(ph.volume.geometry.spacing)) / 1000.0
        assert ml == pytest.approx(ml0, rel=0.05 if organ != "airway" else 0.15), (organ, ml, ml0)


@pytest.mark.slow
def test_the_detectors_lung_search_on_a_tilt_corrected_grid_leaves_out_the_padding_wedge(tmp_path):
    """The voxels of the grown grid that no tilted image covers (-1024 HU padding at the anterior and posterior
    edges) are air beside the body, not lung: neither the detector's quick lung mask nor the segmented lung region
    it limits findings to holds any of them, and both still hold the lungs."""
    from pipeline.detection.lungs import quick_lung_mask, segmented_lung_region
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    # without noise the phantom's air is -1000 HU: only the padding is exactly PADDING_HU
    ph = generate_phantom(3, matrix=96, n_nodules=0, pixel_spacing=2.0, slice_spacing=3.0, noise_hu=0.0)
    write_dicom_series(ph.volume, tmp_path, quirks=["gantry_tilt"])
    vol = load_series(tmp_path, allow_gantry_tilt=True)
    grown_rows = vol.metadata["GantryTiltGrownColumnsRows"][1]
    padding_kji = np.argwhere(vol.array == PADDING_HU)
    # each slice misses `grown_rows` rows in all (split before and after its image), less the blended edge rows
    assert len(padding_kji) >= 0.8 * grown_rows * vol.shape[0] * vol.shape[2]
    padding_ijk = padding_kji[:, ::-1]
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    lung_ijk = np.argwhere(lungs)[::7, ::-1].astype(np.float64)
    lung_ijk = np.round(vol.lps_to_index(ph.volume.geometry.index_to_lps(lung_ijk)))  # on the corrected grid
    for region in (quick_lung_mask(vol), segmented_lung_region(vol, device="cpu")):
        assert not region.near(padding_ijk, 0.0).any()
        assert region.near(lung_ijk, 4.0).mean() > 0.95  # the lungs themselves are searched


def _within(stack, *, on) -> np.ndarray:
    """Bool ``[k, j, 1]`` on the grid of ``on``: its voxels between the first and last slice of ``stack`` along that
    stack's slice normal (the same for every column: both grids' rows run along LPS x)."""
    k, j = np.meshgrid(np.arange(on.shape[0]), np.arange(on.shape[1]), indexing="ij")
    ijk = np.column_stack([np.zeros(k.size), j.ravel(), k.ravel()]).astype(np.float64)
    kk = stack.lps_to_index(on.geometry.index_to_lps(ijk))[:, 2].reshape(k.shape)
    return ((kk >= -1e-3) & (kk <= stack.shape[0] - 1 + 1e-3))[:, :, None]


@pytest.mark.slow
def test_a_real_chest_scanned_with_a_tilted_gantry_keeps_its_airway_lungs_and_body(tilted_real_chest, tmp_path_factory):
    """The real planning chest resampled onto 15 deg tilted planes and corrected at ingest segments as the untilted
    chest: the airway is found, and where both scans hold the chest the lungs, airway and body volumes are those of
    the untilted chest; the grown grid's padding (voxels no tilted image covers, -1024 HU) adds no body and no air
    region joining the airway to the air around the patient."""
    from scipy import ndimage

    from pipeline.ingest.measured import measured_mask
    from pipeline.reconstruction.segment import segment_organs
    from tests._support.real_ct import segmented_rt_planning_chest

    chest, vol = tilted_real_chest["chest"], tilted_real_chest["vol"]
    organs = ["body", "lung_left", "lung_right", "airway"]
    tilted = segment_organs(vol, organs=organs, device="cpu")
    assert tilted.info.get("airway") == "found", (tilted.info, tilted.errors)
    straight_masks = segmented_rt_planning_chest(tmp_path_factory)  # the untilted chest's, segmented once for the suite
    # the tilted images' rows reach past the chest's slab at one end and stop short of it at the other (at the
    # scan's top and bottom): compare what both hold, voxels within the chest's slab and between the first and last
    # tilted image
    both, both_tilted = _within(vol, on=chest), _within(chest, on=vol)
    for organ, rel in (("body", 0.02), ("lung_left", 0.02), ("lung_right", 0.02), ("airway", 0.05)):
        ml = float((tilted.masks[organ] & both_tilted).sum()) * float(np.prod(vol.geometry.spacing)) / 1000.0
        ml0 = float((straight_masks[organ] & both).sum()) * float(np.prod(chest.geometry.spacing)) / 1000.0
        assert ml == pytest.approx(ml0, rel=rel), (organ, ml, ml0)
    # and where they lie: each organ's voxels of the untilted chest (two voxels in from its edge, every 37th) lie in
    # that organ of the corrected chest at the same LPS position. The volumes alone hold for a chest left sheared by
    # the slices' in-plane shift (up to 72 mm here): a shear keeps every volume.
    for organ, least in (("body", 0.995), ("lung_left", 0.995), ("lung_right", 0.995), ("airway", 0.97)):
        kji = np.argwhere(ndimage.binary_erosion(straight_masks[organ], iterations=2))[::37]
        ijk = np.round(vol.lps_to_index(chest.geometry.index_to_lps(kji[:, ::-1].astype(np.float64)))).astype(int)
        held = np.all((ijk >= 0) & (ijk < np.array(vol.shape[::-1])), axis=1)
        assert held.mean() > 0.95, organ
        share = float(tilted.masks[organ][tuple(ijk[held][:, ::-1].T)].mean())
        assert share >= least, (organ, share)
    # no organ in the voxels no tilted image measured (the grown grid's padding)
    measured = measured_mask(vol.geometry, vol.metadata)
    assert measured is not None and not measured.all()
    for organ in organs:
        assert not (tilted.masks[organ] & ~measured).any(), organ
