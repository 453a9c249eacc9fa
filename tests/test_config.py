"""Configuration: schema vs configs/default.yaml, validation messages, precedence, saved effective config."""

from __future__ import annotations

import re

import pytest
import yaml

from pipeline.config import SCHEMA, default_yaml_path, defaults, load_config, overrides_layer
from pipeline.errors import ConfigError


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def test_default_yaml_matches_schema_and_documents_every_option():
    text = default_yaml_path().read_text()
    data = yaml.safe_load(text)
    assert set(data) == set(SCHEMA)
    assert data == defaults()  # the shipped file is exactly the defaults
    lines_of: dict[str, list[str]] = {}  # each top-level section's own lines (several sections share key names)
    section_now = None
    for ln in text.splitlines():
        head = re.match(r"(\w+):", ln)
        if head:
            section_now = head.group(1)
        elif section_now is not None:
            lines_of.setdefault(section_now, []).append(ln)
    for section, opts in SCHEMA.items():
        for key, opt in opts.items():
            line = next(ln for ln in lines_of[section] if re.match(rf"\s+{key}:", ln))
            assert "#" in line, f"{section}.{key} has no comment"
            if opt.unit and opt.kind in ("int", "float"):
                assert opt.unit.split()[0].rstrip(";") in line, f"{section}.{key}: unit {opt.unit!r} not documented"
            if opt.kind in ("int", "float") and opt.lo is not None:  # the range a value is refused outside of
                rng = f"{_number(opt.lo)} to {_number(opt.hi)}" if opt.hi is not None else f">= {_number(opt.lo)}"
                assert rng in line, f"{section}.{key}: range {rng!r} not documented"
            if opt.kind in ("choice", "choices"):
                assert " | ".join(opt.choices) in line or ", ".join(opt.choices) in line, f"{section}.{key}: choices"
    cfg = load_config(default_yaml_path(), environ={})
    assert cfg.to_dict() == defaults()


@pytest.mark.parametrize(
    ("text", "path", "value", "allowed"),
    [
        ("runner:\n  workers: -1\n", "runner.workers", "-1", "integer in [0, 256]"),
        ("runner:\n  wrokers: 2\n", "runner.wrokers", "2", "allowed in runner: workers"),
        ("detector:\n  score_threshold: 1.5\n", "detector.score_threshold", "1.5", "number in [0, 1]"),
        ("loader:\n  backend: cuda\n", "loader.backend", "'cuda'", "one of auto, dali, torch"),
        ("reconstruct:\n  mesh_formats: [stl, vtk]\n", "reconstruct.mesh_formats", "vtk", "stl, ply, obj, glb"),
        ("metrics:\n  port: '9100'\n", "metrics.port", "'9100'", "or null"),
        ("report:\n  enabled: yes please\n", "report.enabled", "yes please", "true or false"),
        ("runner:\n  device: gpu0\n", "runner.device", "gpu0", "cuda:N"),
        ("nonsense:\n  a: 1\n", "nonsense", "nonsense", "allowed: ingest, loader"),
        # was: AttributeError: 'int' object has no attribute 'lower', a traceback for an option named by a number
        ("runner:\n  1: 2\n", "runner.1", "2", "allowed in runner: workers"),
        # was: "allowed: a string", for an option that takes device names only
        ("runner:\n  device: null\n", "runner.device", "None", "auto (a GPU where torch sees one"),
        ("runner:\n  device:\n", "runner.device", "None", "cuda:N[,M...]"),
        # was: no fix, where every other refusal says how to write it
        ("runner: 5\n", "section runner", "5", "Fix: indent the options of runner below it"),
    ],
)
def test_bad_file_values_name_key_value_and_allowed(tmp_path, text, path, value, allowed):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(f, environ={})
    msg = str(ei.value)
    assert str(f) in msg
    assert path in msg
    assert value in msg
    assert allowed in msg


