"""A run over phantom cases plus corrupt ones: quarantine with reasons, non-zero exit, complete good cases."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.runner.results import open_run
from pipeline.volume import Geometry
from tests._support.runner import db_rows, manifest

pytest_plugins = ["tests._support.runner"]
pytestmark = pytest.mark.slow


def test_corrupt_cases_quarantined_good_cases_complete(full_run, dicom_data):
    out, p = full_run["out"], full_run["proc"]
    assert p.returncode == 3, p.stdout + p.stderr
    # summary lists every quarantined case with its reason, and where the report is
    lines = p.stdout.splitlines()
    quarantined = [ln for ln in lines if ln.strip().startswith("quarantined")]
    assert len(quarantined) == 3, p.stdout
    text = "\n".join(quarantined)
    for cls in ("MissingSliceError", "TruncatedFileError", "CorruptPixelDataError", "declares 4294967295 segment(s)"):
        assert cls in text
    assert "missing" in text and "Fix:" in text
    report_line = next(ln for ln in lines if ln.startswith("report: "))
    assert (out / "report" / "report.html").is_file() and report_line.endswith("report.html")

    rows = db_rows(out, "SELECT series_uid, status, error_class, failed_stage, reason, source FROM cases")
    done = {r[0] for r in rows if r[1] == "done"}
    assert done == set(dicom_data["good_uids"])
    failed = {r[5].rsplit("/", 1)[-1]: r for r in rows if r[1] == "failed"}
    assert set(failed) == {"missing_slice", "truncated", "corrupt_rle"}
    for folder, cls in dicom_data["bad_kinds"].items():
        assert failed[folder][2] == cls
    assert failed["corrupt_rle"][3] == "ingest"  # failed inside a worker stage, when its pixels were decoded
    assert failed["missing_slice"][3] == "discover"  # refused from its headers
    assert failed["truncated"][3] == "discover"
    assert all(len(r[4]) > 30 for r in failed.values())
    qfiles = sorted((out / "quarantine").glob("*.json"))
    assert len(qfiles) == 3
    assert {json.loads(q.read_text())["error_class"] for q in qfiles} == {
        "MissingSliceError",
        "TruncatedFileError",
        "CorruptPixelDataError",
    }

    # every stage of every good case ran once and was measured
    att = db_rows(
        out,
        "SELECT c.series_uid, a.stage, a.status, a.wall_s, a.queue_wait_s, a.peak_rss_mb FROM stage_attempts a"
        " JOIN cases c USING (case_key) WHERE c.status='done'",
    )
    assert len(att) == 7 * len(done)
    assert {a[1] for a in att} == {"ingest", "reconstruct", "load", "detect", "nodules", "write", "dicom"}
    assert all(a[2] == "ok" and a[3] > 0 and a[4] >= 0 and a[5] > 10 for a in att)

    # outputs: published folders only, each with its manifest; nothing half-written left behind
    assert not any((out / "tmp").iterdir()) if (out / "tmp").exists() else True
    assert not list((out / "cache").glob("*"))
    for case_dir in (out / "cases").iterdir():
        m = manifest(case_dir)
        names = {f["path"] for f in m["files"]}
        assert {"findings.json", "findings.csv", "volume.json"} <= names
        geom = json.loads((case_dir / "volume.json").read_text())["geometry"]
        assert geom["shape"] == [24, 64, 64] and geom["spacing"] == [2.0, 2.0, 5.0]
        assert any(n.endswith("_lung_left.stl") for n in names) and any(n.endswith("_measurements.json") for n in names)
        for f in m["files"]:
            assert (case_dir / f["path"]).stat().st_size == f["bytes"]
        doc = json.loads((case_dir / "findings.json").read_text())
        assert "LPS" in doc["coordinates"] and doc["timings_ms"] == {}


def test_a_run_opened_by_a_relative_path_keeps_its_files_after_a_change_of_folder(full_run, monkeypatch):
    """A notebook opens a run by a relative path, then changes folder: the run's paths still lead to its files."""
    out = full_run["out"]
    monkeypatch.chdir(out.parent)
    run = open_run(out.name)
    monkeypatch.chdir(out.parent.parent)
    assert run.run_dir == out.resolve()
    done = run.cases[run.cases.status == "done"].case_id
    assert len(done) and all(run.case(c).folder.is_dir() and run.case(c).files for c in done)


def test_a_runs_html_view_escapes_its_folder_name(full_run, tmp_path):
    """A run folder named with HTML's special characters shows as text in a notebook, not as markup."""
    import shutil

    copy = tmp_path / "runs <b>&amp"
    shutil.copytree(full_run["out"], copy)
    page = open_run(copy)._repr_html_()
    assert "runs &lt;b&gt;&amp;amp" in page and "<b>&amp" not in page


