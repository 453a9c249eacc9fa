"""DALI loader == torch loader == MONAI's own transforms, and the index → LPS mapping agrees with MONAI's affine.

Tolerance (model units, window -1024..300 HU → 0..1): max abs difference < 1e-5 and
mean abs difference < 1e-6 against MONAI (Orientationd RAS → Spacingd bilinear →
ScaleIntensityRanged clip → DivisiblePadd); affines equal within 1e-6 mm.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.cache import CaseCache
from pipeline.load import DaliLoader, PreprocessSpec, Roi, TorchLoader, dali_available, make_loader
from pipeline.phantom import generate_phantom
from pipeline.volume import LPS_TO_RAS, CTVolume
from tests._support.volumes import synthetic

HAVE_DALI = dali_available()[0]
LOADERS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(not HAVE_DALI, reason="nvidia-dali not installed"))]
MAX_TOL, MEAN_TOL = 1e-5, 1e-6
BUNDLE = PreprocessSpec(spacing=(0.703125, 0.703125, 1.25), intensity_window=(-1024, 300), size_divisible=(16, 16, 8))


def rotation(axis: int, degrees: float) -> np.ndarray:
    c, s = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    a, b = [x for x in range(3) if x != axis]
    m = np.eye(3)
    m[a, a], m[a, b], m[b, a], m[b, b] = c, -s, s, c
    return m


def phantom(seed: int, matrix: int, slices: int, position: str = "HFS") -> CTVolume:
    """A phantom chest (one small nodule) on a ``slices`` × ``matrix`` × ``matrix`` grid."""
    return generate_phantom(
        seed,
        matrix=matrix,
        pixel_spacing=1.5,
        slice_spacing=2.5,
        slices=slices,
        patient_position=position,
        n_nodules=1,
        nodule_diameter_mm=(4.0, 8.0),
    ).volume


def monai_reference(volume: CTVolume, spec: PreprocessSpec, method: str = "symmetric"):
    from monai.data import MetaTensor
    from monai.transforms import Compose, DivisiblePadd, Orientationd, ScaleIntensityRanged, Spacingd

    arr, aff = volume.to_monai()
    data = {"image": MetaTensor(torch.from_numpy(arr.astype(np.float32)), affine=torch.from_numpy(aff))}
    (a_min, a_max), (b_min, b_max) = spec.intensity_window, spec.output_range
    chain = Compose(
        [
            Orientationd(keys="image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Spacingd(keys="image", pixdim=spec.spacing, mode="bilinear"),
            ScaleIntensityRanged(keys="image", a_min=a_min, a_max=a_max, b_min=b_min, b_max=b_max, clip=spec.clip),
            DivisiblePadd(keys="image", k=spec.size_divisible, method=method),
        ]
    )
    return chain(data)["image"]


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got.detach().cpu().double() - torch.as_tensor(want).cpu().double()).abs()
    mx, mean = float(diff.max()), float(diff.mean())
    assert mx < MAX_TOL and mean < MEAN_TOL, f"{what}: max abs diff {mx:.3g}, mean abs diff {mean:.3g}"


CASES = {
    "hfs_int16": dict(shape=(22, 40, 46), spacing=(0.8, 0.75, 2.0), direction=np.eye(3)),
    "ffs_float32": dict(shape=(19, 37, 41), spacing=(0.6, 0.65, 1.0), direction=np.diag([-1.0, 1.0, -1.0]), dtype=np.float32),
    "flipped_rows": dict(shape=(17, 33, 29), spacing=(0.9, 0.9, 1.25), direction=np.diag([1.0, -1.0, 1.0])),
    "permuted_axes": dict(shape=(20, 30, 35), spacing=(0.9, 0.7, 1.5), direction=np.array([[0, 0, 1], [1, 0, 0], [0, -1, 0.0]])),
    "oblique_12deg": dict(shape=(18, 31, 33), spacing=(0.74, 0.74, 1.6), direction=rotation(2, 12.0) @ rotation(0, 5.0)),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> CaseCache:
    c = CaseCache(tmp_path_factory.mktemp("cache"))
    for n, (name, kw) in enumerate(CASES.items()):
        c.write(name, synthetic(seed=n, **kw))
    c.write("phantom_hfs", phantom(3, 64, 20))
    c.write("phantom_ffs", phantom(4, 64, 16, "FFS"))
    c.write("phantom_hfdr", phantom(5, 64, 12, "HFDR"))
    return c


@pytest.mark.parametrize("loader", LOADERS)
def test_matches_monai_transforms_and_affine(cache, loader):
    ids = list(CASES) + ["phantom_hfs", "phantom_ffs", "phantom_hfdr"]
    out = list(make_loader(cache, BUNDLE, loader=loader, device="cpu", batch_size=2).load(ids))
    assert [c.case_id for c in out] == ids
    for case in out:
        assert case.ok, case.error
        assert case.tensor.dtype == torch.float32 and case.tensor.device.type == "cpu"
        ref = monai_reference(cache.read(case.case_id), BUNDLE)
        assert_close(case.tensor, ref.as_tensor(), f"{loader} vs MONAI, case {case.case_id}")
        np.testing.assert_allclose(
            case.geometry.affine_ras, ref.affine.numpy(), atol=1e-6, err_msg=f"{case.case_id}: affine differs from MONAI's"
        )
        np.testing.assert_allclose(case.geometry.affine_lps, LPS_TO_RAS @ ref.affine.numpy(), atol=1e-6)
        assert all(s % d == 0 for s, d in zip(case.tensor.shape[1:], BUNDLE.size_divisible))


@pytest.mark.skipif(not HAVE_DALI, reason="nvidia-dali not installed")
def test_dali_equals_torch_batch_of_different_sizes(cache):
    ids = ["hfs_int16", "flipped_rows", "phantom_hfs"]
    spec = BUNDLE.replace(size_divisible=(1, 1, 1))
    dali = list(DaliLoader(cache, spec, device="cpu", batch_size=3, num_threads=2).load(ids))
    torch_ = list(TorchLoader(cache, spec, device="cpu").load(ids))
    shapes = {tuple(c.tensor.shape) for c in dali}
    assert len(shapes) == 3, f"the batch should hold three different shapes, got {shapes}"
    for d, t in zip(dali, torch_):
        assert d.geometry == t.geometry
        assert_close(d.tensor, t.tensor, f"DALI vs torch, case {d.case_id}")


@pytest.mark.parametrize("loader", LOADERS)
def test_end_padding_and_other_window(cache, loader):
    spec = PreprocessSpec(
        spacing=(1.0, 0.8, 1.7), intensity_window=(-500, 500), output_range=(-1, 1), size_divisible=(8, 4, 4), pad_method="end"
    )
    for case in make_loader(cache, spec, loader=loader, device="cpu").load(["hfs_int16", "ffs_float32"]):
        ref = monai_reference(cache.read(case.case_id), spec, method="end")
        assert_close(case.tensor, ref.as_tensor(), f"{loader} end padding, case {case.case_id}")
        np.testing.assert_allclose(case.geometry.affine_ras, ref.affine.numpy(), atol=1e-6)


@pytest.mark.parametrize("loader", LOADERS)
def test_unresampled_mapping_matches_ctvolume(cache, loader):
    """spacing=None keeps the grid: tensor voxel (x, y, z) is a source voxel, flipped to RAS."""
    spec = PreprocessSpec(spacing=(None, None, None), size_divisible=(1, 1, 1), intensity_window=(-1024, 300))
    vol = cache.read("hfs_int16")
    case = make_loader(cache, spec, loader=loader, device="cpu").load_one("hfs_int16")
    nk, nj, ni = vol.shape
    assert tuple(case.tensor.shape) == (1, ni, nj, nk)
    rng = np.random.default_rng(1)
    idx = np.stack([rng.integers(0, n, 50) for n in (ni, nj, nk)], axis=1)
    src = np.stack([ni - 1 - idx[:, 0], nj - 1 - idx[:, 1], idx[:, 2]], axis=1)  # LPS i,j run to L,P: RAS flips them
    np.testing.assert_allclose(case.input_index_to_lps(idx), vol.index_to_lps(src), atol=1e-9)
    np.testing.assert_allclose(case.lps_to_input_index(vol.index_to_lps(src)), idx, atol=1e-9)
    hu = vol.array[src[:, 2], src[:, 1], src[:, 0]].astype(np.float64)
    want = np.clip((hu + 1024) / 1324, 0, 1)
    got = case.tensor[0, idx[:, 0], idx[:, 1], idx[:, 2]].double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    # the LPS position of the voxel with the largest value is where CTVolume says it is
    p = np.unravel_index(int(case.tensor.argmax()), case.tensor.shape[1:])
    lps = case.input_index_to_lps(np.array(p, dtype=float))
    s = np.round(vol.lps_to_index(lps)).astype(int)
    assert vol.array[s[2], s[1], s[0]] >= 300


@pytest.mark.parametrize("loader", LOADERS)
def test_roi_crop_is_a_window_of_the_full_input(cache, loader):
    vol = cache.read("ffs_float32")
    lo_lps = vol.index_to_lps([8, 10, 4])
    hi_lps = vol.index_to_lps([25, 30, 12])
    roi = Roi(lo=lo_lps, hi=hi_lps, space="lps", margin_mm=2.0)
    ld = make_loader(cache, BUNDLE, loader=loader, device="cpu")
    full = ld.load_one("ffs_float32")
    crop = ld.load_one("ffs_float32", roi=roi)
    assert all(c < f for c, f in zip(crop.tensor.shape[1:3], full.tensor.shape[1:3]))
    # every crop voxel holding image data equals the full input's voxel at the same LPS position
    (lo, hi) = crop.geometry.valid_box
    grid = np.stack(np.meshgrid(*[np.arange(a, b) for a, b in zip(lo, hi)], indexing="ij"), -1).reshape(-1, 3)
    in_full = np.round(full.lps_to_input_index(crop.input_index_to_lps(grid))).astype(int)
    np.testing.assert_allclose(full.input_index_to_lps(in_full), crop.input_index_to_lps(grid), atol=1e-6)
    a = crop.tensor[0, grid[:, 0], grid[:, 1], grid[:, 2]]
    b = full.tensor[0, in_full[:, 0], in_full[:, 1], in_full[:, 2]]
    assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
    # the ROI (plus margin) lies inside the cropped input
    for corner in (lo_lps, hi_lps):
        x = crop.lps_to_input_index(corner)
        assert np.all(x >= -1e-6) and np.all(x <= np.array(crop.tensor.shape[1:]) - 1 + 1e-6), x
    # the same box given as source voxel indices gives the same input
    by_index = ld.load_one("ffs_float32", roi=Roi(lo=(8, 10, 4), hi=(25, 30, 12), space="index", margin_mm=2.0))
    assert by_index.geometry == crop.geometry
    assert torch.equal(by_index.tensor, crop.tensor)


@pytest.mark.parametrize("loader", LOADERS)
def test_roi_from_sidecar_key(tmp_path, loader):
    cache = CaseCache(tmp_path)
    vol = synthetic((16, 30, 34), (0.8, 0.8, 1.5))
    box = {"lo": [6, 5, 2], "hi": [20, 18, 9], "space": "index", "margin_mm": 1.0}
    cache.write("with_box", vol, extra={"lung_box": box})
    cache.write("without_box", vol)
    spec = BUNDLE.replace(roi_key="lung_box", size_divisible=(4, 4, 4))
    ld = make_loader(cache, spec, loader=loader, device="cpu")
    with_box, without_box = ld.load(["with_box", "without_box"])
    explicit = make_loader(cache, spec.replace(roi_key=None), loader=loader, device="cpu").load_one(
        "with_box", roi=Roi.from_json(box)
    )
    assert with_box.geometry == explicit.geometry and torch.equal(with_box.tensor, explicit.tensor)
    full = make_loader(cache, spec.replace(roi_key=None), loader=loader, device="cpu").load_one("without_box")
    assert without_box.geometry == full.geometry
    assert with_box.tensor.numel() < without_box.tensor.numel()
