"""``ctpipe reconstruct`` refusing its source leaves none of the folders it made for ``--out``.

``--out new/runs/recon`` makes ``new`` and ``new/runs`` as well as ``recon``; a source refused after that (an image
file of NaN voxels is refused by the reconstruction, once the folder is made) removed ``recon`` and left ``new/runs``
behind, empty. Folders that were there before, and any folder holding something, stay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main

#: The options of every run here: one organ, no renderings or DICOM results (the source is an image file).
FAST = ("--organs", "body", "--no-render", "--no-dicom", "--device", "cpu")


def _image(path: Path, value: float) -> Path:
    """A small image file (12 x 16 x 16 voxels of 2 x 2 x 3 mm) holding ``value`` everywhere (float32)."""
    import SimpleITK as sitk

    img = sitk.GetImageFromArray(np.full((12, 16, 16), value, np.float32))
    img.SetSpacing((2.0, 2.0, 3.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(img, str(path))  # an NRRD keeps NaN voxels (SimpleITK reads a NIfTI file's as 0)
    return path


def test_a_refused_source_leaves_none_of_the_folders_made_for_out(tmp_path, capsys):
    src = _image(tmp_path / "src" / "nan.nrrd", np.nan)
    out = tmp_path / "new" / "runs" / "recon"
    assert main(["reconstruct", str(src), "--out", str(out), *FAST]) == 1
    assert "are NaN or infinite" in capsys.readouterr().err  # refused by the reconstruction, after --out was made
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_folders_there_before_stay_when_the_source_is_refused(tmp_path, capsys):
    src = _image(tmp_path / "src" / "nan.nrrd", np.nan)
    (tmp_path / "kept").mkdir()
    assert main(["reconstruct", str(src), "--out", str(tmp_path / "kept" / "a" / "b"), *FAST]) == 1
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
    (tmp_path / "empty_out").mkdir()  # an --out folder given as it is, empty: never removed
    assert main(["reconstruct", str(src), "--out", str(tmp_path / "empty_out"), *FAST]) == 1
    assert (tmp_path / "empty_out").is_dir()
    capsys.readouterr()


def test_a_folder_made_for_out_that_holds_results_stays(tmp_path, capsys):
    src = _image(tmp_path / "src" / "air.nrrd", -1000.0)  # no body: no mesh (exit 1), its measurements written
    out = tmp_path / "new" / "recon"
    assert main(["reconstruct", str(src), "--out", str(out), *FAST]) == 1
    assert [p.name for p in out.iterdir()] and all(p.name.endswith("_measurements.json") for p in out.iterdir())
    capsys.readouterr()


def test_an_unforeseen_error_leaves_none_of_the_folders_made_for_out(tmp_path, monkeypatch, capsys):
    import pipeline.reconstruction.stage as stage

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a fault of the reconstruction itself")

    monkeypatch.setattr(stage, "reconstruct", broken)  # as a bug raising something no command expects would
    src = _image(tmp_path / "src" / "air.nrrd", -1000.0)
    with pytest.raises(RuntimeError, match="a fault of the reconstruction itself"):
        main(["reconstruct", str(src), "--out", str(tmp_path / "new" / "recon"), *FAST])
    assert not (tmp_path / "new").exists()
    capsys.readouterr()
