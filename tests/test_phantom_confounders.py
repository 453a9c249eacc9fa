"""Phantom confounders: table, arms, contrast, bowel gas, coverage, field of view, disease, acquisition, positions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from pipeline.errors import PhantomError
from pipeline.phantom import (
    CONFOUNDER_MASK_NAMES,
    CONFOUNDER_SCENARIOS,
    MASK_NAMES,
    SCENARIO_SEEDS,
    Confounders,
    Phantom,
    generate_phantom,
    load_ground_truth,
    load_masks,
    realistic_confounders,
)
from pipeline.phantom.acquisition import sharp_blur_and_noise
from pipeline.phantom.confounders import (
    ARMS,
    CONTRAST_PHASES,
    COVERAGES,
    FOV_CENTRES,
    KERNELS,
    METALS,
    TABLES,
    scenarios_at,
)

SMALL = dict(matrix=112, pixel_spacing=2.0, slice_spacing=4.0, n_nodules=0, noise_hu=10.0)
TYPICAL = dict(table="curved", arms="raised", bowel_gas=True)


def _make(seed: int = 1, position: str = "HFS", small: dict | None = None, **conf) -> Phantom:
    return generate_phantom(seed, patient_position=position, confounders=Confounders(**conf), **{**SMALL, **(small or {})})


def _lps(ph: Phantom, name: str) -> np.ndarray:
    """A mask as [z, y, x] with LPS coordinates ascending (whatever the patient position)."""
    return ph.volume.geometry.to_lps_view(ph.masks[name])


def _lps_hu(ph: Phantom) -> np.ndarray:
    return ph.volume.geometry.to_lps_view(ph.volume.array)


def _centroid(ph: Phantom, mask: np.ndarray) -> np.ndarray:
    return ph.volume.geometry.centroid_lps(mask)


@pytest.fixture(scope="module")
def supine() -> Phantom:
    return _make(3, table="curved", blanket=True, arms="sides", contrast="arterial", bowel_gas=True, fov_factor=1.4)


@pytest.fixture(scope="module")
def prone() -> Phantom:
    return _make(3, "HFP", table="flat", arms="raised", contrast="arterial", bowel_gas=True, effusion="both")


# -- plain phantoms stay as they were ---------------------------------------------------------


def test_plain_phantom_is_unchanged():
    """Without confounders a phantom is the committed sample's, bit for bit (masks and ground truth)."""
    sample = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"
    ph = generate_phantom(3, matrix=128, slices=64, n_nodules=4, pixel_spacing=1.0, slice_spacing=2.0, nodule_diameter_mm=(4, 20))
    assert set(ph.masks) == set(MASK_NAMES) and ph.truth == {}
    gt = ph.ground_truth()
    assert "truth" not in gt and "confounders" not in gt["options"]
    assert load_ground_truth(sample) == json.loads(json.dumps(gt))
    masks = load_masks(sample)
    for name in MASK_NAMES:
        assert np.array_equal(masks[name], ph.masks[name]), name
    assert np.array_equal(masks["nodule_labels"], ph.nodule_labels)


# -- table ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["supine", "prone"])
def test_table_lies_below_the_patient_along_gravity(which, request):
    ph = request.getfixturevalue(which)
    table, body = _lps(ph, "table"), _lps(ph, "body")
    assert table.any() and not (table & body).any()
    assert table.any(axis=(1, 2)).all(), "the table spans the whole scan length"
    ys = ph.volume.geometry.lps_coordinate(1).ravel()
    ys = np.sort(ys)
    body_y = ys[np.flatnonzero(body.any(axis=(0, 2)))]
    table_y = ys[np.flatnonzero(table.any(axis=(0, 2)))]
    if which == "supine":  # floor is posterior (+y): the table is behind the back
        assert np.median(table_y) > body_y.max() - 5.0 and table_y.max() > body_y.max()
    else:  # prone: the table is in front of the chest
        assert np.median(table_y) < body_y.min() + 5.0 and table_y.min() < body_y.min()
    # wider than the nominal field of view (partly outside it), shell denser than soft tissue
    if ph.truth["fov"]["factor"] <= 1.0:
        assert table[:, :, 0].any() or table[:, :, -1].any() or table[:, 0, :].any() or table[:, -1, :].any()
    assert np.percentile(_lps_hu(ph)[table], 99) > 100
    assert ph.truth["table"]["kind"] in ("curved", "flat")


