"""A segmented nodule's long and short axis as Fleischner 2017 and Lung-RADS v2022 measure them: on the slice where it
is largest, the longest in-plane chord and the longest chord perpendicular to it, and their mean.

Ellipsoids of known axes, turned in the slice's plane, on 0.7 x 0.7 x 2 mm voxels (LPS mm, masks ``[k, j, i]``),
off-centre to the patient's left (+x) and posterior (+y), on a grid read head first supine and on one whose rows run
to the patient's right (+i is -x) and columns anterior (+j is -y), as a prone series is stored."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.dicom_out import read_sr_findings, reported_findings, write_sr
from pipeline.volume import Geometry

SPACING = (0.7, 0.7, 2.0)
PIXEL_MM = SPACING[0]
#: a binary mask places each end of a chord only to within a pixel (a centre inside, the next one outside): the axes
#: of one ellipsoid lie within 0.75 pixel of the true ones, their error over many placements within half a pixel
CASE_TOLERANCE_MM = 0.75 * PIXEL_MM
MEAN_TOLERANCE_MM = 0.5 * PIXEL_MM
SUPINE = np.eye(3)
PRONE = np.diag([-1.0, -1.0, 1.0])
CENTRE_LPS = np.array([62.3, 41.7, -130.0])  # patient's left, posterior


def _ellipsoid(long_mm: float, short_mm: float, angle_deg: float, direction: np.ndarray, shift: np.ndarray) -> tuple:
    """A volume grid and the nodule result (crop mask and crop geometry) of an ellipsoid centred near CENTRE_LPS, its
    long axis ``angle_deg`` from +x (L) towards +y (P) in the axial plane; its height (z) is its short axis. Returns
    (grid, nodule, centre LPS, long-axis unit vector LPS)."""
    n, nk = 64, 24
    centre = CENTRE_LPS + np.array([shift[0], shift[1], 0.0])
    centre_index = np.array([n / 2, n / 2, nk / 2])
    origin = centre - direction @ (centre_index * np.asarray(SPACING))
    g = Geometry(shape=(nk, n, n), spacing=SPACING, origin=tuple(origin), direction=direction)
    kk, jj, ii = np.indices(g.shape)
    lps = g.index_to_lps(np.stack([ii, jj, kk], axis=-1).reshape(-1, 3)).reshape(*g.shape, 3) - centre
    a = np.radians(angle_deg)
    u = np.array([np.cos(a), np.sin(a), 0.0])
    v = np.array([-np.sin(a), np.cos(a), 0.0])
    mask = ((lps @ u) / (long_mm / 2)) ** 2 + ((lps @ v) / (short_mm / 2)) ** 2 + (lps[..., 2] / (short_mm / 2)) ** 2 <= 1
    lo = np.argwhere(mask).min(axis=0)
    hi = np.argwhere(mask).max(axis=0) + 1
    crop = mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    volume = float(crop.sum() * np.prod(SPACING))
    nodule = {
        "index": 0,
        "mask": crop,
        "geometry": g.cropped(lo[::-1].tolist(), hi[::-1].tolist()),
        "volume_mm3": volume,
        "diameter_mm": (6 * volume / np.pi) ** (1 / 3),
    }
    return g, nodule, centre, u


def _reported(g: Geometry, nodule: dict, centre: np.ndarray):
    finding = {"center_lps": centre.tolist(), "diameter_mm": 10.0, "score": 0.9}
    (reported,) = reported_findings([finding], g, series_uid="1.2.3", score_threshold=0.5, nodules=[nodule])
    return reported


@pytest.mark.parametrize("direction", [SUPINE, PRONE], ids=["supine", "prone"])
@pytest.mark.parametrize(("long_mm", "short_mm", "angle_deg"), [(14.0, 6.0, 30.0), (10.0, 7.0, 117.0), (22.0, 15.0, 61.0)])
def test_long_and_short_axis_of_a_turned_ellipsoid(long_mm, short_mm, angle_deg, direction) -> None:
    g, nodule, centre, u = _ellipsoid(long_mm, short_mm, angle_deg, direction, np.array([0.13, -0.21]))
    axes = _reported(g, nodule, centre).axes
    assert axes is not None
    assert abs(axes.long_mm - long_mm) <= CASE_TOLERANCE_MM, (axes.long_mm, long_mm)
    assert abs(axes.short_mm - short_mm) <= CASE_TOLERANCE_MM, (axes.short_mm, short_mm)
    assert axes.mean_mm == pytest.approx((axes.long_mm + axes.short_mm) / 2)
    assert axes.slice_k == 12  # the slice through the ellipsoid's middle, where it is largest
    # the endpoints: on that slice, in LPS, around the nodule's centre (left and posterior: x and y positive), along
    # the ellipsoid's axes, their distance the axis' length
    long_ends, short_ends = np.asarray(axes.long_lps), np.asarray(axes.short_lps)
    for ends, length in ((long_ends, axes.long_mm), (short_ends, axes.short_mm)):
        assert np.all(ends[:, :2] > 30.0)
        np.testing.assert_allclose(ends[:, 2], centre[2], atol=1e-6)
        assert np.linalg.norm(ends[1] - ends[0]) == pytest.approx(length)
        assert np.linalg.norm(ends.mean(axis=0) - centre) <= PIXEL_MM
    along = (long_ends[1] - long_ends[0]) / axes.long_mm
    assert abs(along @ u) >= np.cos(np.radians(4.0))  # the long axis runs along the ellipsoid's
    across = (short_ends[1] - short_ends[0]) / axes.short_mm
    assert abs(across @ along) <= 1e-9  # the short axis is perpendicular to it


def test_the_axes_over_many_placements_lie_within_half_a_pixel() -> None:
    rng = np.random.default_rng(7)
    errors = []
    for _ in range(12):
        angle = float(rng.uniform(0.0, 180.0))
        g, nodule, centre, _u = _ellipsoid(12.0, 8.0, angle, SUPINE, rng.uniform(-0.35, 0.35, 2))
        axes = _reported(g, nodule, centre).axes
        errors += [axes.long_mm - 12.0, axes.short_mm - 8.0]
    assert abs(float(np.mean(errors))) <= MEAN_TOLERANCE_MM / 2, errors
    assert float(np.mean(np.abs(errors))) <= MEAN_TOLERANCE_MM, errors


def test_the_largest_slice_is_measured() -> None:
    """An ellipsoid whose middle lies between two slices: the larger of the two is measured, not the one nearer the
    detector's centre."""
    g, nodule, centre, _u = _ellipsoid(12.0, 8.0, 45.0, SUPINE, np.zeros(2))
    mask = nodule["mask"]
    k_best = int(np.argmax(mask.reshape(mask.shape[0], -1).sum(axis=1)))
    mask[k_best + 1 :] = False  # the upper half removed: the largest slice is now the last one kept
    far = centre + np.array([0.0, 0.0, 6.0])
    axes = _reported(g, nodule, far).axes
    k0 = int(np.rint(g.lps_to_index(nodule["geometry"].origin)[2]))
    assert axes.slice_k == k0 + k_best


