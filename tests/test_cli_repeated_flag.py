"""A single-value flag given twice on one command line: taken when both give the same value, refused (exit status 2,
naming the flag, both values and the fix) when they differ, in every command, rather than the last one winning
without a word. Repeatable flags (``--set``, ``--allow``, ``--quirk``) stay repeatable."""

from __future__ import annotations

import argparse

import pytest

from pipeline.cli import build_parser, main, parse_command_line

A = "dicomweb+http://127.0.0.1:8042/dicom-web"
B = "dimse://PACS@127.0.0.1:104"

#: (command, flag) -> two different values the flag takes (each one or more arguments)
VALUES: dict[tuple[str, str], tuple[list[str], list[str]]] = {
    ("phantom", "--seed"): (["1"], ["2"]),
    ("phantom", "--count"): (["1"], ["2"]),
    ("phantom", "--matrix"): (["64"], ["96"]),
    ("phantom", "--pixel-spacing"): (["0.7"], ["0.8"]),
    ("phantom", "--slice-spacing"): (["1.0"], ["2.0"]),
    ("phantom", "--slice-thickness"): (["1.0"], ["2.0"]),
    ("phantom", "--slices"): (["40"], ["50"]),
    ("phantom", "--nodules"): (["1"], ["2"]),
    ("phantom", "--nodule-diameter"): (["4.0", "8.0"], ["5.0", "9.0"]),
    ("phantom", "--noise-hu"): (["10.0"], ["20.0"]),
    ("phantom", "--patient-position"): (["HFS"], ["FFS"]),
    ("phantom", "--scenario"): (["prone"], ["routine_chest"]),
    ("phantom", "--seed-offset"): (["1"], ["2"]),
    ("phantom", "--transfer-syntax"): (["rle"], ["explicit_le"]),
    ("ingest", "--out"): (["o1"], ["o2"]),
    ("ingest", "--series-uid"): (["1.2.3"], ["1.2.4"]),
    ("ingest", "--min-slices"): (["5"], ["6"]),
    ("ingest", "--axial-tolerance"): (["1.0"], ["2.0"]),
    ("ingest", "--spacing-tolerance"): (["0.1"], ["0.2"]),
    ("ingest", "--threads"): (["1"], ["2"]),
    ("ingest", "--workers"): (["1"], ["2"]),
    ("ingest", "--json"): (["r1.json"], ["r2.json"]),
    ("detect", "--out"): (["o1"], ["o2"]),
    ("detect", "--bundle"): (["b1"], ["b2"]),
    ("detect", "--device"): (["cpu"], ["cuda"]),
    ("detect", "--score-threshold"): (["0.5"], ["0.6"]),
    ("detect", "--series-uid"): (["1.2.3"], ["1.2.4"]),
    ("detect", "--case-id"): (["c1"], ["c2"]),
    ("detect", "--max-png"): (["1"], ["2"]),
    ("detect", "--dicom"): (["sr"], ["seg"]),
    ("evaluate", "--pred"): (["p1.json"], ["p2.json"]),
    ("evaluate", "--truth"): (["t1.json"], ["t2.json"]),
    ("evaluate", "--out"): (["o1"], ["o2"]),
    ("evaluate", "--bootstrap"): (["10"], ["20"]),
    ("evaluate", "--min-diameter"): (["3.0"], ["4.0"]),
    ("evaluate", "--scans"): (["s1.csv"], ["s2.csv"]),
    ("evaluate", "--irrelevant"): (["i1.json"], ["i2.json"]),
    ("evaluate", "--reading"): (["step"], ["interpolate"]),
    ("evaluate", "--max-marks"): (["1"], ["2"]),
    ("evaluate", "--at-score"): (["0.5"], ["0.5", "0.6"]),
    ("evaluate", "--seed"): (["1"], ["2"]),
    ("reconstruct", "--out"): (["o1"], ["o2"]),
    ("reconstruct", "--formats"): (["stl"], ["glb"]),
    ("reconstruct", "--organs"): (["lungs"], ["bone"]),
    ("reconstruct", "--seg-bundle"): (["b1"], ["b2"]),
    ("reconstruct", "--findings"): (["f1.json"], ["f2.json"]),
    ("reconstruct", "--smoothing"): (["1"], ["2"]),
    ("reconstruct", "--target-triangles"): (["1000"], ["2000"]),
    ("reconstruct", "--device"): (["cpu"], ["cuda"]),
    ("reconstruct", "--series-uid"): (["1.2.3"], ["1.2.4"]),
    ("reconstruct", "--case-id"): (["c1"], ["c2"]),
    ("reconstruct", "--dicom"): (["sr"], ["seg"]),
    ("run", "--out"): (["o1"], ["o2"]),
    ("run", "--config"): (["a.yaml"], ["b.yaml"]),
    ("run", "--workers"): (["2"], ["4"]),
    ("run", "--device"): (["cpu"], ["cuda"]),
    ("run", "--bundle"): (["b1"], ["b2"]),
    ("run", "--ray"): (["auto"], ["10.0.0.1:6379"]),
    ("run", "--metrics-port"): (["9100"], ["9101"]),
    ("run", "--dicom"): (["sr"], ["seg"]),
    ("report", "--out"): (["o1"], ["o2"]),
    ("report", "--bin-minutes"): (["5"], ["10"]),
    ("report", "--hours-per-day"): (["8.0"], ["24.0"]),
    ("report", "--gpus"): (["1"], ["2"]),
    ("report", "--nodes"): (["1"], ["2"]),
    ("report", "--cpu-workers"): (["1"], ["2"]),
    ("report", "--timezone"): (["UTC"], ["Europe/Paris"]),
    ("listen", "--out"): (["o1"], ["o2"]),
    ("listen", "--config"): (["a.yaml"], ["b.yaml"]),
    ("listen", "--ae-title"): (["CTPIPE1"], ["CTPIPE2"]),
    ("listen", "--bind"): (["0.0.0.0"], ["127.0.0.1"]),
    ("listen", "--port"): (["11112"], ["11113"]),
    ("listen", "--quiet-period"): (["30.0"], ["60.0"]),
    ("listen", "--send-to"): ([A], [B]),
    ("listen", "--workers"): (["0"], ["2"]),
    ("listen", "--device"): (["cpu"], ["cuda"]),
    ("listen", "--bundle"): (["b1"], ["b2"]),
    ("send", "--to"): ([A], [B]),
    ("send", "--config"): (["a.yaml"], ["b.yaml"]),
    ("send", "--timeout"): (["10.0"], ["20.0"]),
}