def test_blanket_touches_the_back_and_the_table_alone_keeps_a_gap(supine):
    body, table = _lps(supine, "body"), _lps(supine, "table")
    touching = ndimage.binary_dilation(body, structure=np.ones((1, 3, 3), bool)) & table
    assert touching.any(), "the blanket touches the patient"
    hu = _lps_hu(supine)
    assert -150 < np.median(hu[touching]) < 30
    bare = _make(3, table="curved", arms="none")
    near = ndimage.binary_dilation(_lps(bare, "body"), structure=np.ones((1, 3, 3), bool))
    assert not (near & _lps(bare, "table")).any(), "an air gap between patient and table"
    assert bare.truth["table"]["gap_mm"] > 0


# -- arms ----------------------------------------------------------------------------------------


def test_arms_at_the_sides_are_body_with_bone(supine):
    body, bone = _lps(supine, "body"), _lps(supine, "bone")
    k = body.shape[0] // 2
    lab, n = ndimage.label(body[k])
    assert n == 3, "trunk and two arms, separated by a thin gap"
    sizes = ndimage.sum(np.ones_like(lab), lab, range(1, n + 1))
    trunk = 1 + int(np.argmax(sizes))
    xs = np.sort(supine.volume.geometry.lps_coordinate(0).ravel())
    for label_ in range(1, n + 1):
        if label_ == trunk:
            continue
        arm = lab == label_
        assert (bone[k] & arm).any(), "humerus inside the arm"
        assert np.all(np.abs(xs[np.flatnonzero(arm.any(axis=0))]) > 0.5 * supine.truth["fov"]["patient_width_mm"] - 5)
    touching = _make(3, arms="sides_touching", fov_factor=1.4)
    assert ndimage.label(_lps(touching, "body")[k])[1] == 1, "arms pressed against the chest wall"


