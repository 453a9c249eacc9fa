"""A NIfTI-2 image file (a 540-byte header, as dcm2niix and nibabel write for large images) reads as the same data saved
as NIfTI-1 does.

SimpleITK cannot read NIfTI-2 at all: ``read_image`` said the complete file could not be read ("no NIfTI/MHA/NRRD reader
recognises its content"). It is now read with nibabel into the image SimpleITK gives for the NIfTI-1 file: these tests
save the same voxels and header fields as both and compare what ``read_image`` gives (SimpleITK reading the NIfTI-1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import GeometryError, UnreadableFileError
from pipeline.geometry import LPS_TO_RAS
from pipeline.ingest.image import read_image

#: voxel sizes (mm) along i, j, k: all different, so that a swapped axis shows
ZOOMS = (0.7, 0.9, 2.5)


def _rotation(axis: int, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    i, j = [a for a in range(3) if a != axis]
    r = np.eye(3)
    r[i, i], r[j, j], r[i, j], r[j, i] = c, c, -s, s
    return r


def _affine(rotation: np.ndarray, flips: tuple[int, int, int], offset: tuple[float, float, float]) -> np.ndarray:
    """A 4x4 RAS affine: ``rotation`` times :data:`ZOOMS` with the axes' signs ``flips``, ``offset`` in mm."""
    out = np.eye(4)
    out[:3, :3] = rotation @ np.diag(np.multiply(ZOOMS, flips))
    out[:3, 3] = offset
    return out


#: oblique (rotated about x and z), i and k flipped, off the origin
OBLIQUE = _affine(_rotation(0, 0.3) @ _rotation(2, -0.7), (-1, 1, -1), (12.5, -40.0, 88.0))
#: another oblique one: an sform that is not the qform
OTHER = _affine(_rotation(1, 0.5), (1, -1, 1), (1.0, 2.0, 3.0))

#: (qform code, qform, sform code, sform): scanner coordinates in both (dcm2niix), an sform alone (nibabel's
#: default), a qform alone, and two that differ: ITK takes the sform when its code is SCANNER_ANAT (1), else the qform
FORMS = {
    "both": (1, OBLIQUE, 1, OBLIQUE),
    "sform only": (0, None, 2, OBLIQUE),
    "qform only": (1, OBLIQUE, 0, None),
    "differing, sform scanner": (1, OTHER, 1, OBLIQUE),
    "differing, sform aligned": (1, OBLIQUE, 2, OTHER),
}


def _data(dtype: type = np.int16) -> np.ndarray:
    """A 5 x 6 x 7 volume in nibabel's [i, j, k] order, every voxel a different value."""
    return (np.arange(5 * 6 * 7).reshape(5, 6, 7) * 7 - 1000).astype(dtype)


def _save(path: Path, data: np.ndarray, *, nifti2: bool, forms: tuple, endianness: str = "<", slope_inter=None) -> Path:
    """``data`` ([i, j, k]) as a NIfTI-1 or NIfTI-2 file whose header holds exactly ``forms`` and ``slope_inter``."""
    import nibabel as nib

    qcode, qform, scode, sform = forms
    header = (nib.Nifti2Header if nifti2 else nib.Nifti1Header)(endianness=endianness)
    header.set_data_dtype(data.dtype)
    header.set_data_shape(data.shape)
    header.set_zooms((*ZOOMS, 1.0)[: data.ndim])
    header.set_xyzt_units("mm")
    if qform is not None:
        header.set_qform(qform, code=qcode)
    if sform is not None:
        header.set_sform(sform, code=scode)
    image = (nib.Nifti2Image if nifti2 else nib.Nifti1Image)(data, None, header=header)
    if slope_inter is not None:
        image.header.set_slope_inter(*slope_inter)
    nib.save(image, path)
    stored = nib.load(path).header
    assert (int(stored["qform_code"]), int(stored["sform_code"])) == (qcode, scode)  # nothing rewritten on saving
    assert int(stored["sizeof_hdr"]) == (540 if nifti2 else 348)
    return path


