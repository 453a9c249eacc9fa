"""``run_batch`` in an application that set up its own logging (a notebook's ``logging.basicConfig(level=WARNING)``):
``run.log`` still gets the run's info records, the application's handlers get only what they asked for, during
the run and after it, and the ``pipeline`` logger is left as it was. A run whose stages run in the calling process
(``workers=0``) leaves its torch thread count as it was too."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pipeline.runner import run_batch
from pipeline.runner.logs import attach_jsonl, detach
from pipeline.runner.stage import CaseContext, Stage
from tests._support.runner import PHANTOM


class _Listing(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def app_logging() -> Iterator[_Listing]:
    """The application's logging: a handler on the root logger, the root at WARNING, ``pipeline`` untouched."""
    root, pipeline_logger = logging.getLogger(), logging.getLogger("pipeline")
    saved = (root.level, pipeline_logger.level, pipeline_logger.propagate)
    handler = _Listing()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    pipeline_logger.setLevel(logging.NOTSET)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        pipeline_logger.setLevel(saved[1])
        pipeline_logger.propagate = saved[2]


class _Chatty(Stage):
    name = "chatty"

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        logging.getLogger("pipeline.test").info("chatty info of %s", ctx.case.case_id)
        logging.getLogger("pipeline.test").warning("chatty warning of %s", ctx.case.case_id)
        return {}


def _messages(handler: _Listing) -> list[str]:
    return [r.getMessage() for r in handler.records]


def test_run_log_gets_info_while_the_application_gets_warnings_and_its_logger_is_restored(app_logging, tmp_path):
    logger = logging.getLogger("pipeline.test")
    handler = attach_jsonl(tmp_path / "run.log", process="main")
    try:
        logger.info("info during the run")
        logger.warning("warning during the run")
    finally:
        detach(handler)
    logger.info("info after the run")
    logger.warning("warning after the run")
    written = [json.loads(line)["msg"] for line in (tmp_path / "run.log").read_text().splitlines()]
    assert written == ["info during the run", "warning during the run"]
    assert _messages(app_logging) == ["warning during the run", "warning after the run"]
    assert logging.getLogger("pipeline").level == logging.NOTSET and logging.getLogger("pipeline").propagate


