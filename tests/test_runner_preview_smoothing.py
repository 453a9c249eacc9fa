"""The nodules stage of a run draws the 3-D preview's organ views again when those kept in the cache are an earlier
version's; it made them with the default mesh smoothing (20 iterations), whatever the run's
``reconstruct.smoothing_iterations``. It now uses the run's."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.config import load_config
from pipeline.phantom import generate_phantom
from pipeline.runner.recon_stages import NodulesStage, ReconstructStage, render_inputs_path
from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

ORGANS = ["body", "lung_left", "lung_right", "airway", "bone"]


def _preview_drawn_again(tmp_path: Path, smoothing: int) -> np.ndarray:
    """The preview PNG the nodules stage of a run configured with ``smoothing`` draws from an earlier version's cache."""
    ph = generate_phantom(3, matrix=96, pixel_spacing=2.0, slice_spacing=3.0, n_nodules=1, nodule_diameter_mm=(12.0, 12.0))
    findings = [{"center_lps": list(n.center_lps), "diameter_mm": float(n.diameter_mm), "score": 0.9} for n in ph.nodules]
    overrides = {"reconstruct.organs": ORGANS, "reconstruct.device": "cpu", "reconstruct.smoothing_iterations": smoothing}
    cfg = load_config(overrides=overrides, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=tmp_path / "run")
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(tmp_path))
    ctx = CaseContext(case=spec, attempt=0, workdir=tmp_path / "run" / "work", worker=worker)
    CaseCache(worker.cache_dir).write("c1", ph.volume)
    ctx.state.update({k: v for k, v in ReconstructStage(before_detect=True).process(ctx).items() if k != "declared"})
    path = render_inputs_path(ctx.cache_dir, "c1")
    with np.load(path, allow_pickle=False) as data:  # as an earlier version kept them: no digest
        arrays = {k: data[k] for k in data.files if k != "preview_digest"}
    np.savez(path, **arrays)
    ctx.state["findings"] = findings
    NodulesStage().process(ctx)
    return mpimg.imread(ctx.workdir / "recon" / "c1_preview3d.png")


@pytest.mark.slow
def test_the_nodules_stage_draws_stale_preview_views_with_the_runs_smoothing(tmp_path):
    raw = _preview_drawn_again(tmp_path / "raw", 0)
    smoothed = _preview_drawn_again(tmp_path / "smoothed", 20)
    assert raw.shape == smoothed.shape
    assert not np.array_equal(raw, smoothed), "the run's smoothing (0 against 20) shows in the redrawn preview"
