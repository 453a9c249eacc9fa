"""``show``: the radiological display convention whatever the storage order, the series check of findings
(run tables included) and the slice the caller names (InstanceNumber or array index)."""

from __future__ import annotations

import logging

import matplotlib
import numpy as np
import pytest

from pipeline.display import show
from pipeline.errors import GeometryError
from pipeline.volume import CTVolume, Geometry

matplotlib.use("Agg")

SHAPE = (20, 24, 32)  # [k, j, i]: every axis a different length, so that a transposed image cannot pass
SPACING = (1.0, 1.5, 2.0)  # mm along i, j, k
ORIGIN = (-16.0, -18.0, 100.0)  # LPS mm


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _lps_volume(**metadata) -> CTVolume:
    """An LPS-ordered (HFS-like) volume: air with a bright anterior-left block and a dimmer posterior strip."""
    arr = np.full(SHAPE, -800, np.int16)
    arr[:, 2:6, 20:30] = 300  # small j = anterior, large i = the patient's left
    arr[:, 20:23, :] = 0  # posterior strip ("the spine side")
    return CTVolume(arr, Geometry(shape=SHAPE, spacing=SPACING, origin=ORIGIN), metadata=metadata)


def _reordered(vol: CTVolume, perm_ijk: tuple[int, int, int], signs: tuple[int, int, int], **metadata) -> CTVolume:
    """The same voxels in LPS space stored in another order: new index axis c is old axis ``perm_ijk[c]`` read in
    direction ``signs[c]`` (what a NIfTI in RAS order, a feet-first or a prone series, or a sagittal stack gives)."""
    g = vol.geometry
    arr = vol.array.transpose([2 - perm_ijk[2 - d] for d in range(3)])  # array dims are [k, j, i]
    for c, s in enumerate(signs):
        if s < 0:
            arr = np.flip(arr, axis=2 - c)
    old_first = [0 if s > 0 else g.size_ijk[perm_ijk[c]] - 1 for c, s in enumerate(signs)]
    first = [0, 0, 0]
    for c, p in enumerate(perm_ijk):
        first[p] = old_first[c]
    direction = np.stack([g.direction[:, p] * s for p, s in zip(perm_ijk, signs)], axis=1)
    geom = Geometry(
        shape=arr.shape,
        spacing=tuple(g.spacing[p] for p in perm_ijk),
        origin=tuple(g.index_to_lps(first)),
        direction=direction,
    )
    out = CTVolume(np.ascontiguousarray(arr), geom, metadata=metadata)
    probe = np.array([[3.0, 5.0, 7.0]])  # the same LPS point holds the same value in both
    assert out.array[tuple(np.rint(out.lps_to_index(vol.index_to_lps(probe)))[0, ::-1].astype(int))] == vol.array[7, 5, 3]
    return out


def _image(ax) -> np.ndarray:
    return np.asarray(ax.images[0].get_array())


def _circles(ax) -> np.ndarray:
    """(x, y, width, height) of each circle drawn, in image pixels."""
    return np.array([(*p.center, p.width, p.height) for p in ax.patches], dtype=float)


REORDERINGS = {
    "RAS (NIfTI)": ((0, 1, 2), (-1, -1, 1)),
    "feet first": ((0, 1, 2), (-1, 1, -1)),
    "prone feet first": ((0, 1, 2), (1, -1, -1)),
    "all flipped": ((0, 1, 2), (-1, -1, -1)),
    "rows and columns swapped": ((1, 0, 2), (1, -1, 1)),
}


def test_an_lps_series_is_drawn_right_on_left_anterior_up_with_letters():
    vol = _lps_volume()
    ax = show(vol)  # the middle plane, k=10
    img = _image(ax)
    assert img.shape == (24, 32)  # rows = y (A → P), columns = x (R → L)
    bright = np.argwhere(img == 300)
    assert bright[:, 0].max() < 12 and bright[:, 1].min() >= 16  # anterior (top) and the patient's left (image right)
    letters = {t.get_text(): t.get_position() for t in ax.texts if t.get_text() in "RLAP"}
    assert letters["R"][0] < 0.5 < letters["L"][0]
    assert letters["A"][1] > 0.5 > letters["P"][1]  # axes fraction: y grows upwards