def test_run_record_log_and_results(full_run, dicom_data):
    out = full_run["out"]
    run = open_run(out)
    assert len(run.runs) == 1 and run.runs.status[0] == "completed" and run.runs.device[0] == "cpu"
    versions = json.loads(run.runs.versions[0])
    assert {"python", "torch", "monai", "pydicom"} <= set(versions)
    saved = json.loads(run.runs.config[0])
    assert saved["reconstruct"]["renderings"] is False and saved["runner"]["workers"] == 1
    assert "renderings: false" in (out / "config.yaml").read_text()
    assert "6 cases (3 done, 3 failed" in repr(run)
    lat = run.stage_latency()
    assert list(lat.index) == ["ingest", "reconstruct", "load", "detect", "nodules", "write", "dicom"]
    assert (lat["p50"] <= lat["p90"]).all() and (lat["p90"] <= lat["p99"]).all()
    # measurements: both lungs with a volume in mL; findings (if any) inside the volume, LPS mm
    vols = run.measurements[run.measurements.name.str.endswith("volume_ml")]
    assert (vols.value > 0).all() and set(vols.unit) == {"mL"} and len(vols) >= 6
    assert len(run.findings) > 0  # the phantoms' nodules give findings to check
    for f in run.findings.itertuples():
        case = run.case(f.case_id)
        assert case.status == "done" and case.folder is not None
        grid = Geometry.from_json(json.loads((case.folder / "volume.json").read_text())["geometry"])
        assert grid.contains_lps([f.center_x, f.center_y, f.center_z]), (f.case_id, f.center_x, f.center_y, f.center_z)
    det = run.stages[(run.stages.stage == "detect") & (run.stages.status == "ok")]
    assert all(json.loads(d)["model"] > 0 for d in det.detail)  # the detector's own model time (s)
    # the loader made the model input (DALI is installed here: auto picks it) in the model worker, before detect
    load = run.stages[(run.stages.stage == "load") & (run.stages.status == "ok")]
    assert len(load) == 3 and all(json.loads(d)["load"] > 0 for d in load.detail)
    assert set(load.worker) == set(det.worker)
    assert "loader: DALI on CPU" in (out / "run.log").read_text()
    failures = run.failures
    assert len(failures) == 3 and failures.reason.str.len().min() > 20
    # structured log: JSON lines from the main process and the workers
    records = [json.loads(ln) for ln in (out / "run.log").read_text().splitlines()]
    events = [r.get("event") for r in records]
    assert events.count("case_done") == 3 and events.count("case_failed") == 3
    assert {"main", "cpu-1", "model-cpu"} <= {r["process"] for r in records}
    assert all({"t", "level", "logger", "msg"} <= set(r) for r in records)