@pytest.mark.parametrize("forms", list(FORMS.values()), ids=list(FORMS))
@pytest.mark.parametrize("endianness", ["<", ">"])
def test_a_nifti2_reads_as_the_same_data_saved_as_nifti1(tmp_path, forms, endianness):
    data = _data()
    one = read_image(_save(tmp_path / "one.nii.gz", data, nifti2=False, forms=forms, endianness=endianness))
    two = read_image(_save(tmp_path / "two.nii.gz", data, nifti2=True, forms=forms, endianness=endianness))
    assert two.array.dtype == one.array.dtype == np.int16
    np.testing.assert_array_equal(two.array, one.array)
    np.testing.assert_array_equal(two.array, data.transpose(2, 1, 0))  # [k, j, i]
    assert np.allclose(two.spacing, one.spacing) and np.allclose(two.spacing, ZOOMS)
    assert np.allclose(two.origin, one.origin, atol=1e-4)
    assert np.allclose(two.direction, one.direction, atol=1e-5)


@pytest.mark.parametrize(("suffix", "name"), [(".nii.gz", "both"), (".nii", "differing, sform aligned")])
def test_a_voxel_of_a_nifti2_lies_at_its_lps_position(tmp_path, suffix, name):
    forms = FORMS[name]
    data = _data()
    ijk = (3, 1, 5)
    data[ijk] = 2000
    vol = read_image(_save(tmp_path / f"two{suffix}", data, nifti2=True, forms=forms))
    ras = forms[1] if name.startswith("differing") else forms[3]  # the form ITK takes: the qform, the sform
    lps = (LPS_TO_RAS @ ras @ [*ijk, 1.0])[:3]
    np.testing.assert_allclose(vol.index_to_lps(ijk), lps, atol=1e-4)
    i, j, k = np.rint(vol.lps_to_index(lps)).astype(int)
    assert vol.array[k, j, i] == 2000 and (vol.array == 2000).sum() == 1


def test_a_nifti2s_scaling_applies_and_its_nan_voxels_stay_nan(tmp_path):
    """scl_slope/scl_inter as SimpleITK applies a NIfTI-1's; a NaN voxel, which it would read as the intercept, kept."""
    forms = FORMS["both"]
    data = _data(np.float32)
    one = read_image(_save(tmp_path / "one.nii", data, nifti2=False, forms=forms, slope_inter=(2.0, -1000.0)))
    np.testing.assert_allclose(one.array, data.transpose(2, 1, 0).astype(np.float64) * 2 - 1000, rtol=1e-6)
    data[2, 3, 4] = np.nan
    two = read_image(_save(tmp_path / "two.nii", data, nifti2=True, forms=forms, slope_inter=(2.0, -1000.0)))
    assert two.array.dtype == np.float32
    assert np.array_equal(np.argwhere(np.isnan(two.array)), [[4, 3, 2]])
    finite = ~np.isnan(two.array)
    np.testing.assert_array_equal(two.array[finite], one.array[finite])
    assert np.allclose(two.origin, one.origin, atol=1e-4) and np.allclose(two.direction, one.direction, atol=1e-5)


def test_a_damaged_nifti2_names_the_file_and_nibabels_reason(tmp_path):
    path = _save(tmp_path / "cut.nii", _data(), nifti2=True, forms=FORMS["both"])
    path.write_bytes(path.read_bytes()[:700])
    with pytest.raises(UnreadableFileError) as info:
        read_image(path)
    text = str(info.value)
    assert str(path) in text and "NIfTI-2" in text and "Expected 420 bytes" in text and "reader recognises" not in text


def test_a_4d_nifti2_says_which_file_and_what_to_take_from_it(tmp_path):
    data = np.stack([_data(), _data()], axis=-1)
    path = _save(tmp_path / "series.nii.gz", data, nifti2=True, forms=FORMS["both"])
    with pytest.raises(GeometryError) as info:
        read_image(path)
    assert str(path) in str(info.value) and "4-D (5x6x7x2)" in str(info.value) and "image[:, :, :, 0]" in str(info.value)


def test_ctpipe_reconstruct_reads_a_nifti2_chest(tmp_path, capsys):
    import nibabel as nib

    from pipeline.cli import main
    from pipeline.phantom import generate_phantom

    chest = generate_phantom(4, matrix=96).volume
    path = tmp_path / "chest.nii.gz"
    nib.save(nib.Nifti2Image(np.ascontiguousarray(chest.array.transpose(2, 1, 0)), chest.geometry.affine_ras), path)
    vol = read_image(path)
    np.testing.assert_array_equal(vol.array, chest.array)
    assert vol.geometry.same_grid(chest.geometry)
    args = ["reconstruct", str(path), "--out", str(tmp_path / "out"), "--no-render", "--no-dicom"]
    assert main([*args, "--organs", "lung_left,lung_right"]) == 0
    assert "lungs total" in capsys.readouterr().out
    assert len(list((tmp_path / "out").glob("image-*_lung_left.stl"))) == 1