def _sr_case(tmp_path):
    from tests.test_dicom_out_sources import phantom_case

    return phantom_case(tmp_path / "case", n_nodules=1, pixel_spacing=0.9, slice_spacing=2.0, matrix=96, slices=40)


def _write_sr(case, path):
    return write_sr(
        path,
        source=case.source,
        volume=case.volume,
        findings=case.findings,
        model_name="demo",
        model_version="1",
        score_threshold=0.5,
        nodules=case.nodules,
    )


def test_the_sr_states_both_axes_on_their_image_and_the_3d_extent_apart(tmp_path) -> None:
    import highdicom as hd

    case = _sr_case(tmp_path)
    path = _write_sr(case, tmp_path / "sr.dcm")
    g = case.volume.geometry
    (f,) = [f for f in case.findings if f.score >= 0.5]
    axes = _reported(
        g,
        case.nodules[0].to_json() | {"mask": case.nodules[0].mask, "geometry": case.nodules[0].geometry},
        np.asarray(f.center_lps),
    ).axes
    (row,) = read_sr_findings(path).itertuples()
    assert row.long_axis_mm == pytest.approx(axes.long_mm, abs=0.05)
    assert row.short_axis_mm == pytest.approx(axes.short_mm, abs=0.05)
    assert row.mean_diameter_mm == pytest.approx(axes.mean_mm, abs=0.05)
    assert row.max_extent_mm >= row.long_axis_mm
    report = hd.sr.srread(path)
    (group,) = [g for g in report.content.get_volumetric_roi_measurement_groups()]
    by_name = {str(m.name.value): m for m in group.get_measurements()}
    assert {"103339001", "103340004", "max_extent_3d", "81827009"} <= set(by_name)  # 81827009: Diameter, derivation Mean
    for code in ("103339001", "103340004"):  # measured on the image of the slice where the nodule is largest
        (image,) = by_name[code].referenced_images
        assert image.referenced_sop_instance_uid == case.source.sop_instance_uids[axes.slice_k]


