"""Loading a label map (a segmentation file) instead of a CT warns at load time, naming the file and the fix; the
other image files beside it (names that may be a patient's) are named only when identifiers are kept. The commands
that compute from HU (``ctpipe detect``, ``reconstruct``; a worklist row of ``ctpipe run``) refuse such a file, and the
notebook's ``detect`` and ``reconstruct`` warn again of a volume loaded from one."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from pipeline.errors import LabelMapError
from pipeline.ingest import load_series
from tests._support.real_ct import require_real_ct

SUFFIXES = (".nii", ".nii.gz", ".nrrd", ".mha", ".mhd")


def _write(path: Path, array: np.ndarray) -> Path:
    img = sitk.GetImageFromArray(array)
    img.SetSpacing((1.5, 1.5, 3.0))
    sitk.WriteImage(img, str(path))
    return path


def _label_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "label map" in r.getMessage()]


def test_label_map_file_warns_with_the_file_values_and_fix(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    labels = np.zeros((8, 16, 16), np.uint8)
    labels[2:5, 4:9, 4:9] = 10
    labels[5:7, 8:12, 3:6] = 13
    seg = _write(tmp_path / "case_seg.nii.gz", labels)
    _write(tmp_path / "case_ct.nii.gz", np.full((8, 16, 16), -1000, np.int16) + np.arange(16, dtype=np.int16) * 90)
    with caplog.at_level(logging.WARNING):
        vol = load_series(seg, keep_identifiers=True)
    [message] = _label_warnings(caplog)
    assert str(seg) in message
    assert "3 distinct integer values, 0..13" in message
    assert "case_ct.nii.gz" in message and "LabelMap(vol.array, vol.geometry)" in message
    assert vol.metadata["warnings"] == [message]


def test_the_warning_names_no_other_image_file_unless_identifiers_are_kept(tmp_path, caplog):
    # was: "load the CT image instead (beside it: DOE_JANE_ct.nii.gz, MRN12345.nrrd)" on the console and in metadata
    from pipeline.ingest.source import read_source

    mask = np.zeros((6, 10, 10), np.uint8)
    mask[2:4, 3:7, 3:7] = 1
    seg = _write(tmp_path / "seg.nii.gz", mask)
    for name in ("DOE_JANE_ct.nii.gz", "MRN12345.nrrd"):
        _write(tmp_path / name, np.full((6, 10, 10), -1000, np.int16))
    with caplog.at_level(logging.WARNING):
        warned = [load_series(seg).metadata["warnings"], read_source(seg, refuse_label_map=False)[0].metadata["warnings"]]
    with pytest.raises(LabelMapError) as refused:  # the commands' reading refuses it, its fix counting them alike
        read_source(seg)
    texts = _label_warnings(caplog) + [w for ws in warned for w in ws] + [str(refused.value)]
    assert len(texts) == 5 and all("2 other image files beside it" in t and "keep" in t for t in texts), texts
    assert not [t for t in texts if "DOE" in t or "MRN12345" in t], texts
    kept = read_source(seg, keep_identifiers=True, refuse_label_map=False)[0].metadata["warnings"]
    assert "beside it: DOE_JANE_ct.nii.gz, MRN12345.nrrd" in kept[0], kept
    with pytest.raises(LabelMapError, match="beside it: DOE_JANE_ct.nii.gz, MRN12345.nrrd"):
        read_source(seg, keep_identifiers=True)


def test_the_fix_suggests_no_image_file_that_is_a_label_map_itself(tmp_path, caplog):
    # was: TotalSegmentator's example_seg.nii.gz suggested example_seg_fast_force_split.nii.gz, another label map
    from pipeline.ingest.source import read_source

    labels = np.zeros((6, 10, 10), np.uint8)
    labels[2:4, 3:7, 3:7] = 5
    seg = _write(tmp_path / "case_seg.nii.gz", labels)
    _write(tmp_path / "case_seg_fast.nii.gz", labels * 2)  # sorts before the CT files: a label map too
    _write(tmp_path / "case_lungs.nrrd", (labels > 0).astype(np.int16))  # a mask in a signed type
    _write(tmp_path / "case_t.nii.gz", np.full((6, 10, 10), -1000, np.int16))
    _write(tmp_path / "case_u.mha", np.linspace(-1000.0, 400.0, 600, dtype=np.float32).reshape(6, 10, 10))
    with caplog.at_level(logging.WARNING):
        kept = load_series(seg, keep_identifiers=True).metadata["warnings"][0]
        counted = load_series(seg).metadata["warnings"][0]
    assert "(beside it: case_t.nii.gz, case_u.mha)" in kept, kept
    assert "(2 other image files beside it that are no label map, named with keep_identifiers" in counted, counted
    with pytest.raises(LabelMapError, match=r"\(beside it: case_t.nii.gz, case_u.mha\)"):
        read_source(seg, keep_identifiers=True)
    for ct in ("case_t.nii.gz", "case_u.mha"):
        (tmp_path / ct).unlink()
    with caplog.at_level(logging.WARNING):  # only label maps beside it: no file to suggest
        alone = load_series(seg, keep_identifiers=True).metadata["warnings"][0]
    assert "Fix: load the CT image instead; to use the labels" in alone and "beside it" not in alone, alone


def test_binary_mask_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mask = np.zeros((6, 10, 10), np.int16)
    mask[2:4, 3:7, 3:7] = 1
    with caplog.at_level(logging.WARNING):
        load_series(_write(tmp_path / "lungs.nrrd", mask))
    [message] = _label_warnings(caplog)
    assert "2 distinct integer values, 0..1" in message


def test_real_label_files_warn_and_real_ct_never_does(caplog: pytest.LogCaptureFixture) -> None:
    root = require_real_ct()  # skips with a reason when ../shared/real_ct is absent
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    labels = {"example_seg.nii.gz", "example_seg_fast_force_split.nii.gz", "lm-64.nrrd", "wholeLung-64.nrrd"}
    assert labels <= {p.name for p in files}
    for path in files:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            vol = load_series(path)
        warned = _label_warnings(caplog)
        assert bool(warned) == (path.name in labels), (path, warned)
        assert ("warnings" in vol.metadata) == (path.name in labels)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the DICOM series of the folder: real HU, no warning
        load_series(root / "chest_ct_rt_planning_dicom")
        load_series(root / "cip_copdgene_chest_64" / "ct-64Dicom")
    assert not _label_warnings(caplog)
    seg = root / "totalseg_abdomen_lung_bases" / "example_seg.nii.gz"
    assert "example_ct.nii.gz" in " ".join(load_series(seg, keep_identifiers=True).metadata["warnings"])


def _mask(tmp_path: Path, name: str = "DOE_JANE_lungs.nii.gz") -> Path:
    mask = np.zeros((24, 40, 40), np.uint8)
    mask[6:18, 8:32, 8:32] = 1
    (tmp_path / "in").mkdir(exist_ok=True)
    return _write(tmp_path / "in" / name, mask)


@pytest.mark.parametrize("command", ["reconstruct", "detect"])
def test_the_commands_refuse_a_mask_naming_its_token_the_problem_and_the_fix(tmp_path, capsys, command):
    # was: a warning, then exit 0 with a 'body' mesh and measurements of label values taken as HU
    from tests._support.cli import cli_error

    seg = _mask(tmp_path)
    _write(tmp_path / "in" / "DOE_JANE_ct.nii.gz", np.full((24, 40, 40), -1000, np.int16))
    out = tmp_path / "out"
    rc, err = cli_error(capsys, command, str(seg), "--out", str(out), "--device", "cpu")
    assert rc == 1, err
    assert f"ctpipe {command}: error: " in err and "this looks like a label map (a segmentation), not a CT in HU" in err
    assert "2 distinct integer values, 0..1" in err and "compute from HU values" in err
    assert "Fix: give the CT image the labels were made from (1 other image file beside it" in err
    assert "DOE" not in err and "<file:" in err, err  # the file's name may be a patient's: its token
    assert not out.exists()  # nothing written
    rc, err = cli_error(capsys, command, str(seg), "--out", str(out), "--device", "cpu", "--keep-identifiers")
    assert rc == 1 and f"{seg}: this looks like a label map" in err and "beside it: DOE_JANE_ct.nii.gz" in err, err


@pytest.mark.parametrize("command", ["reconstruct", "detect"])
def test_the_commands_refuse_the_real_totalsegmentator_label_map(tmp_path, capsys, command):
    from tests._support.cli import cli_error

    seg = require_real_ct() / "totalseg_abdomen_lung_bases" / "example_seg.nii.gz"  # skips with a reason when absent
    rc, err = cli_error(capsys, command, str(seg), "--out", str(tmp_path / "out"), "--device", "cpu")
    assert rc == 1 and "this looks like a label map" in err and "distinct integer values, 0..117" in err, err
    assert not (tmp_path / "out").exists()


def test_run_quarantines_a_worklist_row_naming_a_label_map_with_that_reason_and_goes_on(tmp_path, capsys):
    # was: "no CT series found. Fix: check the worklist row's path and series_uid" for both rows
    from pipeline.cli import main
    from pipeline.runner import open_run

    _mask(tmp_path, "seg.nii.gz")
    ct = np.full((24, 40, 40), -1000, np.int16) + np.arange(40, dtype=np.int16) * 37
    _write(tmp_path / "in" / "ct.nii.gz", ct)
    worklist = tmp_path / "in" / "worklist.csv"
    worklist.write_text("path\nseg.nii.gz\nct.nii.gz\n")
    rc = main(["run", str(worklist), "--out", str(tmp_path / "run"), "--workers", "0", "--quiet"])
    capsys.readouterr()
    assert rc == 3
    errors = sorted(open_run(tmp_path / "run").failures.reason)
    assert len(errors) == 2, errors  # each row quarantined with its own reason: the first did not stop the second
    seg_row, ct_row = errors  # by row
    assert "worklist.csv:2" in seg_row and "this looks like a label map (a segmentation), not a CT in HU" in seg_row
    assert "2 distinct integer values, 0..1" in seg_row and "the CT the labels were made from" in seg_row
    assert "worklist.csv:3" in ct_row and "a NIfTI/MHA/NRRD image, not a DICOM series" in ct_row
    assert "label map" not in ct_row


def test_notebook_detect_and_reconstruct_warn_again_of_a_volume_loaded_from_a_label_map(tmp_path, caplog):
    # load_series keeps its documented warn-and-load; detect and reconstruct then said nothing of it
    from pipeline import detect, reconstruct

    vol = load_series(_mask(tmp_path, "seg.nii.gz"))
    for run in (lambda: reconstruct(vol, organs=["body"], render=False), lambda: detect(vol, device="cpu")):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            run()
        again = [m for m in _label_warnings(caplog) if "loaded from a label map" in m]
        assert len(again) == 1 and "its values are taken as HU" in again[0] and "seg.nii.gz" in again[0], again
    plain = load_series(_write(tmp_path / "ct.nii.gz", np.full((24, 40, 40), -1000, np.int16)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reconstruct(plain, organs=["body"], render=False)
    assert not _label_warnings(caplog)
