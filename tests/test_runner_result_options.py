"""A rerun into a run folder with options its completed results were not made with (the detector's threshold or
model, the organs, the DICOM results, ...) is refused, naming each option, the earlier and the new value; options of
how the run goes (workers, metrics, report) may change between runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.runner import run_batch
from pipeline.runner.result_options import changed_result_options, check_result_options
from pipeline.runner.stages import IngestStage
from pipeline.runner.store import RunStore
from tests._support.runner import PHANTOM, ctpipe, db_rows


def _store_with_done_case(run_dir: Path, config: dict) -> RunStore:
    store = RunStore(run_dir)
    store.start_run("r1", command="t", sources=[], config=config, versions={}, device="cpu", host="h", pid=1)
    store.upsert_discovered(case_key="a:1", case_id="a", series_uid="a", fingerprint="f" * 24, source="src")
    store.begin_case("a:1", "r1")
    store.complete_case("a:1", output_dir="cases/a", findings=[], measurements=[])
    return store


def test_a_changed_threshold_is_refused_with_both_values_and_the_fix(tmp_path):
    store = _store_with_done_case(tmp_path / "run", load_config(None).to_dict())
    cfg = load_config(None, overrides={"detector.score_threshold": 0.9, "reconstruct.organs": ["body"]})
    with pytest.raises(ConfigError) as err:
        check_result_options(store, cfg, tmp_path / "run")
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'run'}: 1 completed case(s) in this run folder were analysed with other options")
    assert "run(s) r1" in text
    assert "detector.score_threshold was null, is 0.9 now" in text
    assert 'reconstruct.organs was ["body","lung_left","lung_right","airway","bone"], is ["body"] now' in text
    assert "Fix: give the new options a new --out folder" in text
    organs = '["body","lung_left","lung_right","airway","bone"]'
    assert f"--set detector.score_threshold=null --set 'reconstruct.organs={organs}'" in text  # to paste into a shell
    store.close()


def test_options_of_how_the_run_goes_may_change(tmp_path):
    store = _store_with_done_case(tmp_path / "run", load_config(None).to_dict())
    cfg = load_config(None, overrides={"runner.workers": 5, "report.enabled": False, "detector.amp": False})
    check_result_options(store, cfg, tmp_path / "run")  # no error
    store.close()


def test_options_an_earlier_ctpipe_did_not_record_and_list_order_are_not_changes():
    now = load_config(None).to_dict()
    earlier = json.loads(json.dumps(now))
    del earlier["outputs"]["seg_omit_empty_frames"]
    earlier["reconstruct"]["organs"] = list(reversed(earlier["reconstruct"]["organs"]))
    earlier["ingest"]["min_slices"] = 10.0
    assert changed_result_options(earlier, now) == {}
    earlier["outputs"]["dicom"] = ["sr"]
    assert changed_result_options(earlier, now) == {"outputs.dicom": (["sr"], ["sr", "seg"])}


@pytest.fixture
def one_case_run(tmp_path) -> Path:
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    write_phantom_case(generate_phantom(21, n_nodules=0, **PHANTOM), tmp_path / "src" / "case21")
    out = tmp_path / "run"
    s = run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": False})
    assert s.exit_code == 0 and s.done == 1
    return out


def test_run_batch_refuses_before_recording_a_run(one_case_run):
    out = one_case_run
    with pytest.raises(ConfigError, match=r"detector\.score_threshold was null, is 0\.25 now"):
        run_batch([out.parent / "src"], out=out, stages=[IngestStage()], workers=0, **{"detector.score_threshold": 0.25})
    assert db_rows(out, "SELECT COUNT(*) FROM runs") == [(1,)]  # the refused run is not recorded
    log = [json.loads(line) for line in (out / "run.log").read_text().splitlines()]
    assert log[-1]["event"] == "result_options_changed" and log[-1]["level"] == "info"
    assert log[-1]["changed"] == ["detector.score_threshold"]
    s = run_batch([out.parent / "src"], out=out, stages=[IngestStage()], workers=1, **{"report.enabled": False})
    assert s.exit_code == 0 and s.skipped == 1  # another worker count resumes


def test_ctpipe_run_exits_1_naming_the_option_and_the_fix(one_case_run):
    out = one_case_run
    res = ctpipe("run", str(out.parent / "src"), "--out", str(out), "--quiet", "--set", "detector.score_threshold=0.9")
    assert res.returncode == 1, res.stderr
    assert "detector.score_threshold was null, is 0.9 now" in res.stderr
    assert "--set detector.score_threshold=null" in res.stderr
    assert res.stderr.count("were analysed with other options") == 1  # said once


def test_model_files_replaced_under_the_same_path_are_refused(tmp_path):
    from pipeline.runner.result_options import WEIGHTS_KEY, weights_digest

    bundle = tmp_path / "bundle"
    (bundle / "models").mkdir(parents=True)
    (bundle / "configs").mkdir()
    (bundle / "configs" / "inference.json").write_text("{}")
    (bundle / "models" / "model.pt").write_bytes(b"weights of version 1")
    before = weights_digest(str(bundle))
    assert before == weights_digest(str(bundle / "configs" / "inference.json"))  # the folder or its JSON file
    assert weights_digest(None) not in (None, before)  # the demo weights have their own
    cfg = load_config(None, overrides={"detector.bundle": str(bundle)})
    store = RunStore(tmp_path / "run")
    versions = {WEIGHTS_KEY: before}
    store.start_run("r1", command="t", sources=[], config=cfg.to_dict(), versions=versions, device="cpu", host="h", pid=1)
    store.upsert_discovered(case_key="a:1", case_id="a", series_uid="a", fingerprint="f" * 24, source="src")
    store.begin_case("a:1", "r1")
    store.complete_case("a:1", output_dir="cases/a", findings=[], measurements=[])
    check_result_options(store, cfg, tmp_path / "run", weights=weights_digest(str(bundle)))  # the same files: resumes
    (bundle / "models" / "model.pt").write_bytes(b"weights of version 2")
    after = weights_digest(str(bundle))
    with pytest.raises(ConfigError, match=rf"detector weights was sha256 {before[:12]}, is sha256 {after[:12]} now"):
        check_result_options(store, cfg, tmp_path / "run", weights=after)
    store.close()


def test_ctpipe_listen_refuses_at_its_start_a_folder_made_with_other_options(one_case_run):
    from pipeline.pacs.listener import Listener

    opts = {"pacs.allowed_aets": ["ORTHANC"], "report.enabled": False, "workers": 0, "detector.score_threshold": 0.3}
    listener = Listener(one_case_run, load_config(overrides=opts, environ={}), stages=[IngestStage()])
    try:
        with pytest.raises(ConfigError, match=r"detector\.score_threshold was null, is 0\.3 now"):
            listener.start()  # before it accepts any series, not at every batch
        assert listener._ae is None
    finally:
        listener.close()


def test_a_folder_made_when_the_crop_margin_defaulted_to_10_mm_resumes_unless_it_cropped_to_the_lungs():
    """``loader.roi_margin_mm`` now defaults to null (the model's crop margin): a folder recorded with the old 10 mm
    default resumes, the margin shaping nothing without ``loader.roi: lungs``; with that crop the change is named."""
    now = load_config(environ={}).to_dict()
    earlier = json.loads(json.dumps(now))
    earlier["loader"]["roi_margin_mm"] = 10.0
    assert changed_result_options(earlier, now) == {}
    lungs = load_config(overrides={"loader.roi": "lungs"}, environ={}).to_dict()
    earlier["loader"]["roi"] = "lungs"
    assert changed_result_options(earlier, lungs) == {"loader.roi_margin_mm": (10.0, None)}
    now_set = load_config(overrides={"loader.roi_margin_mm": 4.0}, environ={}).to_dict()
    earlier["loader"]["roi"] = "none"
    assert changed_result_options(earlier, now_set) == {}  # no crop in either: the margin was never used
