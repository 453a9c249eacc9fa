"""Geometry, CTVolume and resampling: LPS conventions checked against SimpleITK."""

from __future__ import annotations

import numpy as np
import pytest
import SimpleITK as sitk

from pipeline.errors import GeometryError, LoaderError
from pipeline.volume import CTVolume, Geometry, LabelMap, resample_array


def _oblique_direction() -> np.ndarray:
    a = np.deg2rad(20)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    flip = np.diag([1.0, -1.0, -1.0])  # a feet-first-like flip of j and k
    return rz @ flip


def _volume(shape=(6, 7, 9), direction=None, dtype=np.int16) -> CTVolume:
    rng = np.random.default_rng(0)
    arr = rng.integers(-1000, 1000, size=shape).astype(dtype)
    geom = Geometry(
        shape=shape,
        spacing=(0.7, 0.8, 2.5),
        origin=(-120.0, -90.5, 33.0),
        direction=np.eye(3) if direction is None else direction,
    )
    return CTVolume(arr, geom, metadata={"SeriesInstanceUID": "1.2.3"})


def test_index_to_lps_matches_simpleitk():
    vol = _volume(direction=_oblique_direction())
    img = vol.to_sitk()
    for ijk in [(0, 0, 0), (8, 6, 5), (3, 1, 2)]:
        expected = img.TransformIndexToPhysicalPoint(ijk)
        np.testing.assert_allclose(vol.index_to_lps(ijk), expected, atol=1e-9)
        np.testing.assert_allclose(vol.lps_to_index(expected), ijk, atol=1e-9)


def test_sitk_round_trip_keeps_voxels_and_geometry():
    vol = _volume(direction=_oblique_direction())
    back = CTVolume.from_sitk(vol.to_sitk())
    np.testing.assert_array_equal(back.array, vol.array)
    assert back.geometry.same_grid(vol.geometry, atol=1e-9)


def test_monai_convention_is_channel_first_ijk_with_ras_affine():
    vol = _volume()
    arr, affine = vol.to_monai()
    assert arr.shape == (1, 9, 7, 6)
    assert arr[0, 4, 2, 1] == vol.array[1, 2, 4]
    lps = vol.index_to_lps((4, 2, 1))
    ras = affine @ np.array([4, 2, 1, 1.0])
    np.testing.assert_allclose(ras[:3], [-lps[0], -lps[1], lps[2]])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"spacing": (0.7, 0.0, 1.0)}, "spacing must be > 0"),
        ({"direction": np.array([[1, 0.2, 0], [0, 1, 0], [0, 0, 1.0]])}, "not orthonormal"),
        ({"origin": (0, float("nan"), 0)}, "origin must be 3 finite"),
        ({"shape": (0, 4, 4)}, "shape must be 3 positive"),
    ],
)
def test_invalid_geometry_is_refused_with_the_value(kwargs, words):
    base = {"shape": (4, 4, 4), "spacing": (1, 1, 1), "origin": (0, 0, 0)}
    base.update(kwargs)
    with pytest.raises(GeometryError, match=words):
        Geometry(**base)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"shape": (0, 4, 4)}, "shape must be 3 positive sizes (k, j, i), got (0, 4, 4)"),
        ({"shape": (4, 4)}, "shape must be 3 positive sizes (k, j, i), got (4, 4)"),
        ({"shape": (4.5, 4, 4)}, "got (4.5, 4, 4)"),  # was: taken as 4 slices
        ({"shape": None}, "got None"),  # was: a bare TypeError
        ({"origin": (0, 0)}, "origin must be 3 finite numbers"),
        ({"origin": ("a", 0, 0)}, "origin must be 3 finite numbers"),  # was: a bare ValueError
        ({"direction": np.eye(2)}, "direction must be a 3x3 matrix"),
        ({"direction": "abc"}, "direction must be a 3x3 matrix of numbers, got str 'abc'"),  # was: a bare ValueError
        ({"direction": [1, 0, 0]}, "direction must be a 3x3 matrix, got list [1, 0, 0]"),
        ({"direction": [[1, 0, 0], [0, 1]]}, "direction must be a 3x3 matrix of numbers"),  # was: a bare ValueError
        ({"direction": {"i": (1, 0, 0)}}, "direction must be a 3x3 matrix of numbers, got dict"),  # was: a TypeError
        ({"direction": np.eye(3) * 1j}, "dtype complex128"),  # was: a ComplexWarning, then all zeros "not orthonormal"
        ({"direction": np.where(np.eye(3) > 0, np.nan, 0.0)}, "direction must be a 3x3 matrix of finite numbers"),
    ],
    ids=[
        "empty",
        "2-D",
        "fraction",
        "none",
        "origin-2",
        "origin-text",
        "direction",
        "direction-text",
        "direction-3",
        "direction-ragged",
        "direction-dict",
        "direction-complex",
        "direction-nan",
    ],
)
def test_invalid_geometry_says_what_to_pass(kwargs, words):
    # was: the shape, origin and direction errors said what was wrong, and not what to pass instead
    base: dict = {"shape": (4, 4, 4), "spacing": (1, 1, 1), "origin": (0, 0, 0)}
    base.update(kwargs)
    with pytest.raises(GeometryError) as err:
        Geometry(**base)
    assert words in err.value.problem and err.value.fix, str(err.value)
    if "shape" in kwargs:
        assert "[k, j, i]" in err.value.fix and "shape=array.shape" in err.value.fix
    if "direction" in kwargs:
        assert "3x3 matrix whose column c is the LPS direction of index axis c" in err.value.fix