def test_an_earlier_sr_long_axis_reads_as_the_3d_extent(tmp_path, monkeypatch) -> None:
    """SRs of earlier versions named the 3-D extent "Long axis" and stated no short axis."""
    from pipeline.dicom_out import codes, sr

    case = _sr_case(tmp_path)
    new = read_sr_findings(_write_sr(case, tmp_path / "new.dcm"))
    monkeypatch.setattr(sr.C, "MAX_EXTENT", codes.LONG_AXIS)
    monkeypatch.setattr(sr, "_axis_measurements", lambda f, source: [])
    old = read_sr_findings(_write_sr(case, tmp_path / "old.dcm"))
    assert old.max_extent_mm.tolist() == pytest.approx(new.max_extent_mm.tolist())
    assert old.long_axis_mm.isna().all() and old.short_axis_mm.isna().all() and old.mean_diameter_mm.isna().all()


def test_the_nodule_results_state_the_axes_with_their_image_and_endpoints() -> None:
    """The reconstruction's nodule JSON: both axes, their mean, the slice's InstanceNumber and the endpoints (LPS mm)."""
    from pipeline.reconstruction.nodule_geometry import axes_json

    g, nodule, centre, _u = _ellipsoid(14.0, 6.0, 30.0, SUPINE, np.zeros(2))
    numbers = list(range(200, 200 - g.shape[0], -1))  # InstanceNumbers counting down the volume's slices
    out = axes_json(nodule, g, {"InstanceNumbers": numbers})
    axes = _reported(g, nodule, centre).axes
    assert out["long_axis_mm"] == pytest.approx(axes.long_mm, abs=0.001)
    assert out["short_axis_mm"] == pytest.approx(axes.short_mm, abs=0.001)
    assert out["mean_diameter_mm"] == pytest.approx(axes.mean_mm, abs=0.001)
    assert out["axes_slice_k"] == axes.slice_k == 12
    assert out["axes_instance_number"] == 188
    np.testing.assert_allclose(out["long_axis_lps_mm"], axes.long_lps, atol=0.001)
    np.testing.assert_allclose(out["short_axis_lps_mm"], axes.short_lps, atol=0.001)
    assert axes_json({"index": 0, "mask": None, "geometry": None}, g, {}) == dict.fromkeys(out)


