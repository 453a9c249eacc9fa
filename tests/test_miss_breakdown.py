"""scripts/miss_breakdown.py: every nodule the pipeline does not report at its operating point is put in one class."""

from __future__ import annotations

import re

import pytest

from tests._support.scripts import import_script

pytestmark = pytest.mark.slow


def test_every_nodule_is_reported_or_in_one_miss_class(capsys):
    script = import_script("miss_breakdown")
    assert script.main(["--seed0", "3000", "--n", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"(\d+) nodules,", out)[1])
    reported = int(re.search(r": (\d+)/\d+ nodules reported", out)[1])
    missed = [int(n) for n in re.findall(r"missed, [a-z ]+: (\d+)", out)]
    assert total > 0 and len(missed) == 3, out  # seed 3000 holds nodules
    assert reported + sum(missed) == total, out
    fp = int(re.search(r"false positives: (\d+)", out)[1])
    assert fp == sum(int(n) for n in re.findall(r"^  (?:network box|small blob alone): (\d+)", out, re.M)), out


def test_held_out_seeds_are_refused():
    script = import_script("miss_breakdown")
    with pytest.raises(SystemExit) as info:
        script.main(["--seed0", "341", "--n", "2"])
    assert info.value.code == 2
