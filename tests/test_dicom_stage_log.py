"""The run log of ``ctpipe run`` names a nodule that cannot be segmented once, not once more for the DICOM results
(whose stage segments the findings again for the SR's sizes and the SEG's masks). On the downsampled COPDGene chest
of the shared real CT (``../shared/real_ct``; skipped where absent), whose false positives include such findings."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from pipeline.reconstruction.nodules import segment_findings
from pipeline.runner import run_batch
from tests._support.real_ct import require_real_ct
from tests.test_dicom_out_sources import phantom_case


def test_a_nodule_that_cannot_be_segmented_is_warned_of_once_per_run(tmp_path: Path) -> None:
    src = require_real_ct() / "cip_copdgene_chest_64" / "ct-64Dicom"
    # no recon renderings and no throughput report: the run log is what is checked here
    off = {"reconstruct.renderings": False, "report.enabled": False}
    summary = run_batch([src], out=tmp_path / "run", workers=0, **off)
    assert summary.done == 1
    records = [json.loads(line) for line in (tmp_path / "run" / "run.log").read_text().splitlines() if line.strip()]
    warned = Counter(r["msg"] for r in records if r.get("level") == "warning" and "nodule not segmented" in r["msg"])
    assert warned, "expected findings of this scan that cannot be segmented"
    assert max(warned.values()) == 1, warned


def test_segment_findings_can_log_failures_already_reported_at_info(tmp_path: Path, caplog) -> None:
    case = phantom_case(tmp_path / "case", n_nodules=0)
    g = case.volume.geometry
    in_air = {"center_lps": g.index_to_lps(np.array([1.0, 1.0, 1.0])).tolist(), "diameter_mm": 6.0}  # outside the body
    with caplog.at_level(logging.INFO, logger="pipeline.reconstruction.nodules"):
        (first,) = segment_findings(case.volume, [in_air], case_id="c")
        (again,) = segment_findings(case.volume, [in_air], case_id="c", report_failures=False)
    assert first.error and again.error == first.error
    levels = [r.levelname for r in caplog.records if "nodule not segmented" in r.getMessage()]
    assert levels == ["WARNING", "INFO"]