def _prism(inside, angle_deg: float, direction: np.ndarray = SUPINE, spacing=SPACING, n: int = 64) -> tuple:
    """A nodule whose slices are the 2-D shape ``inside(x, y)`` (mm, about its centre, in the shape's own frame, turned
    ``angle_deg`` in the slice's plane) on the three middle slices of a grid of ``spacing``; returns (grid, nodule)."""
    nk = 9
    centre_index = np.array([n / 2 + 0.3, n / 2 - 0.2, nk // 2])
    origin = CENTRE_LPS - direction @ (centre_index * np.asarray(spacing))
    g = Geometry(shape=(nk, n, n), spacing=spacing, origin=tuple(origin), direction=direction)
    kk, jj, ii = np.indices(g.shape)
    lps = g.index_to_lps(np.stack([ii, jj, kk], axis=-1).reshape(-1, 3)).reshape(*g.shape, 3) - CENTRE_LPS
    rows, cols = direction[:, 0], direction[:, 1]  # the slice's in-plane axes (LPS)
    x, y = lps @ rows, lps @ cols
    a = np.radians(angle_deg)
    xs, ys = np.cos(a) * x + np.sin(a) * y, -np.sin(a) * x + np.cos(a) * y
    mask = inside(xs, ys) & (np.abs(kk - nk // 2) <= 1)
    lo, hi = np.argwhere(mask).min(axis=0), np.argwhere(mask).max(axis=0) + 1
    crop = mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    return g, {"index": 0, "mask": crop, "geometry": g.cropped(lo[::-1].tolist(), hi[::-1].tolist())}


def _axes_of(g: Geometry, nodule: dict):
    from pipeline.reconstruction.nodule_geometry import axial_axes, nodule_mask

    return axial_axes(nodule_mask(nodule, g), g)


@pytest.mark.parametrize("angle_deg", [0.0, 23.0, 71.0])
@pytest.mark.parametrize("direction", [SUPINE, PRONE], ids=["supine", "prone"])
def test_the_short_axis_of_an_l_shaped_nodule_is_its_perpendicular_chord_not_its_width(angle_deg, direction) -> None:
    """An L of two 20 x 5 mm arms: its long axis joins the arms' outer ends (20·√2 = 28.3 mm); every line
    perpendicular to it crosses one arm or the corner, 5·√2 = 7.1 mm, while its width across the long axis is
    (20 + 5)/√2 = 17.7 mm."""
    arm, thick = 20.0, 5.0

    def inside(x, y):
        x, y = x + arm / 2, y + arm / 2  # the corner at (-10, -10)
        return ((x >= 0) & (y >= 0)) & (((x <= arm) & (y <= thick)) | ((x <= thick) & (y <= arm)))

    axes = _axes_of(*_prism(inside, angle_deg, direction))
    assert axes.long_mm == pytest.approx(arm * np.sqrt(2), abs=PIXEL_MM)  # a sharp corner is cut by up to a pixel
    assert axes.short_mm == pytest.approx(thick * np.sqrt(2), abs=2 * CASE_TOLERANCE_MM), axes.short_mm
    long_ends, short_ends = np.asarray(axes.long_lps), np.asarray(axes.short_lps)
    along = (long_ends[1] - long_ends[0]) / axes.long_mm
    across = (short_ends[1] - short_ends[0]) / axes.short_mm
    assert abs(across @ along) <= 1e-9


@pytest.mark.parametrize("angle_deg", [0.0, 37.0])
def test_the_short_axis_of_a_crescent_is_its_perpendicular_chord_not_its_width(angle_deg) -> None:
    """Half an annulus (outer radius 12 mm, inner 8 mm): its long axis is the outer diameter (24 mm) along its flat
    side; the longest chord perpendicular to it, tangent to the inner circle, is √(12² - 8²) = 8.9 mm, while its width
    across the long axis is 12 mm."""
    big, small = 12.0, 8.0

    def inside(x, y):
        r2 = x**2 + (y + big / 2) ** 2
        return (r2 <= big**2) & (r2 >= small**2) & (y + big / 2 >= 0)

    axes = _axes_of(*_prism(inside, angle_deg))
    assert axes.long_mm == pytest.approx(2 * big, abs=CASE_TOLERANCE_MM)
    assert axes.short_mm == pytest.approx(np.sqrt(big**2 - small**2), abs=2 * CASE_TOLERANCE_MM), axes.short_mm


@pytest.mark.parametrize("diameter", [6.0, 11.0, 25.0])
def test_a_discs_short_axis_is_its_diameter(diameter) -> None:
    axes = _axes_of(*_prism(lambda x, y: x**2 + y**2 <= (diameter / 2) ** 2, 0.0, spacing=(0.98, 0.98, 2.0)))
    assert axes.long_mm == pytest.approx(diameter, abs=0.75 * 0.98)
    assert axes.short_mm == pytest.approx(diameter, abs=0.75 * 0.98)
    assert axes.short_mm <= axes.long_mm + 1e-9


def _tilted(deg: float) -> np.ndarray:
    """Direction cosines of an oblique acquisition: rows along L, columns turned ``deg`` from P towards S."""
    a = np.radians(deg)
    return np.array([[1.0, 0.0, 0.0], [0.0, np.cos(a), -np.sin(a)], [0.0, np.sin(a), np.cos(a)]])


def test_an_oblique_acquisitions_axes_are_measured_in_its_image_plane_and_say_so() -> None:
    """A 14 x 6 mm ellipse in the plane of images tilted 20° from axial: its axes are measured on those images (their
    endpoints in the image's plane, not at one z) and the nodule results, nodule lines and titles say so."""
    from pipeline.reconstruction.nodule_geometry import axes_json, plane_note, plane_tilt_deg

    direction = _tilted(20.0)
    g, nodule = _prism(lambda x, y: (x / 7.0) ** 2 + (y / 3.0) ** 2 <= 1, 30.0, direction)
    axes = _axes_of(g, nodule)
    assert axes.long_mm == pytest.approx(14.0, abs=CASE_TOLERANCE_MM)
    assert axes.short_mm == pytest.approx(6.0, abs=CASE_TOLERANCE_MM)
    normal = np.cross(direction[:, 0], direction[:, 1])
    ends = np.asarray(axes.long_lps + axes.short_lps)
    np.testing.assert_allclose(ends @ normal, ends[0] @ normal, atol=1e-6)  # in the image's plane
    assert np.ptp(ends[:, 2]) > 1.0  # which is not an axial one
    out = axes_json(nodule, g, {})
    assert out["axes_plane_tilt_deg"] == 20.0
    assert plane_note(out["axes_plane_tilt_deg"]) == " (in its image plane, 20.0° from axial)"
    assert plane_tilt_deg(_prism(lambda x, y: x**2 + y**2 <= 9, 0.0, PRONE)[0]) == 0.0
    assert plane_note(0.0) == plane_note(0.9) == ""


def test_each_image_reference_of_a_nodule_uses_its_templates_concept(tmp_path) -> None:
    """TID 1411: the volume surface's image is its "Source image for segmentation" (DCM 121233); TID 1419: each axis'
    image, on which a viewer shows the measurement, is its "Source of Measurement" (DCM 121112, inferred from). Read
    back as highdicom reads them."""
    import highdicom as hd

    from tests.test_dicom_out_sources import assert_valid

    case = _sr_case(tmp_path)
    path = _write_sr(case, tmp_path / "sr.dcm")
    (f,) = [f for f in case.findings if f.score >= 0.5]
    k = int(np.rint(case.volume.geometry.lps_to_index(f.center_lps)[2]))
    (group,) = hd.sr.srread(path).content.get_volumetric_roi_measurement_groups()
    (surface_image,) = group.roi.source_images_for_segmentation
    assert surface_image.referenced_sop_instance_uid == case.source.sop_instance_uids[k]
    items = {str(item.ConceptNameCodeSequence[0].CodeValue): item for item in group[0].ContentSequence}
    assert items["121233"].RelationshipType == "CONTAINS" and items["121233"].ValueType == "IMAGE"
    for code in ("103339001", "103340004"):
        (source,) = items[code].ContentSequence
        assert (source.RelationshipType, source.ValueType) == ("INFERRED FROM", "IMAGE")
        assert source.ConceptNameCodeSequence[0].CodeValue == "121112"
    assert_valid(path)  # last: it skips where dciodvfy is missing


def test_a_one_pixel_nodule_and_a_large_mass_have_axes() -> None:
    """A nodule of one pixel per slice has axes no longer than a pixel; a 120 mm mass is measured on a coarser
    sampling, within a pixel."""
    g, nodule = _prism(lambda x, y: (np.abs(x) <= 0.35) & (np.abs(y) <= 0.35), 0.0)
    assert nodule["mask"].sum() == 3
    axes = _axes_of(g, nodule)
    assert 0 < axes.short_mm <= axes.long_mm <= PIXEL_MM
    big = _axes_of(*_prism(lambda x, y: (x / 60.0) ** 2 + (y / 40.0) ** 2 <= 1, 10.0, n=200))
    assert big.long_mm == pytest.approx(120.0, abs=PIXEL_MM)
    assert big.short_mm == pytest.approx(80.0, abs=PIXEL_MM)
