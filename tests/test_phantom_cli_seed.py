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
