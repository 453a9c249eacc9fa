"""Every SR states each finding's lung side whatever organs the reconstruction was asked for, and the SEG holds
only those organs: ``ctpipe reconstruct --organs`` and ``ctpipe run``'s ``reconstruct.organs`` without both lungs
(the lungs that give the sides are segmented for the SR alone, as ``ctpipe detect`` segments them).

A phantom (64 x 64 pixels of 2 mm, 24 slices of 5 mm) with one nodule in each lung; positions LPS mm (+x is the
patient's left).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.dicom_out import read_sr_findings
from pipeline.dicom_out.seg import ORGAN_LABELS
from tests._support.runner import QUICK
from tests.test_dicom_out_sources import Case, phantom_case

pytestmark = pytest.mark.slow

#: a reported finding within this distance (mm, LPS) of a nodule's centre is that nodule
MATCH_MM = 6.0


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    """The phantom, one nodule in each lung (the patient's left at the larger LPS x)."""
    out = phantom_case(tmp_path_factory.mktemp("sides") / "case", seed=4, n_nodules=2, matrix=64, slices=24)
    assert sorted(n.lung for n in out.phantom.nodules) == ["lung_left", "lung_right"]
    return out


def _assert_sides(sr: Path, case: Case) -> None:
    """The SR states, for the finding at each nodule, the lung that nodule lies in; and a side for every finding."""
    table = read_sr_findings(sr)
    centres = table[["center_x", "center_y", "center_z"]].to_numpy(dtype=float)
    for nodule in case.phantom.nodules:
        near = np.linalg.norm(centres - np.asarray(nodule.center_lps), axis=1) <= MATCH_MM
        assert near.any(), (nodule, table[["center_x", "center_y", "center_z"]])
        assert table.side[near].tolist() == [nodule.lung.removeprefix("lung_")] * int(near.sum()), table[["center_x", "side"]]
    assert table.side.notna().all(), table[["center_x", "center_y", "center_z", "side"]]


def _organ_segments(seg: Path) -> list[str]:
    return sorted(d.SegmentLabel for d in hd.seg.segread(seg).SegmentSequence if not d.SegmentLabel.startswith("Nodule "))


@pytest.mark.parametrize("organs", [["body"], ["lung_left"]], ids=["no-lung", "one-lung"])
def test_reconstruct_sr_states_both_sides_whatever_the_organs(case: Case, tmp_path: Path, organs: list[str]) -> None:
    findings = tmp_path / "findings.json"
    doc: list[dict[str, Any]] = [
        {"center_lps": list(n.center_lps), "diameter_mm": n.diameter_mm, "score": 0.9} for n in case.phantom.nodules
    ]
    findings.write_text(json.dumps(doc))
    out = tmp_path / "recon"
    argv = ["reconstruct", str(case.dicom), "--out", str(out), "--organs", ",".join(organs), "--findings", str(findings)]
    assert main([*argv, "--no-render", "--smoothing", "0", "--device", "cpu"]) == 0
    stem = case.volume.series_uid
    _assert_sides(out / f"{stem}_sr.dcm", case)
    assert _organ_segments(out / f"{stem}_seg.dcm") == sorted(ORGAN_LABELS[o] for o in organs)  # no lung not asked for


@pytest.mark.parametrize("organs", [["body"], ["lung_left"]], ids=["no-lung", "one-lung"])
def test_run_sr_states_both_sides_whatever_the_organs(case: Case, tmp_path: Path, organs: list[str]) -> None:
    from pipeline.runner import open_run, run_batch

    options = {**QUICK, "reconstruct.organs": organs, "outputs.dicom": ["sr", "seg"]}
    summary = run_batch([case.dicom], out=tmp_path / "run", workers=0, **options)
    assert summary.done == 1
    table = open_run(tmp_path / "run").dicom_outputs
    _assert_sides(Path(table.sr.iloc[0]), case)
    assert _organ_segments(Path(table.seg.iloc[0])) == sorted(ORGAN_LABELS[o] for o in organs)