def test_invalid_yaml_and_missing_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("runner: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "missing.yaml", environ={})


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        ("runner:\n  workers: 1\nreport:\n  enabled: false\nrunner:\n  retries: 2\n", "line 5, column 1", "'runner'"),
        ("runner:\n  workers: 1\n  retries: 2\n  workers: 0\n", "line 4, column 3", "'workers'"),
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, text, where, key):
    """YAML keeps the later of two equal keys without a word: the first runner section or workers would be lost."""
    f = tmp_path / "twice.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(f, environ={})
    assert f"{f}, {where}: " in str(ei.value) and f"{key} is given twice (first on line" in str(ei.value)
    f.write_text("runner: &r\n  workers: 1\nreport: {enabled: false}\n")  # anchors and flow mappings still read
    assert load_config(f, environ={}).runner.workers == 1


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("runner:\n  workers: 3\n  queue_depth: 5\ndetector:\n  score_threshold: 0.3\n")
    env = {"CTPIPE_RUNNER_WORKERS": "6", "CTPIPE_REPORT_HOURS_PER_DAY": "10", "CTPIPE_UNRELATED": "x"}
    cfg = load_config(f, overrides={"workers": 8, "device": None}, environ=env)
    assert cfg.runner.workers == 8  # CLI beats env and file
    assert cfg.report.hours_per_day == 10.0  # env beats default
    assert cfg.runner.queue_depth == 5  # file beats default
    assert cfg.detector.score_threshold == 0.3
    assert cfg.runner.device == "auto"  # an unset flag (None) changes nothing
    assert cfg.metrics.bind == "127.0.0.1"  # default
    assert cfg.sources["runner.workers"] == "overrides"
    assert cfg.sources["report.hours_per_day"] == "environment variable CTPIPE_REPORT_HOURS_PER_DAY"
    cfg2 = load_config(f, environ=env)
    assert cfg2.runner.workers == 6


def test_env_values_are_validated_with_the_variable_name():
    with pytest.raises(ConfigError) as ei:
        load_config(environ={"CTPIPE_RUNNER_WORKERS": "many"})
    assert "runner.workers" in str(ei.value) and "'many'" in str(ei.value) and "CTPIPE_RUNNER_WORKERS" in str(ei.value)
    # the command line (an override) takes precedence: the variable does not count, whatever its value
    assert load_config(environ={"CTPIPE_RUNNER_WORKERS": "many"}, overrides={"workers": 0}).runner.workers == 0
    with pytest.raises(ConfigError, match="CTPIPE_RUNNER_WORKRES"):
        load_config(environ={"CTPIPE_RUNNER_WORKRES": "2"})


def test_a_misspelt_option_is_refused_with_the_likely_name_in_a_file_a_set_and_a_variable(tmp_path):
    # was: only the list of allowed names, and a variable's written as runner.'wrokers'
    f = tmp_path / "c.yaml"
    f.write_text("detector:\n  score_treshold: 0.5\n")
    with pytest.raises(ConfigError) as ei:
        load_config(f, environ={})
    assert str(ei.value).startswith(
        f"{f}: unknown option 'detector.score_treshold' (value 0.5); did you mean detector.score_threshold?"
    )
    assert str(ei.value).endswith("Fix: rename it to detector.score_threshold")
    with pytest.raises(ConfigError) as ei:
        load_config(overrides={"runner.worker": 2}, override_sources={"runner.worker": "--set runner.worker=2"}, environ={})
    assert "did you mean runner.workers?" in str(ei.value) and "Fix: rename it to runner.workers" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_config(environ={"CTPIPE_RUNNER_WROKERS": "3"})
    text = str(ei.value)
    assert text.startswith("environment variable CTPIPE_RUNNER_WROKERS: unknown option 'runner.wrokers' (value '3'); ")
    assert "did you mean CTPIPE_RUNNER_WORKERS, option runner.workers?" in text
    assert text.endswith("Fix: rename it to CTPIPE_RUNNER_WORKERS, or unset it")
    with pytest.raises(ConfigError) as ei:  # nothing close: the list alone, and the old fix
        load_config(overrides={"runner.foo": 2}, override_sources={"runner.foo": "--set runner.foo=2"}, environ={})
    assert "did you mean" not in str(ei.value) and "(value 2); allowed in runner: workers," in str(ei.value)


