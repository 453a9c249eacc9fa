"""``ctpipe COMMAND --help`` is complete: each command says what it does, each argument what it takes, and each option
with a default states it (a user compares them with configs/default.yaml and the README)."""

from __future__ import annotations

import argparse

import pytest

from pipeline.argtypes import NumberIn
from pipeline.cli import build_parser

COMMANDS = ("phantom", "ingest", "detect", "evaluate", "reconstruct", "run", "report", "listen", "send")


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in COMMANDS}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_argument_is_described_and_every_default_stated(name):
    parser = _commands()[name]
    assert parser.description, f"ctpipe {name} --help has no description"
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        label = "/".join(action.option_strings) or action.metavar or action.dest
        if not action.help:
            missing.append(f"{label}: no help")
        elif (
            action.option_strings
            and not isinstance(action, (argparse._StoreTrueAction, argparse._CountAction))
            and action.default not in (None, [], argparse.SUPPRESS)
            and "default" not in action.help
        ):
            missing.append(f"{label}: default {action.default!r} not stated")
    assert not missing, f"ctpipe {name} --help: " + "; ".join(missing)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_number_option_states_the_range_it_enforces(name):
    # was: ctpipe ingest --axial-tolerance 100 refused as "out of range (0.0..90.0)", ctpipe listen --port, ctpipe
    # report --bin-minutes and others the same, with a range their --help did not give
    missing = []
    for action in _commands()[name]._actions:
        kind = action.type
        if not isinstance(kind, NumberIn) or action.help == argparse.SUPPRESS:
            continue
        text = " ".join(str(action.help).split())
        if kind.lo is not None and kind.hi is not None:
            stated = [f"{_number(kind.lo)}..{_number(kind.hi)}"]
        elif kind.lo is not None and kind.lo > 1:  # 0 or 1 at least: a count or a duration, as expected
            stated = [f"at least {_number(kind.lo)}", f">= {_number(kind.lo)}"]
        else:
            continue
        if not any(s in text for s in stated):
            missing.append(f"{'/'.join(action.option_strings)}: {stated[0]} not stated")
    assert not missing, f"ctpipe {name} --help: " + "; ".join(missing)


def test_run_states_the_configured_defaults_of_its_flags():
    text = " ".join(_commands()["run"].format_help().split())
    assert "default: runner.workers of the configuration, 2" in text
    assert "default: runner.device of the configuration, auto" in text
    # was: "by default they appear nowhere in the run folder", while the SR and SEG carry them by design
    assert "appear nowhere in the run folder but in its DICOM results (SR, SEG)" in text


def test_phantom_states_the_range_of_each_size_it_checks():
    # was: --matrix 8 refused as "out of range (64..1024)", a range the help did not give
    text = " ".join(_commands()["phantom"].format_help().split())
    for stated in (
        "rows = columns per slice, 64..1024 (default 256)",
        "number of slices, 8..1024",
        "mm, 0.3..10 (default: the slice spacing)",
        "each 1..60 (default 3 30)",
        "HU, 0..500 (default 20)",
    ):
        assert stated in text, stated


def test_reconstruct_describes_every_file_it_writes_and_every_source_it_reads():
    # was: no word of the SR and SEG it writes by default, nor of the NIfTI/MHA/NRRD images it reads
    text = " ".join(_commands()["reconstruct"].format_help().split())
    for stated in ("<stem>_seg.dcm", "<stem>_sr.dcm", "NIfTI/MHA/NRRD image", "<stem>_labels.npz", "Exit status 0"):
        assert stated in text, stated


def test_listen_and_send_state_the_configured_defaults_and_ranges_of_their_flags():
    # was: ctpipe listen --help named no default port, AE title or quiet period, and ctpipe send's RUN_DIR had no help
    from pipeline.config_schema import SCHEMA

    pacs = SCHEMA["pacs"]
    listen = " ".join(_commands()["listen"].format_help().split())
    for stated in (
        f"(pacs.ae_title; default {pacs['ae_title'].default})",
        f"(pacs.port; default {pacs['port'].default})",
        f"(pacs.quiet_period_s; default {pacs['quiet_period_s'].default:g})",
        f"(runner.device; default {SCHEMA['runner']['device'].default})",
        f"(pacs.bind; default {pacs['bind'].default})",
    ):
        assert stated in listen, stated
    assert "Exit status 0 stopped by SIGTERM (systemctl stop), SIGHUP or Ctrl-C" in listen  # was: no exit status at all
    send = " ".join(_commands()["send"].format_help().split())
    assert "run folder written by ctpipe run --out or ctpipe listen --out" in send
    assert "1 RUN_DIR is not a run folder or no destination is given" in send  # was: 0 and 3 only


def test_report_states_its_exit_statuses():
    # was: "Write report.html (plots embedded), report.json and CSV tables for RUN_DIRs." and no exit status
    text = " ".join(_commands()["report"].format_help().split())
    for stated in (
        "Exit status 0 written, 1 a path that does not exist",
        "2 bad arguments",
        "is left out, counted with one line per reason",
    ):
        assert stated in text, stated


