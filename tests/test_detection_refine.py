"""Centre refinement (pipeline.detection.refine) against phantom ground truth, LPS mm throughout."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from pipeline.detection import refine as refine_module
from pipeline.detection.findings import Finding, Findings
from pipeline.detection.refine import Refinement, _ball, _open, refine_centres, refine_findings, rescore_compact
from pipeline.errors import ConfigError
from pipeline.phantom import generate_phantom
from pipeline.volume import CTVolume, Geometry
from tests._support.detection import two_mm_finding

PHANTOM = dict(matrix=128, pixel_spacing=1.2, slice_spacing=2.0, slices=60, n_nodules=6, nodule_diameter_mm=(4.0, 14.0))


def _perturbed(phantom, seed: int, frac: float = 0.7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True centres, diameters, and centres moved by ``frac`` × radius in a random direction (a detector's error)."""
    rng = np.random.default_rng(seed)
    true = np.array([n.center_lps for n in phantom.nodules])
    diam = np.array([n.diameter_mm for n in phantom.nodules])
    u = rng.normal(size=true.shape)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return true, diam, true + u * (frac * diam / 2)[:, None]


@pytest.mark.parametrize("position", ["HFS", "FFS"])
def test_refined_centres_are_closer_to_phantom_truth(position: str) -> None:
    ph = generate_phantom(3, patient_position=position, **PHANTOM)
    if position == "FFS":  # the flipped phantom really has a flipped index → LPS mapping
        assert ph.volume.direction[0, 0] < 0 and ph.volume.direction[2, 2] < 0
    true, diam, start = _perturbed(ph, 11)
    res = refine_centres(ph.volume, start, diam)
    before = np.linalg.norm(start - true, axis=1)
    after = np.linalg.norm(res.centers_lps - true, axis=1)
    assert res.refined.sum() >= len(true) - 2  # pleura-attached nodules may be left as they were
    assert np.all(after[res.refined] < before[res.refined])
    assert np.all(after[~res.refined] == before[~res.refined])
    assert np.median(after[res.refined]) < 0.6  # mm; the perturbation was 1.4..4.9 mm
    # refined centres inside the nodule's radius: every LUNA16 hit is kept, and more are gained
    assert np.sum(after <= diam / 2) >= np.sum(before <= diam / 2)
    assert np.sum(after <= diam / 2) >= len(true) - 1
    # diameters within 35 % of the truth for refined, unattached nodules
    free = np.array([n.attached_to is None for n in ph.nodules]) & res.refined
    assert np.all(np.abs(res.diameters_mm[free] - diam[free]) <= 0.35 * diam[free])


def test_hfs_and_ffs_give_the_same_lps_centres() -> None:
    """The same anatomy stored with opposite index directions refines to the same LPS points."""
    hfs = generate_phantom(3, patient_position="HFS", **PHANTOM)
    ffs = generate_phantom(3, patient_position="FFS", **PHANTOM)
    true, diam, start = _perturbed(hfs, 5)
    a = refine_centres(hfs.volume, start, diam)
    b = refine_centres(ffs.volume, start, diam)
    both = a.refined & b.refined
    assert both.sum() >= 3
    assert np.allclose(a.centers_lps[both], b.centers_lps[both], atol=0.6)
    assert np.all(np.linalg.norm(b.centers_lps[both] - true[both], axis=1) < 1.0)


def _sphere_volume(direction: np.ndarray, centre_lps: np.ndarray, radius: float) -> CTVolume:
    geo = Geometry(shape=(40, 48, 48), spacing=(0.8, 0.8, 1.0), origin=(10.0, -20.0, 30.0), direction=direction)
    k, j, i = np.indices(geo.shape)
    lps = geo.index_to_lps(np.stack([i, j, k], axis=-1))
    inside = np.linalg.norm(lps - centre_lps, axis=-1) <= radius
    arr = np.where(inside, 30.0, -850.0).astype(np.float32)
    return CTVolume(arr, geo)


def test_off_grid_sphere_with_rotated_axes_is_found_exactly() -> None:
    direction = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # columns: LPS unit vectors
    vol = _sphere_volume(direction, np.zeros(3), 1.0)  # placeholder to read the geometry
    centre = vol.index_to_lps([23.3, 21.6, 18.4])
    vol = _sphere_volume(direction, centre, 4.0)
    res = refine_centres(vol, centre[None] + np.array([[1.8, -1.2, 1.0]]), np.array([8.0]))
    assert res.refined[0]
    assert np.linalg.norm(res.centers_lps[0] - centre) < 0.15
    assert abs(res.diameters_mm[0] - 8.0) < 1.0
    assert res.contrast_hu[0] > 800