def test_overrides_by_short_dotted_and_section_names():
    layer = overrides_layer({"workers": 2, "detector.amp": False, "reconstruct__organs": ["body"], "report": {"enabled": False}})
    assert layer == {
        "runner": {"workers": 2},
        "detector": {"amp": False},
        "reconstruct": {"organs": ["body"]},
        "report": {"enabled": False},
    }
    cfg = load_config(overrides={"reconstruct.mesh_formats": "stl,glb,stl"}, environ={})
    assert cfg.reconstruct.mesh_formats == ["stl", "glb"]
    with pytest.raises(ConfigError, match="unknown override 'wrkers'"):
        load_config(overrides={"wrkers": 2}, environ={})
    with pytest.raises(ConfigError, match="runner.workers = True"):
        load_config(overrides={"workers": True}, environ={})


def test_override_sources_label_each_option_and_its_errors():
    overrides = {"runner.workers": 2, "runner.device": "cpu", "device": "cuda", "report": {"enabled": False}, "bundle": None}
    labels = {"runner.workers": "--set runner.workers=2", "runner.device": "--set runner.device=cpu", "device": "--device"}
    cfg = load_config(overrides=overrides, override_sources=labels, environ={})
    assert cfg.runner.workers == 2 and cfg.runner.device == "cuda"
    assert cfg.sources["runner.workers"] == "--set runner.workers=2"
    assert cfg.sources["runner.device"] == "--device"  # the later override sets it, and names it
    assert cfg.sources["report.enabled"] == "overrides"  # no label: as before
    with pytest.raises(ConfigError) as ei:
        load_config(overrides={"runner.workers": -1}, override_sources={"runner.workers": "--set runner.workers=-1"}, environ={})
    assert str(ei.value).startswith("--set runner.workers=-1: runner.workers = -1 is not allowed (out of range)")
    with pytest.raises(ConfigError) as ei:
        load_config(overrides={"runner.wrkers": 1}, override_sources={"runner.wrkers": "--set runner.wrkers=1"}, environ={})
    assert str(ei.value).startswith("--set runner.wrkers=1: unknown option 'runner.wrkers'")


def test_config_object_is_read_only_and_round_trips():
    cfg = load_config(environ={})
    with pytest.raises(AttributeError, match="config section 'runner' has no option 'nonexistent'"):
        _ = cfg.runner.nonexistent
    fix = r"Fix: give the value when loading it, load_config\(overrides=\{'runner.workers': 5\}\) or --set runner.workers=5"
    with pytest.raises(AttributeError, match=r"read-only: cannot set runner.workers to 5\. " + fix):
        cfg.runner.workers = 5
    with pytest.raises(AttributeError, match=r"read-only: cannot replace the section 'runner'"):
        cfg.runner = cfg.report
    with pytest.raises(AttributeError, match=r"read-only: cannot delete runner.workers"):
        del cfg.runner.workers
    assert cfg.runner.workers == cfg.runner["workers"] == 2 and cfg.runner is cfg["runner"]
    d = cfg.to_dict()
    d["runner"]["workers"] = 99
    assert cfg.runner.workers == 2  # to_dict returns a copy
    assert cfg.get_path("metrics.nvml_interval_s") == 2.0


def test_cli_overrides_an_unset_flag_leaves_the_set_alone_and_a_flag_saying_the_same_is_taken():
    from pipeline.runner.cli import cli_overrides

    overrides, labels = cli_overrides(
        ["outputs.dicom=none", "runner.workers=1"], {"outputs.dicom": ("--dicom", None), "workers": ("--workers", 1)}
    )
    cfg = load_config(overrides=overrides, override_sources=labels, environ={})
    assert cfg.outputs.dicom == [] and cfg.sources["outputs.dicom"] == "--set outputs.dicom=none"  # was: dropped
    assert cfg.runner.workers == 1 and cfg.sources["runner.workers"] == "--workers"


def test_a_password_typed_into_a_set_address_is_not_echoed():
    from pipeline.runner.cli_options import _parse_set

    overrides, labels = _parse_set(["pacs.send_to=dicomweb+http://u:secret@127.0.0.1:8042/dicom-web"])
    assert "secret" not in labels["pacs.send_to"]
    with pytest.raises(ConfigError, match="credentials") as err:
        load_config(overrides=overrides, override_sources=labels, environ={})
    assert "secret" not in str(err.value) and "--set pacs.send_to=" in str(err.value)


