"""Bad input as a new user gives it: each is a one-line error naming the file or option, the problem and the fix."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from tests._support.cli import cli_error as _err

SAMPLE = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003"
TRUTH = SAMPLE.parent / "phantom_00001"


def test_a_dicom_file_named_like_a_nifti_and_a_junk_image_are_refused_by_name(tmp_path, capsys):
    dicom = tmp_path / "in" / "chest.nii.gz"  # outputs beside it would be a DICOM folder's, refused
    dicom.parent.mkdir()
    shutil.copyfile(next(iter(sorted((TRUTH / "dicom").glob("*.dcm")))), dicom)
    for cmd in ("detect", "reconstruct"):  # was: a torch RuntimeError traceback (a one-slice volume) in detect
        rc, err = _err(capsys, cmd, str(dicom), "--out", str(tmp_path / cmd))
        assert rc == 1 and f"{dicom}: this is a DICOM file, not a NIfTI/MHA/NRRD image" in err and "Fix: pass the folder" in err
    junk = tmp_path / "junk.nii.gz"
    junk.write_text("not an image")
    rc, err = _err(capsys, "detect", str(junk), "--out", str(tmp_path / "o"))
    assert rc == 1 and "no NIfTI/MHA/NRRD reader recognises its content" in err and "sitkImageReaderBase" not in err


def test_a_one_slice_image_is_too_small_for_the_detector(tmp_path, capsys):
    import SimpleITK as sitk

    img = sitk.GetImageFromArray(np.full((1, 64, 64), -1000, np.int16))
    img.SetSpacing((1.0, 1.0, 1.0))
    sitk.WriteImage(img, str(tmp_path / "slice.nii.gz"))
    rc, err = _err(capsys, "detect", str(tmp_path / "slice.nii.gz"), "--out", str(tmp_path / "o"), "--device", "cpu")
    assert rc == 1 and re.search(r"case image-[0-9a-f]{12}: the volume covers only", err) and "needs at least 16.0 mm" in err
    assert "Fix: pass the whole chest series" in err


def test_an_empty_folder_says_so_in_detect_and_ingest(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, err = _err(capsys, "detect", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert rc == 1 and f"{tmp_path / 'empty'}: the folder holds no files" in err
    assert "SelectionRules(" not in err and "series_uid" not in err  # was: the rules' repr and a fix to pick a series
    rc = main(["ingest", str(tmp_path / "empty"), "--out", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert rc == 1 and f"no series was cached: {tmp_path / 'empty'}: the folder holds no files" in out and "Fix:" in out
    assert "see the reasons above" not in out


def test_a_missing_bundle_and_corrupt_or_truncated_weights(tmp_path, capsys):
    import torch

    from tests._support.detection import write_bundle

    src = str(SAMPLE / "dicom")
    rc, err = _err(capsys, "detect", src, "--out", str(tmp_path / "o"), "--bundle", str(tmp_path / "nope"))
    assert rc == 1 and f"{tmp_path / 'nope'}: no such bundle folder" in err and "Fix: check the path" in err
    bundle = write_bundle(tmp_path / "b", state={"w": torch.zeros(1000)})
    weights = bundle / "models" / "model.pt"
    good = weights.read_bytes()
    weights.write_bytes(b"not a torch file at all")
    rc, err = _err(capsys, "detect", src, "--out", str(tmp_path / "o"), "--bundle", str(bundle), "--device", "cpu")
    assert rc == 1 and f"{weights}: weights file is not a readable torch state dict" in err
    assert "weights_only" not in err and "not a torch checkpoint" in err  # was: torch's advice to load it unsafely
    weights.write_bytes(good[: len(good) // 2])
    rc, err = _err(capsys, "detect", src, "--out", str(tmp_path / "o"), "--bundle", str(bundle), "--device", "cpu")
    assert rc == 1 and "the file ends early (truncated)" in err and "Fix: the file is corrupt or truncated" in err


@pytest.mark.parametrize(("text", "says"), [("{bad", "is not valid JSON"), ("[1, 2]", "must hold a JSON object, got list")])
def test_a_bundle_config_that_is_not_a_json_object_says_how_to_mend_it(tmp_path, capsys, text, says):
    # was: "b/configs/inference.json: inference.json is not valid JSON (...)" and no fix
    (tmp_path / "b" / "configs").mkdir(parents=True)
    (tmp_path / "b" / "configs" / "inference.json").write_text(text)
    rc, err = _err(capsys, "detect", str(SAMPLE / "dicom"), "--out", str(tmp_path / "o"), "--bundle", str(tmp_path / "b"))
    assert rc == 1 and f"inference.json {says}" in err and "Fix: " in err, err


@pytest.mark.parametrize(
    ("text", "says", "mend"),
    [
        (b'{"format": "ctpipe-detector/1",\n "name": x}', "is not valid JSON (Expecting value: line 2", "at line 2, column 10"),
        (b"[1, 2]", "must hold a JSON object, got list", "(a JSON object: {...})"),
        (b'\xff{"name": "x"}', "is not valid JSON: byte 0 is not UTF-8 text", "(a JSON object in UTF-8 text)"),
    ],
)
def test_a_model_json_that_is_not_a_json_object_says_where_and_how_to_mend_or_regenerate_it(tmp_path, capsys, text, says, mend):
    # was: "model.json: model config is not valid JSON (...)" and no fix; a list or a file not in UTF-8: a traceback
    model = tmp_path / "model.json"
    model.write_bytes(text)
    rc, err = _err(capsys, "detect", str(SAMPLE / "dicom"), "--out", str(tmp_path / "o"), "--bundle", str(model))
    assert rc == 1 and f"{model}: model config {says}" in err and f"Fix: mend model.json {mend}, or write it again" in err, err
    assert f"scripts/train_detector.py --out {model}" in err


def test_the_demo_model_json_unreadable_or_broken_says_to_reinstall(tmp_path, monkeypatch):
    from pipeline.detection import model_config
    from pipeline.errors import BundleError

    demo = tmp_path / "demo_phantom_retinanet.json"
    demo.write_text("{")
    monkeypatch.setattr(model_config, "DEMO_MODEL_JSON", demo)
    with pytest.raises(BundleError, match=r"line 1, column 2, or reinstall ctpipe, which ships the demo model's"):
        model_config.load_model_config(demo)
    real = Path.read_bytes

    def refused(self: Path) -> bytes:  # injected: the tests run as root, whom file permissions do not stop
        if self == demo:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(BundleError, match=r"model config cannot be read \(Permission denied\)\. Fix: check the file's"):
        model_config.load_model_config(demo)


def test_set_with_a_bad_yaml_value_or_unknown_option_names_the_set(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for cmd in (["run", str(tmp_path / "empty")], ["listen", "--allow", "X"]):
        rc, err = _err(capsys, *cmd, "--out", str(tmp_path / "r"), "--set", "reconstruct.mesh_formats=[stl")
        assert rc == 2 and "--set reconstruct.mesh_formats=[stl: the value '[stl' is not valid YAML" in err, cmd
    rc, err = _err(capsys, "run", str(tmp_path / "empty"), "--out", str(tmp_path / "r"), "--set", "runner.wrkers=2")
    assert rc == 2 and "--set runner.wrkers=2: unknown option 'runner.wrkers'" in err and "overrides" not in err
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


@pytest.mark.parametrize("command", [["run", "SRC", "--out", "R"], ["listen", "--allow", "X", "--out", "R"], ["send", "SRC"]])
def test_a_set_item_of_the_wrong_shape_is_a_bad_argument_exit_2(tmp_path, capsys, command):
    (tmp_path / "empty").mkdir()
    argv = [{"SRC": str(tmp_path / "empty"), "R": str(tmp_path / "r")}.get(a, a) for a in command]
    for item, says in (
        ("workers", "--set 'workers' is not SECTION.KEY=VALUE: no '='"),
        ("runner.workers", "--set 'runner.workers' is not SECTION.KEY=VALUE: no '='"),
        ("workers=4", "--set 'workers=4' is not SECTION.KEY=VALUE: no section"),
        ("runner.workers=", "--set 'runner.workers=' gives no value"),
    ):
        with pytest.raises(SystemExit) as exit_info:  # argparse's own exit: 2, as for any bad argument
            main([*argv, "--set", item])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (item, err)
        assert says in err and "--set section.key=value" in err, (item, err)
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_a_bad_value_set_on_the_command_line_is_checked_once_and_names_the_set_item_or_flag(tmp_path, capsys, monkeypatch):
    import pipeline.config as config

    checked: list[tuple[str, str]] = []
    real_check = config.check_value
    monkeypatch.setattr(
        config,
        "check_value",
        lambda path, opt, value, source: checked.append((path, source)) or real_check(path, opt, value, source),
    )
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE", raising=False)
    (tmp_path / "empty").mkdir()
    for cmd in (["run", str(tmp_path / "empty")], ["listen", "--allow", "X"]):
        checked.clear()
        rc, err = _err(capsys, *cmd, "--out", str(tmp_path / "r"), "--set", "runner.device=gpu0")
        assert rc == 2 and "--set runner.device=gpu0: runner.device = 'gpu0' is not allowed" in err, cmd
        assert err.count("gpu0") == 2 and "overrides" not in err  # reported once
        assert [c for c in checked if c[0] == "runner.device"] == [("runner.device", "--set runner.device=gpu0")], cmd
        rc, err = _err(capsys, *cmd, "--out", str(tmp_path / "r"), "--set", "runner.device=cpu", "--device", "gpu0")
        assert rc == 2 and "--device: runner.device = 'gpu0' is not allowed" in err and "--set" not in err, cmd
    rc, err = _err(capsys, "run", str(tmp_path / "empty"), "--out", str(tmp_path / "r"), "--set", "runnr.workers=2")
    assert rc == 2 and "--set runnr.workers=2: unknown section 'runnr'" in err
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_report_on_a_missing_folder_or_a_file(tmp_path, capsys):
    rc, err = _err(capsys, "report", str(tmp_path / "nope"), "--out", str(tmp_path / "rep"))
    assert rc == 1 and "no run database here: the folder does not exist" in err and "Fix: check the path" in err
    (tmp_path / "afile").write_text("x")
    rc, err = _err(capsys, "report", str(tmp_path / "afile"), "--out", str(tmp_path / "rep"))
    assert rc == 1 and f"{tmp_path / 'afile'}: no run database here: this is a file, not a run folder" in err


@pytest.mark.parametrize("option", ["--pred", "--truth"])
def test_evaluate_names_the_option_of_a_missing_path(tmp_path, capsys, option):
    paths = {"--pred": str(tmp_path / "p"), "--truth": str(TRUTH)}
    (tmp_path / "p").mkdir()
    paths[option] = str(tmp_path / "nope")
    rc, err = _err(capsys, "evaluate", "--pred", paths["--pred"], "--truth", paths["--truth"], "--out", str(tmp_path / "e"))
    assert rc == 1 and f"{tmp_path / 'nope'}: no such file or folder (given as {option}). Fix: check the path" in err


def test_evaluate_without_ground_truth_or_with_junk_predictions_says_what_the_option_takes(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    rc, err = _err(
        capsys, "evaluate", "--pred", str(tmp_path / "p"), "--truth", str(tmp_path / "t"), "--out", str(tmp_path / "e")
    )
    assert rc == 1 and "no ground truth found" in err and "Fix: --truth takes phantom ground_truth.json" in err
    (tmp_path / "p" / "a.findings.json").write_text("not json")
    rc, err = _err(capsys, "evaluate", "--pred", str(tmp_path / "p"), "--truth", str(TRUTH), "--out", str(tmp_path / "e"))
    assert rc == 1 and "not a ctpipe findings JSON" in err and "Fix: --pred takes findings JSONs" in err


def test_ingest_of_an_image_file_or_a_folder_of_them_names_the_commands_that_read_it(tmp_path, capsys):
    # was: "no series was cached: ...: no DICOM image files found ... Fix: point ctpipe at the folder holding the DICOM
    # image files", for a NIfTI file that ctpipe detect and ctpipe reconstruct read as it is
    import SimpleITK as sitk

    folder = tmp_path / "nifti"
    folder.mkdir()
    sitk.WriteImage(sitk.GetImageFromArray(np.full((4, 8, 8), -1000, np.int16)), str(folder / "ct.nii.gz"))
    for source in (folder / "ct.nii.gz", folder):
        rc = main(["ingest", str(source), "--out", str(tmp_path / "cache")])
        out = capsys.readouterr().out
        assert rc == 1 and "no series was cached: " in out, out
        fix = out.split("Fix: ", 1)[1]
        assert "ctpipe ingest and ctpipe run read DICOM series" in fix and "`ctpipe detect FILE`" in fix, fix
        assert "load_series(FILE)" in fix and "point ctpipe at the folder holding the DICOM image files" not in fix, fix