@pytest.mark.parametrize("name", sorted(REORDERINGS))
def test_any_storage_order_gives_the_same_image_circles_and_outlines(name):
    vol = _lps_volume()
    perm, signs = REORDERINGS[name]
    other = _reordered(vol, perm, signs)
    centre = vol.index_to_lps([24.0, 4.0, 10.0])  # in the anterior-left block, slice k=10 of the LPS volume
    finding = [{"center_lps": centre.tolist(), "diameter_mm": 8.0, "score": 0.9}]
    mask = np.zeros(SHAPE, bool)
    mask[8:13, 2:6, 20:30] = True
    other_mask = _reordered(CTVolume(mask.astype(np.int16), vol.geometry), perm, signs).array.astype(bool)
    a = show(vol, findings=finding, recon={"lung_left": mask})
    b = show(other, findings=finding, recon={"lung_left": other_mask})
    np.testing.assert_array_equal(_image(a), _image(b))
    # the finding lands on the pixel of its LPS position: column x = 24 (left of centre: image right), row y = 4
    assert _circles(a) == pytest.approx(_circles(b))
    assert _circles(b)[0][:2] == pytest.approx((24.0, 4.0))
    assert _image(b)[4, 24] == 300
    va = np.concatenate([p.vertices for p in a.collections[0].get_paths()])
    vb = np.concatenate([p.vertices for p in b.collections[0].get_paths()])
    assert np.sort(va, axis=0) == pytest.approx(np.sort(vb, axis=0))
    assert vb[:, 0].min() >= 19 and vb[:, 1].max() <= 6  # the outline is around the anterior-left block
    assert [t.get_text() for t in b.get_legend().get_texts()] == ["left lung"]  # named as the MPR PNGs name it


def test_a_ras_nifti_read_through_simpleitk_is_not_upside_down(tmp_path):
    sitk = pytest.importorskip("SimpleITK")
    vol = _lps_volume()
    ras = _reordered(vol, (0, 1, 2), (-1, -1, 1))
    path = tmp_path / "ras.nii.gz"
    sitk.WriteImage(ras.to_sitk(), str(path))
    back = CTVolume.from_sitk(sitk.ReadImage(str(path)))
    assert np.allclose(np.diag(back.direction), (-1, -1, 1))  # stored in RAS order
    np.testing.assert_array_equal(_image(show(back)), _image(show(vol)))


#: Markers (LPS mm) of the tilted series: A and B share an axial plane (z 15 mm) 60 mm apart along y, so that a plane
#: of a grid turned 15° about L-R through A misses B by 16 mm; C lies 45 mm below them.
MARK_A, MARK_B, MARK_C = np.array([-25.0, -30.0, 15.0]), np.array([25.0, 30.0, 15.0]), np.array([-25.0, 30.0, -30.0])


def _bright_blobs(ax) -> list[np.ndarray]:
    """The bone balls' centres on the image of ``ax`` (pixels: column, row), left to right."""
    from scipy import ndimage

    img = _image(ax)
    labels, n = ndimage.label(img > 600)
    sizes = ndimage.sum(img > 600, labels, range(1, n + 1))
    found = [np.array(c[::-1]) for c, s in zip(ndimage.center_of_mass(img > 600, labels, range(1, n + 1)), sizes) if s >= 4]
    return sorted(found, key=lambda p: p[0])


def _title_z(title: str) -> float:
    """The LPS z (mm) of ``axial at z=15.7 mm (LPS)`` in a title."""
    import re

    found = re.match(r"axial at z=(-?[\d.]+) mm \(LPS\)", title)
    assert found, title
    return float(found.group(1))