def test_set_null_sets_a_nullable_option_to_null_over_the_config_file(tmp_path):
    from pipeline.runner.cli import cli_overrides

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("metrics:\n  port: 9100\n")
    overrides, labels = cli_overrides(["metrics.port=null"], {})
    assert load_config(cfg_file, environ={}).metrics.port == 9100
    assert load_config(cfg_file, overrides=overrides, override_sources=labels, environ={}).metrics.port is None
    overrides, labels = cli_overrides(["runner.workers=~"], {})
    with pytest.raises(ConfigError, match="--set runner.workers=~"):
        load_config(overrides=overrides, override_sources=labels, environ={})


def test_a_run_records_where_each_option_was_set(tmp_path, monkeypatch, capsys):
    """config.yaml of the run folder names the flag, variable or file behind every option not left at its default,
    and run.log keeps the same for each run; a run_batch Config with keyword overrides keeps the Config's sources."""
    from pipeline.cli import main
    from pipeline.runner.batch import run_batch

    (tmp_path / "empty").mkdir()
    conf = tmp_path / "my conf.yaml"
    conf.write_text("runner:\n  retries: 2\n  queue_depth: 3\nreport:\n  bin_minutes: 10\n")
    monkeypatch.setenv("CTPIPE_REPORT_BIN_MINUTES", "20")
    monkeypatch.setenv("CTPIPE_RUNNER_RETRIES", "3")
    out = tmp_path / "run"
    argv = ["run", str(tmp_path / "empty"), "--out", str(out), "--config", str(conf), "--workers", "0"]
    assert main([*argv, "--set", "runner.retries=4"]) == 0
    capsys.readouterr()
    saved = (out / "config.yaml").read_text()
    assert "  workers: 0  # from --workers\n" in saved
    assert "  retries: 4  # from --set runner.retries=4\n" in saved
    assert "  bin_minutes: 20  # from environment variable CTPIPE_REPORT_BIN_MINUTES\n" in saved
    assert f"  queue_depth: 3  # from {conf}\n" in saved
    assert "  max_in_flight: 0\n" in saved  # a default: nothing to name
    assert yaml.safe_load(saved)["runner"]["retries"] == 4
    log = (out / "run.log").read_text()
    assert "runner.retries by --set runner.retries=4" in log and "runner.workers by --workers" in log

    monkeypatch.delenv("CTPIPE_REPORT_BIN_MINUTES")
    monkeypatch.delenv("CTPIPE_RUNNER_RETRIES")
    run_batch([tmp_path / "empty"], out=tmp_path / "run2", config=load_config(conf), workers=0)
    saved = (tmp_path / "run2" / "config.yaml").read_text()
    assert f"  retries: 2  # from {conf}\n" in saved and "  workers: 0  # from overrides\n" in saved


def test_a_run_records_no_dicom_as_set_by_the_flag_typed(tmp_path, monkeypatch, capsys):
    # was: "dicom: []  # from --dicom" for a run given --no-dicom, a flag the command line did not hold
    from pipeline.cli import main

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("CTPIPE_OUTPUTS_DICOM", "sr")
    for flags, label in ((["--no-dicom"], "--no-dicom"), (["--dicom", "none"], "--dicom")):
        out = tmp_path / label.strip("-")
        assert main(["run", str(tmp_path / "empty"), "--out", str(out), "--workers", "0", *flags]) == 0
        capsys.readouterr()
        assert f"  dicom: []  # from {label}\n" in (out / "config.yaml").read_text()


def test_a_number_in_exponent_notation_is_a_number_in_a_file_a_variable_and_a_set(tmp_path):
    """YAML 1.1 (PyYAML) reads ``1e3`` and ``2e-2`` as strings; the refusal then said "'1e3' is not allowed; allowed: a
    number", which it is. They are taken as the numbers they are; words and integers written so stay refused."""
    f = tmp_path / "c.yaml"
    f.write_text("runner:\n  stage_timeout_s: 1e3\ningest:\n  spacing_tolerance: 2E-2\n")
    cfg = load_config(
        f, environ={"CTPIPE_METRICS_LINGER_S": "1.5e1"}, overrides={"report.hours_per_day": yaml.safe_load("1.2e1")}
    )
    assert cfg.runner.stage_timeout_s == 1000.0 and cfg.ingest.spacing_tolerance == 0.02
    assert cfg.metrics.linger_s == 15.0 and cfg.report.hours_per_day == 12.0
    with pytest.raises(ConfigError, match=r"runner.stage_timeout_s = '1e3x'"):
        load_config(environ={"CTPIPE_RUNNER_STAGE_TIMEOUT_S": "1e3x"})
    with pytest.raises(ConfigError, match=r"out of range"):
        load_config(environ={"CTPIPE_RUNNER_STAGE_TIMEOUT_S": "1e9"})
    with pytest.raises(ConfigError, match=r"runner.workers = '1e1'.*an integer"):
        load_config(environ={"CTPIPE_RUNNER_WORKERS": "1e1"})


