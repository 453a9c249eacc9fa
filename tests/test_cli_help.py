"""``ctpipe COMMAND --help`` is complete: each command says what it does, each argument what it takes, and each option
with a default states it (a user compares them with configs/default.yaml and the README)."""

from __future__ import annotations

import argparse

import pytest

from pipeline.cli import build_parser

COMMANDS = ("phantom", "ingest", "detect", "evaluate", "reconstruct", "run", "report")


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


def test_run_states_the_configured_defaults_of_its_flags():
    text = " ".join(_commands()["run"].format_help().split())
    assert "default: runner.workers of the configuration, 2" in text
    assert "default: runner.device of the configuration, auto" in text


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