@pytest.mark.parametrize("tilt_deg", [15.0, -15.0])
def test_an_oblique_series_is_drawn_as_a_true_axial_plane_where_its_letters_say(tilt_deg):
    """A gantry-tilt corrected series (grid turned 15° about L-R) was drawn in its nearest straight order: the plane
    through finding A was the grid's tilted plane, B (same z as A, 60 mm posterior) missing from it. show() now
    resamples onto patient axes as the renderings do: A and B both on the plane, as far apart and on the sides the
    letters R-L, A-P say, the circle on A, the mask's outline on B, and the title saying so."""
    from tests._support.shapes import tilted_volume

    vol = tilted_volume(tilt_deg, [MARK_A, MARK_B, MARK_C])
    x, y, z = vol.index_to_lps(np.argwhere(np.ones(vol.shape, bool))[:, ::-1].astype(float)).T.reshape(3, *vol.shape)
    lesion = (x - MARK_B[0]) ** 2 + (y - MARK_B[1]) ** 2 + (z - MARK_B[2]) ** 2 <= 64.0
    finding = {"center_lps": MARK_A.tolist(), "diameter_mm": 10.0, "score": 0.9}
    ax = show(vol, findings=[finding], recon={"lesion": lesion})
    title = ax.get_title()
    assert "resampled to patient axes (grid 15.0° oblique)" in title, title
    assert abs(_title_z(title) - MARK_A[2]) <= 0.75, title  # the plane nearest A's z, on a 1.5 mm grid
    found = _bright_blobs(ax)
    assert len(found) == 2, (title, found)
    a, b = found  # A is right (image left) and anterior (up) of B
    np.testing.assert_allclose((b - a) * 1.5, (MARK_B - MARK_A)[:2], atol=3.0)
    ((cx, cy, _w, _h),) = _circles(ax)
    np.testing.assert_allclose((cx, cy), a, atol=1.5)
    ring = np.concatenate([p.vertices for p in ax.collections[0].get_paths()])
    np.testing.assert_allclose(ring.mean(axis=0), b, atol=1.5)
    assert [t.get_text() for t in ax.texts if t.get_text() in "RLAP"] == ["R", "L", "A", "P"]


def test_a_slice_of_an_oblique_series_is_shown_on_the_true_axial_plane_through_its_centre():
    """slice=/k= of a tilted series name a source slice: the true axial plane through that slice's centre is shown,
    its title naming both."""
    from tests._support.shapes import tilted_volume

    vol = tilted_volume(15.0, [MARK_A, MARK_B, MARK_C])
    k = int(np.rint(vol.lps_to_index(MARK_C.reshape(1, 3))[0, 2]))
    centre_z = vol.index_to_lps(np.array([[44.5, 44.5, k]]))[0, 2]
    ax = show(vol, k=k)
    title = ax.get_title()
    assert abs(_title_z(title) - centre_z) <= 0.75, title  # the plane nearest the slice's centre, on a 1.5 mm grid
    assert f" mm (LPS) through the centre of slice {k + 1} (k={k})" in title, title
    assert "resampled to patient axes" in title


def test_an_oblique_series_resamples_only_the_plane_it_draws(monkeypatch):
    """show() of a tilted 300-slice series took 3.8 s and a float copy of the whole volume, to draw one plane: only
    that plane of the patient-axis grid is resampled now, the same image as from the whole grid."""
    from pipeline.reconstruction import render_planes
    from tests._support.shapes import tilted_volume

    vol = tilted_volume(15.0, [MARK_A, MARK_B, MARK_C])
    finding = {"center_lps": MARK_A.tolist(), "diameter_mm": 10.0, "score": 0.9}
    whole, _, _ = render_planes.to_patient_axes(vol, {}, None)
    shapes: list[tuple[int, ...]] = []
    resample = render_planes._resampled
    monkeypatch.setattr(
        render_planes, "_resampled", lambda a, src, dst, **kw: (shapes.append(dst.shape), resample(a, src, dst, **kw))[1]
    )
    ax = show(vol, findings=[finding])
    assert shapes and all(s[0] == 1 for s in shapes), shapes  # one axial plane [k, j, i]
    z = int(np.rint(whole.lps_to_index(MARK_A.reshape(1, 3))[0, 2]))
    np.testing.assert_allclose(_image(ax), whole.array[z], atol=1e-3)