def test_array_shape_must_match_geometry():
    geom = Geometry(shape=(4, 4, 4), spacing=(1, 1, 1), origin=(0, 0, 0))
    with pytest.raises(GeometryError, match=r"differs from geometry shape"):
        CTVolume(np.zeros((4, 4, 5), np.int16), geom)


def test_linear_resampling_matches_simpleitk():
    vol = _volume(shape=(10, 12, 14), dtype=np.float32, direction=_oblique_direction())
    out = vol.resample((1.1, 0.6, 1.7), device="cpu")
    ref = sitk.Resample(vol.to_sitk(), out.to_sitk(), sitk.Transform(), sitk.sitkLinear, 0.0, sitk.sitkFloat32)
    ref_arr = sitk.GetArrayFromImage(ref)
    # compare inside the source extent (SimpleITK pads outside with 0, ctpipe clamps to the edge)
    idx = np.stack(np.meshgrid(*[np.arange(n) for n in out.geometry.size_ijk], indexing="ij"), -1).reshape(-1, 3)
    src_idx = vol.lps_to_index(out.index_to_lps(idx))
    inside = np.all((src_idx >= 0) & (src_idx <= np.array(vol.geometry.size_ijk) - 1), axis=1)
    mine = out.array.transpose(2, 1, 0).reshape(-1)
    theirs = ref_arr.transpose(2, 1, 0).reshape(-1)
    assert inside.sum() > 0.5 * inside.size
    np.testing.assert_allclose(mine[inside], theirs[inside], atol=1e-2)


def test_nearest_resampling_of_labels_keeps_label_values_and_positions():
    geom = Geometry(shape=(8, 8, 8), spacing=(1, 1, 2), origin=(0, 0, 0))
    arr = np.zeros((8, 8, 8), np.uint8)
    arr[2:6, 3:5, 1:4] = 3
    labels = LabelMap(arr, geom, labels={3: "lung_left"})
    out = labels.resample((0.5, 0.5, 1.0))
    assert set(np.unique(out.array)) == {0, 3}
    assert out.labels == {3: "lung_left"}

    # the centroid in LPS is preserved to within half an output voxel
    def centroid(lm):
        k, j, i = np.nonzero(lm.array)
        return lm.index_to_lps(np.stack([i, j, k], 1)).mean(0)

    np.testing.assert_allclose(centroid(out), centroid(labels), atol=0.5)


