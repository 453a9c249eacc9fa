"""Notebook API mistakes: each gives a message that names the problem and the fix, or simply works.

One slice file of a series, NIfTI/MHA/NRRD images given to load_series, one organ name as a string,
values that are not HU, and short reprs of a reconstruction, its meshes and a phantom.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.errors import CtpipeError, NoSeriesFoundError, ReconstructionError, SingleSliceError
from pipeline.ingest import load_series, scan_directory
from pipeline.reconstruction import ORGANS, reconstruct
from pipeline.reconstruction.mesh import Mesh
from pipeline.volume import CTVolume
from tests._support.dicom import write_series
from tests._support.shapes import synthetic_chest


def _fix(err: pytest.ExceptionInfo) -> str:
    assert isinstance(err.value, CtpipeError) and err.value.fix, str(err.value)
    return err.value.fix


# --- 1. one file of a multi-slice series --------------------------------------------------------------
def test_one_slice_file_of_a_series_names_its_folder(tmp_path):
    paths = write_series(tmp_path, n=6, series_uid="1.2.3.44")
    with pytest.raises(SingleSliceError) as err:
        load_series(paths[2])
    text = str(err.value)
    assert str(paths[2]) in text and "one slice of series 1.2.3.44" in text and "6 slices" in text
    assert "scout" not in text
    assert _fix(err) == f"pass the folder: load_series({str(tmp_path)!r}); on the command line: {tmp_path} as the source"
    assert load_series(tmp_path).shape[0] == 6  # the fix works


def test_one_slice_file_in_a_folder_of_several_series_names_the_series(tmp_path):
    paths = write_series(tmp_path, n=5, series_uid="1.2.3.5", names=lambda k: f"a{k}.dcm")
    write_series(tmp_path, n=7, series_uid="1.2.3.7", names=lambda k: f"b{k}.dcm", series_number=3)
    with pytest.raises(SingleSliceError) as err:
        load_series(paths[0])
    assert "one slice of series 1.2.3.5" in str(err.value) and "5 slices" in str(err.value)
    fix = _fix(err)
    assert f"load_series({str(tmp_path)!r}, series_uid='1.2.3.5')" in fix and "2 series" in fix
    assert fix.endswith(f"on the command line: {tmp_path} --series-uid 1.2.3.5")  # ctpipe detect/reconstruct
    assert load_series(tmp_path, series_uid="1.2.3.5").shape[0] == 5


def test_a_lone_slice_is_still_called_a_scout_or_key_image(tmp_path):
    paths = write_series(tmp_path, n=1)
    (tmp_path / "notes.txt").write_text("not a slice\n" * 40)
    with pytest.raises(SingleSliceError) as err:
        load_series(paths[0])
    assert "at least 2 slices" in str(err.value) and "scout or key image" in _fix(err)


# --- 2. NIfTI / MHA / NRRD images -----------------------------------------------------------------------
OBLIQUE = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # columns: i, j, k axes in LPS


@pytest.fixture(scope="module")
def chest() -> CTVolume:
    vol, _ = synthetic_chest(n=24, slices=10, direction=OBLIQUE, noise=0.0)
    return vol.with_array(np.asarray(vol.array).astype(np.int16))


@pytest.mark.parametrize("name", ["chest.nii.gz", "chest.nii", "chest.mha", "chest.nrrd"])
def test_load_series_reads_an_image_file_in_lps(tmp_path, chest, name):
    import SimpleITK as sitk

    path = tmp_path / name
    sitk.WriteImage(chest.to_sitk(), str(path))
    vol = load_series(path)
    assert vol.series_uid == "chest"
    np.testing.assert_array_equal(vol.array, chest.array)
    np.testing.assert_allclose(vol.geometry.direction, OBLIQUE, atol=1e-6)
    np.testing.assert_allclose(vol.geometry.origin, chest.geometry.origin, atol=1e-4)
    np.testing.assert_allclose(vol.geometry.spacing, chest.geometry.spacing, atol=1e-6)
    # the voxel at the same index is at the same LPS point (a NIfTI is RAS on disk; the reader converts it)
    ijk = np.array([[3.0, 5.0, 7.0]])
    np.testing.assert_allclose(vol.geometry.index_to_lps(ijk), chest.geometry.index_to_lps(ijk), atol=1e-4)
    with pytest.raises(NoSeriesFoundError) as err:
        load_series(path, series_uid="1.2.3")
    assert "leave out series_uid" in _fix(err)


def test_run_batch_given_an_image_file_names_the_python_calls_that_read_it(tmp_path, chest):
    # was: "Fix: analyse the image with `ctpipe detect chest.nii.gz`", a shell command, in a notebook
    import SimpleITK as sitk

    from pipeline.errors import ConfigError
    from pipeline.runner import run_batch

    path = tmp_path / "chest.nii.gz"
    sitk.WriteImage(chest.to_sitk(), str(path))
    with pytest.raises(ConfigError) as err:
        run_batch([path], out=tmp_path / "run")
    assert str(path) in str(err.value) and "run_batch reads DICOM folders" in str(err.value)
    fix = _fix(err)
    assert fix == f"load it with volume = load_series({str(path)!r}), then detect(volume) or reconstruct(volume)", fix
    assert "ctpipe" not in fix and not (tmp_path / "run").exists()
    assert load_series(path).shape == chest.shape  # the fix works


@pytest.mark.parametrize(
    ("stored", "loaded"),
    [(np.int32, np.int16), (np.uint8, np.int16), (np.float64, np.float32), (np.float32, np.float32), (np.int16, np.int16)],
)
def test_an_image_file_loads_as_int16_or_float32_like_a_dicom_series(tmp_path, chest, stored, loaded):
    """load_series' documented types: an int32 NIfTI (what many tools write) is int16, a float64 one float32."""
    import SimpleITK as sitk

    values = np.clip(chest.array, 0, 255) if stored is np.uint8 else chest.array
    path = tmp_path / "chest.nii.gz"
    sitk.WriteImage(chest.with_array(values.astype(stored)).to_sitk(), str(path))
    vol = load_series(path)
    assert vol.array.dtype == loaded
    np.testing.assert_array_equal(vol.array, values)


