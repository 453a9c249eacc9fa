"""The notebook example (the docstring of pipeline.runner, copied into the README) runs as written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import pytest

import pipeline.runner

matplotlib.use("Agg")

pytestmark = pytest.mark.slow


def example_code() -> str:
    doc = pipeline.runner.__doc__
    block = doc.split("runs this same code)::", 1)[1]
    return textwrap.dedent(block).strip() + "\n"


def test_readme_notebook_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(example_code(), "README example", "exec"), ns)  # noqa: S102 - the example is the test
    summary, run, vol, ax = ns["summary"], ns["run"], ns["vol"], ns["ax"]
    assert summary.exit_code == 0 and summary.done == 2 and not summary.quarantined
    assert Path(summary.report_html).is_file()
    assert "2 cases (2 done, 0 failed" in repr(run)
    assert set(run.cases.status) == {"done"}
    assert (run.cases.latency_s > 0).all()
    assert list(run.stage_latency().index) == ["ingest", "detect", "reconstruct", "write"]
    lungs = ns["lungs"]
    assert len(lungs) == 2 and (lungs.value > 0).all() and set(lungs.unit) == {"mL"}
    # the case folders hold what the results point to
    case = run.case(vol.series_uid)
    assert case.status == "done" and any(p.name == "findings.json" for p in case.files)
    assert "CaseResult(" in repr(case)
    # the in-memory API agrees with the batch run on the same series (same model, same input)
    mem = sorted((f.score, f.center_lps) for f in ns["findings"] if f.score >= 0.1)
    batch = sorted((r.score, (r.center_x, r.center_y, r.center_z)) for r in case.findings.itertuples() if r.score >= 0.1)
    assert len(mem) == len(batch)
    for (s1, c1), (s2, c2) in zip(mem, batch):
        assert s1 == pytest.approx(s2, abs=1e-3) and c1 == pytest.approx(c2, abs=1.0)  # LPS mm
    assert set(ns["recon"].masks) == {"lung_left", "lung_right"}
    assert ax.get_title().startswith("slice k=")
    assert len(ax.collections) >= 1  # organ outlines drawn


def test_show_draws_findings_on_the_right_slice():
    import numpy as np

    from pipeline.runner.show import show
    from pipeline.volume import CTVolume, Geometry

    geom = Geometry(shape=(20, 32, 32), spacing=(1.0, 1.0, 2.0), origin=(-16.0, -16.0, 100.0))
    vol = CTVolume(np.full((20, 32, 32), -800, np.int16), geom)
    centre = geom.index_to_lps([10, 12, 7])  # (i, j, k) → LPS mm
    f = [{"center_lps": centre.tolist(), "diameter_mm": 6.0, "score": 0.8}]
    ax = show(vol, findings=f)
    assert ax.get_title().startswith("slice k=7 ")
    (circle,) = ax.patches
    assert circle.center == pytest.approx((10.0, 12.0))
    ax = show(vol, findings=f, slice=15)  # far from the finding: nothing drawn
    assert not ax.patches
    with pytest.raises(IndexError, match="outside the volume"):
        show(vol, slice=20)