def test_resample_array_refuses_different_directions():
    a = Geometry(shape=(2, 2, 2), spacing=(1, 1, 1), origin=(0, 0, 0))
    b = a.with_(direction=np.diag([-1.0, 1, -1]))
    with pytest.raises(GeometryError, match="equal direction"):
        resample_array(np.zeros((2, 2, 2), np.float32), a, b)


def test_crop_returns_new_volume_with_shifted_origin():
    vol = _volume(direction=_oblique_direction())
    sub = vol.crop((2, 1, 3), (6, 5, 6))
    assert sub.shape == (3, 4, 4)
    np.testing.assert_allclose(sub.origin, vol.index_to_lps((2, 1, 3)))
    np.testing.assert_array_equal(sub.array, vol.array[3:6, 1:5, 2:6])
    np.testing.assert_allclose(sub.index_to_lps((1, 1, 1)), vol.index_to_lps((3, 2, 4)))
    before = int(vol.array[3, 1, 2])
    sub.array[0, 0, 0] = before + 1
    assert int(vol.array[3, 1, 2]) == before  # a copy, not a view


def test_crop_outside_the_grid_is_an_error():
    vol = _volume()
    with pytest.raises(GeometryError, match="empty crop box"):
        vol.crop((20, 0, 0), (30, 2, 2))


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda v: v.crop((0, 0), (3, 3)), r"corners must be 3 whole voxel indices \(i, j, k\).*lo=\(0, 0\)"),
        (lambda v: v.crop((1.5, 0, 0), (3, 3, 3)), r"whole voxel indices.*lo=\(1\.5, 0, 0\)"),  # not silently voxel 1
        (lambda v: v.crop((0, 0, 0), (3, 3, 3, 3)), r"hi=\(3, 3, 3, 3\)"),
        (lambda v: v.resample((0.0, 1.0, 1.0)), r"new spacing must be > 0 mm.*\(0\.0, 1\.0, 1\.0\)"),
        (lambda v: v.geometry.binned((1, 1)), r"steps must be 3 whole numbers.*\(1, 1\)"),
        (lambda v: v.geometry.binned((1, 0, 2)), r"steps must be 3 whole numbers.*1 or more.*\(1, 0, 2\)"),
        (lambda v: v.geometry.binned(2), r"steps must be 3 whole numbers.*got int 2"),  # was: a bare TypeError
        (lambda v: v.geometry.binned(("a", 1, 1)), r"steps must be 3 whole numbers.*'a'"),  # was: a bare ValueError
        (lambda v: v.geometry.binned((float("inf"), 1, 1)), r"steps must be 3 whole numbers.*inf"),  # OverflowError
        (lambda v: v.geometry.with_(spacings=(1, 1, 1)), r"Geometry has no field 'spacings'"),  # was: a TypeError
        (lambda v: v.resample((-1.0, 1.0, 1.0)), r"new spacing must be > 0 mm.*\(-1\.0, 1\.0, 1\.0\)"),
        (lambda v: v.resample((1.0, 2.0)), r"spacing must be one number or 3 numbers \(i, j, k\) in mm, got \(1\.0, 2\.0\)"),
        (lambda v: v.resample("2mm"), r"spacing must be one number or 3 numbers.*got '2mm'"),
        (lambda v: v.resample(True), r"spacing must be one number or 3 numbers.*got True"),
        (lambda v: v.resample(-2), r"new spacing must be > 0 mm.*got -2"),
        (lambda v: v.index_to_lps([[1, 2]]), r"voxel indices \(i, j, k\) must have 3 coordinates.*shape \(1, 2\)"),
        (lambda v: v.lps_to_index((1.0, 2.0)), r"LPS points \(x, y, z\) in mm must have 3 coordinates.*shape \(2,\)"),
    ],
)
def test_wrong_corners_spacings_and_points_are_refused_with_the_value(call, words):
    with pytest.raises(GeometryError, match=words) as err:
        call(_volume())
    assert err.value.fix