def test_an_integer_image_beyond_int16_loads_as_float32(tmp_path, chest):
    import SimpleITK as sitk

    values = chest.array.astype(np.int32) * 100  # up to tens of thousands: beyond int16
    assert np.abs(values).max() > 32767
    path = tmp_path / "wide.mha"
    sitk.WriteImage(chest.with_array(values).to_sitk(), str(path))
    vol = load_series(path)
    assert vol.array.dtype == np.float32
    np.testing.assert_array_equal(vol.array, values)


def _not_one_volume(kind: str):
    import SimpleITK as sitk

    if kind == "2-D":
        return sitk.GetImageFromArray(np.zeros((10, 12), np.int16))
    if kind == "4-D":
        return sitk.JoinSeries([sitk.GetImageFromArray(np.zeros((3, 10, 12), np.int16))] * 2)
    return sitk.GetImageFromArray(np.zeros((3, 10, 12, 3), np.int16), isVector=True)


@pytest.mark.parametrize(
    "kind, words, fix",
    [
        ("2-D", r"this image is 2-D \(12x10\)", "sitk.JoinSeries"),
        ("4-D", r"this image is 4-D \(12x10x3x2\)", "image[:, :, :, 0]"),
        ("vector", r"3-D \(12x10x3\) with 3 component\(s\) per voxel", "sitk.VectorIndexSelectionCast"),
    ],
)
def test_an_image_that_is_not_one_3d_volume_is_refused_naming_the_file(tmp_path, kind, words, fix):
    import SimpleITK as sitk

    from pipeline.errors import GeometryError

    image = _not_one_volume(kind)
    with pytest.raises(GeometryError, match=words) as err:
        CTVolume.from_sitk(image)
    assert fix in _fix(err)
    path = tmp_path / "scan.nrrd"
    sitk.WriteImage(image, str(path))
    with pytest.raises(GeometryError, match=words) as err:
        load_series(path)
    assert str(err.value).startswith(f"{path}: ") and fix in _fix(err)


def test_a_folder_of_images_says_which_file_to_load(tmp_path, chest):
    import SimpleITK as sitk

    for name in ("b.nii.gz", "a.mha"):
        sitk.WriteImage(chest.to_sitk(), str(tmp_path / name))
    with pytest.raises(NoSeriesFoundError) as err:
        load_series(tmp_path)
    assert "no DICOM series but 2 image file(s): a.mha, b.nii.gz" in str(err.value)
    assert _fix(err) == f"load one image file: load_series({str(tmp_path / 'a.mha')!r}) reads NIfTI/MHA/NRRD images"
    assert "remove the file" not in str(err.value)


def test_an_image_next_to_a_dicom_series_is_skipped_with_how_to_load_it(tmp_path, chest):
    import SimpleITK as sitk

    write_series(tmp_path, n=6)
    sitk.WriteImage(chest.to_sitk(), str(tmp_path / "seg.nii.gz"))
    assert load_series(tmp_path).shape[0] == 6
    skipped = {f.path.name: f.reason for f in scan_directory(tmp_path).skipped_files}
    assert "NIfTI/MHA/NRRD image" in skipped["seg.nii.gz"]


# --- 3. organs --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_chest() -> CTVolume:
    return synthetic_chest(n=48, slices=24)[0]


def test_one_organ_name_as_a_string(small_chest):
    rec = reconstruct(small_chest, organs="lung_left", device="cpu", render=False)
    assert list(rec.masks) == ["lung_left"] and not rec.errors
    rec = reconstruct(small_chest, organs="body, bone", device="cpu", render=False)
    assert list(rec.masks) == ["body", "bone"]


