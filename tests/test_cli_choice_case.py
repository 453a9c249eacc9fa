"""Every option that takes names from a fixed set reads them in any letter case, as they are spelt (``STL`` is
``stl``, ``hfs`` is ``HFS``): each command's flags and comma lists, ``--set``, the environment and config files;
a name that is none of them is still refused with the names allowed."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.cli import build_parser, main, parse_command_line
from pipeline.config import load_config
from pipeline.config_schema import SCHEMA
from pipeline.errors import ConfigError

#: (command line, the argument it sets, what the command reads)
FLAGS = [
    (["phantom", "OUT", "--seed", "1", "--patient-position", "ffp"], "patient_position", "FFP"),
    (["phantom", "OUT", "--scenario", "Prone"], "scenario", "prone"),
    (["phantom", "OUT", "--scenario", "ALL"], "scenario", "all"),
    (["phantom", "OUT", "--seed", "1", "--transfer-syntax", "RLE"], "transfer_syntax", "rle"),
    (["phantom", "OUT", "--seed", "1", "--quirk", "Gantry_Tilt", "--quirk", "LOCALIZER"], "quirks", ["gantry_tilt", "localizer"]),
    (["evaluate", "--pred", "P", "--truth", "T", "--out", "O", "--reading", "STEP"], "reading", "step"),
    (["detect", "SRC", "--out", "O", "--dicom", "SR"], "dicom", ("sr",)),
    (["detect", "SRC", "--out", "O", "--device", "CPU"], "device", "cpu"),
    (["reconstruct", "SRC", "--out", "O", "--dicom", "Seg,SR"], "dicom", ("sr", "seg")),
    (["reconstruct", "SRC", "--out", "O", "--device", "GPU"], "device", "cuda"),
    (["run", "SRC", "--out", "O", "--dicom", "SEG"], "dicom", ("seg",)),
]


@pytest.mark.parametrize(("argv", "dest", "read"), FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_a_flag_reads_its_names_in_any_letter_case(argv, dest, read):
    args = parse_command_line(build_parser(), argv)  # was: "argument --scenario: invalid choice: 'Prone'", exit 2
    assert getattr(args, dest) == read


def test_a_name_that_is_none_of_the_choices_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command_line(build_parser(), ["phantom", "OUT", "--scenario", "PRONED"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "invalid choice: 'PRONED' (choose from" in err and "'prone'" in err
    with pytest.raises(ConfigError, match=r"runner.engine = 'RAYS' is not allowed; allowed: one of local, ray"):
        load_config(overrides={"runner.engine": "RAYS"}, environ={})


#: every option of the configuration that takes names from a fixed set, with its names
CHOICE_OPTIONS = [(f"{sec}.{key}", opt) for sec, opts in SCHEMA.items() for key, opt in opts.items() if opt.choices]


@pytest.mark.parametrize(("path", "opt"), CHOICE_OPTIONS, ids=[p for p, _ in CHOICE_OPTIONS])
def test_a_configuration_option_reads_its_names_in_any_letter_case(tmp_path, path, opt):
    sec, key = path.split(".")
    name = opt.choices[-1]
    typed = name.swapcase()  # 'TORCH', 'iMAGESiNaCQUISITION'
    read = name if opt.kind == "choice" else [name]
    value = typed if opt.kind == "choice" else f"[{typed}]"
    file = tmp_path / "c.yaml"
    file.write_text(f"{sec}:\n  {key}: {value}\n")
    env = {f"CTPIPE_{sec}_{key}".upper(): typed}
    # was: "reconstruct.mesh_formats = ['STL'] is not allowed; allowed: a list drawn from stl, ply, obj, glb, or none"
    assert load_config(file, environ={}).get_path(path) == read
    assert load_config(environ=env).get_path(path) == read
    assert load_config(overrides={path: value if opt.kind == "choice" else [typed]}, environ={}).get_path(path) == read


def test_the_device_and_the_ray_address_words_in_any_letter_case():
    from pipeline.runner.cli import run_overrides
    from pipeline.runner.cli_options import load_cli_config

    args = parse_command_line(build_parser(), ["run", "SRC", "--out", "O", "--ray", "LOCAL", "--device", "CPU"])
    overrides, labels = run_overrides(args)
    cfg = load_cli_config(None, overrides, labels)
    assert cfg.runner.ray_address == "local" and cfg.runner.engine == "ray" and cfg.runner.device == "cpu"
    assert load_config(environ={"CTPIPE_RUNNER_RAY_ADDRESS": "Auto"}).runner.ray_address == "auto"


def test_reconstruct_reads_organs_and_formats_in_any_letter_case(tmp_path, capsys):
    import SimpleITK as sitk

    volume = np.full((12, 16, 16), -1000.0, np.float32)  # a soft-tissue block in air: a body, no lungs
    volume[2:10, 3:13, 3:13] = 40.0
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing((2.0, 2.0, 3.0))
    sitk.WriteImage(image, str(tmp_path / "block.nrrd"))
    out = tmp_path / "recon"
    fast = ["--no-render", "--no-dicom", "--device", "cpu"]
    # was: "--organs: unknown organ name(s) BODY. Fix: choose from body,lung_left,lung_right,airway,bone", exit 2
    assert (
        main(["reconstruct", str(tmp_path / "block.nrrd"), "--out", str(out), "--organs", "BODY", "--formats", "GLB", *fast]) == 0
    )
    capsys.readouterr()
    assert [p.name.split("_", 1)[1] for p in out.glob("*.glb")] == ["body.glb"]
