"""``ctpipe run`` with only the SR (``outputs.dicom: [sr]``): the same report as with the SEG beside it, each finding
with its lung side and the measurements of its segmentation, and the same UIDs, so that an archive keeps one copy
when a site adds the SEG later. Tiny phantom (64 x 64 pixels of 2 mm, 5 mm slices); positions LPS mm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.dicom_out import read_sr_findings
from pipeline.runner import open_run, run_batch
from tests._support.dicom_dates import assert_same_but_dates
from tests._support.runner import QUICK


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One phantom with a nodule, run once with ``outputs.dicom: [sr]``, once with ``[sr, seg]`` and once with
    ``[sr, seg]`` and the reconstruction off (``no_recon``: detection only, no SEG); SR path by run."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    root = tmp_path_factory.mktemp("outputs")
    ph = generate_phantom(11, n_nodules=1, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0)
    write_phantom_case(ph, root / "src")
    paths: dict[str, Path] = {}
    for name, outputs, recon in (("sr", ["sr"], True), ("sr_seg", ["sr", "seg"], True), ("no_recon", ["sr", "seg"], False)):
        # no throughput report: its plots are most of a tiny run's time, and none of it is checked here
        options: dict[str, Any] = {**QUICK, "outputs.dicom": outputs, "reconstruct.enabled": recon, "report.enabled": False}
        summary = run_batch([root / "src"], out=root / name, workers=0, **options)
        assert summary.done == 1
        table = open_run(root / name).dicom_outputs
        paths[name] = Path(table.sr.iloc[0])
        assert (table.seg.notna() if name == "sr_seg" else table.seg.isna()).all()
    paths["truth"] = root / "src"
    return paths


@pytest.mark.slow
def test_an_sr_alone_states_each_findings_side_and_segmented_size(runs: dict[str, Path]) -> None:
    table = read_sr_findings(runs["sr"])
    assert len(table) >= 1
    assert table.side.notna().all(), table[["tracking_id", "side"]]
    assert (
        table.max_extent_mm.notna().all()
        and table.long_axis_mm.notna().all()
        and table.diameter_mm.notna().all()
        and table.volume_mm3.notna().all()
    )
    with_seg = read_sr_findings(runs["sr_seg"])
    assert table.side.tolist() == with_seg.side.tolist()
    assert table.max_extent_mm.tolist() == pytest.approx(with_seg.max_extent_mm.tolist())
    assert table.long_axis_mm.tolist() == pytest.approx(with_seg.long_axis_mm.tolist())


@pytest.mark.slow
def test_an_sr_alone_is_the_same_file_as_the_sr_written_beside_a_seg(runs: dict[str, Path]) -> None:
    assert_same_but_dates(runs["sr"], runs["sr_seg"])  # the same UIDs and content, each made at its own time


@pytest.mark.slow
def test_a_run_without_reconstruction_states_each_findings_side(runs: dict[str, Path]) -> None:
    """``reconstruct.enabled: false`` (detection only): the lungs segmented before detection give each finding its
    side, as the reconstruction's do (it stated none); nothing is measured, so no size and no SEG."""
    import json

    import numpy as np

    table = read_sr_findings(runs["no_recon"])
    assert len(table) >= 1 and table.side.notna().all(), table[["tracking_id", "center_x", "side"]]
    with_recon = read_sr_findings(runs["sr"]).set_index("tracking_uid").side
    common = [uid for uid in table.tracking_uid if uid in with_recon.index]  # the same finding (the same centre)
    assert common and table.set_index("tracking_uid").side[common].tolist() == with_recon[common].tolist()
    nodule = json.loads(next(runs["truth"].rglob("ground_truth.json")).read_text())["nodules"][0]
    centres = table[["center_x", "center_y", "center_z"]].to_numpy(dtype=float)
    nearest = int(np.argmin(np.linalg.norm(centres - np.asarray(nodule["center_lps"]), axis=1)))
    assert table.side[nearest] == nodule["lung"].removeprefix("lung_")
    assert table.diameter_mm.isna().all()