#: each command's arguments that it needs besides the flag tested (a float as Python writes it: messages show values so)
BASE = {
    "phantom": ["OUT"],
    "ingest": ["SRC", "--out", "OUT"],
    "detect": ["SRC", "--out", "OUT"],
    "evaluate": ["--pred", "p.json", "--truth", "t.json", "--out", "OUT"],
    "reconstruct": ["SRC", "--out", "OUT"],
    "run": ["SRC", "--out", "OUT"],
    "report": ["RUN", "--out", "OUT"],
    "listen": ["--out", "OUT"],
    "send": ["RUN"],
}


def _argv(command: str, flag: str) -> list[str]:
    """``ctpipe command``'s needed arguments, those of ``flag`` left out (it is given twice after them)."""
    base, argv = BASE[command], []
    i = 0
    while i < len(base):
        if base[i] == flag:
            i += 2
            continue
        argv.append(base[i])
        i += 1
    return [command, *argv]


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _single_value_flags() -> set[tuple[str, str]]:
    """Every (command, flag) whose value the last occurrence would replace: the options of argparse's "store"."""
    return {
        (name, action.option_strings[0])
        for name, command in _commands().items()
        for action in command._actions
        if action.option_strings and isinstance(action, argparse._StoreAction)
    }


def test_every_single_value_flag_of_every_command_is_covered():
    assert _single_value_flags() == set(VALUES)


def _status(capsys, argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize(("command", "flag"), sorted(VALUES), ids=lambda v: str(v))
def test_a_single_value_flag_given_twice(tmp_path, monkeypatch, capsys, command, flag):
    monkeypatch.chdir(tmp_path)
    for name in ("p.json", "t.json", "p1.json", "p2.json", "t1.json", "t2.json"):  # evaluate reads them as it parses
        (tmp_path / name).write_text("[]")
    first, other = VALUES[(command, flag)]
    argv = _argv(command, flag)
    rc, err = _status(capsys, [*argv, flag, *first, flag, *other])
    assert rc == 2, err  # was: the last one taken without a word
    said, says = " ".join(first), " ".join(other)
    assert f"ctpipe {command}: error: {flag}: given twice, as {said} and as {says}" in err, err
    assert f"Fix: give it once: either {flag} {said} or {flag} {says}, not both" in err, err
    assert not (tmp_path / "OUT").exists()

    parser = build_parser()  # the same value twice: taken, as once
    alike = parse_command_line(parser, [*argv, flag, *first, flag, *first])
    assert vars(alike) == vars(parse_command_line(parser, [*argv, flag, *first]))


def test_an_earlier_name_and_its_flag_give_one_option(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, err = _status(capsys, ["ingest", "SRC", "--out", "OUT", "--threads", "2", "--workers", "4"])
    assert rc == 2
    assert "--threads and --workers: given twice, as 2 and as 4" in err, err
    args = parse_command_line(build_parser(), ["ingest", "SRC", "--out", "OUT", "--threads", "2", "--workers", "2"])
    assert args.threads == 2


@pytest.mark.parametrize(
    ("argv", "dest", "expected"),
    [
        (["listen", "--out", "OUT", "--allow", "MOD1", "--allow", "MOD2"], "allow", ["MOD1", "MOD2"]),
        (["run", "SRC", "--out", "OUT", "--set", "runner.retries=2", "--set", "runner.workers=3"], "set", None),
        (["phantom", "OUT", "--quirk", "localizer", "--quirk", "gantry_tilt"], "quirks", ["localizer", "gantry_tilt"]),
        (["run", "SRC", "--out", "OUT", "-v", "-v"], "verbose_after", 2),
    ],
)
def test_repeatable_flags_stay_repeatable(argv, dest, expected):
    args = parse_command_line(build_parser(), argv)
    value = getattr(args, dest)
    assert value == (expected if expected is not None else ["runner.retries=2", "runner.workers=3"])