# -- findings of another series -------------------------------------------------------------------------------
def _run_with_two_series(tmp_path):
    from pipeline.runner.store import RunStore

    store = RunStore(tmp_path / "run")
    store.start_run("r1", command="ctpipe run x", sources=["x"], config={}, versions={}, device="cpu", host="h", pid=1)
    for key, cid, uid, centre in (("ka", "a", "1.2.3", [-10.0, -8.0, 110.0]), ("kb", "b", "4.5.6", [5.0, 2.0, 120.0])):
        store.upsert_discovered(case_key=key, case_id=cid, series_uid=uid, fingerprint="f", source=f"/src/{cid}")
        store.begin_case(key, "r1")
        finding = {"center_lps": centre, "diameter_mm": 6.0, "score": 0.9}
        store.complete_case(key, output_dir=f"cases/{cid}", findings=[finding], measurements=[])
    store.close()
    return tmp_path / "run"


def test_open_run_findings_carry_case_and_series(tmp_path):
    from pipeline.runner.results import open_run

    run = open_run(_run_with_two_series(tmp_path))
    f = run.findings
    assert list(f.columns[:3]) == ["run_dir", "case_id", "series_uid"]
    assert dict(zip(f.case_id, f.series_uid)) == {"a": "1.2.3", "b": "4.5.6"}
    assert list(run.case("b").findings.series_uid) == ["4.5.6"]


def test_show_refuses_another_series_findings_from_a_run_table(tmp_path):
    from pipeline.runner.results import open_run

    run = open_run(_run_with_two_series(tmp_path))
    vol_b = _lps_volume(SeriesInstanceUID="4.5.6")
    with pytest.raises(GeometryError, match=r"series 1\.2\.3, the volume is series 4\.5\.6") as err:
        show(vol_b, findings=run.findings[run.findings.case_id == "a"])
    assert "run.findings.series_uid == vol.series_uid" in str(err.value)
    # the whole table: only this series' finding is drawn
    ax = show(vol_b, findings=run.findings, k=10)
    assert len(ax.patches) == 1 and ax.patches[0].center == pytest.approx(
        tuple(vol_b.geometry.lps_view_index(vol_b.lps_to_index([5.0, 2.0, 120.0]))[0, :2])
    )


def test_findings_without_a_series_uid_are_drawn_with_a_warning(caplog):
    import pandas as pd

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    x, y, z = vol.index_to_lps([10.0, 12.0, 7.0])
    table = pd.DataFrame({"center_x": [x], "center_y": [y], "center_z": [z], "diameter_mm": [6.0], "score": [0.8]})
    with caplog.at_level(logging.WARNING, logger="pipeline.display"):
        ax = show(vol, findings=table)
    assert len(ax.patches) == 1
    assert "cannot check" in caplog.text and "1.2.3" in caplog.text


def test_a_list_of_finding_objects_warns_that_it_lost_its_series_and_how_to_keep_it(caplog):
    # was: "1 finding(s) carry no series UID (no series_uid column or value)" for list(ctp.detect(vol)): no column
    # was given, and a Finding object holds no series; the Findings that detect returns holds it
    from pipeline.detection import Finding, Findings

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    centre = tuple(float(v) for v in vol.index_to_lps([10.0, 12.0, 7.0]))
    box = (tuple(c - 3.0 for c in centre), tuple(c + 3.0 for c in centre))
    found = Findings([Finding(centre, *box, 6.0, 0.8, (10, 12, 7), 8)], series_uid="1.2.3")
    with caplog.at_level(logging.WARNING):
        show(vol, findings=found)  # the Findings itself: its series is checked, nothing to warn of
    assert "series UID" not in caplog.text, caplog.text
    with caplog.at_level(logging.WARNING):
        ax = show(vol, findings=list(found))
    assert len(ax.patches) == 1
    [warning] = [r.getMessage() for r in caplog.records if "no series UID" in r.getMessage()]
    assert "a Finding object does not hold its series" in warning and "pass that Findings itself" in warning, warning
    assert "findings=detect(vol)" in warning and "series_uid column" not in warning, warning