@pytest.mark.parametrize("device", ["tpu", -1, "cuda:x"])
def test_resample_refuses_an_unknown_device_with_the_device_names(device):
    # was: torch's own RuntimeError ("Expected one of cpu, cuda, ipu, xpu, ...") from deep inside resample_array
    vol = _volume()
    labels = LabelMap((vol.array > 0).astype(np.uint8), vol.geometry, labels={1: "x"})
    for call in (lambda: vol.resample(2, device=device), lambda: labels.resample(2, device=device)):
        with pytest.raises(LoaderError) as err:
            call()
        assert f"unknown device {device!r}" in str(err.value) and "cuda:N" in str(err.value) and err.value.fix


def test_resample_reads_the_device_names_detect_reads(monkeypatch):
    # was: device="CPU" and device="auto" were torch's errors, though detect and reconstruct read them
    vol = _volume()
    for name in ("CPU", "auto", " cpu "):
        assert np.array_equal(vol.resample(2, device=name).array, vol.resample(2, device="cpu").array)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(LoaderError, match=r"device 1 \(cuda:1\) was asked for but torch sees no CUDA GPU"):
        vol.resample(2, device=1)


def test_one_number_resamples_to_isotropic_voxels_like_monai_and_torchio():
    vol = _volume()
    labels = LabelMap((vol.array > 0).astype(np.uint8), vol.geometry, labels={1: "x"})
    for spacing in (2, 2.0, np.float32(2.0)):
        out = vol.resample(spacing, device="cpu")
        assert out.spacing == (2.0, 2.0, 2.0) and out.origin == vol.origin
        assert np.array_equal(out.array, vol.resample((2.0, 2.0, 2.0), device="cpu").array)
        assert labels.resample(spacing, device="cpu").geometry == out.geometry


def test_crop_keeps_the_kept_slices_source_references_and_resampling_drops_them():
    vol = _volume()
    nk = vol.shape[0]
    md = {
        "SeriesInstanceUID": "1.2.3",
        "InstanceNumbers": list(range(101, 101 + nk)),
        "SOPInstanceUIDs": [f"9.{k}" for k in range(nk)],
    }
    vol = CTVolume(vol.array, vol.geometry, metadata=md)
    sub = vol.crop((0, 0, 2), (9, 7, 5))
    assert sub.metadata["InstanceNumbers"] == [103, 104, 105] and sub.metadata["SOPInstanceUIDs"] == ["9.2", "9.3", "9.4"]
    coarse = vol.resample((1.4, 1.6, 5.0))
    assert "InstanceNumbers" not in coarse.metadata and "SOPInstanceUIDs" not in coarse.metadata
    assert coarse.series_uid == "1.2.3"


def test_volumes_label_maps_and_geometries_pickle_copy_compare_and_hash():
    import copy
    import pickle

    vol = _volume(direction=_oblique_direction())
    labels = LabelMap(vol.array > 0, vol.geometry, labels={1: "lung_left"})
    for obj in (vol, labels):
        back = pickle.loads(pickle.dumps(obj))
        np.testing.assert_array_equal(back.array, obj.array)
        assert back.geometry == obj.geometry and hash(back.geometry) == hash(obj.geometry)
        assert copy.deepcopy(obj).geometry == obj.geometry
    assert pickle.loads(pickle.dumps(vol)).metadata == dict(vol.metadata)
    assert dict(pickle.loads(pickle.dumps(labels)).labels) == {1: "lung_left"}
    moved = vol.geometry.with_(origin=(0.0, 0.0, 0.0))
    assert moved != vol.geometry and {vol.geometry, copy.deepcopy(vol.geometry)} == {vol.geometry}


