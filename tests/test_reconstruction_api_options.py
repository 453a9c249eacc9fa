"""``reconstruct``'s mesh options as a notebook passes them: one format as a string (as ``organs`` takes one organ),
and ``smoothing`` / ``target_triangles`` outside the ranges the configuration and the command line allow refused
before any work, naming the argument, the value and the range."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ReconstructionError
from pipeline.phantom import generate_phantom
from pipeline.reconstruction import reconstruct
from pipeline.volume import CTVolume, Geometry


@pytest.fixture(scope="module")
def chest():
    return generate_phantom(7, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=0).volume


@pytest.mark.parametrize(("formats", "suffixes"), [("ply", [".ply"]), ("stl, GLB", [".glb", ".stl"])])
def test_mesh_formats_as_a_string_are_format_names_not_letters(chest, tmp_path, formats, suffixes):
    rec = reconstruct(chest, organs="lung_left", mesh_formats=formats, out_dir=tmp_path, render=False)
    assert sorted(p.suffix for p in rec.files["mesh"]) == suffixes


_TINY = CTVolume(np.full((4, 4, 4), -1000, np.int16), Geometry(shape=(4, 4, 4), spacing=(1, 1, 1), origin=(0, 0, 0)))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"smoothing": -1}, "smoothing=-1 is not a whole number of iterations in 0..500"),
        ({"smoothing": 2.5}, "smoothing=2.5 is not a whole number"),
        ({"smoothing": 501}, "smoothing=501 is not"),
        ({"target_triangles": 0}, "target_triangles=0 is not a whole number of triangles in 100 or more"),
        ({"target_triangles": 5e4}, "target_triangles=50000.0 is not a whole number"),
    ],
)
def test_mesh_options_out_of_range_are_refused_before_any_work(tmp_path, options, message):
    out = tmp_path / "out"
    with pytest.raises(ReconstructionError) as err:
        reconstruct(_TINY, out_dir=out, **options)
    text = str(err.value)
    assert message in text and "Fix: pass " in text
    assert not out.exists()


def test_the_configuration_s_limits_are_accepted(chest):
    rec = reconstruct(chest, organs="lung_left", smoothing=0, target_triangles=100, render=False)
    assert rec.meshes["lung_left"].n_triangles <= 2000


@pytest.mark.parametrize("stem", ["../up", "sub/case", ".hidden", ""])
def test_a_stem_that_is_a_path_is_refused_before_writing_anything(tmp_path, stem):
    out = tmp_path / "out" / "case"
    with pytest.raises(ReconstructionError) as err:
        reconstruct(_TINY, out_dir=out, stem=stem)
    assert f"stem={stem!r} is not a plain file name" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_files_stay_in_out_dir_whatever_the_series_uid(chest, tmp_path):
    """A volume whose series UID holds path characters (built in a notebook, not read from DICOM) is written under a
    name with them replaced, inside out_dir; a plain name with a space is kept as it is."""
    odd = CTVolume(chest.array, chest.geometry, metadata={"SeriesInstanceUID": "../../run/1"})
    out = tmp_path / "a" / "b"
    rec = reconstruct(odd, organs="lung_left", out_dir=out, render=False)
    assert rec.files and all(p.parent == out for paths in rec.files.values() for p in paths)
    rec = reconstruct(chest, organs="lung_left", out_dir=out, render=False, stem="my scan")
    assert (out / "my scan_lung_left.stl") in rec.files["mesh"]


def test_the_step_seconds_cover_the_measurements(chest, monkeypatch):
    """``Reconstruction.seconds`` (the runner's reconstruct timings, the logged total) counts the organ and lung
    measurements as the step ``measure``, so that the steps add up to the reconstruction's time."""
    import time

    from pipeline.reconstruction import measure

    real = measure.lung_measurements

    def slow(*args, **kwargs):  # lung figures on a large scan: 0.3 s
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, "lung_measurements", slow)
    rec = reconstruct(chest, organs="lung_left,lung_right", render=False)
    assert rec.seconds["measure"] >= 0.3


def test_mask_of_an_organ_not_produced_names_the_organs_there_are():
    """``recon.mask("lungs")`` raised a bare ``KeyError: 'lungs'``."""
    from pipeline.reconstruction.stage import Reconstruction
    from pipeline.volume import LabelMap

    grid = Geometry(shape=(2, 3, 4), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0))
    masks = {o: LabelMap(np.ones(grid.shape, np.uint8), grid, labels={1: o}) for o in ("lung_left", "lung_right")}
    rec = Reconstruction(geometry=grid, masks=masks)
    with pytest.raises(KeyError, match=r"no mask of organ 'lungs': this reconstruction has lung_left, lung_right"):
        rec.mask("lungs")
    assert rec.mask("lung_left").dtype == bool and rec.mask("lung_left").all()


@pytest.mark.parametrize("organs", [None, 5])
def test_organs_that_are_no_names_are_refused_naming_the_organs(organs):
    """``reconstruct(vol, organs=None)`` raised "'NoneType' object is not iterable"."""
    vol = CTVolume(np.full((4, 4, 4), -1000, np.int16), Geometry(shape=(4, 4, 4), spacing=(1, 1, 1), origin=(0, 0, 0)))
    with pytest.raises(ReconstructionError) as err:
        reconstruct(vol, organs=organs)
    assert str(err.value).startswith(f"organs: organs={organs!r} is not organ names")
    assert "leave organs out for body, lung_left, lung_right, airway, bone" in err.value.fix


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stem": 7}, "stem: must be text, got int 7"),  # was: AttributeError: 'int' object has no attribute ...
        ({"out_dir": 7}, "out_dir: must be a folder (a str or a pathlib.Path), got int 7"),  # was: a bare TypeError
    ],
    ids=["stem", "out_dir"],
)
def test_a_stem_or_out_dir_that_is_not_text_is_named_before_any_work(tmp_path, options, message):
    with pytest.raises(ReconstructionError) as err:
        reconstruct(_TINY, **{"out_dir": tmp_path / "out", **options})
    assert str(err.value).startswith(message) and err.value.fix, str(err.value)
    assert not (tmp_path / "out").exists()