def test_the_title_counts_the_findings_drawn_on_the_slice_of_those_given():
    """A title saying "13 finding(s)" over a slice with two circles would send a reader looking for eleven more."""
    import pandas as pd

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    centres = vol.index_to_lps(np.array([[10.0, 12.0, 7.0], [20.0, 6.0, 7.0], [16.0, 12.0, 16.0]]))  # the last one on k=16
    table = pd.DataFrame(
        {"center_x": centres[:, 0], "center_y": centres[:, 1], "center_z": centres[:, 2], "diameter_mm": 4.0, "score": 0.8}
    )
    table["series_uid"] = "1.2.3"
    ax = show(vol, findings=table, k=7)
    assert len(ax.patches) == 2 and "2 of 3 finding(s) on this slice" in ax.get_title()
    assert "no findings" in show(vol, k=7).get_title()


# -- which slice ------------------------------------------------------------------------------------------------
def test_slice_is_the_instance_number_and_k_the_array_index():
    numbers = [120 - 3 * k for k in range(SHAPE[0])]  # descending, as many scanners number a head-first stack
    vol = _lps_volume(InstanceNumbers=numbers, SeriesDescription="Chest 1.0 B70f", SeriesNumber=3, SeriesInstanceUID="1.2.3.4")
    k = numbers.index(63)
    ax = show(vol, slice=63)
    assert ax.get_title().startswith(f"InstanceNumber 63 (k={k})")
    assert "series 3 Chest 1.0 B70f" in ax.get_title()
    np.testing.assert_array_equal(_image(ax), _image(show(vol, k=k)))
    assert show(vol, k=0).get_title().startswith("InstanceNumber 120 (k=0)")
    with pytest.raises(ValueError, match="not both"):
        show(vol, slice=63, k=k)
    with pytest.raises(
        IndexError, match=r"InstanceNumber 64 is not in this series: its 20 slices have InstanceNumbers 63\.\.120"
    ):
        show(vol, slice=64)
    with pytest.raises(IndexError, match="outside"):
        show(vol, k=20)


def test_without_instance_numbers_slice_counts_from_one():
    vol = _lps_volume()
    assert show(vol, slice=8).get_title().startswith("slice 8 (k=7)")
    with pytest.raises(IndexError, match=r"slice 21 is not in this series.*1\.\.20"):
        show(vol, slice=21)


def test_a_feet_first_series_names_the_slice_of_its_own_order():
    vol = _lps_volume(InstanceNumbers=list(range(1, SHAPE[0] + 1)))
    ffs = _reordered(vol, (0, 1, 2), (-1, 1, -1), InstanceNumbers=list(range(1, SHAPE[0] + 1)))
    ax = show(ffs, k=4)  # k=4 of the feet-first stack is k=15 of the head-first one
    assert ax.get_title().startswith("InstanceNumber 5 (k=4)")
    np.testing.assert_array_equal(_image(ax), _image(show(vol, k=15)))


