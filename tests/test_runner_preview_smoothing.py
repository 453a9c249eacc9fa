"""The nodules stage of a run draws the 3-D preview's organ views again when those kept in the cache are an earlier
version's; it made them with the default mesh smoothing (20 iterations), whatever the run's
``reconstruct.smoothing_iterations``. It now uses the run's."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.config import load_config
from pipeline.phantom import generate_phantom
from pipeline.runner.recon_stages import NodulesStage, ReconstructStage, render_inputs_path
from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

ORGANS = ["body", "lung_left", "lung_right", "airway", "bone"]


def _context(run_dir: Path, source: Path, smoothing: int) -> CaseContext:
    overrides = {"reconstruct.organs": ORGANS, "reconstruct.device": "cpu", "reconstruct.smoothing_iterations": smoothing}
    cfg = load_config(overrides=overrides, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=run_dir)
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(source))
    return CaseContext(case=spec, attempt=0, workdir=run_dir / "work", worker=worker)


@pytest.fixture(scope="module")
def earlier_version(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A phantom with one 12 mm nodule, cached and reconstructed by a run's reconstruct stage (default smoothing, 20
    iterations), its rendering inputs kept as an earlier version kept them (no digest); the run folder, the stage's
    output and findings at the nodule."""
    root = tmp_path_factory.mktemp("preview_smoothing")
    ph = generate_phantom(3, matrix=96, pixel_spacing=2.0, slice_spacing=3.0, n_nodules=1, nodule_diameter_mm=(12.0, 12.0))
    findings = [{"center_lps": list(n.center_lps), "diameter_mm": float(n.diameter_mm), "score": 0.9} for n in ph.nodules]
    ctx = _context(root / "run", root, 20)
    CaseCache(ctx.cache_dir).write("c1", ph.volume)
    state = {k: v for k, v in ReconstructStage(before_detect=True).process(ctx).items() if k != "declared"}
    path = render_inputs_path(ctx.cache_dir, "c1")
    with np.load(path, allow_pickle=False) as data:  # as an earlier version kept them: no digest
        arrays = {k: data[k] for k in data.files if k != "preview_digest"}
    np.savez(path, **arrays)
    return {"run": root / "run", "source": root, "state": state, "findings": findings}


def _preview_drawn_again(earlier_version: dict[str, Any], folder: Path, smoothing: int) -> np.ndarray:
    """The preview PNG the nodules stage of a run configured with ``smoothing`` draws from an earlier version's cache
    (a copy of it in ``folder``)."""
    shutil.copytree(earlier_version["run"], folder / "run")
    ctx = _context(folder / "run", earlier_version["source"], smoothing)
    ctx.state.update(copy.deepcopy(earlier_version["state"]))
    ctx.state["findings"] = earlier_version["findings"]
    NodulesStage().process(ctx)
    return mpimg.imread(ctx.workdir / "recon" / "c1_preview3d.png")


@pytest.mark.slow
def test_the_nodules_stage_draws_stale_preview_views_with_the_runs_smoothing(earlier_version, tmp_path):
    """One reconstruction's stale views, drawn again by two runs' nodules stages: with no smoothing and with 20
    iterations (the default, and the reconstruction's own)."""
    raw = _preview_drawn_again(earlier_version, tmp_path / "raw", 0)
    smoothed = _preview_drawn_again(earlier_version, tmp_path / "smoothed", 20)
    assert raw.shape == smoothed.shape
    assert not np.array_equal(raw, smoothed), "the run's smoothing (0 against 20) shows in the redrawn preview"
