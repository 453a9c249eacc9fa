"""scripts/candidate_recall.py: the share of phantom nodules any pipeline candidate reaches, by small-blob cap."""

from __future__ import annotations

import re

import pytest

from tests._support.scripts import import_script

pytestmark = pytest.mark.slow


def test_more_blob_candidates_never_reach_fewer_nodules(capsys):
    script = import_script("candidate_recall")
    assert script.main(["--seed0", "3000", "--n", "1", "--blobs", "0", "60", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = {int(m[0]): (int(m[1]), int(m[2]), int(m[3])) for m in re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)", out, re.M)}
    assert set(rows) == {0, 60}, out
    (none_cand, none_hit, total), (more_cand, more_hit, total2) = rows[0], rows[60]
    assert total == total2 > 0, out  # seed 3000 holds nodules
    assert more_cand > none_cand and more_hit >= none_hit, out  # the blobs add candidates, never remove a hit


def test_held_out_seeds_are_refused():
    script = import_script("candidate_recall")
    with pytest.raises(SystemExit) as info:
        script.main(["--seed0", "341", "--n", "2"])
    assert info.value.code == 2