def test_a_table_of_several_series_keeps_only_this_series_rows(caplog):
    import pandas as pd

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    x, y, z = vol.index_to_lps([10.0, 12.0, 7.0])
    table = pd.DataFrame(
        {
            "series_uid": ["1.2.3", "4.5.6", None],
            "center_x": [x, x - 6, x + 6],
            "center_y": [y] * 3,
            "center_z": [z] * 3,
            "diameter_mm": [6.0] * 3,
            "score": [0.8, 0.7, 0.6],
        }
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.display"):
        ax = show(vol, findings=table)  # the plane of this series' finding, k=7
    assert _circles(ax)[:, :2].tolist() == [[10.0, 12.0]]
    assert "1 finding(s) without a series UID among findings of several series: left out" in caplog.text


def test_an_sr_table_without_sizes_is_drawn_with_its_boxes_and_points():
    """``read_sr_findings`` states no diameter for a finding that was not segmented (NaN) and no box for a point:
    the box's equivalent diameter sizes the circle, and a point is marked on the plane nearest its centre."""
    import pandas as pd

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    x, y, z = vol.index_to_lps([10.0, 12.0, 7.0])
    px, py, pz = vol.index_to_lps([20.0, 6.0, 7.3])  # 0.6 mm above plane k=7 (2 mm slices)
    nan = float("nan")
    table = pd.DataFrame(
        {
            "center_x": [x, px],
            "center_y": [y, py],
            "center_z": [z, pz],
            "box_min_x": [x - 3.0, nan],
            "box_min_y": [y - 3.0, nan],
            "box_min_z": [z - 3.0, nan],
            "box_max_x": [x + 3.0, nan],
            "box_max_y": [y + 3.0, nan],
            "box_max_z": [z + 3.0, nan],
            "diameter_mm": [nan, nan],
            "score": [0.9, 0.8],
            "graphic_type": ["ELLIPSOID", "POINT"],
        }
    )
    ax = show(vol, findings=table, k=7)
    circles = _circles(ax)
    assert np.all(np.isfinite(circles))
    # a 6 mm box: a 6 mm circle, 6 pixels wide (1.0 mm) and 4 high (1.5 mm); the point: the 2-pixel minimum radius
    np.testing.assert_allclose(circles, [[10.0, 12.0, 6.0, 4.0], [20.0, 6.0, 4.0, 4.0 / 1.5]])
    assert len(show(vol, findings=table, k=9).patches) == 0  # 3.4 mm from the point, 4 mm from the box centre


@pytest.mark.parametrize("window", [(150, -1350), (-600,), (-600, "W1500"), -600, (0, float("nan"))])
def test_a_window_that_is_not_a_range_is_refused_naming_it(window):
    with pytest.raises(ValueError, match=r"window=.* is not an HU range \(lowest, highest\): pass two numbers, lowest first"):
        show(_lps_volume(), window=window)


def test_the_window_sets_the_grey_scale():
    ax = show(_lps_volume(), window=(-160, 240))
    assert ax.images[0].get_clim() == (-160.0, 240.0)


# -- what it is given ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("findings", "named"),
    [
        ([1, 2], r"finding 0 is not an object with center_lps"),
        (
            [{"center_lps": [0.0, 0.0, 107.0]}],
            r"findings, finding 0: finding .* has no box: center_lps is given without diameter_mm",
        ),
        ([{"center_lps": [0.0, 0.0], "diameter_mm": 5.0}], r"center_lps must be 3 finite numbers .*got \[0\.0, 0\.0\]"),
        ([{"center_lps": [0.0, 0.0, 107.0], "diameter_mm": "6 mm"}], r"diameter_mm must be a positive size in mm, got '6 mm'"),
    ],
)
def test_findings_without_a_usable_centre_and_size_are_refused_naming_them(findings, named):
    """The same check ``reconstruct(findings=...)`` makes: the finding's index, the field and the value, with the fix
    (before, ``float() argument must be ... not 'NoneType'``)."""
    from pipeline.errors import ReconstructionError

    with pytest.raises(ReconstructionError, match=named) as err:
        show(_lps_volume(), findings=findings)
    assert "Fix: give box_min_lps/box_max_lps (LPS mm), or center_lps with diameter_mm" in str(err.value)


