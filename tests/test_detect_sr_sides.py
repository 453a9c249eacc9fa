"""``ctpipe detect``'s SR states each finding's lung side (TID 1500 ``Finding Site`` laterality), as ``ctpipe run``'s
does: from the reconstruction's lung segmentation, in DICOM patient coordinates (LPS mm: +x is the patient's left),
whatever the patient position and the order the scanner stored rows, columns and slices in.

Phantoms (64 × 64 pixels of 2 mm, 5 mm slices) in four patient positions, one nodule in each lung; and the real
RT-planning chest, whose four lesions lie in known lobes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.dicom_out import read_sr_findings
from pipeline.volume import CTVolume
from tests._support.real_ct import detected_rt_planning_chest, rt_planning_chest
from tests.test_dicom_out_sources import assert_valid, phantom_case

#: a reported finding within this distance (mm, LPS) of a nodule's centre is that nodule
MATCH_MM = 6.0


def _detect(src: Path, out: Path, *extra: str) -> Path:
    """``ctpipe detect`` of ``src`` on the CPU into ``out``; the SR it wrote."""
    rc = main(["detect", str(src), "--out", str(out), "--case-id", "c", "--no-png", "--device", "cpu", *extra])
    assert rc == 0
    return out / "c_sr.dcm"


def _side_near(table, center_lps) -> list[str | None]:
    """The sides the SR states for its findings within :data:`MATCH_MM` of ``center_lps`` (LPS mm)."""
    centres = table[["center_x", "center_y", "center_z"]].to_numpy(dtype=float)
    near = np.linalg.norm(centres - np.asarray(center_lps, dtype=float), axis=1) <= MATCH_MM
    return [None if s is None or s != s else str(s) for s in table.side[near]]


@pytest.mark.slow
@pytest.mark.parametrize("position", ["HFS", "FFS", "HFP", "FFP"])
def test_detect_sr_states_the_lung_each_nodule_lies_in(tmp_path, position):
    case = phantom_case(tmp_path / "case", position=position, seed=4, n_nodules=2, matrix=64, slices=24)
    by_lung = {n.lung: np.asarray(n.center_lps) for n in case.phantom.nodules}
    assert set(by_lung) == {"lung_left", "lung_right"}  # one nodule in each lung
    assert by_lung["lung_left"][0] > by_lung["lung_right"][0]  # the patient's left at larger LPS x
    sr = _detect(case.dicom, tmp_path / "out", "--score-threshold", "0.5")
    table = read_sr_findings(sr)
    for lung, centre in by_lung.items():
        assert _side_near(table, centre) == [lung.removeprefix("lung_")], (position, lung, table[["center_x", "side"]])
    assert table.side.notna().all(), table[["center_x", "center_y", "center_z", "side"]]  # every finding is in a lung
    assert_valid(sr)


#: the planning chest's lesions (LPS mm, within MATCH_MM) and the lung each lies in
PLANNING_CHEST_LESIONS = {
    "26 mm, right upper lobe": ((-86.5, 82.4, -9.1), "right"),
    "13 mm, right lower lobe": ((-43.5, 135.0, -90.4), "right"),
    "8 mm, left upper lobe": ((101.2, 79.3, 32.3), "left"),
    "6 mm, left lower lobe": ((98.2, 62.6, -20.6), "left"),
}


@pytest.fixture(scope="module")
def planning_chest() -> CTVolume:
    """The real RT-planning chest (512 x 512 x 141), read by ctpipe's ingest once for the module's tests, which only
    read it. Skips with a reason when ../shared/real_ct is absent."""
    return rt_planning_chest().volume


@pytest.mark.slow
def test_detect_sr_states_the_side_of_the_real_chests_lesions(tmp_path_factory):
    """``ctpipe detect`` of the planning chest (the CPU, no PNGs; run once for every module that reads its findings:
    :func:`~tests._support.real_ct.detected_rt_planning_chest`)."""
    sr = detected_rt_planning_chest(tmp_path_factory) / "c_sr.dcm"  # skips with a reason when ../shared/real_ct is absent
    table = read_sr_findings(sr)
    for what, (centre, side) in PLANNING_CHEST_LESIONS.items():
        assert _side_near(table, centre) == [side], (what, table[["center_x", "center_y", "center_z", "side"]])
    assert table.side.notna().all(), table[["center_x", "center_y", "center_z", "side"]]
    # standard codes only (2 mm slices: no quality flag); the source has no PatientID or StudyID to copy
    assert_valid(sr, allowed_warnings=("needed to build DICOMDIR",))


@pytest.mark.slow
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_field_of_view_on_one_lung_states_that_lungs_side(side, planning_chest):
    """The planning chest cut to the columns of one lung (the mediastinum and the other lung out of the field of
    view): its lesions still lie in that lung, not in the one on the same half of the image."""
    from pipeline.dicom_out import lung_side_masks
    from pipeline.dicom_out.model import reported_findings

    vol = planning_chest
    g = vol.geometry
    x = np.asarray(g.index_to_lps(np.stack([np.arange(g.shape[2]), np.zeros(g.shape[2]), np.zeros(g.shape[2])], 1)))[:, 0]
    columns = np.flatnonzero(x < -25.0 if side == "right" else x > 35.0)  # LPS x: the patient's right is negative
    i0, i1 = int(columns.min()), int(columns.max()) + 1
    crop = g.cropped([i0, 0, 0], [i1, g.shape[1], g.shape[0]])
    one = CTVolume(np.ascontiguousarray(np.asarray(vol.array)[:, :, i0:i1]), crop, metadata=vol.metadata)
    lesions = [centre for centre, s in PLANNING_CHEST_LESIONS.values() if s == side]
    findings = [{"center_lps": c, "diameter_mm": 8.0, "score": 0.9} for c in lesions]
    masks = lung_side_masks(one, device="cpu")
    reported = reported_findings(findings, crop, series_uid="1.2.3", score_threshold=0.5, organ_masks=masks)
    assert [f.side for f in reported] == [side] * len(lesions)
