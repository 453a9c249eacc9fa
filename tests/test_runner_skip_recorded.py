"""A stage that returns without its work records the skip on its attempt when it happens, so that stage latency
leaves it out whatever becomes of the case: also a case that skipped detection and then failed in a later stage,
and a detection whose model input, loaded again, held no lungs to search."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pipeline.config import load_config
from pipeline.runner import build_report, model_stages
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, WorkerInfo
from tests.test_runner_engine import Detect, Ingest, Reconstruct, _run

NO_LUNGS = "no lungs in the scan"


class NoLungsDetect(Stage):
    """Detection as the detect stage returns it for a scan without lungs (its skip path), for cases ``skip``."""

    name = "detect"
    group = "model"

    def __init__(self, skip: tuple[str, ...]) -> None:
        self.skip = skip
        self.real = Detect()

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        if ctx.case.case_id in self.skip:
            return {"findings": [], "detect_skipped": NO_LUNGS, "skipped": NO_LUNGS}
        return self.real.process(ctx)


def test_a_skipped_detection_of_a_case_that_failed_later_is_no_latency_sample(tmp_path):
    stages: list[Stage] = [Ingest(), NoLungsDetect(("gone",)), Reconstruct(broken=("gone",))]
    result, store, _, _ = _run(tmp_path, ["ok1", "gone"], stages=stages)
    assert result.done == ["ok1"] and [c for c, *_ in result.failed] == ["gone"]
    rows = dict(
        store.db.execute(
            "SELECT c.case_id, a.skip_reason FROM stage_attempts a JOIN cases c USING (case_key) WHERE a.stage='detect'"
        )
    )
    assert rows == {"ok1": None, "gone": NO_LUNGS}
    store.end_run("r1", status="completed", n_cases=2, n_done=1, n_failed=1, n_skipped=0)
    store.close()
    lat = build_report([tmp_path / "run"], tmp_path / "rep").summary["latency_s"]
    assert (lat["detect"]["n"], lat["detect"]["skipped"]) == (1, 1)
    assert (lat["ingest"]["n"], lat["ingest"]["skipped"]) == (2, 0)


def test_a_detection_whose_reloaded_input_holds_no_lungs_says_it_skipped(tmp_path, monkeypatch):
    stage = model_stages.DetectStage()
    # the detector's settings that its empty result names; no model is needed on this path
    stage._det = SimpleNamespace(
        config=SimpleNamespace(name="test-model"), device="cpu", precision="fp32", score_threshold=0.5, threshold_source="test"
    )
    reason = "no lung voxels found in the series (empty lung mask); nothing to search"

    class Loading:
        def __init__(self, worker: WorkerInfo) -> None:
            pass

        def __call__(self, ctx: CaseContext) -> dict[str, Any]:
            return {"case": None, "region": None, "lungs": None, "reason": reason, "timings": {"lung_mask": 0.2}}

    monkeypatch.setattr(model_stages, "_Loading", Loading)
    worker = WorkerInfo("test", "cpu", load_config(environ={}), tmp_path)
    case = CaseSpec("c1", "c1:fp", "1.2.3", "fp" * 12, "/src/c1", ("/src/c1/1.dcm",), None)
    out = stage.process(CaseContext(case, 1, tmp_path / "work", worker, {}))
    assert out["findings"] == [] and out["skipped"] == reason
    # no search ran: the case's detection is declared skipped, so its SR makes no statement on nodules (not "none")
    assert out["detect_skipped"] == reason
