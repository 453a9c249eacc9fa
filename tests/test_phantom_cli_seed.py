"""`ctpipe phantom` seeds: a negative one (numpy takes none) is refused with the range before any case is made."""

from __future__ import annotations

import pytest

from pipeline.cli import main
from tests._support.cli import cli_error as _err


def test_a_negative_seed_is_refused_naming_seed_and_its_range(tmp_path, capsys):
    # was: a numpy traceback (ValueError: expected non-negative integer) once the volume was generated
    out = tmp_path / "pz"
    with pytest.raises(SystemExit) as ei:
        main(["phantom", str(out), "--seed", "-1"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "argument --seed: -1 is out of range (0..4294967295)" in err
    assert "Traceback" not in err and not out.exists()


def test_seeds_moved_or_counted_out_of_range_are_refused_before_any_case(tmp_path, capsys):
    out = tmp_path / "pz"
    rc, err = _err(capsys, "phantom", str(out), "--scenario", "all", "--seed-offset", "-5001")
    assert rc == 2 and "--seed-offset -5001 moves the scenario seeds to -1..30, outside 0..4294967295" in err
    assert "Fix: use a --seed-offset of -5000 or more" in err
    rc, err = _err(capsys, "phantom", str(out), "--seed", "4294967295", "--count", "3")
    assert rc == 2 and "runs up to seed 4294967297, above the largest seed 4294967295" in err and "--count 1 or less" in err
    assert not out.exists()


def test_nodules_in_a_scenario_without_lungs_are_refused_before_any_case(tmp_path, capsys):
    # was: the case generated, then "case seed 5009 failed: generate_phantom(n_nodules=..., confounders=...):
    # n_nodules=2 but coverage='abdomen_only' ... Fix: pass n_nodules=0 or None", Python's words, exit status 1
    out = tmp_path / "pz"
    rc, err = _err(capsys, "phantom", str(out), "--scenario", "abdomen_only", "--nodules", "2")
    assert rc == 2 and "ctpipe phantom: error: --nodules 2: scenario abdomen_only puts no lung in the scan" in err, err
    assert "Fix: leave --nodules out, or choose a --scenario with lungs" in err and "n_nodules" not in err
    assert not out.exists()


def test_a_case_that_fails_names_the_flags_not_the_python_arguments(tmp_path, capsys):
    # was: "case seed 3 failed: generate_phantom(nodule_diameter_mm=...): a nodule of the minimum diameter ..."
    out = tmp_path / "pz"
    argv = ["phantom", str(out), "--seed", "3", "--matrix", "64", "--slices", "20", "--nodules", "1"]
    rc, err = _err(capsys, *argv, "--nodule-diameter", "20", "30")
    assert rc == 1 and "case seed 3 failed: --nodule-diameter 20 30: a nodule of the minimum diameter 20 mm" in err, err
    assert "generate_phantom" not in err and "larger --matrix or --pixel-spacing" in err