def test_unknown_organ_names_list_the_valid_ones(small_chest):
    with pytest.raises(ReconstructionError) as err:
        reconstruct(small_chest, organs=["lungz", "heart"], device="cpu")
    text = str(err.value)
    assert "unknown organ name(s) ['heart', 'lungz']" in text and "_" not in text.split("]")[0].split("[")[1]
    assert all(o in text for o in ORGANS)
    assert "organs=['lung_left', 'lung_right']" in _fix(err)


# --- 4. values that are not HU --------------------------------------------------------------------------
def test_not_hu_hint_tells_stored_values_from_normalised_ones():
    from pipeline.intensity import not_hu_hint

    assert not_hu_hint(np.full((4, 8, 8), -1000.0)) == ""
    assert "stored pixel values" in not_hu_hint(np.full((4, 8, 8), 24, np.uint16))
    assert "normalised intensities" in not_hu_hint(np.linspace(0, 1, 256).reshape(4, 8, 8))
    assert not_hu_hint(np.zeros((0, 8, 8))) == ""


@pytest.mark.parametrize("kind", ["normalised", "stored"])
def test_reconstruct_says_when_the_values_are_not_hu(small_chest, kind, caplog):
    hu = np.asarray(small_chest.array, dtype=np.float32)
    values = ((hu + 1024) / 1424).clip(0, 1) if kind == "normalised" else (hu + 1024).clip(0)
    note = "normalised intensities, not HU" if kind == "normalised" else "stored pixel values, not HU"
    with caplog.at_level(logging.WARNING, logger="pipeline.reconstruction.stage"):
        rec = reconstruct(small_chest.with_array(values), device="cpu", render=False)
    assert rec.quality is not None and rec.quality.lungs_absent
    flag = next(f for f in rec.quality.flags if f.code == "lungs_absent")
    assert note in flag.message
    assert any(note in f["message"] for f in rec.measurements["quality"]["flags"])
    assert note in rec.errors["lung_left"] and "Fix: pass the volume in Hounsfield units" in rec.errors["lung_left"]
    assert note in caplog.text


def test_no_hint_for_a_scan_in_hu_without_lungs():
    vol, truth = synthetic_chest(n=48, slices=24)
    arr = np.asarray(vol.array).copy()
    arr[(arr < -500) & truth["body"]] = 40.0  # air around the body stays: real HU
    rec = reconstruct(vol.with_array(arr), device="cpu", render=False)
    assert rec.quality is not None and rec.quality.lungs_absent
    assert "not HU" not in str(rec.quality.to_json()) and "not HU" not in rec.errors["lung_left"]


# --- 5. short reprs -----------------------------------------------------------------------------------
def test_reconstruction_repr_is_a_short_summary(small_chest):
    rec = reconstruct(small_chest, device="cpu", render=False)
    text = repr(rec)
    assert text.startswith("Reconstruction(shape=") and len(text) < 1200, text
    assert "array(" not in text and "[[" not in text
    for organ, mesh in rec.meshes.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(organ))
        assert f"{mesh.n_vertices:,} vertices" in line and f"{mesh.n_triangles:,} faces" in line and " mL " in line
    assert "quality: lungs" in text


def test_mesh_repr_gives_counts_not_arrays():
    mesh = Mesh("cube", np.zeros((1234, 3)), np.zeros((2000, 3), dtype=np.int64))
    assert repr(mesh) == "Mesh('cube', 1,234 vertices, 2,000 faces, LPS mm)"


def test_phantom_repr_names_its_volume_masks_and_nodules_not_arrays():
    from pipeline.phantom import generate_phantom

    phantom = generate_phantom(3, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=2)
    text = repr(phantom)
    assert text.startswith("Phantom(seed=3, volume=CTVolume(shape=(24, 64, 64)") and len(text) < 800, text
    assert "array(" not in text and "[[" not in text and "\n" not in text
    assert f"masks={sorted(phantom.masks)}" in text and "nodules=2: " in text
    n = phantom.nodules[0]
    assert f"{n.diameter_mm:.1f} mm {n.kind} in {n.lung} at LPS ({n.center_lps[0]:.1f}, " in text


def test_phantom_repr_with_many_nodules_stays_short():
    import dataclasses

    from pipeline.phantom import Nodule, generate_phantom

    phantom = generate_phantom(3, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=2.5, n_nodules=0)
    nodules = tuple(Nodule((-60.0 + i, 10.0, -20.0 - i), 4.0 + i, "solid", None, "lung_right") for i in range(12))
    text = repr(dataclasses.replace(phantom, nodules=nodules))
    assert len(text) < 600, text  # was: about 1,100 characters, every nodule listed
    assert "nodules=12: 4.0 mm solid in lung_right at LPS (-60.0, 10.0, -20.0) mm; " in text, text
    assert "6.0 mm solid in lung_right at LPS (-58.0, 10.0, -22.0) mm" in text and "7.0 mm" not in text, text
    assert text.endswith("; … 9 more (.nodules lists them))"), text