#: the layouts a header with a malformed pixdim comes in: :data:`FORMS` and neither form set (origin 0, axes i, j, k)
PIXDIM_LAYOUTS = {**FORMS, "neither": (0, None, 0, None)}


def _write_header(path: Path, *, nifti2: bool, pixdim: tuple[int, float] | None = None, **fields: int) -> Path:
    """``path`` (an uncompressed .nii) with ``pixdim[index]`` set to ``value`` (``pixdim=(index, value)``) and
    ``fields`` set in its header as stored: the header an old converter writes, which nibabel's own writer would not."""
    import nibabel as nib

    klass = nib.Nifti2Header if nifti2 else nib.Nifti1Header
    with open(path, "r+b") as fh:
        header = klass.from_fileobj(fh, check=False)
        if pixdim is not None:
            header["pixdim"][pixdim[0]] = pixdim[1]
        for field, value in fields.items():
            header[field] = value
        fh.seek(0)
        fh.write(header.binaryblock)
    return path


def _assert_reads_as_simpleitk_reads(nifti2: Path, nifti1: Path) -> None:
    """``read_image`` of the NIfTI-2 ``nifti2`` gives the array, spacing, origin, LPS direction and voxel positions
    that SimpleITK gives for the NIfTI-1 ``nifti1``."""
    import SimpleITK as sitk

    want = sitk.ReadImage(str(nifti1))
    vol = read_image(nifti2)
    np.testing.assert_array_equal(vol.array, sitk.GetArrayFromImage(want))
    np.testing.assert_allclose(vol.spacing, want.GetSpacing(), atol=1e-6)
    np.testing.assert_allclose(vol.origin, want.GetOrigin(), atol=1e-4)
    np.testing.assert_allclose(vol.direction, np.reshape(want.GetDirection(), (3, 3)), atol=1e-5)
    ijk = (3, 1, 5)
    np.testing.assert_allclose(vol.index_to_lps(ijk), want.TransformContinuousIndexToPhysicalPoint(ijk), atol=1e-4)


#: (pixdim index, value) of malformed headers: negative voxel sizes, a negative qfac other than -1, non-finite sizes
MALFORMED_PIXDIM = {
    "negative pixdim1": (1, -ZOOMS[0]),
    "negative pixdim2": (2, -ZOOMS[1]),
    "negative pixdim3": (3, -ZOOMS[2]),
    "negative qfac": (0, -2.0),
    "nan pixdim2": (2, float("nan")),
    "inf pixdim3": (3, float("inf")),
}


@pytest.mark.parametrize("name", list(PIXDIM_LAYOUTS))
@pytest.mark.parametrize("malformed", list(MALFORMED_PIXDIM))
def test_a_nifti2_with_a_malformed_pixdim_reads_as_simpleitk_reads_it_as_nifti1(tmp_path, name, malformed):
    """A negative pixdim[1..3] (nibabel makes it positive on load) flips that axis's direction as ITK's reader flips
    it, its spacing the pixdim's size; a negative qfac pixdim[0] other than -1 (nibabel makes it 1) flips the qform's
    k axis as niftilib flips it; a NaN or infinite pixdim[1..3] (nibabel keeps it) is 1 mm, as niftilib makes it."""
    forms, pixdim = PIXDIM_LAYOUTS[name], MALFORMED_PIXDIM[malformed]
    one = _write_header(_save(tmp_path / "one.nii", _data(), nifti2=False, forms=forms), nifti2=False, pixdim=pixdim)
    two = _write_header(_save(tmp_path / "two.nii", _data(), nifti2=True, forms=forms), nifti2=True, pixdim=pixdim)
    _assert_reads_as_simpleitk_reads(two, one)


@pytest.mark.parametrize("name", list(FORMS))
def test_a_nifti2_with_an_xform_code_nibabel_does_not_know_reads_as_simpleitk_reads_it_as_nifti1(tmp_path, name):
    """niftilib takes any qform_code or sform_code above 0 as set; nibabel's header check makes one it does not know
    (here 7) into 0, unset."""
    forms = FORMS[name]
    codes = {field: 7 for field, code in (("qform_code", forms[0]), ("sform_code", forms[2])) if code > 0}
    one = _write_header(_save(tmp_path / "one.nii", _data(), nifti2=False, forms=forms), nifti2=False, **codes)
    two = _write_header(_save(tmp_path / "two.nii", _data(), nifti2=True, forms=forms), nifti2=True, **codes)
    _assert_reads_as_simpleitk_reads(two, one)
