"""``ctpipe run`` under cron, systemd and Prometheus: what an operator sees (quiet output, exit statuses, signals,
log records, configuration mistakes, metrics of a run with nothing to do)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.cli import build_parser, main
from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.runner.logs import attach_jsonl, detach
from pipeline.runner.metrics import RunMetrics
from pipeline.runner.stage import CaseContext, CaseSpec, Stage, Task, WorkerInfo
from pipeline.runner.task_run import run_task


def test_quiet_run_with_nothing_to_do_prints_the_summary_and_why(tmp_path, capsys, own_signals):
    """A nightly cron run on a folder without new studies: exit 0, the summary line and why nothing ran; no paths."""
    (tmp_path / "incoming").mkdir()
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "incoming"), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("run ") and "0 case(s) done" in lines[0]
    assert lines[1] == f"no CT series found in {tmp_path / 'incoming'}: nothing to do"
    assert (out / "metrics.prom").is_file() and (out / "run.log").is_file()  # written, only not announced


def test_a_run_whose_only_series_is_not_selected_says_so_rather_than_none_found(tmp_path, capsys, own_signals):
    """A folder holding one CT series too short for ingest.min_slices: was "no CT series found in ...", as for an empty
    folder, while a series was there and left out for a reason the user can change."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(9, matrix=64, slices=8, pixel_spacing=2.0, slice_spacing=5.0, n_nodules=0)
    write_dicom_series(ph.volume, tmp_path / "incoming" / "short", seed=9)
    argv = ["run", str(tmp_path / "incoming"), "--out", str(tmp_path / "run"), "--workers", "0"]
    assert main([*argv, "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"no CT series selected in {tmp_path / 'incoming'}: 1 series found and not selected"), lines
    assert not any("no CT series found" in line for line in lines), lines
    assert main(argv) == 0  # without --quiet, the series' own line says why and how to take it
    out = capsys.readouterr().out
    assert "  not selected " in out and "--set ingest.min_slices=8" in out, out


def test_a_folder_of_nifti_images_says_how_to_analyse_them(tmp_path, capsys, own_signals):
    import SimpleITK as sitk

    (tmp_path / "incoming").mkdir()
    image = sitk.GetImageFromArray(np.full((4, 8, 8), -1000, np.int16))
    sitk.WriteImage(image, str(tmp_path / "incoming" / "chest.nii.gz"))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "incoming"), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("no CT series found")
    # the image named by its token, as every skipped file that is not DICOM, unless identifiers are kept
    assert "NIfTI/MHA/NRRD images are not DICOM series (1, such as" in lines[2] and "incoming/<file:" in lines[2]
    assert ">.nii.gz" in lines[2] and "chest" not in lines[2]
    assert "`ctpipe detect FILE` or `ctpipe reconstruct FILE`" in lines[2]
    argv = ["run", str(tmp_path / "incoming"), "--out", str(tmp_path / "kept"), "--workers", "0", "--quiet"]
    assert main([*argv, "--keep-identifiers"]) == 0
    assert "chest.nii.gz" in capsys.readouterr().out.splitlines()[2]


def test_quiet_run_names_a_quarantined_case_once(tmp_path, capsys, own_signals):
    """Cron mails stdout and stderr together: the quarantined case is in the summary, not also as a log line."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    ph = generate_phantom(21, matrix=64, slices=24, pixel_spacing=2.0, slice_spacing=5.0)
    write_dicom_series(ph.volume, tmp_path / "incoming" / "gap", quirks=["missing_slice"], seed=21)
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "incoming"), "--out", str(out), "--workers", "0", "--quiet"]) == 3
    captured = capsys.readouterr()
    assert sum("1 slice(s) missing" in line for line in (captured.out + captured.err).splitlines()) == 1
    assert "quarantined" in captured.out
    assert "MissingSliceError" in (out / "run.log").read_text()  # the log keeps it


def test_run_help_lists_every_exit_status():
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    text = " ".join(run.format_help().split())
    for status in ("0 all cases done", "3 some cases quarantined", "4 the run folder could not be written", "1 the run"):
        assert status in text
    assert "130 interrupted" in text and "SIGHUP" in text and "2 bad command-line arguments" in text
    assert "141 the reader of its output closed it early" in text and "Ray actors that cannot be placed" in text


class _HangUp(Stage):
    """A stage during which the terminal closes: the process gets SIGHUP while a case runs."""

    name = "ingest"
    group = "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN), "SIGHUP would kill the run"
        os.kill(os.getpid(), signal.SIGHUP)
        raise AssertionError("SIGHUP did not stop the run")


def test_sighup_stops_the_run_like_sigterm(tmp_path, monkeypatch, capsys, own_signals):
    """The terminal of an interactive run closes (SIGHUP) while a case runs: recorded as interrupted, exit 130, and
    the same command resumes it."""
    import pipeline.runner.batch as batch
    from tests._support.dicom import write_series

    write_series(tmp_path / "src" / "a", n=12, series_uid="1.2.3.77")
    argv = ["run", str(tmp_path / "src"), "--out", str(tmp_path / "run"), "--workers", "0", "--quiet"]
    argv += ["--set", "report.enabled=false"]
    real_build = batch.build_stages
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [_HangUp()])
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    assert main(argv) == 130
    assert "interrupted; run the same command again to resume" in capsys.readouterr().err
    run = tmp_path / "run" / "runs.sqlite"
    with sqlite3.connect(run) as db:
        assert db.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
        ((status,),) = db.execute("SELECT status FROM cases").fetchall()
    assert status == "running"  # left mid-case: the next run takes it again
    # resumable: the same command, the terminal open this time, runs the case to the end
    monkeypatch.setattr(batch, "build_stages", lambda cfg: [s for s in real_build(cfg) if s.name == "ingest"])
    assert main(argv) == 0
    with sqlite3.connect(run) as db:
        assert db.execute("SELECT status FROM runs ORDER BY started_at").fetchall() == [("interrupted",), ("completed",)]
        assert db.execute("SELECT status FROM cases").fetchall() == [("done",)]


def test_sighup_ignored_under_nohup_stays_ignored(tmp_path, monkeypatch, own_signals):
    import pipeline.runner.batch as batch

    seen = []
    monkeypatch.setattr(batch, "run_batch", lambda *a, **k: seen.append(signal.getsignal(signal.SIGHUP)) or 1 / 0)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with pytest.raises(ZeroDivisionError):
        main(["run", str(tmp_path), "--out", str(tmp_path / "run")])
    assert seen == [signal.SIG_IGN]


def test_console_log_timestamps_are_utc_with_zone(tmp_path):
    """Cron mails and journald lines carry the same UTC times as run.log, whatever TZ the job runs under."""
    # the UTC hour read just before and just after the line is logged: one of them is the line's, even when the
    # hour turns in between
    hour = "print(time.strftime('%Y-%m-%dT%H', time.gmtime()), flush=True)"
    code = (
        "import logging, time; from pipeline.cli import setup_logging; setup_logging(0); "
        f"{hour}; logging.getLogger('pipeline.x').warning('hello'); {hour}"
    )
    env = {**os.environ, "TZ": "Pacific/Kiritimati"}  # UTC+14: never the same hour as UTC, nor the next
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    utc_hours = tuple(p.stdout.split())
    line = p.stderr.strip()
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ WARNING pipeline.x: hello$", line), line
    assert len(utc_hours) == 2 and line.startswith(utc_hours), (utc_hours, line)


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("CTPIPE_RUNNR_WORKERS", "CTPIPE_RUNNER_WORKERS"),  # a letter missing in the section
        ("CTPIPE_WORKERS", "CTPIPE_RUNNER_WORKERS"),  # the section left out
        ("CTPIPE_METRIC_PORT", "CTPIPE_METRICS_PORT"),
    ],
)
def test_misspelt_environment_variable_is_refused_not_ignored(name, meant):
    with pytest.raises(ConfigError, match=meant) as err:
        load_config(environ={name: "4"})
    assert name in str(err.value)


def test_other_ctpipe_variables_are_not_configuration():
    env = {
        "CTPIPE_NODE": "gpu7",
        "CTPIPE_DICOMWEB_USER": "u",
        "CTPIPE_DICOMWEB_PASSWORD": "p",
        "CTPIPE_UNRELATED": "x",
        "CTPIPE_TEST_WORKERS": "2",
    }
    assert load_config(environ=env).runner.workers == 2


def test_config_file_indented_with_a_tab_names_line_and_fix(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text("runner:\n\tworkers: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, environ={})
    msg = str(err.value)
    assert f"{f}, line 2, column 1" in msg and "tab" in msg and "spaces" in msg
    assert "\n" not in msg and "<unicode string>" not in msg


def test_config_file_with_a_byte_order_mark_and_crlf_reads(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_bytes(b"\xef\xbb\xbfrunner:\r\n  workers: 1\r\n")
    assert load_config(f, environ={}).runner.workers == 1


def test_last_update_metric_of_a_run_without_cases_is_its_start():
    """An alert on ``time() - ctpipe_run_last_update_time_seconds`` must not fire for a quiet night (no cases)."""
    from prometheus_client.parser import text_string_to_metric_families

    m = RunMetrics(node="n")
    values = {s.name: s.value for fam in text_string_to_metric_families(m.text()) for s in fam.samples}
    assert values["ctpipe_run_last_update_time_seconds"] == pytest.approx(values["ctpipe_run_start_time_seconds"], abs=5)


class _Chatty(Stage):
    name = "chatty"
    group = "cpu"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        logging.getLogger("pipeline.reconstruction.nodules").warning("nodule 0: no nodule voxels near the centre")
        return {}


def test_records_logged_inside_a_stage_name_their_case(tmp_path):
    """A worker's warning from deep inside a stage is traceable to its case in run.log."""
    case = CaseSpec("c1", "1.2.3:fp", "1.2.3", "fp", str(tmp_path))
    task = Task(case, 0, "chatty", 0, str(tmp_path / "w"), {}, 0.0)
    (tmp_path / "w").mkdir()
    handler = attach_jsonl(tmp_path / "run.log", process="cpu-1")
    try:
        res = run_task(_Chatty(), task, WorkerInfo("cpu-1", "cpu", load_config(environ={}), tmp_path))
        logging.getLogger("pipeline.runner.x").warning("between cases")
    finally:
        detach(handler)
    assert res.ok
    records = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    inside = next(r for r in records if r["msg"].startswith("nodule 0"))
    assert inside["case_id"] == "c1" and inside["stage"] == "chatty"
    outside = next(r for r in records if r["msg"] == "between cases")
    assert "case_id" not in outside and "stage" not in outside


def _metric(path: Path, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for fam in text_string_to_metric_families(path.read_text()) for s in fam.samples if s.name == name]
    return samples[0].value if samples else None


def test_textfile_says_when_the_run_ended_and_how(tmp_path):
    """node_exporter's textfile carries the run's end and exit status: 0 for a quiet night, 3 with a quarantined case."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.batch import run_batch
    from tests._support.runner import PHANTOM

    (tmp_path / "empty").mkdir()
    opts: dict[str, Any] = {"workers": 0, "report.enabled": False, "metrics.textfile_dir": str(tmp_path / "textfiles")}
    quiet = run_batch(tmp_path / "empty", out=tmp_path / "quiet", **opts)
    assert quiet.exit_code == 0
    for path in (tmp_path / "quiet" / "metrics.prom", tmp_path / "textfiles" / "ctpipe.prom"):
        assert _metric(path, "ctpipe_run_exit_status") == 0
        end = _metric(path, "ctpipe_run_end_time_seconds")
        assert end is not None and end >= (_metric(path, "ctpipe_run_start_time_seconds") or 0) > 0

    write_dicom_series(generate_phantom(21, **PHANTOM).volume, tmp_path / "gap", quirks=["missing_slice"], seed=21)
    bad = run_batch(tmp_path / "gap", out=tmp_path / "bad", **opts)
    assert bad.exit_code == 3
    assert _metric(tmp_path / "bad" / "metrics.prom", "ctpipe_run_exit_status") == 3
    assert _metric(tmp_path / "textfiles" / "ctpipe.prom", "ctpipe_run_exit_status") == 3  # the latest run's


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, capsys, own_signals):
    """Without --quiet under cron or systemd (stderr a file or pipe), tqdm's carriage-return frames stay out of the mail."""
    (tmp_path / "incoming").mkdir()
    assert main(["run", str(tmp_path / "incoming"), "--out", str(tmp_path / "run"), "--workers", "0"]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "case/s" not in captured.err, captured.err
    assert "log: " in captured.out  # without --quiet the paths are printed


def test_the_summary_names_the_node_exporter_copy_of_the_metrics(tmp_path, capsys, own_signals):
    """With metrics.textfile_dir set, the run's paths name both metrics files: RUN_DIR/metrics.prom and the copy in
    textfile_dir that node_exporter reads (was: only the first, the node's copy never printed)."""
    (tmp_path / "incoming").mkdir()
    node_dir = tmp_path / "textfiles"
    argv = ["run", str(tmp_path / "incoming"), "--out", str(tmp_path / "run"), "--workers", "0"]
    assert main([*argv, "--set", f"metrics.textfile_dir={node_dir}"]) == 0
    out = capsys.readouterr().out
    assert f"metrics: {tmp_path / 'run' / 'metrics.prom'}\n" in out, out
    assert f"metrics for node_exporter: {node_dir / 'ctpipe.prom'}\n" in out, out
    assert (node_dir / "ctpipe.prom").is_file()


def test_ctpipe_run_called_in_process_puts_the_signal_handlers_back(tmp_path):
    """``ctpipe run`` stops on the first Ctrl-C, SIGTERM or SIGHUP and only notes later ones; called through
    ``main`` in a Python process (a notebook, a scheduler written in Python), it leaves that process's own handling
    as it found it: a later Ctrl-C there is a KeyboardInterrupt again, not swallowed."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    (tmp_path / "incoming").mkdir()
    assert main(["run", str(tmp_path / "incoming"), "--out", str(tmp_path / "run"), "--workers", "0", "--quiet"]) == 0
    assert {s: signal.getsignal(s) for s in before} == before


def test_more_workers_than_cores_is_said(tmp_path, monkeypatch):
    from pipeline.runner.batch import run_batch

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    (tmp_path / "src").mkdir()
    run_batch(tmp_path / "src", out=tmp_path / "run", workers=16, **{"report.enabled": False})
    records = [json.loads(line) for line in (tmp_path / "run" / "run.log").read_text().splitlines()]
    warned = [r for r in records if r.get("event") == "config_warning"]
    assert len(warned) == 1 and "runner.workers = 16" in warned[0]["msg"] and "2 CPU core(s)" in warned[0]["msg"]
    assert "--workers 2 or fewer" in warned[0]["msg"]


def test_metrics_linger_after_the_run_for_a_last_scrape(tmp_path):
    """metrics.linger_s: the endpoint still answers, with the final counters, after the run's cases are done."""
    import threading
    import time

    from pipeline.runner import run_batch
    from tests._support.orthanc import free_port
    from tests._support.prometheus import local_opener

    (tmp_path / "incoming").mkdir()
    port = free_port()
    options = {"metrics.port": port, "metrics.linger_s": 2.0, "report.enabled": False}
    started = time.monotonic()
    worker = threading.Thread(target=run_batch, args=([tmp_path / "incoming"],), kwargs={"out": tmp_path / "run", **options})
    worker.start()
    seen = []
    while worker.is_alive():
        try:
            with local_opener().open(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                seen.append((time.monotonic() - started, r.read().decode()))
        except OSError:
            pass
        time.sleep(0.1)
    worker.join()
    assert time.monotonic() - started >= 2.0
    late = [text for t, text in seen if t >= 1.5]  # well after an empty run's own work
    assert late and "ctpipe_cases_processed_total" in late[-1]
    # the final values a last scrape is for: the run's end time and exit status (0: an empty run ends well)
    assert re.search(r"^ctpipe_run_exit_status\{[^}]*\} 0\.0$", late[-1], re.M), late[-1]
    assert re.search(r"^ctpipe_run_end_time_seconds\{[^}]*\} [1-9]", late[-1], re.M)


def test_a_log_line_an_earlier_run_left_cut_short_does_not_swallow_the_next_runs_first_line(tmp_path):
    log_path = tmp_path / "run.log"
    log_path.write_text('{"t": 1, "msg": "case done"}\n{"t": 2, "msg": "case sta')  # the disk filled mid-line
    handler = attach_jsonl(log_path, process="main")
    try:
        logging.getLogger("pipeline.runner").warning("earlier run(s) found: resuming")
    finally:
        detach(handler)
    lines = log_path.read_text().splitlines()
    assert lines[1] == '{"t": 2, "msg": "case sta'  # the cut line stands alone
    assert json.loads(lines[0])["msg"] == "case done" and json.loads(lines[2])["msg"] == "earlier run(s) found: resuming"
    handler = attach_jsonl(log_path, process="main")  # a whole last line is left as it is
    detach(handler)
    assert log_path.read_text().splitlines() == lines


def test_the_run_time_and_its_record_leave_out_the_metrics_linger(tmp_path):
    """The summary's seconds (and so its cases/h), the store's run end (the report's active time) and the end time in
    metrics.prom are the run's own, not the metrics.linger_s spent serving the final metrics afterwards."""
    import time

    from pipeline.runner import open_run, run_batch
    from tests._support.orthanc import free_port

    (tmp_path / "incoming").mkdir()
    linger = 3.0
    options = {"metrics.port": free_port(), "metrics.linger_s": linger, "metrics.textfile": True, "report.enabled": False}
    started_wall, started = time.time(), time.monotonic()
    summary = run_batch([tmp_path / "incoming"], out=tmp_path / "run", **options)
    wall = time.monotonic() - started
    assert wall >= linger
    assert summary.elapsed_s <= wall - linger + 0.5, (summary.elapsed_s, wall)
    (row,) = open_run(tmp_path / "run").runs.itertuples()
    assert row.ended_at - row.started_at == pytest.approx(summary.elapsed_s, abs=0.01)
    prom = (tmp_path / "run" / "metrics.prom").read_text()
    (end_line,) = [ln for ln in prom.splitlines() if ln.startswith("ctpipe_run_end_time_seconds{")]
    assert float(end_line.split()[-1]) <= started_wall + wall - linger + 0.5


def test_the_progress_eta_of_a_batch_longer_than_a_day_is_not_wrapped_to_the_clock():
    """A backfill of 10,000 cases at 400 cases/h takes about 25 h: its ETA read "01:00:00" (the hours of a clock face)."""
    import time as _time

    from pipeline.runner.progress import Progress

    p = Progress(total=10_001, done=1, started=_time.monotonic() - 9.0)  # 400 cases/h
    assert p.eta_s is not None and 24 * 3600 < p.eta_s < 26 * 3600
    assert "ETA 25:00:0" in p.describe(), p.describe()
    short = Progress(total=3, done=1, started=_time.monotonic() - 60.0)  # 2 left at 60 cases/h: 2 min
    assert "ETA 00:02:00" in short.describe() or "ETA 00:01:59" in short.describe(), short.describe()


def test_the_second_stop_signal_is_noted_and_the_third_stops_at_once(tmp_path, capfd):
    """The first SIGTERM (or Ctrl-C) stops the run; a second, while it records the stop, only says so; a third stops
    it at once, so that a run whose first stop was swallowed somewhere can still be stopped from the keyboard."""
    from pipeline.runner.cli import stop_once

    replaced = stop_once(str(tmp_path / "run"))
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # noted, not raised
        assert "already stopping" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)


def test_run_log_keeps_the_series_and_quality_flag_a_record_names(tmp_path):
    """``ctpipe listen``'s and a PACS retrieve's records name their series (``series_uid``), the detector's warnings
    their quality flag: run.log keeps both, so that grepping it for a series finds its records."""
    handler = attach_jsonl(tmp_path / "run.log", process="main")
    try:
        logging.getLogger("pipeline.pacs.listener").info(
            "series released", extra={"event": "listen_released", "series_uid": "1.2.826.0.1.3680043.8.498.7"}
        )
        logging.getLogger("pipeline.detection.infer").warning("thick slices", extra={"quality_flag": "thick_slices"})
    finally:
        detach(handler)
    released, thick = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert released["series_uid"] == "1.2.826.0.1.3680043.8.498.7" and released["event"] == "listen_released"
    assert thick["quality_flag"] == "thick_slices"


def test_every_extra_field_the_pipeline_logs_reaches_run_log():
    """Each key a ``pipeline`` module passes in a log call's ``extra={...}`` is one the run.log formatter writes."""
    import ast

    from pipeline.runner.logs import _FIELDS

    root = Path(__file__).resolve().parents[1] / "pipeline"
    levels = {"debug", "info", "warning", "error", "exception", "critical", "log"}
    dropped: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in levels):
                continue
            for kw in node.keywords:
                if kw.arg == "extra" and isinstance(kw.value, ast.Dict):
                    for key in kw.value.keys:
                        if isinstance(key, ast.Constant) and key.value not in _FIELDS:
                            dropped.setdefault(key.value, f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not dropped, f"extra fields run.log drops (add them to pipeline/runner/logs.py _FIELDS): {dropped}"