def test_raised_arms_appear_in_the_top_slices_only():
    ph = _make(4, table="curved", arms="raised", coverage="full")
    plain = _make(4, table="curved", coverage="full")
    extra = _lps(ph, "body").sum(axis=(1, 2)) - _lps(plain, "body").sum(axis=(1, 2))
    assert (extra >= 0).all()
    n = extra.size
    assert extra[-3:].sum() > 0 and extra[: n // 2].sum() == 0
    assert (_lps(ph, "bone") & ~_lps(plain, "bone")).any()


# -- contrast ------------------------------------------------------------------------------------


def test_arterial_blood_is_bright_but_not_bone(supine):
    blood, bone = _lps(supine, "contrast_blood"), _lps(supine, "bone")
    hu = _lps_hu(supine)
    assert blood.any() and not (blood & bone).any()
    assert supine.truth["contrast_phase"] == "arterial"
    assert 250 <= supine.truth["blood_hu"]["aorta"] <= 400
    core = ndimage.binary_erosion(blood, iterations=1)
    assert np.percentile(hu[core], 90) > 200
    # the confounder: a bone-like threshold also takes enhanced blood
    assert np.count_nonzero((hu > 200) & core) > 20


def test_venous_phase_enhances_blood_and_kidneys():
    ph = _make(5, coverage="bases_only", contrast="venous")
    t = ph.truth
    assert t["contrast_phase"] == "venous" and t["kidneys_in_scan"]
    assert 150 <= t["blood_hu"]["aorta"] <= 200 and 150 <= t["blood_hu"]["kidney_cortex"] <= 200
    assert ph.volume.metadata["ContrastBolusAgent"] == "IODINE"
    assert ph.masks["contrast_blood"].any() and not (ph.masks["contrast_blood"] & ph.masks["bone"]).any()
    none = _make(5, coverage="bases_only")
    assert not none.masks["contrast_blood"].any() and none.truth["blood_hu"]["aorta"] == 42.0


# -- bowel gas -----------------------------------------------------------------------------------


def _gas_below_lungs(ph: Phantom) -> None:
    gas = _lps(ph, "bowel_gas")
    lungs = _lps(ph, "lung_left") | _lps(ph, "lung_right")
    assert gas.any() and not (gas & lungs).any()
    assert np.median(_lps_hu(ph)[ndimage.binary_erosion(gas)]) < -850
    # in every column along z holding both, all gas lies below all lung (under the diaphragm)
    k = np.arange(gas.shape[0])[:, None, None]
    top_gas = np.where(gas, k, -1).max(axis=0)
    low_lung = np.where(lungs, k, gas.shape[0]).min(axis=0)
    both = gas.any(axis=0) & lungs.any(axis=0)
    assert both.any() and np.all(top_gas[both] < low_lung[both])


@pytest.mark.parametrize("which", ["supine", "prone"])
def test_bowel_gas_is_below_the_diaphragm_with_a_level(which, request):
    ph = request.getfixturevalue(which)
    _gas_below_lungs(ph)
    gas = _lps(ph, "bowel_gas")
    hu = _lps_hu(ph)
    # air-fluid level: gas floats on the non-dependent side; the next voxel towards the floor is fluid or wall
    step = 1 if which == "supine" else -1  # +y (posterior) is down when supine, -y when prone
    edge = gas & ~np.roll(gas, -step, axis=1)
    below = np.roll(edge, step, axis=1) & _lps(ph, "body")
    assert np.median(hu[below]) > -400
    # the level is flat: most gas columns end at the same height
    ys = np.arange(gas.shape[1])[None, :, None]
    ends = np.where(gas, ys, -1).max(axis=1) if which == "supine" else np.where(gas, ys, 10**6).min(axis=1)
    ends = ends[gas.any(axis=1)]
    assert np.max(np.bincount(ends - ends.min())) > 0.2 * ends.size


def test_bowel_gas_next_to_lung_bases_in_an_abdomen_scan():
    ph = _make(6, table="curved", bowel_gas=True, coverage="bases_only")
    _gas_below_lungs(ph)
    assert ph.volume.metadata["BodyPartExamined"] == "ABDOMEN"


# -- coverage ------------------------------------------------------------------------------------

EXPECTED = {
    "full": "complete",
    "chest_only": "complete",
    "apices_cut": "apex_cut",
    "bases_only": "apex_cut",
    "abdomen_only": "absent",
}


@pytest.mark.parametrize("coverage", COVERAGES)
def test_coverage_gives_the_recorded_lung_parts(coverage):
    ph = _make(7, coverage=coverage, small=dict(matrix=96, slice_spacing=5.0))
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    t = ph.truth
    assert t["lungs_in_scan"] == EXPECTED[coverage] and t["coverage"] == coverage
    assert set(t["lung_status"].values()) == {EXPECTED[coverage]}
    frac = t["lung_fraction_in_scan"]
    if coverage in ("full", "chest_only"):
        assert frac > 0.97
    elif coverage == "abdomen_only":
        assert not lungs.any() and frac == 0.0
    else:
        assert 0.0 < frac < (0.995 if coverage == "apices_cut" else 0.6)
    if coverage == "apices_cut":  # the most superior slice cuts the lungs
        assert _lps(ph, "lung_left")[-1].any()


def test_anatomy_keeps_its_size_whatever_the_coverage():
    full = _make(8, coverage="full", small=dict(slice_spacing=2.0))
    tight = _make(8, coverage="chest_only", small=dict(slice_spacing=2.0))
    for ph in (full, tight):
        assert ph.truth["lungs_in_scan"] == "complete"
    assert full.truth["lung_z_mm"] == tight.truth["lung_z_mm"]
    assert full.volume.shape[0] > tight.volume.shape[0]
    lungs = [p.masks["lung_left"].sum() for p in (full, tight)]
    assert lungs[0] == pytest.approx(lungs[1], rel=0.02)


def test_abdomen_only_refuses_nodules():
    with pytest.raises(PhantomError, match="abdomen_only"):
        generate_phantom(
            1, matrix=96, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=2, confounders=Confounders(coverage="abdomen_only")
        )


# -- field of view -------------------------------------------------------------------------------


def test_small_field_of_view_cuts_body_and_lungs_at_the_edge():
    ph = _make(9, fov_factor=0.6, small=dict(slice_spacing=5.0))
    wide = _make(9, small=dict(slice_spacing=5.0))
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    assert lungs[:, :, 0].any() and lungs[:, :, -1].any(), "both lungs reach the image edge"
    assert ph.truth["fov"]["cuts_body"] and ph.truth["fov"]["cuts_lungs"]
    assert not wide.truth["fov"]["cuts_lungs"]
    # same patient, smaller pixels: the anatomy keeps its absolute size
    assert ph.volume.geometry.spacing[0] == pytest.approx(0.6 * wide.volume.geometry.spacing[0])
    assert ph.truth["fov"]["patient_width_mm"] == wide.truth["fov"]["patient_width_mm"]
    assert ph.truth["fov"]["fov_mm"] == pytest.approx(0.6 * 112 * 2.0)
    assert ph.truth["lung_z_mm"] == wide.truth["lung_z_mm"]


def test_off_centre_field_of_view_on_one_lung():
    ph = _make(9, fov_factor=0.65, fov_centre="left_lung", small=dict(slice_spacing=5.0))
    left, right = ph.masks["lung_left"].sum(), ph.masks["lung_right"].sum()
    assert left > 1.5 * right
    assert ph.masks["lung_right"][:, :, 0].any(), "the right lung is cut at the image's right edge (HFS: i runs to the left)"
    assert ph.truth["fov"]["cuts_body"] and ph.truth["fov"]["centre"] == "left_lung"


# -- positions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["HFS", "FFS", "HFP"])
def test_left_lung_at_larger_x_and_dependent_fluid_in_every_position(position):
    ph = _make(
        10,
        position,
        table="curved",
        arms="sides",
        bowel_gas=True,
        effusion="both",
        contrast="venous",
        small=dict(slice_spacing=5.0),
    )
    g = ph.volume.geometry
    left, right = _centroid(ph, ph.masks["lung_left"]), _centroid(ph, ph.masks["lung_right"])
    assert left[0] > right[0] + 10
    down = np.asarray(ph.truth["gravity_lps"])
    assert down @ _centroid(ph, ph.masks["table"]) > down @ _centroid(ph, ph.masks["body"]) + 50
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    assert down @ _centroid(ph, ph.masks["effusion"]) > down @ _centroid(ph, lungs) + 10
    assert ph.volume.metadata["PatientPosition"] == position
    assert g.shape == ph.masks["table"].shape


# -- disease -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diseased() -> Phantom:
    return _make(11, emphysema=0.2, effusion="right", atelectasis="left", small=dict(slice_spacing=3.0))


def test_emphysema_index_is_recorded_and_visible(diseased):
    t = diseased.truth
    lungs = diseased.masks["lung_left"] | diseased.masks["lung_right"]
    emph = diseased.masks["emphysema"]
    assert not (emph & ~lungs).any()
    assert t["emphysema_index"] == pytest.approx(emph.sum() / lungs.sum(), abs=1e-4)
    assert 0.12 < t["emphysema_index"] < 0.25
    hu = diseased.volume.array
    core = ndimage.binary_erosion(emph)
    assert np.median(hu[core]) < -950
    # measured LAA-950 follows the truth
    laa = np.mean(hu[lungs] < -950)
    assert laa == pytest.approx(t["emphysema_index"], abs=0.08)
    assert _make(11, small=dict(slice_spacing=3.0)).truth["emphysema_index"] < 0.01


def test_effusion_and_atelectasis_replace_lung(diseased):
    m = diseased.masks
    lungs = m["lung_left"] | m["lung_right"]
    hu = diseased.volume.array
    for name, side, lo, hi in (("effusion", "right", -10, 30), ("atelectasis", "left", 15, 80)):
        mask = m[name]
        assert mask.any() and not (mask & lungs).any() and not (mask & m["vessels"]).any(), name
        x = _centroid(diseased, mask)[0]
        assert (x < 0) == (side == "right"), name
        assert lo < np.median(hu[ndimage.binary_erosion(mask)]) < hi, name
        assert diseased.truth[name]["sides"] == side and diseased.truth[name]["volume_ml"][side] > 0
    # dependent: the fluid lies posterior to the lung (supine)
    assert _centroid(diseased, m["effusion"])[1] > _centroid(diseased, m["lung_right"])[1] + 10


# -- acquisition ---------------------------------------------------------------------------------


def test_sharp_kernel_and_thick_slices():
    ph = _make(12, kernel="sharp", thick_slices_mm=5.0, small=dict(noise_hu=20.0))
    g = ph.volume.geometry
    assert g.spacing[2] == 5.0 and ph.volume.metadata["SliceThickness"] == 5.0
    assert ph.truth["slice_thickness_mm"] == 5.0 and ph.options["slice_spacing"] == 5.0
    assert ph.volume.metadata["ConvolutionKernel"] == "LUNG" and ph.truth["kernel"] == "sharp"
    assert ph.truth["noise_hu"] == 80.0
    outside = ~ndimage.binary_dilation(ph.masks["body"] | ph.masks["table"], iterations=4)
    standard = _make(12, thick_slices_mm=5.0, small=dict(noise_hu=20.0))
    # air is clipped at -1024 HU, which hides part of the noise there
    assert np.std(ph.volume.array[outside]) > 2.0 * np.std(standard.volume.array[outside])
    flat = np.zeros((4, 64, 64), np.float32)
    assert sharp_blur_and_noise(flat, np.random.default_rng(0), sigma_z=1.0, pixel=0.8, noise_hu=20.0) == 80.0
    assert np.std(flat) == pytest.approx(80.0, rel=0.1)
    # edge enhancement: overshoot next to a step
    step = np.zeros((1, 64, 64), np.float32)
    step[:, :, 32:] = 1000.0
    sharp_blur_and_noise(step, np.random.default_rng(0), sigma_z=0.0, pixel=0.8, noise_hu=0.0)
    assert step.max() > 1050 and step.min() < -50


@pytest.mark.parametrize("kind", ["port", "spine"])
def test_metal_is_dense_not_bone_and_streaks(kind):
    ph = _make(13, metal=kind, small=dict(slice_spacing=3.0, matrix=128, pixel_spacing=1.5))
    metal, bone = ph.masks["metal"], ph.masks["bone"]
    assert metal.any() and not (metal & bone).any() and not (metal & ~ph.masks["body"]).any()
    assert ph.truth["metal"]["present"] and ph.truth["metal"]["kind"] == kind
    hu = ph.volume.array
    assert np.median(hu[metal]) > 2000 and hu.max() == pytest.approx(3071.0)
    # streaks: soft tissue around the metal is far noisier on its slices than elsewhere
    body_core = ndimage.binary_erosion(ph.masks["body"], iterations=3) & ~ph.masks["lung_left"] & ~ph.masks["lung_right"]
    near = (
        ndimage.binary_dilation(metal, structure=np.ones((1, 3, 3), bool), iterations=int(20 / 1.5))
        & ~ndimage.binary_dilation(metal, structure=np.ones((1, 3, 3), bool), iterations=3)
        & body_core
        & ~bone
    )
    slices = np.flatnonzero(metal.any(axis=(1, 2)))
    other = np.setdiff1d(np.arange(hu.shape[0]), np.arange(slices.min() - 4, slices.max() + 5))
    shifted = np.zeros_like(near)
    shifted[other] = near[slices[len(slices) // 2]]
    assert np.std(hu[near]) > 1.5 * np.std(hu[shifted & body_core & ~bone])


# -- options, scenarios, realistic draws, ground truth --------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(table="wooden"), ["table", "curved", "flat"]),
        (dict(arms="up"), ["arms", "raised"]),
        (dict(contrast="late"), ["contrast", "venous"]),
        (dict(coverage="head"), ["coverage", "abdomen_only"]),
        (dict(fov_factor=0.2), ["fov_factor", "0.5", "1.5"]),
        (dict(fov_centre="heart"), ["fov_centre", "left_lung"]),
        (dict(emphysema=0.9), ["emphysema", "0.6"]),
        (dict(effusion="yes"), ["effusion", "both"]),
        (dict(kernel="soft"), ["kernel", "sharp"]),
        (dict(thick_slices_mm=20.0), ["thick_slices_mm", "10"]),
        (dict(metal="gold"), ["metal", "port"]),
        (dict(bowel_gas="yes"), ["bowel_gas", "True"]),
        (dict(fine_vessels=1), ["fine_vessels", "True"]),
        (dict(bronchovascular="yes"), ["bronchovascular", "True"]),
        (dict(blanket=True), ["blanket", "table"]),
    ],
)
def test_bad_confounders_are_refused(kwargs, words):
    with pytest.raises(PhantomError) as info:
        Confounders(**kwargs)
    text = str(info.value)
    assert "Fix:" in text
    for w in words:
        assert w in text, (w, text)


def test_generate_refuses_a_non_confounders_value():
    with pytest.raises(PhantomError, match="confounders"):
        generate_phantom(1, matrix=96, confounders={"table": "curved"})  # type: ignore[arg-type]


def test_scenarios_cover_every_confounder_and_position():
    sc = CONFOUNDER_SCENARIOS
    assert len(sc) >= 20
    seeds = [s.seed for s in sc.values()]
    assert len(set(seeds)) == len(seeds) and all(s in SCENARIO_SEEDS for s in seeds)
    confs = [s.confounders for s in sc.values()]
    for field, values in (
        ("table", TABLES),
        ("arms", ARMS),
        ("contrast", CONTRAST_PHASES),
        ("coverage", COVERAGES),
        ("fov_centre", FOV_CENTRES),
        ("kernel", KERNELS),
        ("metal", METALS),
    ):
        assert {getattr(c, field) for c in confs} == set(values), field
    assert {c.effusion for c in confs} == {"none", "left", "right", "both"}
    assert any(c.atelectasis != "none" for c in confs) and any(c.emphysema > 0 for c in confs)
    assert any(c.blanket for c in confs) and any(c.bowel_gas for c in confs)
    assert any(c.thick_slices_mm for c in confs) and any(c.fov_factor < 1 for c in confs) and any(c.fov_factor > 1 for c in confs)
    assert {s.patient_position for s in sc.values()} == {"HFS", "FFS", "HFP"}
    assert all(s.description for s in sc.values())


def test_scenarios_at_an_offset_are_the_same_scenarios_with_new_seeds():
    held_out = scenarios_at(2000)
    assert list(held_out) == list(CONFOUNDER_SCENARIOS)
    for name, s in CONFOUNDER_SCENARIOS.items():
        h = held_out[name]
        assert h.seed == s.seed + 2000 and 7000 <= h.seed < 7100
        assert h.confounders == s.confounders and h.patient_position == s.patient_position
    assert not {h.seed for h in held_out.values()} & set(SCENARIO_SEEDS)
    assert scenarios_at(0) == CONFOUNDER_SCENARIOS
    with pytest.raises(PhantomError, match="seed_offset"):
        scenarios_at(1.5)  # type: ignore[arg-type]


def test_bone_truth_leaves_out_the_spinal_canal():
    """The vertebral arch's bars cross the canal, which is painted CSF: that is not bone."""
    ph = _make(2, table="none", arms="none", small={"noise_hu": 0.0})
    hu, bone = ph.volume.array, ph.masks["bone"]
    assert bone.any()
    assert (bone & (hu < 50.0)).sum() <= 0.001 * bone.sum()


@pytest.mark.parametrize("name", ["everything", "prone_bases_only_arms_sides", "feet_first_small_fov_metal"])
def test_scenarios_generate(name):
    s = CONFOUNDER_SCENARIOS[name]
    ph = generate_phantom(s.seed, confounders=s.confounders, patient_position=s.patient_position, **SMALL)
    assert set(ph.masks) == set(MASK_NAMES) | set(CONFOUNDER_MASK_NAMES)
    assert ph.truth["patient_position"] == s.patient_position


def test_realistic_confounders_are_deterministic_and_varied():
    draws = [realistic_confounders(seed) for seed in range(300)]
    assert draws[:20] == [realistic_confounders(seed) for seed in range(20)]
    assert realistic_confounders(np.int64(5)) == draws[5]
    share = lambda f: np.mean([f(c) for c in draws])  # noqa: E731
    assert share(lambda c: c.table != "none") > 0.85
    assert share(lambda c: c.coverage == "full") > 0.6
    assert share(lambda c: c.arms != "none") > 0.8
    for f in (
        lambda c: c.contrast != "none",
        lambda c: c.coverage != "full",
        lambda c: c.fov_factor < 1,
        lambda c: c.emphysema > 0,
        lambda c: c.effusion != "none",
        lambda c: c.metal != "none",
        lambda c: c.kernel == "sharp",
        lambda c: c.thick_slices_mm is not None,
    ):
        assert 0.01 < share(f) < 0.5
    ph = generate_phantom(21, confounders=draws[21], **SMALL)
    assert ph.ground_truth()["options"]["confounders"] == dataclasses.asdict(draws[21])


def test_ground_truth_round_trip_with_confounders(supine, tmp_path):
    supine.save_ground_truth(tmp_path)
    gt = load_ground_truth(tmp_path)
    assert gt == json.loads(json.dumps(supine.ground_truth()))
    assert Confounders.from_json(gt["options"]["confounders"]) == Confounders(
        table="curved", blanket=True, arms="sides", contrast="arterial", bowel_gas=True, fov_factor=1.4
    )
    t = gt["truth"]
    for key in (
        "lungs_in_scan",
        "lung_status",
        "contrast_phase",
        "slice_thickness_mm",
        "fov",
        "metal",
        "emphysema_index",
        "bowel_gas_ml",
        "table",
        "arms",
        "effusion",
        "atelectasis",
        "gravity_lps",
    ):
        assert key in t, key
    assert t["metal"]["present"] is False and isinstance(t["fov"]["cuts_body"], bool)
    masks = load_masks(tmp_path)
    for name in (*MASK_NAMES, *CONFOUNDER_MASK_NAMES):
        assert np.array_equal(masks[name], supine.masks[name]), name
    assert set(gt["masks"]["names"]) == set(MASK_NAMES) | set(CONFOUNDER_MASK_NAMES)


def test_same_seed_same_confounded_phantom(supine):
    again = _make(3, table="curved", blanket=True, arms="sides", contrast="arterial", bowel_gas=True, fov_factor=1.4)
    assert np.array_equal(again.volume.array, supine.volume.array)
    assert again.ground_truth() == supine.ground_truth()


def test_cli_scenario_and_realistic(tmp_path, capsys):
    from pipeline.cli import main

    small = ["--matrix", "96", "--pixel-spacing", "2", "--slice-spacing", "5", "--nodules", "0"]
    assert main(["phantom", str(tmp_path), "--scenario", "prone", *small]) == 0
    seed = CONFOUNDER_SCENARIOS["prone"].seed
    gt = load_ground_truth(tmp_path / f"phantom_{seed:05d}")
    assert gt["truth"]["scenario"] == "prone" and gt["patient_position"] == "HFP"
    assert main(["phantom", str(tmp_path), "--scenario", "prone", "--seed-offset", "2000", *small]) == 0
    gt = load_ground_truth(tmp_path / f"phantom_{seed + 2000:05d}")
    assert gt["truth"]["scenario"] == "prone" and gt["patient_position"] == "HFP"
    assert main(["phantom", str(tmp_path), "--seed", "3", "--seed-offset", "2000", *small]) == 2
    assert "--seed-offset" in capsys.readouterr().err
    assert main(["phantom", str(tmp_path), "--seed", "40", "--count", "2", "--realistic", *small]) == 0
    for s in (40, 41):
        gt = load_ground_truth(tmp_path / f"phantom_{s:05d}")
        assert Confounders.from_json(gt["options"]["confounders"]) == realistic_confounders(s)
    assert "realistic confounders" in capsys.readouterr().out
    fine = tmp_path / "fine"
    assert main(["phantom", str(fine), "--seed", "40", "--realistic", "--fine-vessels", *small]) == 0
    conf = Confounders.from_json(load_ground_truth(fine / "phantom_00040")["options"]["confounders"])
    assert conf == dataclasses.replace(realistic_confounders(40), fine_vessels=True)
    assert main(["phantom", str(fine), "--seed", "42", "--realistic", "--fine-vessels", "--bronchovascular", *small]) == 0
    conf = Confounders.from_json(load_ground_truth(fine / "phantom_00042")["options"]["confounders"])
    assert conf == dataclasses.replace(realistic_confounders(42), fine_vessels=True, bronchovascular=True)
    capsys.readouterr()
    assert main(["phantom", str(fine), "--seed", "41", "--fine-vessels", *small]) == 2
    err = capsys.readouterr().err
    assert "--fine-vessels" in err and "--realistic" in err and not (fine / "phantom_00041").exists()
    assert main(["phantom", str(fine), "--seed", "41", "--bronchovascular", *small]) == 2
    assert "--bronchovascular" in capsys.readouterr().err
    assert main(["phantom", str(tmp_path), *small]) == 2
    assert "--seed" in capsys.readouterr().err
    assert main(["phantom", str(tmp_path), "--scenario", "all", "--seed", "3", *small]) == 2


def test_trachea_in_scan_needs_one_connected_airway_not_scattered_bronchi():
    from pipeline.phantom.confounders import scenarios_at

    s = scenarios_at(14000)["bases_only_bowel_gas"]  # 1.2 mL of airway at the top: four segmental bronchi
    ph = generate_phantom(s.seed, confounders=s.confounders, matrix=180, pixel_spacing=2.0, slice_spacing=2.5)
    voxel_ml = float(np.prod(ph.volume.geometry.spacing)) / 1000.0
    assert ph.masks["airway"].sum() * voxel_ml > 1.0 and not ph.trachea_in_scan()
    r = scenarios_at(14000)["routine_chest"]
    assert generate_phantom(r.seed, confounders=r.confounders, matrix=180, pixel_spacing=2.0).trachea_in_scan()