def test_a_path_or_array_where_a_volume_belongs_says_how_to_make_one():
    from pipeline.errors import NotAVolumeError
    from pipeline.volume import require_volume

    with pytest.raises(NotAVolumeError, match=r"load_series\('scans/case1'\)"):
        require_volume("scans/case1")
    with pytest.raises(TypeError, match="CTVolume\\(array, Geometry"):  # a TypeError, as Python's own would be
        require_volume(np.zeros((2, 2, 2)))
    with pytest.raises(GeometryError, match="geometry must be a Geometry, got tuple"):
        CTVolume(np.zeros((3, 3, 3)), (2.0, 2.0, 3.0))  # type: ignore[arg-type]


def test_metadata_is_read_only():
    vol = _volume()
    with pytest.raises(TypeError, match="does not support item assignment"):
        vol.metadata["SeriesInstanceUID"] = "x"  # type: ignore[index]
    assert vol.metadata["SeriesInstanceUID"] == "1.2.3"
    assert "1.2.3" in repr(vol)


def _all_axis_aligned_directions():
    import itertools

    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            d = np.zeros((3, 3))
            for c, a in enumerate(perm):
                d[a, c] = signs[c]
            yield d


def test_lps_view_ascends_in_lps_for_every_axis_aligned_orientation():
    for d in _all_axis_aligned_directions():
        g = Geometry(shape=(4, 5, 6), spacing=(0.5, 0.7, 2.0), origin=(1.0, -2.0, 30.0), direction=d)
        coords = [np.broadcast_to(g.lps_coordinate(a), g.shape) for a in range(3)]
        # exact coordinates from index_to_lps, voxel by voxel
        k, j, i = np.indices(g.shape)
        ref = g.index_to_lps(np.stack([i, j, k], axis=-1))
        for a in range(3):
            np.testing.assert_allclose(coords[a], ref[..., a])
        views = [g.to_lps_view(c) for c in coords]  # [z, y, x]
        assert np.all(np.diff(views[0], axis=2) > 0) and np.all(np.diff(views[1], axis=1) > 0)
        assert np.all(np.diff(views[2], axis=0) > 0)
        lo, _ = g.bounds_lps()
        np.testing.assert_allclose([views[0][0, 0, 0], views[1][0, 0, 0], views[2][0, 0, 0]], lo)
        np.testing.assert_allclose(np.diff(views[0], axis=2)[0, 0, 0], g.spacing_lps()[0])
        np.testing.assert_allclose(np.diff(views[2], axis=0)[0, 0, 0], g.spacing_lps()[2])
        arr = np.arange(np.prod(g.shape)).reshape(g.shape)
        assert np.array_equal(g.from_lps_view(g.to_lps_view(arr)), arr)
        assert g.to_lps_view(arr).shape == tuple(g.shape[g.array_axis(a)] for a in (2, 1, 0))  # [z, y, x]


def test_slice_axis_and_centroid():
    feet_first_sagittal = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])  # k runs along x
    g = Geometry(shape=(6, 5, 4), spacing=(1.0, 1.0, 2.0), origin=(0.0, 0.0, 0.0), direction=feet_first_sagittal)
    assert g.array_axis(0) == 0  # x along k
    assert g.array_axis(2) == 1  # z along j (negatively)
    mask = np.zeros(g.shape, dtype=bool)
    mask[2, 1, 3] = True  # k=2, j=1, i=3
    np.testing.assert_allclose(g.centroid_lps(mask), g.index_to_lps([3, 1, 2]))
    with pytest.raises(GeometryError, match="empty"):
        g.centroid_lps(np.zeros(g.shape, dtype=bool))
    with pytest.raises(GeometryError, match="0 \\(x\\), 1 \\(y\\) or 2"):
        g.array_axis(3)


def test_axis_map_refuses_45_degree_grids():
    c = np.cos(np.pi / 4)
    rotated_45 = np.array([[c, c, 0.0], [c, -c, 0.0], [0.0, 0.0, 1.0]])  # i and j both read as x
    g = Geometry(shape=(2, 2, 2), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=rotated_45)
    with pytest.raises(GeometryError, match="axis-aligned"):
        g.axis_map()