def test_a_ground_glass_nodule_on_the_chest_wall_is_refined_without_the_wall() -> None:
    """A -600 HU ball of 6 mm touching a +40 HU wall: half way between background and the ball's own peak, the wall
    is above threshold too and the blob reaches the window's border; voxels much brighter than the ball's peak
    (``bright_cap``) are not part of it, so the centre moves onto the ball."""
    geo = Geometry(shape=(40, 48, 48), spacing=(0.8, 0.8, 1.0), origin=(0.0, 0.0, 0.0), direction=np.eye(3))
    k, j, i = np.indices(geo.shape)
    lps = geo.index_to_lps(np.stack([i, j, k], axis=-1))
    centre = np.array([19.0, 19.2, 20.0])
    ball = np.linalg.norm(lps - centre, axis=-1) <= 3.0
    wall = lps[..., 0] >= centre[0] + 3.0  # the wall's surface touches the ball (L side)
    arr = np.where(wall, 40.0, np.where(ball, -600.0, -850.0)).astype(np.float32)
    vol = CTVolume(arr, geo)
    start = centre[None] + np.array([[-1.2, -1.0, 0.8]])  # a candidate off the ball, on its lung side
    capped = refine_centres(vol, start, np.array([6.0]))
    assert capped.refined[0]
    assert np.linalg.norm(capped.centers_lps[0] - centre) < 0.5
    uncapped = refine_centres(vol, start, np.array([6.0]), bright_cap=None)
    assert np.linalg.norm(uncapped.centers_lps[0] - centre) > 1.0  # the wall drew it away, or it was left


def test_flat_noise_and_bad_sizes() -> None:
    geo = Geometry(shape=(30, 30, 30), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=np.eye(3))
    noise = np.random.default_rng(0).normal(-850, 20, geo.shape).astype(np.float32)
    res = refine_centres(CTVolume(noise, geo), np.array([[15.0, 15.0, 15.0]]), np.array([6.0]))
    assert not res.refined[0] and np.allclose(res.centers_lps[0], [15, 15, 15])
    with pytest.raises(ConfigError, match="sizes"):
        refine_centres(CTVolume(noise, geo), np.zeros((2, 3)), np.ones(3))
    empty = refine_centres(CTVolume(noise, geo), np.zeros((0, 3)), np.zeros(0))
    assert empty.centers_lps.shape == (0, 3)


def test_refine_findings_moves_boxes() -> None:
    ph = generate_phantom(3, **PHANTOM)
    true, diam, start = _perturbed(ph, 2)
    items = []
    for c, d in zip(start, diam):
        ijk = np.round(ph.volume.lps_to_index(c)).astype(int)
        items.append(
            Finding(
                center_lps=tuple(c),
                box_min_lps=tuple(c - d / 2),
                box_max_lps=tuple(c + d / 2),
                diameter_mm=float(d),
                score=0.5,
                voxel_ijk=tuple(int(v) for v in ijk),
                slice_number=int(ijk[2]) + 1,
            )
        )
    found = Findings(items, case_id="p3")
    out = refine_findings(ph.volume, found)
    assert out.case_id == "p3" and len(out) == len(found) and [f.score for f in out] == [f.score for f in found]
    moved = 0
    for f, g, t in zip(found, out, true):
        c = np.asarray(g.center_lps)
        assert np.allclose((np.asarray(g.box_min_lps) + np.asarray(g.box_max_lps)) / 2, c)
        assert tuple(g.voxel_ijk) == tuple(np.round(ph.volume.lps_to_index(c)).astype(int))
        assert g.slice_number == g.voxel_ijk[2] + 1
        if g != f:
            moved += 1
            assert np.linalg.norm(c - t) < np.linalg.norm(np.asarray(f.center_lps) - t)
    assert moved >= len(items) - 2


def test_rescore_raises_only_compact_refined_blobs() -> None:
    ref = Refinement(
        centers_lps=np.zeros((4, 3)),
        diameters_mm=np.full(4, 5.0),
        refined=np.array([True, True, False, True]),
        shift_mm=np.zeros(4),
        contrast_hu=np.full(4, 500.0),
        elongation=np.array([1.2, 6.0, 0.0, 1.9]),
    )
    s = np.array([0.3, 0.3, 0.3, 0.9])
    out = rescore_compact(s, ref, boost=1.0, max_elongation=2.0)
    assert np.allclose(out, [1 - 0.7**2, 0.3, 0.3, 1 - 0.1**2])
    assert np.all((out >= s) & (out <= 1.0))


def test_sphere_is_compact_and_a_tube_is_not() -> None:
    geo = Geometry(shape=(40, 40, 40), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=np.eye(3))
    k, j, i = np.indices(geo.shape)
    ball = (i - 20) ** 2 + (j - 20) ** 2 + (k - 20) ** 2 <= 16
    tube = ((i - 20) ** 2 + (j - 20) ** 2 <= 4) & (abs(k - 20) <= 7)  # a 4 mm vessel segment, 15 mm long
    res = []
    for mask in (ball, tube):
        vol = CTVolume(np.where(mask, 40.0, -850.0).astype(np.float32), geo)
        res.append(refine_centres(vol, np.array([[20.5, 19.5, 20.5]]), np.array([8.0]), window_factor=2.5))
    assert res[0].refined[0] and res[0].elongation[0] < 1.3
    assert res[1].refined[0] and res[1].elongation[0] > 2.5