def test_findings_given_as_a_box_only_are_drawn_with_its_equivalent_diameter():
    vol = _lps_volume()
    lo, hi = vol.index_to_lps([7.0, 10.0, 7.0]), vol.index_to_lps([13.0, 14.0, 7.0])
    lo[2], hi[2] = lo[2] - 3.0, hi[2] + 3.0  # 6 x 6 x 6 mm
    ax = show(vol, findings=[{"box_min_lps": lo.tolist(), "box_max_lps": hi.tolist(), "score": 0.7}], k=7)
    np.testing.assert_allclose(_circles(ax), [[10.0, 12.0, 6.0, 4.0]])


def test_a_findings_json_path_is_read_as_reconstruct_reads_it(tmp_path):
    from pipeline.detection.findings import Finding, Findings
    from pipeline.errors import ReconstructionError

    vol = _lps_volume(SeriesInstanceUID="1.2.3")
    c = vol.index_to_lps([10.0, 12.0, 7.0])
    f = Finding(tuple(c), tuple(c - 3.0), tuple(c + 3.0), 6.0, 0.8, (10, 12, 7), 8)
    path = Findings([f], series_uid="1.2.3").write_json(tmp_path / "findings.json")
    ax = show(vol, findings=str(path))
    assert _circles(ax)[:, :2].tolist() == [[10.0, 12.0]]
    with pytest.raises(GeometryError, match="the findings are of series 4.5.6, the volume is series 1.2.3"):
        show(vol, findings=Findings([f], series_uid="4.5.6").write_json(tmp_path / "other.json"))
    with pytest.raises(ReconstructionError, match=r"missing\.json: cannot read the findings"):
        show(vol, findings=tmp_path / "missing.json")


@pytest.mark.parametrize("recon", [np.zeros(SHAPE, bool), [np.zeros(SHAPE, bool)], "masks.npz"])
def test_recon_that_is_no_reconstruction_label_map_or_dict_is_refused_naming_it(recon):
    with pytest.raises(TypeError, match=r"recon= must be a Reconstruction, a LabelMap or a dict of bool masks") as err:
        show(_lps_volume(), recon=recon)
    assert type(recon).__name__ in str(err.value) and "{'lesion': mask}" in str(err.value)
    lesion = np.zeros(SHAPE, bool)
    lesion[:, 2:6, 20:30] = True
    ax = show(_lps_volume(), recon={"lesion": lesion})  # the fix it names works
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["lesion"]


@pytest.mark.parametrize(("option", "value"), [("slice", 8.5), ("k", "3"), ("k", float("nan"))])
def test_a_slice_or_k_that_is_not_a_whole_number_is_refused_naming_it(option, value):
    with pytest.raises(TypeError, match=rf"{option}={value!r} is not a whole number"):
        show(_lps_volume(), **{option: value})


def test_a_slice_number_read_as_a_float_names_its_slice():
    """A pandas column with gaps holds whole numbers as floats: ``slice=table.slice_number[0]`` may be 8.0."""
    assert show(_lps_volume(), slice=np.float64(8.0)).get_title().startswith("slice 8 (k=7)")
    assert show(_lps_volume(), k=7.0).get_title().startswith("slice 8 (k=7)")


def test_ax_that_is_not_one_axes_is_refused_naming_it():
    """``fig, axes = plt.subplots(1, 2); show(vol, ax=axes)`` raised "'numpy.ndarray' object has no attribute 'imshow'"."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    with pytest.raises(
        TypeError, match=r"ax= must be one matplotlib Axes, got ndarray of 2 Axes: pass one of them, e\.g\. ax=axes\[0\]"
    ):
        show(_lps_volume(), ax=axes)
    with pytest.raises(
        TypeError, match=r"ax= must be one matplotlib Axes, got Figure: pass one of its Axes, e\.g\. ax=fig\.gca\(\)"
    ):
        show(_lps_volume(), ax=fig)
    assert show(_lps_volume(), ax=axes[1]) is axes[1]


def test_a_short_series_name_is_not_shown_as_the_end_of_a_longer_one():
    """An image file's volume is named by its file name (``example_ct``): the title showed ``series …example_ct``."""
    first_line = show(_lps_volume(SeriesInstanceUID="example_ct")).get_title().splitlines()[0]  # the window below it
    assert first_line.endswith(" · series example_ct")
    long = "1.2.826.0.1.3680043.8.498.12452262804706837244"
    assert show(_lps_volume(SeriesInstanceUID=long)).get_title().splitlines()[0].endswith(f" · series …{long[-12:]}")