# command-line flags that set an option of configs/default.yaml (or mirror it): (command, flag) -> section.key
MIRRORED = {
    ("ingest", "--min-slices"): "ingest.min_slices",
    ("ingest", "--spacing-tolerance"): "ingest.spacing_tolerance",
    ("detect", "--score-threshold"): "detector.score_threshold",
    ("reconstruct", "--smoothing"): "reconstruct.smoothing_iterations",
    ("reconstruct", "--target-triangles"): "reconstruct.target_triangles",
    ("run", "--workers"): "runner.workers",
    ("run", "--metrics-port"): "metrics.port",
    ("report", "--bin-minutes"): "report.bin_minutes",
    ("report", "--hours-per-day"): "report.hours_per_day",
    ("listen", "--port"): "pacs.port",
    ("listen", "--quiet-period"): "pacs.quiet_period_s",
    ("listen", "--workers"): "runner.workers",
}


@pytest.mark.parametrize(("command", "flag"), sorted(MIRRORED))
def test_a_flag_mirroring_an_option_has_its_range_and_default(command, flag):
    from pipeline.config_schema import SCHEMA

    section, key = MIRRORED[(command, flag)].split(".")
    opt = SCHEMA[section][key]
    action = next(a for a in _commands()[command]._actions if flag in a.option_strings)
    assert isinstance(action.type, NumberIn) and (action.type.lo, action.type.hi) == (opt.lo, opt.hi)
    if action.default is not None:  # None: the configuration's value applies
        assert action.default == opt.default


def test_keep_identifiers_says_which_identifiers_it_keeps_and_where():
    # was: "keep patient identifiers (PatientID, PatientName, PatientBirthDate, AccessionNumber, ...) in the case cache
    # and volume.json": the "..." promised more than the four ever read, and nothing said that the option also writes
    # patient-named folders and files as they are in run.log, the console, the run store and the report
    from pipeline.config_schema import SCHEMA
    from pipeline.ingest.header_values import METADATA_IDENTIFIERS

    run = next(a for a in _commands()["run"]._actions if "--keep-identifiers" in a.option_strings)
    for text in (run.help or "", SCHEMA["privacy"]["keep_identifiers"].help):
        assert "..." not in text and "…" not in text, text
        assert all(k in text for k in METADATA_IDENTIFIERS), text
        assert "run.log" in text and "report" in text and "description" in text, text


def _placeholder(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    return action.dest.upper() if action.option_strings else action.dest


def test_an_argument_several_commands_take_has_one_placeholder():
    # was: ctpipe detect SRC read "src", and --device DEVICE / --bundle BUNDLE there and in ctpipe reconstruct, while
    # ctpipe run and listen read --device DEV and --bundle PATH: one name for one kind of value in every usage line.
    # --out names the kind of folder written (CACHE_DIR, RUN_DIR, ...), so it may differ.
    seen: dict[str, dict[str, str]] = {}
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.nargs == 0 or action.help == argparse.SUPPRESS or "--out" in action.option_strings:
                continue
            key = action.option_strings[0] if action.option_strings else "source"
            if not action.option_strings and action.dest not in ("src", "sources"):
                continue
            seen.setdefault(key, {})[name] = _placeholder(action)
    differing = {key: by_command for key, by_command in seen.items() if len(set(by_command.values())) > 1}
    assert not differing, differing
    assert set(seen["source"].values()) == {"SRC"}


def test_phantom_names_the_case_folders_it_writes(tmp_path):
    # was: "into OUT_DIR/phantom_<seed>/", while --seed 7 writes OUT_DIR/phantom_00007/
    from pipeline.cli import main

    text = " ".join(_commands()["phantom"].format_help().split())
    assert "--seed 7 writes OUT_DIR/phantom_00007/" in text
    assert main(["phantom", str(tmp_path), "--seed", "7", "--matrix", "64", "--slices", "8", "--nodules", "0"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["phantom_00007"]


def test_listen_says_what_it_does_in_the_commands_own_terms():
    # was: "hands every complete series ... to the crash-safe runner on RUN_DIR", a name of ctpipe's insides
    text = " ".join(_commands()["listen"].format_help().split())
    assert "crash-safe runner" not in text and "handed to the runner" not in text
    assert "processes every complete series (quiet for pacs.quiet_period_s) as ctpipe run does" in text


def test_readme_says_what_listen_does_in_the_terms_of_its_help():
    # was: the README's PACS section said complete series "feed the crash-safe runner", a name of ctpipe's insides
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "crash-safe runner" not in readme and "handed to the runner" not in readme
    assert "The listener processes every complete series as `ctpipe run` does" in readme


@pytest.mark.parametrize("command", ["run", "listen"])
def test_bundle_states_the_option_of_the_configuration_it_defaults_to(command):
    # was: "(default: demo weights)", while detector.bundle of --config or CTPIPE_DETECTOR_BUNDLE is the model used
    action = next(a for a in _commands()[command]._actions if "--bundle" in a.option_strings)
    text = " ".join(str(action.help).split())
    assert "detector.bundle" in text and "demo weights" in text, text
