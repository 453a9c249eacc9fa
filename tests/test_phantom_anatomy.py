"""Synthetic chest phantom: anatomy in HU, masks, nodules and LPS geometry."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydicom.uid import UID
from scipy import ndimage

from pipeline.errors import PhantomError
from pipeline.phantom import MASK_NAMES, Nodule, Phantom, generate_phantom, load_ground_truth, load_masks

SMALL = dict(matrix=128, pixel_spacing=0.7, slice_spacing=1.25)


@pytest.fixture(scope="module")
def ph() -> Phantom:
    return generate_phantom(3, n_nodules=4, **SMALL)


@pytest.fixture(scope="module")
def ph_256() -> Phantom:
    return generate_phantom(5, matrix=256, pixel_spacing=0.7, slice_spacing=2.5, n_nodules=5)


def _centroid_lps(ph: Phantom, mask: np.ndarray) -> np.ndarray:
    kji = np.argwhere(mask).mean(axis=0)
    return ph.volume.geometry.index_to_lps(kji[::-1])


def test_same_seed_gives_identical_phantom(ph):
    again = generate_phantom(3, n_nodules=4, **SMALL)
    assert np.array_equal(again.volume.array, ph.volume.array)
    assert np.array_equal(again.nodule_labels, ph.nodule_labels)
    for name in MASK_NAMES:
        assert np.array_equal(again.masks[name], ph.masks[name])
    assert again.nodules == ph.nodules
    assert again.volume.metadata["SeriesInstanceUID"] == ph.volume.metadata["SeriesInstanceUID"]
    assert again.ground_truth() == ph.ground_truth()


def test_different_seeds_differ(ph):
    other = generate_phantom(4, n_nodules=4, **SMALL)
    assert not np.array_equal(other.volume.array, ph.volume.array)
    assert not np.array_equal(other.masks["lung_left"], ph.masks["lung_left"])
    assert other.volume.metadata["StudyInstanceUID"] != ph.volume.metadata["StudyInstanceUID"]
    assert other.volume.metadata["PatientID"] != ph.volume.metadata["PatientID"]


def test_volume_masks_and_metadata_types(ph):
    vol = ph.volume
    assert vol.array.dtype == np.float32
    assert set(ph.masks) == set(MASK_NAMES)
    for name, m in ph.masks.items():
        assert m.dtype == bool and m.shape == vol.shape, name
        assert m.any(), f"mask {name} is empty"
    assert ph.nodule_labels.dtype == np.uint8 and ph.nodule_labels.shape == vol.shape
    meta = vol.metadata
    for key in (
        "PatientID",
        "StudyInstanceUID",
        "SeriesInstanceUID",
        "SliceThickness",
        "ConvolutionKernel",
        "KVP",
        "PatientPosition",
    ):
        assert meta.get(key) not in (None, ""), key
    assert meta["Manufacturer"] == "ctpipe-phantom"
    assert meta["PatientPosition"] == "HFS"
    for key in ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID"):
        uid = UID(meta[key])
        assert uid.is_valid, meta[key]
    assert np.allclose(vol.geometry.direction, np.eye(3))


def test_hu_of_each_tissue(ph_256):
    ph = ph_256
    a = ph.volume.array
    m = ph.masks
    lungs = (m["lung_left"] | m["lung_right"]) & ~m["vessels"] & (ph.nodule_labels == 0)
    core = ndimage.binary_erosion(lungs, iterations=2)
    assert -900 <= np.median(a[core]) <= -750
    outside = ~ndimage.binary_dilation(m["body"], iterations=3)
    assert abs(np.median(a[outside]) + 1000) < 15
    bone = ndimage.binary_erosion(m["bone"])
    assert 300 <= np.median(a[bone]) <= 1500
    airway = ndimage.binary_erosion(m["airway"])
    assert np.median(a[airway]) < -900
    soft = ndimage.binary_erosion(m["body"], iterations=3) & ~ndimage.binary_dilation(
        m["lung_left"] | m["lung_right"] | m["bone"] | m["airway"], iterations=3
    )
    assert -120 <= np.median(a[soft]) <= 70
    # fat and muscle both present in the soft tissue
    assert np.mean((a[soft] > -140) & (a[soft] < -60)) > 0.05
    assert np.mean((a[soft] > 20) & (a[soft] < 80)) > 0.2
    vessels = ndimage.binary_erosion(m["vessels"])
    if vessels.any():
        assert np.median(a[vessels]) > -300


def test_left_lung_is_at_larger_lps_x(ph):
    left = _centroid_lps(ph, ph.masks["lung_left"])
    right = _centroid_lps(ph, ph.masks["lung_right"])
    assert left[0] > right[0] + 10
    assert abs(left[2] - right[2]) < 20


def test_lungs_do_not_touch_and_contain_vessels(ph):
    m = ph.masks
    grown = ndimage.binary_dilation(m["lung_left"], structure=np.ones((3, 3, 3), bool), iterations=2)
    assert not (grown & m["lung_right"]).any()
    assert not (m["lung_left"] & m["airway"]).any()
    assert not ((m["lung_left"] | m["lung_right"]) & m["bone"]).any()
    assert not (m["vessels"] & ~(m["lung_left"] | m["lung_right"])).any()
    for name in ("lung_left", "lung_right", "airway", "bone"):
        assert not (m[name] & ~m["body"]).any(), name


def test_nodules_inside_lungs_at_stated_positions(ph_256):
    ph = ph_256
    geom = ph.volume.geometry
    assert len(ph.nodules) == 5
    assert ph.nodule_labels.max() == len(ph.nodules)
    for n, nod in enumerate(ph.nodules, start=1):
        assert isinstance(nod, Nodule)
        mask = ph.nodule_labels == n
        assert mask.any()
        assert ph.masks[nod.lung][mask].all(), f"nodule {n} leaves {nod.lung}"
        centroid = _centroid_lps(ph, mask)
        err_vox = np.abs(geom.lps_to_index(centroid) - geom.lps_to_index(nod.center_lps))
        assert np.all(err_vox <= 1.0), (n, err_vox)
        assert 3.0 <= nod.diameter_mm <= 30.0
        volume = mask.sum() * np.prod(geom.spacing)
        assert volume == pytest.approx(np.pi / 6 * nod.diameter_mm**3, rel=0.35)
        assert nod.kind in ("solid", "part_solid", "ground_glass")
        assert nod.attached_to in (None, "pleura", "vessel")
        assert (nod.lung == "lung_left") == (nod.center_lps[0] > 0)
    # solid nodules are soft tissue, ground glass sits between lung and soft tissue; the core is eroded in-plane only
    # (2.5 mm slices: a 3-D erosion leaves nothing of a 6 mm nodule)
    a = ph.volume.array
    checked = set()
    for n, nod in enumerate(ph.nodules, start=1):
        core = ndimage.binary_erosion(ph.nodule_labels == n, structure=np.ones((1, 3, 3), dtype=bool), iterations=2)
        if core.sum() < 5:
            continue
        med = np.median(a[core])
        if nod.kind == "solid":
            assert -100 <= med <= 150, (n, med)
        elif nod.kind == "ground_glass":
            assert -750 <= med <= -250, (n, med)
        checked.add(nod.kind)
    assert {"solid", "ground_glass"} <= checked, f"only {sorted(checked)} nodules were large enough to check"


def test_nodule_kinds_and_attachments_occur():
    kinds, attached = set(), set()
    for seed in range(4):
        ph = generate_phantom(seed, matrix=192, slice_spacing=2.5, n_nodules=6)
        kinds |= {n.kind for n in ph.nodules}
        attached |= {n.attached_to for n in ph.nodules}
    assert kinds == {"solid", "part_solid", "ground_glass"}
    assert {"pleura", "vessel", None} <= attached


def test_pleural_nodule_touches_chest_wall():
    for seed in range(6):
        ph = generate_phantom(seed, matrix=128, n_nodules=4)
        lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
        for n, nod in enumerate(ph.nodules, start=1):
            if nod.attached_to == "pleura":
                grown = ndimage.binary_dilation(ph.nodule_labels == n, iterations=2)
                assert (grown & ~lungs).any()
                return
    pytest.fail("no pleural nodule in six phantoms")


def test_no_nodules_when_asked_and_random_count():
    ph = generate_phantom(7, n_nodules=0, **SMALL)
    assert ph.nodules == () and not ph.nodule_labels.any()
    counts = [len(generate_phantom(s, matrix=96, slice_spacing=2.5).nodules) for s in range(20)]
    assert all(0 <= c <= 6 for c in counts)
    assert 0 in counts and 6 in counts and len(set(counts)) >= 4


def test_matrix_spacing_and_slices_are_respected():
    ph = generate_phantom(1, matrix=160, pixel_spacing=0.9, slice_spacing=2.0, slice_thickness=3.0, slices=40, n_nodules=1)
    g = ph.volume.geometry
    assert g.shape == (40, 160, 160)
    assert g.spacing == pytest.approx((0.9, 0.9, 2.0))
    assert ph.volume.metadata["SliceThickness"] == pytest.approx(3.0)
    # the chest is complete even in a short scan: lungs end inside the volume
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    per_slice = lungs.sum(axis=(1, 2))
    assert per_slice[0] == 0 and per_slice[-1] == 0 and per_slice.max() > 0
    # default slice count covers the chest and scales with the field of view
    a = generate_phantom(1, matrix=128, n_nodules=0)
    b = generate_phantom(1, matrix=256, slice_spacing=2.5, n_nodules=0)
    assert a.volume.shape[0] * 1.25 == pytest.approx(b.volume.shape[0] * 2.5 / 2, rel=0.1)


def test_ffs_changes_direction_but_not_lps_anatomy(ph):
    ffs = generate_phantom(3, n_nodules=4, patient_position="FFS", **SMALL)
    g = ffs.volume.geometry
    assert np.allclose(g.direction, np.diag([-1.0, 1.0, -1.0]))
    assert np.allclose(g.direction.T @ g.direction, np.eye(3)) and np.linalg.det(g.direction) == pytest.approx(1.0)
    assert ffs.volume.metadata["PatientPosition"] == "FFS"
    # the same patient: voxels reordered as the scanner stores them, LPS positions unchanged
    assert np.array_equal(ffs.volume.array, ph.volume.array[::-1, :, ::-1])
    assert np.allclose(g.index_to_lps([0, 0, 0]), ph.volume.geometry.index_to_lps([127, 0, ph.volume.shape[0] - 1]))
    for a, b in zip(ffs.nodules, ph.nodules):
        assert a.center_lps == pytest.approx(b.center_lps)
    for name in ("lung_left", "lung_right"):
        assert np.allclose(_centroid_lps(ffs, ffs.masks[name]), _centroid_lps(ph, ph.masks[name]), atol=1e-6)
    assert _centroid_lps(ffs, ffs.masks["lung_left"])[0] > _centroid_lps(ffs, ffs.masks["lung_right"])[0]
    for n, nod in enumerate(ffs.nodules, start=1):
        c = _centroid_lps(ffs, ffs.nodule_labels == n)
        assert np.all(np.abs(g.lps_to_index(c) - g.lps_to_index(nod.center_lps)) <= 1.0)


@pytest.mark.parametrize(
    "position, row, col",
    [("HFP", (-1, 0, 0), (0, -1, 0)), ("FFP", (1, 0, 0), (0, -1, 0)), ("HFDR", (0, 1, 0), (-1, 0, 0))],
)
def test_other_positions_give_scanner_orientations(position, row, col):
    ph = generate_phantom(2, matrix=96, slice_spacing=2.5, n_nodules=1, patient_position=position)
    d = ph.volume.geometry.direction
    assert np.allclose(d[:, 0], row) and np.allclose(d[:, 1], col)
    assert np.linalg.det(d) == pytest.approx(1.0)
    left = _centroid_lps(ph, ph.masks["lung_left"])
    right = _centroid_lps(ph, ph.masks["lung_right"])
    assert left[0] > right[0] + 5
    spine = _centroid_lps(ph, ph.masks["bone"])
    assert spine[1] > _centroid_lps(ph, ph.masks["body"])[1]  # bone mass (spine) is posterior: +y


def test_ground_truth_round_trip(ph, tmp_path):
    path = ph.save_ground_truth(tmp_path)
    assert path == tmp_path / "ground_truth.json"
    gt = load_ground_truth(tmp_path)
    assert gt == json.loads(json.dumps(ph.ground_truth()))
    assert gt["seed"] == 3 and gt["series_uid"] == ph.volume.metadata["SeriesInstanceUID"]
    assert len(gt["nodules"]) == len(ph.nodules)
    for rec, nod in zip(gt["nodules"], ph.nodules):
        assert rec["center_lps"] == pytest.approx(nod.center_lps, abs=1e-3)
        assert rec["diameter_mm"] == pytest.approx(nod.diameter_mm, abs=1e-3)
        assert rec["kind"] == nod.kind and rec["lung"] == nod.lung
        ijk = ph.volume.geometry.lps_to_index(nod.center_lps)
        assert rec["center_ijk"] == pytest.approx(ijk, abs=1e-2)
    masks = load_masks(tmp_path)
    for name in MASK_NAMES:
        assert np.array_equal(masks[name], ph.masks[name])
    assert np.array_equal(masks["nodule_labels"], ph.nodule_labels)
    assert not list(tmp_path.glob("*.tmp"))


def test_load_ground_truth_errors_name_the_file(tmp_path):
    with pytest.raises(PhantomError, match="ground_truth.json"):
        load_ground_truth(tmp_path)
    bad = tmp_path / "ground_truth.json"
    bad.write_text("{not json")
    with pytest.raises(PhantomError, match="not valid JSON"):
        load_ground_truth(bad)
    bad.write_text(json.dumps({"seed": 1}))
    with pytest.raises(PhantomError, match="lacks keys"):
        load_ground_truth(bad)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(matrix=16), "matrix"),
        (dict(pixel_spacing=0.0), "pixel_spacing"),
        (dict(slice_spacing=-1.0), "slice_spacing"),
        (dict(slices=2), "slices"),
        (dict(n_nodules=-1), "n_nodules"),
        (dict(nodule_diameter_mm=(10.0, 5.0)), "nodule_diameter_mm"),
        (dict(noise_hu=float("nan")), "noise_hu"),
        (dict(patient_position="XYZ"), "patient_position"),
        (dict(seed="seven"), "seed"),
    ],
)
def test_bad_options_raise_phantom_error(kwargs, word):
    kwargs = dict(kwargs)
    seed = kwargs.pop("seed", 0)
    with pytest.raises(PhantomError, match=word) as info:
        generate_phantom(seed, **kwargs)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    ("diameters", "says"),
    [
        ((30, 3), "the maximum must be at least the minimum, got (30, 3) mm"),  # was: 3.0 is outside 30..60
        ((30, 29.5), "the maximum must be at least the minimum, got (30, 29.5) mm"),
        ((3, 70), "nodule_diameter_mm[1]=70.0 is outside 1..60"),  # was: outside 3..60, as if 3 were the limit
        ((0.5, 3), "nodule_diameter_mm[0]=0.5 is outside 1..60"),
    ],
)
def test_nodule_diameters_out_of_order_or_range_lead_with_what_is_wrong(diameters, says):
    with pytest.raises(PhantomError) as info:
        generate_phantom(0, nodule_diameter_mm=diameters)
    assert str(info.value).startswith("generate_phantom(nodule_diameter_mm"), str(info.value)
    assert f"): {says}" in str(info.value), str(info.value)
    if "at least" in says:
        low, high = diameters
        assert info.value.fix == f"give (min, max) in mm, the smaller first, e.g. ({high:g}, {low:g})"


def test_nodules_that_cannot_fit_raise():
    with pytest.raises(PhantomError, match="does not fit"):
        generate_phantom(0, matrix=96, nodule_diameter_mm=(45.0, 50.0), n_nodules=1)


def test_noise_level_follows_noise_hu():
    quiet = generate_phantom(1, matrix=96, slice_spacing=2.5, n_nodules=0, noise_hu=0.0)
    noisy = generate_phantom(1, matrix=96, slice_spacing=2.5, n_nodules=0, noise_hu=30.0)
    outside = ~ndimage.binary_dilation(quiet.masks["body"], iterations=3)
    assert np.std(quiet.volume.array[outside]) < 2.0
    assert np.std(noisy.volume.array[outside]) == pytest.approx(30.0, rel=0.25)


def test_thresholding_recovers_the_masks(ph_256):
    """The masks are the tissue under the image: simple HU thresholds agree with them."""
    ph = ph_256
    a = ph.volume.array
    smooth = ndimage.gaussian_filter(a, 0.7)
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    body = ph.masks["body"]
    low = (smooth < -400) & ndimage.binary_erosion(body, iterations=2) & ~ndimage.binary_dilation(ph.masks["airway"])

    def dice(x, y):
        return 2 * np.sum(x & y) / (x.sum() + y.sum())

    assert dice(low, lungs & (ph.nodule_labels == 0) & ~ph.masks["vessels"]) > 0.9
    filled = np.stack([ndimage.binary_fill_holes(sl) for sl in smooth > -500])
    assert dice(filled, body) > 0.97
    assert dice(a > 200, ph.masks["bone"]) > 0.85
    # airway: region growing from the trachea at the top slice, threshold midway between air and wall
    lab, _ = ndimage.label((a < -600) & body)
    top = np.unique(lab[-1][lab[-1] > 0])
    assert dice(np.isin(lab, top), ph.masks["airway"]) > 0.85


def test_slab_painter_matches_the_analytic_lung():
    """Vessel growth uses Layout.in_lung on points; the voxel painter must draw the same lungs."""
    from pipeline.phantom.anatomy import AnatomyPainter
    from pipeline.phantom.layout import draw_layout
    from pipeline.phantom.scanner import CanonicalGrid

    n = 96
    xs = (np.arange(n) - n / 2) * 1.5
    zs = -150 + (np.arange(80) - 40) * 2.5
    grid = CanonicalGrid(xs=xs, ys=xs.copy(), zs=zs, pixel_spacing=1.5, slice_spacing=2.5)
    layout = draw_layout(np.random.default_rng(0), fov_mm=n * 1.5, pixel=1.5, scan_length_mm=200.0, z_center=-150.0)
    painter = AnatomyPainter(layout, grid)
    hu = np.empty(grid.shape, np.float32)
    lung = np.empty(grid.shape, bool)
    bone = np.empty(grid.shape, bool)
    painter.paint(0, grid.shape[0], None, hu, lung, bone)
    analytic = layout.in_lung(xs[None, None, :], xs[None, :, None], zs[:, None, None])
    assert lung.sum() > 1000
    assert not (lung & ~analytic).any()
    assert np.count_nonzero(analytic & ~lung & ~bone) <= 1e-3 * analytic.sum()
    assert np.all(hu[lung] < -700)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(matrix=64, slices=16, n_nodules=1),
        dict(matrix=64, pixel_spacing=2.0, slice_spacing=5.0, slices=24, n_nodules=1),
        dict(matrix=64, pixel_spacing=2.0, slice_spacing=4.0, slices=16, n_nodules=1, nodule_diameter_mm=(6.0, 10.0)),
    ],
)
def test_tiny_phantoms_are_complete(kwargs):
    """Small fields of view still hold a complete chest with the nodule asked for."""
    for seed in range(6):
        ph = generate_phantom(seed, **kwargs)
        assert len(ph.nodules) == 1
        for name in MASK_NAMES:
            assert ph.masks[name].any(), (seed, name)
        lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
        assert ph.masks[ph.nodules[0].lung][ph.nodule_labels == 1].all()
        assert not lungs[0].any() and not lungs[-1].any()


def test_slice_thickness_blurs_along_k_only():
    """Thicker slices (same spacing) smooth the image between slices, not within them."""
    thin = generate_phantom(2, matrix=96, slice_spacing=1.25, slice_thickness=1.25, n_nodules=0, noise_hu=0.0)
    thick = generate_phantom(2, matrix=96, slice_spacing=1.25, slice_thickness=5.0, n_nodules=0, noise_hu=0.0)
    assert np.array_equal(thin.masks["lung_left"], thick.masks["lung_left"])
    dk = [np.abs(np.diff(p.volume.array, axis=0)).mean() for p in (thin, thick)]
    di = [np.abs(np.diff(p.volume.array, axis=2)).mean() for p in (thin, thick)]
    assert dk[1] < 0.7 * dk[0]
    assert di[1] == pytest.approx(di[0], rel=0.15)
