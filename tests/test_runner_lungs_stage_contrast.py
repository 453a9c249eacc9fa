"""The lungs-only step of a run without reconstruction: the contrast phase it reports is the scan's."""

from __future__ import annotations

import pytest

import pipeline as ctp

pytestmark = pytest.mark.slow  # a whole run of one case (about 10 s)


def test_a_run_without_reconstruction_reads_a_non_contrast_chest_as_one(tmp_path):
    # as data_samples/phantom_00003: with the lungs alone, its bone read as 16 mL of arterial blood
    phantom = ctp.generate_phantom(3, matrix=128, slices=64, pixel_spacing=1.0, slice_spacing=2.0, n_nodules=0)
    ctp.write_phantom_series(phantom, tmp_path / "src" / "case3")
    summary = ctp.run_batch(
        [tmp_path / "src"],
        out=tmp_path / "run",
        workers=0,
        **{"reconstruct.enabled": False, "report.enabled": False, "detector.write_png": False, "outputs.dicom": []},
    )
    assert summary.exit_code == 0 and summary.done == 1
    cases = ctp.open_run(tmp_path / "run").cases
    assert cases.contrast_phase.tolist() == ["non_contrast"]
    assert "contrast_arterial" not in cases["flags"].iloc[0]
