"""An image file (NIfTI, MHA, NRRD) has no patient header to tell a patient's name by, so its name cannot be told
patient-named as a DICOM folder is: ``ctpipe detect`` and ``ctpipe reconstruct`` name their outputs and the series
in them by a digest of the image (``image-<12 hex digits>``, the same for the same image), and say once how to name
them otherwise; with ``--case-id`` they are named by it, with
``--keep-identifiers`` by the file's name; findings written under a ``--case-id`` are of the series ``reconstruct
--case-id`` reads with the same id. ``load_series`` in a notebook names the volume by the file's name, as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from tests._support.leaks import file_text

NAME = "DOE_JANE_MRN12345"
PLANTED = ("doe", "jane", "mrn12345")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """A small chest phantom written as a NIfTI file named after a patient."""
    import SimpleITK as sitk

    from pipeline.phantom import generate_phantom

    ph = generate_phantom(4, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=2)
    path = tmp_path_factory.mktemp("images") / f"{NAME}.nii.gz"
    sitk.WriteImage(ph.volume.to_sitk(), str(path))
    return path


def _found(text: str) -> list[str]:
    low = text.lower()
    return [w for w in PLANTED if re.search(rf"(?<![a-z]){w}(?![a-z])", low) or (w[0].isdigit() and w in low)]


def _in_outputs(out: Path) -> list[str]:
    """The planted words in the names and the contents of the files under ``out``."""
    hits = []
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        text = rel + (file_text(p) if p.is_file() else "")
        hits += [f"{rel}: {w}" for w in _found(text)]
    return hits


RECONSTRUCT = ["--organs", "lung_left,lung_right", "--no-render", "--device", "cpu", "--dicom", "none"]


def test_an_image_file_names_its_outputs_by_a_digest_of_its_voxels_unless_asked(image, tmp_path, capsys):
    # was: without --case-id the file's name (DOE_JANE_MRN12345) named the outputs and the series in them, with a
    # warning: the outputs are now named by a digest of the voxels and geometry, the same for the same image
    out = tmp_path / "r"
    assert main(["reconstruct", str(image), "--out", str(out), *RECONSTRUCT, "-v"]) == 0
    err = capsys.readouterr().err
    assert err.count("--case-id") == 1 and "--keep-identifiers" in err and "no patient header" in err, err
    assert "image-" in err and "MRN12345_" not in err, err  # the case is named by the digest in the messages too
    names = sorted(p.name for p in out.iterdir())
    assert names and all(re.match(r"image-[0-9a-f]{12}[_.]", n) for n in names), names
    assert _in_outputs(out) == []
    again = tmp_path / "again"
    assert main(["reconstruct", str(image), "--out", str(again), *RECONSTRUCT]) == 0
    assert sorted(p.name for p in again.iterdir()) == names  # a stable name: the same image, the same case

    # ctpipe detect names it so before it loads the model (a model folder that does not exist: exit status 1 after)
    rc = main(["detect", str(image), "--out", str(tmp_path / "d"), "--device", "cpu", "--bundle", str(tmp_path / "none"), "-v"])
    assert rc == 1
    err = capsys.readouterr().err
    assert names[0][:18] in err and err.count("--case-id") == 1, err


def test_keep_identifiers_names_the_outputs_by_the_image_files_name(image, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["reconstruct", str(image), "--out", str(out), *RECONSTRUCT, "--keep-identifiers", "-v"]) == 0
    err = capsys.readouterr().err
    assert "--case-id" not in err and "image-" not in err and f"reconstruction of {NAME}:" in err, err
    assert list(out.glob(f"{NAME}_*")) and not list(out.glob("image-*"))


def test_a_notebook_reads_an_image_under_its_files_name(image):
    from pipeline.ingest import load_series

    assert load_series(image).series_uid == NAME  # the name a notebook's user chose to load, as it is


def test_reconstruct_case_id_uses_nothing_of_an_image_file_name(image, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["reconstruct", str(image), "--out", str(out), "--case-id", "case1", *RECONSTRUCT]) == 0
    err = capsys.readouterr().err
    assert "--case-id" not in err, err
    assert list(out.glob("case1_*")) and _in_outputs(out) == []


def test_reconstruct_case_id_must_be_a_plain_file_name(image, tmp_path, capsys):
    rc = main(["reconstruct", str(image), "--out", str(tmp_path / "r"), "--case-id", "../x", *RECONSTRUCT])
    assert rc == 2 and "--case-id" in capsys.readouterr().err  # a bad argument, refused before anything is made
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_detect_case_id_uses_nothing_of_an_image_file_name_and_reconstruct_reads_its_findings(image, tmp_path, capsys):
    det = tmp_path / "d"
    argv = ["detect", str(image), "--out", str(det), "--device", "cpu", "--case-id", "case1", "--score-threshold", "0.3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--case-id" not in err and "case1 is not DICOM" in err and _found(err) == [], err
    assert (det / "case1.findings.json").is_file() and list((det / "case1_png").glob("*.png"))
    assert _in_outputs(det) == []
    rec = tmp_path / "r"
    argv = ["reconstruct", str(image), "--out", str(rec), "--case-id", "case1", "--findings", str(det / "case1.findings.json")]
    assert main([*argv, *RECONSTRUCT]) == 0
    assert _in_outputs(rec) == []


def test_reconstruct_case_id_names_the_case_not_the_file_when_no_dicom_is_written(image, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["reconstruct", str(image), "--out", str(out), "--case-id", "case1", *RECONSTRUCT[:-1], "sr"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "case1 is not DICOM" in err and _found(err) == [], err