def test_bad_source_and_bad_config_are_refused_before_running(tmp_path, dicom_data, capsys):
    from pipeline.cli import main

    assert main(["run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r")]) == 1
    assert "no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # no run folder, store or log behind a mistyped source
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("x")
    assert main(["run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "kept")]) == 1
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mine.txt"]  # a folder that was there stays
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runner:\n  workers: lots\n")
    assert main(["run", str(dicom_data["good"]), "--out", str(tmp_path / "r2"), "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "runner.workers" in err and "'lots'" in err and str(cfg) in err


def test_worklist_csv_discovery(dicom_data, tmp_path):
    from pipeline.config import load_config
    from pipeline.runner.discover import discover

    good = dicom_data["good"]
    uid = dicom_data["good_uids"][1]
    wl = tmp_path / "worklist.csv"
    wl.write_text(
        "path,series_uid,case_id\n"
        f"{good / 'case11'},,\n"  # every selected series under the folder
        f"{good},{uid},nightly-2\n"  # one series by UID, with a chosen case id
        f"{good / 'case12'},1.2.3.4,\n"  # UID not there
        "no/such/folder,,\n"
    )  # relative to the CSV's folder, missing
    found = discover([wl], load_config(environ={}))
    ok = [c for c in found.cases if c.rejected is None]
    bad = [c for c in found.cases if c.rejected is not None]
    assert sorted(c.series_uid for c in ok) == sorted([dicom_data["good_uids"][0], uid])
    assert any(c.case_id == "nightly-2" and c.series_uid == uid for c in ok)
    assert all(len(c.files) == 24 and len(c.fingerprint) == 24 for c in ok)
    assert len(bad) == 2 and {c.rejected[0] for c in bad} == {"NoSeriesFoundError"}
    reasons = " ".join(c.rejected[1] for c in bad)
    assert "1.2.3.4" in reasons and "does not exist" in reasons and "worklist.csv:5" in reasons
    # the same series found twice (folder and worklist) is one case key, so it runs once
    keys = [c.case_key for c in discover([good, wl], load_config(environ={})).cases if c.rejected is None]
    assert len(keys) == 5 and len(set(keys)) == 3


def test_worklist_exported_from_a_spreadsheet(dicom_data, tmp_path):
    from pipeline.config import load_config
    from pipeline.runner.discover import discover

    good = dicom_data["good"]
    wl = tmp_path / "worklist.csv"  # Excel's "CSV UTF-8" where commas are decimal separators: BOM, semicolons, CRLF
    wl.write_bytes(f"\ufeffPath;Case_ID\r\n{good / 'case11'};nightly-1\r\n".encode())
    (case,) = discover([wl], load_config(environ={})).cases
    assert case.rejected is None and case.case_id == "nightly-1" and case.series_uid == dicom_data["good_uids"][0]


def test_a_worklist_case_id_that_is_a_path_touches_nothing_outside_the_run(dicom_data, tmp_path):
    """A case id names the case's files and folders: '../../outside/settings' would have the runner clear and write
    beside it. The row is quarantined with the reason, nothing outside the run folder changes, the others run."""
    from pipeline.runner import run_batch
    from tests._support.runner import QUICK

    outside = tmp_path / "outside"
    (outside / "settings.a1").mkdir(parents=True)
    for name in ("settings.json", "settings.npy", "settings.a1/file.txt"):
        (outside / name).write_text("keep me")
    good = dicom_data["good"]
    wl = tmp_path / "wl" / "worklist.csv"
    wl.parent.mkdir()
    wl.write_text(f"path,case_id\n{good / 'case11'},../../outside/settings\n{good / 'case12'},nightly-1\n")
    s = run_batch([wl], out=tmp_path / "run", workers=0, **{**QUICK, "report.enabled": False, "outputs.dicom": []})
    assert s.done == 1 and len(s.quarantined) == 1 and s.exit_code == 3
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == [
        "settings.a1",
        "settings.a1/file.txt",
        "settings.json",
        "settings.npy",
    ]
    assert all(p.read_text() == "keep me" for p in outside.rglob("*") if p.is_file())
    failures = open_run(tmp_path / "run").failures
    assert "'../../outside/settings' is not a safe file name" in failures.reason.iloc[0]
    assert "worklist.csv:2" in failures.reason.iloc[0]


def test_a_model_that_cannot_load_stops_the_run_with_its_reason(dicom_data, tmp_path):
    from pipeline.errors import BundleError
    from pipeline.runner import run_batch

    with pytest.raises(BundleError, match="no such bundle folder"):  # a mistyped path: refused before the run starts
        run_batch([dicom_data["good"]], out=tmp_path / "r0", workers=0, bundle=str(tmp_path / "no_such_bundle"))
    assert not (tmp_path / "r0").exists()
    broken = tmp_path / "broken_bundle"  # its config reads, its model does not load
    (broken / "configs").mkdir(parents=True)
    (broken / "configs" / "inference.json").write_text("{}")
    s = run_batch([dicom_data["good"]], out=tmp_path / "r", workers=0, bundle=str(broken), **{"report.enabled": False})
    assert s.exit_code == 1 and s.done == 0
    assert "stage detect cannot start" in s.fatal and "broken_bundle" in s.fatal
    assert db_rows(tmp_path / "r", "SELECT status FROM runs") == [("failed",)]
    # nothing was lost: the cases are retried by the next run (none is marked done or failed)
    assert {r[0] for r in db_rows(tmp_path / "r", "SELECT status FROM cases")} <= {"pending", "running"}


def test_device_resolution_without_a_gpu_is_explicit():
    import torch

    from pipeline.errors import ConfigError
    from pipeline.runner.batch import resolve_devices

    assert resolve_devices("cpu", True) == (["cpu"], "cpu")
    assert resolve_devices("cuda", False) == (["cpu"], "cpu")  # no model stage: no device needed
    if not torch.cuda.is_available():
        assert resolve_devices("auto", True) == (["cpu"], "cpu")
        with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
            resolve_devices("cuda:0", True)


def test_a_gpu_this_host_lacks_is_refused_naming_where_the_device_was_set(tmp_path, capsys, monkeypatch):
    # was: "runner.device: runner.device = 'cuda:1' but torch sees no CUDA GPU", whether the value came from --device,
    # a --config file or a CTPIPE_RUNNER_DEVICE left in a service file
    from pathlib import Path

    import torch

    from pipeline.cli import main

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU torch sees")
    sample = Path(__file__).resolve().parents[1] / "data_samples" / "phantom_00003" / "dicom"
    monkeypatch.setenv("CTPIPE_RUNNER_DEVICE", "cuda:1")
    assert main(["run", str(sample), "--out", str(tmp_path / "r"), "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert "environment variable CTPIPE_RUNNER_DEVICE: runner.device = 'cuda:1' but torch sees no CUDA GPU" in err, err
    monkeypatch.delenv("CTPIPE_RUNNER_DEVICE")
    assert main(["run", str(sample), "--out", str(tmp_path / "r2"), "--workers", "0", "--device", "cuda:1"]) == 1
    err = capsys.readouterr().err
    assert "error: --device: runner.device = 'cuda:1' but torch sees no CUDA GPU. Fix: use --device cpu or auto" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="device nodes are read on Linux only")
def test_a_host_without_gpu_device_nodes_runs_on_cpu_without_importing_torch(tmp_path):
    from pipeline.runner.batch import no_gpu_here

    assert no_gpu_here(tmp_path)
    (tmp_path / "nvidiactl").touch()  # the control node alone is no GPU
    assert no_gpu_here(tmp_path)
    for node in ("nvidia0", "dxg"):  # a GPU of the NVIDIA driver, WSL's GPU
        (tmp_path / node).touch()
        assert not no_gpu_here(tmp_path)
        (tmp_path / node).unlink()
    if no_gpu_here():  # this host: the run's main process learns it without torch
        code = "import sys\nfrom pipeline.runner.batch import resolve_devices\n"
        code += "print(resolve_devices('auto', True), 'torch' in sys.modules)"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert p.stdout.split() == ["(['cpu'],", "'cpu')", "False"], p.stdout + p.stderr


@pytest.mark.gpu
def test_gpu_run_one_model_worker_per_device(dicom_data, tmp_path):
    import torch

    from pipeline.runner import open_run, run_batch

    s = run_batch(
        [dicom_data["good"]],
        out=tmp_path / "gpu",
        workers=1,
        device="cuda",
        **{"reconstruct.renderings": False, "report.enabled": False},
    )
    assert s.exit_code == 0 and s.done == 3
    run = open_run(tmp_path / "gpu")
    det = run.stages[run.stages.stage.isin(["load", "detect"])]
    assert set(det.device) <= {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert (det.peak_cuda_mb > 0).all()
    assert "cuda:0" in run.runs.device[0]


def test_a_source_file_changed_after_discovery_is_seen_before_results_are_published(dicom_data, tmp_path):
    """The DICOM stage compares the case's files with what discovery fingerprinted (SOPInstanceUIDs and sizes): a
    file truncated since is a SeriesStillWrittenError (the case is left for the next run), one removed since a
    SourceMismatchError (the case is quarantined), an untouched series passes."""
    import shutil
    from types import SimpleNamespace

    from pipeline.config import load_config
    from pipeline.errors import SeriesStillWrittenError, SourceMismatchError
    from pipeline.runner.dicom_stage import _check_unchanged
    from pipeline.runner.discover import discover

    src = tmp_path / "case"
    shutil.copytree(dicom_data["good"] / "case11", src)
    (case,) = [c for c in discover([src], load_config(environ={})).cases if c.rejected is None]
    ctx = SimpleNamespace(case=case)
    _check_unchanged(ctx)  # as discovered
    victim = sorted(src.rglob("*.dcm"))[5]
    victim.write_bytes(victim.read_bytes()[:-1000])  # the archive rewrote it, cut short
    with pytest.raises(SeriesStillWrittenError, match="changed since they were ingested"):
        _check_unchanged(ctx)
    victim.unlink()
    with pytest.raises(SourceMismatchError, match="changed since they were ingested: a file is gone") as err:
        _check_unchanged(ctx)
    assert type(err.value) is SourceMismatchError


def test_a_series_folder_deleted_during_the_run_is_named_as_changed_not_as_unreadable(dicom_data, tmp_path):
    """The DICOM stage reads the source series for its references: when the series' folder was deleted after
    discovery, the case's error says the series changed since ingest (the true problem), not 'cannot read the file'."""
    import shutil
    from types import SimpleNamespace

    from pipeline import load_series
    from pipeline.config import load_config
    from pipeline.errors import SourceMismatchError
    from pipeline.runner.dicom_stage import source_as_discovered
    from pipeline.runner.discover import discover

    src = tmp_path / "case"
    shutil.copytree(dicom_data["good"] / "case12", src)
    (case,) = [c for c in discover([src], load_config(environ={})).cases if c.rejected is None]
    volume = load_series(src)
    ctx = SimpleNamespace(case=case)
    assert source_as_discovered(ctx, volume) is not None  # as discovered
    shutil.rmtree(src)
    with pytest.raises(SourceMismatchError, match="changed since they were ingested") as err:
        source_as_discovered(ctx, volume)
    assert "a file is gone" in str(err.value) and str(src) in str(err.value)
