"""A run's case folder shows the nodules in its renderings as ``ctpipe reconstruct --findings`` does.

``ctpipe run`` reconstructs before detection (one lung mask per case), so the reconstruction's renderings were made
before there were findings: the overview MPRs and the 3-D preview never showed the nodules and no MPR went through
one. The ``nodules`` stage now draws them (overview MPRs, an MPR set through each nodule, the preview) from the
organ masks and preview views the reconstruction kept in the cache, without reconstructing again.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from pipeline.cache import CaseCache
from pipeline.config import load_config
from pipeline.phantom import generate_phantom
from pipeline.reconstruction import reconstruct
from pipeline.runner.recon_stages import NodulesStage, ReconstructStage
from pipeline.runner.stage import CaseContext, CaseSpec, WorkerInfo

ORGANS = ["body", "lung_left", "lung_right", "airway", "bone"]


def _case(tmp_path: Path):
    ph = generate_phantom(3, matrix=96, pixel_spacing=2.0, slice_spacing=3.0, n_nodules=2, nodule_diameter_mm=(10.0, 14.0))
    findings = [{"center_lps": list(n.center_lps), "diameter_mm": float(n.diameter_mm), "score": 0.9} for n in ph.nodules]
    cfg = load_config(overrides={"reconstruct.organs": ORGANS, "reconstruct.device": "cpu"}, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=tmp_path / "run")
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(tmp_path))
    ctx = CaseContext(case=spec, attempt=0, workdir=tmp_path / "run" / "work", worker=worker)
    CaseCache(worker.cache_dir).write("c1", ph.volume)
    return ph.volume, findings, ctx


def _pixels(path: Path) -> np.ndarray:
    return mpimg.imread(path)


@pytest.mark.slow
def test_a_runs_renderings_show_the_nodules_as_reconstruct_with_findings_does(tmp_path):
    volume, findings, ctx = _case(tmp_path)
    state = ReconstructStage(before_detect=True).process(ctx)
    declared = list(state.pop("declared"))
    ctx.state.update(state)
    ctx.state["findings"] = findings
    out = NodulesStage().process(ctx)
    declared += out.get("declared", [])
    recon = ctx.workdir / "recon"
    expected = tmp_path / "expected"
    reconstruct(volume, organs=ORGANS, findings=findings, out_dir=expected, stem="c1", device="cpu")
    pngs = sorted(p.name for p in expected.glob("*.png"))
    assert any("_nodule_01_mpr_" in n for n in pngs) and any("_nodule_02_mpr_" in n for n in pngs), pngs
    assert sorted(p.name for p in recon.glob("*.png")) == pngs  # the nodules' own MPRs too
    for name in pngs:  # the same overlays: outlines, markers, letters, the preview's nodules
        assert np.array_equal(_pixels(recon / name), _pixels(expected / name)), name
    assert sorted(f"recon/{n}" for n in pngs) == sorted({d for d in declared if d.endswith(".png")})
    listed = json.loads((recon / "c1_measurements.json").read_text())["files"]["render"]
    assert sorted(listed) == pngs  # the measurements JSON names every rendering
    assert not any(ctx.cache_dir.glob("c1.render.npz")), "the rendering inputs leave the cache once drawn"


@pytest.mark.slow
def test_a_case_without_findings_keeps_the_reconstructions_renderings(tmp_path):
    _volume, _findings, ctx = _case(tmp_path)
    state = ReconstructStage(before_detect=True).process(ctx)
    ctx.state.update(state)
    before = {p.name: p.read_bytes() for p in (ctx.workdir / "recon").glob("*.png")}
    ctx.state["findings"] = []
    assert NodulesStage().process(ctx) == {}
    assert {p.name: p.read_bytes() for p in (ctx.workdir / "recon").glob("*.png")} == before
