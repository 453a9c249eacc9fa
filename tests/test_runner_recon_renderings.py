"""A run's case folder shows the nodules in its renderings as ``ctpipe reconstruct --findings`` does.

``ctpipe run`` reconstructs before detection (one lung mask per case), so the reconstruction's renderings were made
before there were findings: the overview MPRs and the 3-D preview never showed the nodules and no MPR went through
one. The ``nodules`` stage now draws them (overview MPRs, an MPR set through each nodule, the preview) from the
organ masks and preview views the reconstruction kept in the cache, without reconstructing again.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def reconstructed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One phantom (two nodules, 10 and 14 mm) cached and reconstructed once by a run's reconstruct stage (before
    detection, renderings on): its volume, findings at its nodules, the run folder and the stage's output. Each
    test works on its own copy of that run folder (:func:`_case`)."""
    root = tmp_path_factory.mktemp("recon_renderings")
    ph = generate_phantom(3, matrix=96, pixel_spacing=2.0, slice_spacing=3.0, n_nodules=2, nodule_diameter_mm=(10.0, 14.0))
    findings = [{"center_lps": list(n.center_lps), "diameter_mm": float(n.diameter_mm), "score": 0.9} for n in ph.nodules]
    ctx = _context(root / "run", root)
    CaseCache(ctx.cache_dir).write("c1", ph.volume)
    state = ReconstructStage(before_detect=True).process(ctx)
    return {"volume": ph.volume, "findings": findings, "run": root / "run", "source": root, "state": state}


def _context(run_dir: Path, source: Path) -> CaseContext:
    cfg = load_config(overrides={"reconstruct.organs": ORGANS, "reconstruct.device": "cpu"}, environ={})
    worker = WorkerInfo(name="w0", device="cpu", config=cfg, run_dir=run_dir)
    spec = CaseSpec(case_id="c1", case_key="1.2.3:abc", series_uid="1.2.3", fingerprint="abc", source=str(source))
    return CaseContext(case=spec, attempt=0, workdir=run_dir / "work", worker=worker)


def _case(reconstructed: dict[str, Any], tmp_path: Path) -> tuple[CaseContext, dict[str, Any]]:
    """A context on a copy of the reconstructed run folder, in ``tmp_path``, and a copy of the reconstruct stage's
    output."""
    shutil.copytree(reconstructed["run"], tmp_path / "run")
    return _context(tmp_path / "run", reconstructed["source"]), copy.deepcopy(reconstructed["state"])


def _pixels(path: Path) -> np.ndarray:
    return mpimg.imread(path)


@pytest.mark.slow
def test_a_runs_renderings_show_the_nodules_as_reconstruct_with_findings_does(reconstructed, tmp_path):
    volume, findings = reconstructed["volume"], reconstructed["findings"]
    ctx, state = _case(reconstructed, tmp_path)
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
def test_a_case_without_findings_keeps_the_reconstructions_renderings(reconstructed, tmp_path):
    ctx, state = _case(reconstructed, tmp_path)
    ctx.state.update(state)
    before = {p.name: p.read_bytes() for p in (ctx.workdir / "recon").glob("*.png")}
    ctx.state["findings"] = []
    assert NodulesStage().process(ctx) == {}
    assert {p.name: p.read_bytes() for p in (ctx.workdir / "recon").glob("*.png")} == before