@pytest.mark.parametrize("radius_vox", [(0.5, 1.6, 1.6), (1.0, 1.4, 1.4), (2.4, 3.3, 2.0), (3.0, 4.2, 4.6)])
def test_opening_equals_scipys_binary_opening(radius_vox: tuple[float, float, float]) -> None:
    rng = np.random.default_rng(5)
    ball = _ball(np.array(radius_vox))
    for shape in [(9, 31, 27), (17, 21, 21)]:  # blobs reaching the window's edge included
        mask = ndimage.gaussian_filter(rng.random(shape), 1.5) > 0.5
        assert np.array_equal(_open(mask, ball), ndimage.binary_opening(mask, structure=ball))


def test_boxes_beyond_nodule_size_keep_their_centre() -> None:
    """A 120 mm box (an untrained network's) is not refined: its window would take about a second per box."""
    ph = generate_phantom(3, **PHANTOM)
    true, diam, start = _perturbed(ph, 11)
    sizes = np.where(np.arange(len(diam)) % 2 == 0, 120.0, diam)
    res = refine_centres(ph.volume, start, sizes)
    big = sizes > 40.0
    assert big.any() and (~big).any()
    assert not res.refined[big].any() and np.array_equal(res.centers_lps[big], start[big])
    assert np.array_equal(res.diameters_mm[big], sizes[big]) and np.all(res.shift_mm[big] == 0.0)
    # no window is read for them: neither contrast nor elongation is measured
    assert np.all(res.contrast_hu[big] == 0.0) and np.all(res.elongation[big] == 0.0)
    assert res.refined[~big].sum() >= (~big).sum() - 1  # the nodule-sized ones are refined as before
    at_limit = refine_centres(ph.volume, start, np.minimum(sizes, 40.0), max_diameter_mm=40.0)
    assert at_limit.refined[big].any()  # the limit is inclusive: 40 mm boxes are still refined


def test_a_wide_nodule_on_a_fine_grid_is_refined_on_a_sampled_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32 mm nodule on 0.5 mm pixels: its window (about 100 voxels across) is sampled every few voxels (at most
    ``MAX_WINDOW_VOXELS`` along each axis: about a tenth of the work), yet the centre lands within a fraction of a
    millimetre of the truth and the size is kept."""
    geo = Geometry(shape=(90, 130, 130), spacing=(0.5, 0.5, 0.8), origin=(-30.0, -30.0, 40.0), direction=np.eye(3))
    centre = geo.index_to_lps([64.3, 61.7, 44.6])
    k, j, i = np.indices(geo.shape)
    inside = np.linalg.norm(geo.index_to_lps(np.stack([i, j, k], axis=-1)) - centre, axis=-1) <= 16.0
    vol = CTVolume(np.where(inside, 20.0, -850.0).astype(np.float32), geo)
    windows: list[tuple[int, ...]] = []
    smooth = refine_module.ndimage.gaussian_filter

    def spy(win: np.ndarray, sigma: object) -> np.ndarray:
        windows.append(win.shape)
        return smooth(win, sigma)

    monkeypatch.setattr(refine_module.ndimage, "gaussian_filter", spy)
    res = refine_centres(vol, centre[None] + np.array([[3.0, -2.5, 2.0]]), np.array([32.0]))
    assert len(windows) == 1 and max(windows[0]) <= min(refine_module.MAX_WINDOW_VOXELS, 60)  # whole: 105 across
    assert res.refined[0]
    assert np.linalg.norm(res.centers_lps[0] - centre) < 0.3
    assert abs(res.diameters_mm[0] - 32.0) < 1.5


def test_a_findings_copy_has_its_own_timings_and_flags() -> None:
    """Copies (``with_candidates``, ``select``) are new objects: timing or flagging one leaves the other as it was."""
    f = two_mm_finding(score=0.7, voxel_ijk=(1, 2, 3), slice_number=4)
    a = Findings([f], timings_ms={"model": 5.0}, flags={"thick_slices": "x"})
    for b in (a.with_candidates([f]), a.select(0.5, "test")):
        b.timings_ms["total"] = 9.0
        b.flags["lossy_compressed"] = "y"
        assert b.timings_ms == {"model": 5.0, "total": 9.0} and set(b.flags) == {"thick_slices", "lossy_compressed"}
    assert a.timings_ms == {"model": 5.0} and a.flags == {"thick_slices": "x"}