def test_run_batch_leaves_the_application_s_logging_as_it_was(app_logging, tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    write_dicom_series(generate_phantom(64, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=64)
    out = tmp_path / "run"
    summary = run_batch([tmp_path / "src"], out=out, stages=[IngestStage(), _Chatty()], workers=0)
    assert summary.done == 1
    seen = _messages(app_logging)
    assert any(m.startswith("chatty warning") for m in seen)
    assert not [r.getMessage() for r in app_logging.records if r.levelno < logging.WARNING]
    assert any('"msg": "chatty info of' in line for line in (out / "run.log").read_text().splitlines())
    assert logging.getLogger("pipeline").level == logging.NOTSET and logging.getLogger("pipeline").propagate
    logging.getLogger("pipeline.ingest").info("a later call's progress")
    assert "a later call's progress" not in _messages(app_logging)


def test_run_batch_in_process_leaves_the_torch_threads_as_they_were(tmp_path):
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    class _Threads(Stage):
        name = "threads"

        def process(self, ctx: CaseContext) -> dict[str, Any]:
            seen.append(torch.get_num_threads())
            return {}

    seen: list[int] = []
    write_dicom_series(generate_phantom(65, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=65)
    before = torch.get_num_threads()
    mine = 3 if before != 3 else 2
    torch.set_num_threads(mine)
    try:
        overrides = {"runner.torch_threads": mine + 1}
        summary = run_batch([tmp_path / "src"], out=tmp_path / "run", stages=[IngestStage(), _Threads()], workers=0, **overrides)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert summary.done == 1 and seen == [mine + 1]  # the run's setting while its stages ran
    assert after == mine  # the application's own afterwards


def test_forked_workers_still_log_to_run_log_only(app_logging, tmp_path):
    """Worker processes forked from a notebook inherit its handlers: their records go to run.log, not to the
    application's handlers (a file here, so that what a worker writes is seen)."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    app_file = logging.FileHandler(tmp_path / "app.log")
    logging.getLogger().addHandler(app_file)
    try:
        write_dicom_series(generate_phantom(66, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=66)
        out = tmp_path / "run"
        summary = run_batch(
            [tmp_path / "src"], out=out, stages=[IngestStage(), _Chatty()], workers=1, **{"runner.start_method": "fork"}
        )
    finally:
        logging.getLogger().removeHandler(app_file)
        app_file.close()
    assert summary.done == 1
    assert (out / "run.log").read_text().count("chatty warning") == 1
    # the worker's warning reaches the application once, from the main process (not from the worker's inherited
    # handler); its info record never, as with workers=0
    app = (tmp_path / "app.log").read_text()
    assert app.count("chatty warning") == 1 and "chatty info" not in app, app


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stages_warnings_reach_the_console_whatever_the_worker_count(app_logging, tmp_path, workers):
    """A warning a stage logs about a case (thick slices, ...) reaches the application's handlers (ctpipe run's
    console) once, with its case and stage, whether the stage ran in the calling process or in a worker process
    (was: only with workers=0; with worker processes it went to run.log alone); info records stay in run.log."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    write_dicom_series(generate_phantom(68, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=68)
    out = tmp_path / "run"
    summary = run_batch([tmp_path / "src"], out=out, stages=[IngestStage(), _Chatty()], workers=workers)
    assert summary.done == 1
    chatty = [r for r in app_logging.records if "chatty" in r.getMessage()]
    assert [r.getMessage().split(" of ")[0] for r in chatty] == ["chatty warning"], _messages(app_logging)
    assert chatty[0].levelno == logging.WARNING and chatty[0].name == "pipeline.test"
    assert (out / "run.log").read_text().count("chatty warning") == 1  # written once, by the process that ran it


@pytest.fixture
def notebook_backend():
    """The application's matplotlib backend (a notebook's inline one; svg here) with a figure open."""
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    plt.switch_backend("svg")
    fig = plt.figure()
    try:
        yield fig
    finally:
        plt.close("all")
        plt.switch_backend(before)


def test_a_run_s_report_and_finding_figures_leave_the_matplotlib_backend_alone(notebook_backend, tmp_path):
    """The report's plots and a finding's PNG are drawn without switching the application's backend, which would
    close its figures and stop a notebook showing any more."""
    import matplotlib
    import matplotlib.pyplot as plt

    from pipeline.detection.figures import finding_png
    from pipeline.detection.findings import Finding
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    ph = generate_phantom(67, n_nodules=1, **{**PHANTOM, "slices": 12})
    write_dicom_series(ph.volume, tmp_path / "src", seed=67)
    out = tmp_path / "run"
    summary = run_batch([tmp_path / "src"], out=out, stages=[IngestStage()], workers=0, **{"report.enabled": True})
    assert summary.report_html is not None and summary.report_html.is_file()
    c = ph.nodules[0].center_lps
    f = Finding(c, tuple(v - 4 for v in c), tuple(v + 4 for v in c), 8.0, 0.9, (32, 32, 6), 7)
    assert finding_png(ph.volume, f).startswith(b"\x89PNG")
    assert matplotlib.get_backend() == "svg"
    assert plt.fignum_exists(notebook_backend.number)


def test_a_run_with_worker_processes_leaves_the_environment_as_it_was(tmp_path, monkeypatch):
    """The workers' hash seed and native thread counts are set for them, not left in the calling process' environment
    for whatever it starts later (a notebook's next run with other settings, its shell commands)."""
    import os

    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.runner.stages import IngestStage

    for var in ("PYTHONHASHSEED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    write_dicom_series(generate_phantom(68, n_nodules=0, **{**PHANTOM, "slices": 12}).volume, tmp_path / "src", seed=68)
    summary = run_batch(
        [tmp_path / "src"], out=tmp_path / "run", stages=[IngestStage()], workers=1, **{"runner.torch_threads": 1}
    )
    assert summary.done == 1
    assert [v for v in ("PYTHONHASHSEED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if v in os.environ] == []
    assert os.environ["MKL_NUM_THREADS"] == "7"