def test_binned_grid_puts_each_voxel_at_its_blocks_centre():
    direction = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # i along -y, j along +x
    g = Geometry(shape=(9, 10, 11), spacing=(0.8, 0.9, 2.0), origin=(5.0, -3.0, 40.0), direction=direction)
    b = g.binned((2, 4, 4))
    assert b.shape == (5, 3, 3) and b.spacing == pytest.approx((3.2, 3.6, 4.0))
    assert np.allclose(b.direction, g.direction)
    block = np.array([[i, j, k] for i in range(4, 8) for j in range(4, 8) for k in range(2, 4)], dtype=float)
    assert np.allclose(b.index_to_lps([1, 1, 1]), g.index_to_lps(block).mean(axis=0))  # block (1, 1, 1): a full one
    with pytest.raises(GeometryError, match="steps must be 3 whole numbers of voxels, 1 or more"):
        g.binned((0, 1, 1))


def test_centroid_of_a_label_map_is_that_of_its_labelled_voxels_in_lps():
    """``geometry.centroid_lps(recon.masks["lung_left"])``: a LabelMap (not its array) gives the centre of its labelled
    voxels, on an oblique, flipped grid as for its array, checked against SimpleITK; one on another grid is refused."""
    vol = _volume(direction=_oblique_direction())
    arr = np.zeros(vol.shape, np.uint8)
    arr[1:3, 2:5, 4:8] = 1
    labels = LabelMap(arr, vol.geometry, labels={1: "blob"})
    centre = vol.geometry.centroid_lps(labels)
    img = labels.to_sitk()
    ijk = np.argwhere(arr)[:, ::-1].mean(axis=0)
    np.testing.assert_allclose(centre, img.TransformContinuousIndexToPhysicalPoint(ijk.tolist()), atol=1e-9)
    np.testing.assert_allclose(centre, vol.geometry.centroid_lps(arr.astype(bool)), atol=1e-12)
    moved = LabelMap(arr, vol.geometry.with_(origin=(0.0, 0.0, 0.0)), labels={1: "blob"})
    with pytest.raises(GeometryError, match="the label map lies on another grid"):
        vol.geometry.centroid_lps(moved)


def test_a_geometry_repr_is_one_line_with_its_units_and_the_way_each_index_axis_runs():
    """A notebook echoing ``vol.geometry`` got the dataclass repr: a multi-line direction array, no units, no order."""
    lps = Geometry(shape=(141, 512, 512), spacing=(0.9765625, 0.9765625, 2.0), origin=(-250.0, -164.0, -164.5))
    assert repr(lps) == (
        "Geometry(shape=(141, 512, 512) [k,j,i], spacing=(0.976562, 0.976562, 2) mm [i,j,k], "
        "origin=(-250, -164, -164.5) LPS mm, direction: i→L j→P k→S)"
    )
    ras = lps.with_(direction=np.diag([-1.0, -1.0, 1.0]))  # a NIfTI stored RAS, read through SimpleITK
    assert repr(ras).endswith("direction: i→R j→A k→S)")
    c, s = np.cos(np.radians(45)), np.sin(np.radians(45))  # no axis-aligned reading: the cosines themselves
    oblique = lps.with_(direction=np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]))
    assert "\n" not in repr(oblique)
    assert repr(oblique).endswith("direction=((0.707107, -0.707107, 0), (0.707107, 0.707107, 0), (0, 0, 1)))")


def test_a_volume_given_an_affine_for_its_geometry_says_how_to_get_one():
    """``CTVolume(array, nifti.affine)`` printed the matrix over several lines and advised building a Geometry only."""
    with pytest.raises(GeometryError) as err:
        CTVolume(np.zeros((2, 3, 4), np.int16), np.eye(4))
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("geometry must be a Geometry, got ndarray of shape (4, 4), dtype float64")
    assert "a 4x4 affine (a NIfTI's is RAS): read the file with load_series(path), which converts it to LPS" in text