@pytest.mark.parametrize(
    "device, why",
    [("cuda:,0", "empty"), ("cuda:0,,1", "empty"), ("cuda:1,", "empty"), ("cuda:0,0", "twice"), ("cuda:1,0,1", "twice")],
)
def test_a_device_list_with_an_empty_or_repeated_gpu_is_refused(device, why):
    """``cuda:0,,1`` reached ``int('')`` (a traceback on a GPU server) and ``cuda:0,0`` started two model workers on one
    GPU, which the run record and the capacity model then counted as two GPUs."""
    with pytest.raises(ConfigError) as ei:
        load_config(environ={"CTPIPE_RUNNER_DEVICE": device})
    text = str(ei.value)
    assert f"runner.device = {device!r}" in text and "CTPIPE_RUNNER_DEVICE" in text and why in text
    assert load_config(environ={"CTPIPE_RUNNER_DEVICE": "cuda:1,0"}).runner.device == "cuda:1,0"


@pytest.mark.parametrize("option", ["detector.bundle", "runner.worklist_root", "metrics.textfile_dir", "pacs.netrc"])
def test_a_path_option_starting_with_a_tilde_is_refused_with_the_full_path(tmp_path, monkeypatch, option):
    """A config file or variable is not a shell: '~/data' reached the run as it is, and the error said the folder
    "does not exist" (a folder the user sees in the home folder), or nothing at all (pacs.netrc)."""
    import os

    monkeypatch.chdir(tmp_path)  # no folder named '~' here
    sec, key = option.split(".")
    home = os.path.expanduser("~")
    f = tmp_path / "c.yaml"
    f.write_text(f"{sec}:\n  {key}: ~/data\n")
    for kw in ({"path": f, "environ": {}}, {"environ": {f"CTPIPE_{sec}_{key}".upper(): "~/data"}}):
        with pytest.raises(ConfigError) as ei:
            load_config(**kw)
        text = str(ei.value)
        assert f"{option} = '~/data'" in text and "'~'" in text and f"{home}/data" in text, text
    (tmp_path / "~").mkdir()  # a folder really named '~' in the working folder: the path names it
    assert getattr(getattr(load_config(f, environ={}), sec), key) == "~/data"


def test_an_option_variable_set_but_empty_says_so_and_how_to_keep_the_default():
    """``CTPIPE_RUNNER_DEVICE=`` (a service file that meant to leave it out) read as null: "runner.device = None is
    not allowed; allowed: a string", which names neither the empty variable nor the device names."""
    with pytest.raises(ConfigError) as ei:
        load_config(environ={"CTPIPE_RUNNER_DEVICE": ""})
    text = str(ei.value)
    assert text.startswith("environment variable CTPIPE_RUNNER_DEVICE: set but empty: runner.device takes auto")
    assert "cuda:N" in text and "unset CTPIPE_RUNNER_DEVICE" in text and "runner.device = 'auto'" in text
    with pytest.raises(ConfigError, match=r"CTPIPE_RUNNER_WORKERS: set but empty: runner.workers takes an integer"):
        load_config(environ={"CTPIPE_RUNNER_WORKERS": "  "})
    # an option that takes null reads an empty variable as null; the command line still wins over an empty variable
    assert load_config(environ={"CTPIPE_DETECTOR_SCORE_THRESHOLD": ""}).detector.score_threshold is None
    assert load_config(environ={"CTPIPE_RUNNER_DEVICE": ""}, overrides={"device": "cpu"}).runner.device == "cpu"