def test_each_circle_gives_the_score_as_the_findings_table_png_and_sr_do():
    # was: "1.00" beside a finding that ctpipe detect, its PNG and the SR give as 0.997 (the planning chest's nodule 2)
    vol = _lps_volume()
    centre = vol.index_to_lps([24.0, 4.0, 10.0])
    scores = {0.99694: "0.997", 0.99996: "0.999", 0.5: "0.500"}  # never a score below 1 stated as 1
    for score, text in scores.items():
        ax = show(vol, findings=[{"center_lps": centre.tolist(), "diameter_mm": 6.0, "score": score}])
        labels = [t.get_text() for t in ax.texts if t.get_text() not in ("R", "L", "A", "P") and not t.get_text().endswith(" mm")]
        assert labels == [text], (score, labels)


def test_masks_without_a_colour_of_their_own_are_outlined_in_distinct_colours():
    # was: recon={"lesion": ..., "cyst": ...} drew both outlines white, and the legend two white lines
    from matplotlib.colors import to_hex

    from pipeline.reconstruction.organs import OUTLINE_COLORS

    vol = _lps_volume()
    masks = {name: np.zeros(SHAPE, bool) for name in ("lesion", "cyst", "lung_left")}
    masks["lesion"][8:13, 2:6, 20:30] = True
    masks["cyst"][8:13, 10:14, 4:10] = True
    masks["lung_left"][8:13, 15:19, 20:30] = True
    ax = show(vol, recon=masks, k=10)
    legend = ax.get_legend()
    colours = {t.get_text(): to_hex(h.get_color()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert set(colours) == {"lesion", "cyst", "left lung"} and len(set(colours.values())) == 3, colours
    assert colours["left lung"] == OUTLINE_COLORS["lung_left"]
    drawn = {to_hex(c.get_edgecolor()[0]) for c in ax.collections}
    assert set(colours.values()) <= drawn  # the outlines are drawn in the legend's colours


def test_only_the_masks_whose_outline_is_drawn_are_in_the_legend():
    vol = _lps_volume()
    block = np.zeros(SHAPE, bool)
    block[:, 2:6, 20:30] = True
    everywhere = np.ones(SHAPE, bool)  # no edge on any plane: nothing drawn, so no legend entry either
    ax = show(vol, recon={"lesion": block, "field_of_view": everywhere})
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["lesion"]
    ax = show(vol, recon={"field_of_view": everywhere})
    assert ax.get_legend() is None  # no outline drawn: no empty legend box


@pytest.mark.parametrize(
    "bad",
    [
        {"recon": np.zeros(SHAPE, bool)},
        {"slice": 8.5},
        {"slice": 21},
        {"k": 20},
        {"slice": 3, "k": 2},
        {"window": (150, -1350)},
        {"ax": "axes"},
    ],
)
def test_every_argument_show_refuses_is_a_ctpipe_error(bad):
    """A notebook that catches ``CtpipeError`` around a figure catches show()'s refusals too; the plain Python
    types stay (a TypeError, ValueError or IndexError handler still catches them)."""
    from pipeline.errors import CtpipeError, DisplayArgumentError

    with pytest.raises(CtpipeError) as err:
        show(_lps_volume(), **bad)
    assert isinstance(err.value, DisplayArgumentError)
    assert isinstance(err.value, (TypeError, ValueError, IndexError))
    assert next(iter(bad)) + "=" in str(err.value) or "slice" in str(err.value)
