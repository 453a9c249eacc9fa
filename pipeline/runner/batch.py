"""``run_batch``: one run of the pipeline over sources into a run folder (what ``ctpipe run`` calls)."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import platform
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..atomic import atomic_write_bytes
from ..config import Config, from_dict, load_config, overrides_layer
from ..errors import ConfigError, FatalRunError
from .discover import Discovery, discover
from .engine import Engine
from .logs import attach_jsonl, detach
from .metrics import NvmlSampler, RunMetrics
from .progress import Progress
from .report import build_report
from .resume import RunLock, plan, reconcile
from .stage import Stage, WorkerInfo
from .stages import build_stages
from .store import RunStore
from .workers import InlineExecutor, ProcessExecutor

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_QUARANTINED = 3


@dataclass
class RunSummary:
    """What a run did. ``exit_code``: 0 all cases done, 3 some quarantined, 1 the run could not proceed."""

    run_dir: Path
    run_id: str
    total: int = 0
    done: int = 0
    skipped: int = 0  # done by an earlier run of this folder
    quarantined: list[tuple[str, str, str]] = field(default_factory=list)  # (case_id, error class, reason)
    not_selected: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    report_html: Path | None = None
    metrics_file: Path | None = None
    fatal: str | None = None

    @property
    def exit_code(self) -> int:
        if self.fatal:
            return EXIT_FATAL
        return EXIT_QUARANTINED if self.quarantined else EXIT_OK

    @property
    def cases_per_hour(self) -> float:
        return 3600.0 * self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}: {self.done} case(s) done, {len(self.quarantined)} quarantined, "
               f"{self.skipped} already done earlier, of {self.total}, in {self.elapsed_s:.1f} s"]
        if self.fatal:
            out.append(f"run stopped: {self.fatal}")
        for cid, cls, reason in self.quarantined:
            out.append(f"  quarantined {cid}: {cls}: {reason}")
        for ns in self.not_selected:
            out.append(f"  not selected {ns['series']} ({ns['source']}): {ns['why']}")
        return out

    def __repr__(self) -> str:
        return "RunSummary(" + "; ".join(self.lines()) + f"; report={self.report_html})"


def software_versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "ctpipe": __version__, "platform": platform.platform()}
    for dist in ("torch", "monai", "pydicom", "numpy", "SimpleITK", "nvidia-dali-cuda120", "pandas", "prometheus-client"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def resolve_devices(device: str, need_model: bool) -> tuple[list[str], str]:
    """Model worker devices and a description of the device for the run record."""
    if not need_model or device == "cpu":
        return ["cpu"], "cpu"
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if n else "cpu"
    if device == "cpu":
        return ["cpu"], "cpu"
    if not n:
        raise ConfigError(f"runner.device = {device!r} but torch sees no CUDA GPU", where="runner.device",
                          fix="use --device cpu or auto")
    ids = list(range(n)) if device == "cuda" else [int(x) for x in device[5:].split(",")]
    bad = [i for i in ids if i >= n]
    if bad:
        raise ConfigError(f"runner.device = {device!r} names GPU(s) {bad} but only {n} exist", where="runner.device",
                          fix=f"use cuda:0..cuda:{n - 1}")
    devs = [f"cuda:{i}" for i in ids]
    return devs, ", ".join(f"{d} ({torch.cuda.get_device_name(int(d[5:]))})" for d in devs)


def run_batch(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    config: str | os.PathLike[str] | Config | None = None,
    stages: Sequence[Stage] | None = None,
    progress: Callable[[Progress], Any] | None = None,
    command: str | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run the pipeline over DICOM folders / worklist CSVs into the run folder ``out``.

    Re-running into the same folder resumes: completed cases are skipped, interrupted
    ones retried. ``overrides`` set options by short name (``workers=4``, ``device="cuda"``)
    or dotted name (``**{"report.enabled": False}``); they win over the environment and
    the ``config`` file. ``stages`` replaces the standard stages (for custom pipelines).
    Returns a :class:`RunSummary`; positions in all outputs are LPS mm.
    """
    t0 = time.monotonic()
    cfg = config if isinstance(config, Config) else load_config(config, overrides=overrides)
    if isinstance(config, Config) and overrides:
        merged = cfg.to_dict()
        for sec, vals in overrides_layer({k: v for k, v in overrides.items() if v is not None}).items():
            merged.setdefault(sec, {}).update(vals)
        cfg = from_dict(merged, source="overrides")
    srcs = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    run_dir = Path(out)
    lock = RunLock(run_dir)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    summary = RunSummary(run_dir, run_id)
    handler = attach_jsonl(run_dir / "run.log", process="main")
    store = RunStore(run_dir)
    try:
        return _run(srcs, cfg, run_dir, run_id, store, summary, stages, progress, command, t0)
    finally:
        store.close()
        detach(handler)
        lock.release()


def _run(srcs: list, cfg: Config, run_dir: Path, run_id: str, store: RunStore, summary: RunSummary,
         stages: Sequence[Stage] | None, progress_cb: Callable | None, command: str | None, t0: float) -> RunSummary:
    reconcile(store, run_dir)
    found: Discovery = discover(srcs, cfg)
    summary.not_selected = found.not_selected
    pl = plan(store, found.cases, retry_failed=cfg.runner.retry_failed)
    summary.total = len(found.cases)
    summary.skipped = len(pl.done)
    pipeline = list(stages) if stages is not None else build_stages(cfg)
    need_model = any(s.group == "model" for s in pipeline)
    devices, device_desc = resolve_devices(cfg.runner.device, need_model and bool(pl.to_run))
    workers = cfg.runner.workers
    n_procs = (max(1, workers) + (len(devices) if need_model else 0)) if workers else 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = cfg.runner.torch_threads or max(1, cores // n_procs)
    atomic_write_bytes(run_dir / "config.yaml", _yaml(cfg.to_dict()).encode())
    store.start_run(run_id, command=command or " ".join(sys.argv), sources=[str(s) for s in srcs], config=cfg.to_dict(),
                    versions=software_versions(), device=device_desc, host=socket.gethostname(), pid=os.getpid())
    log.info("run %s: %d case(s) to run, %d done earlier, %d quarantined earlier; device %s", run_id, len(pl.to_run),
             len(pl.done), len(pl.failed_before), device_desc, extra={"event": "run_start", "run_id": run_id})
    prog = Progress(total=len(pl.to_run) + len(pl.rejected), callback=progress_cb)
    metrics = RunMetrics()
    if cfg.metrics.port:
        metrics.serve(cfg.metrics.port, cfg.metrics.bind)
    sampler = NvmlSampler(cfg.metrics.nvml_interval_s, metrics) if device_desc != "cpu" else None
    if sampler:
        sampler.start()
    executor: Any = None
    status = "completed"
    try:
        if not pl.to_run:  # nothing for the stages: no workers, no model
            executor = InlineExecutor([], WorkerInfo("main", "cpu", cfg, run_dir))
            in_flight = 1
        elif workers == 0:
            import torch

            torch.set_num_threads(threads)
            executor = InlineExecutor(pipeline, WorkerInfo("main", devices[0], cfg, run_dir))
            in_flight = 1
        else:
            executor = ProcessExecutor(pipeline, config=cfg, run_dir=run_dir, workers=workers, devices=devices,
                                       queue_depth=cfg.runner.queue_depth, start_method=cfg.runner.start_method,
                                       torch_threads=threads)
            in_flight = cfg.runner.max_in_flight or 2 * (workers + len(devices)) + 2
        engine = Engine(pipeline, executor, store, run_dir=run_dir, run_id=run_id, max_in_flight=in_flight,
                        retries=cfg.runner.retries, keep_cache=cfg.runner.keep_cache, observers=[metrics, prog])
        if progress_cb is not None:
            progress_cb(prog)  # show the bar before the first case finishes
        summary.done = len(engine.run(pl.to_run, pl.rejected).done)
    except FatalRunError as exc:
        summary.fatal = str(exc)
        status = "failed"
        log.error("run stopped: %s", exc, extra={"event": "run_failed", "run_id": run_id})
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if executor is not None:
            executor.close()
        if sampler:
            sampler.stop()
            store.add_gpu_samples(run_id, sampler.drain())
        metrics.stop()
        summary.elapsed_s = time.monotonic() - t0
        failed_rows = store.cases_with_status("failed")
        summary.quarantined = [(r["case_id"], r["error_class"], r["reason"]) for r in failed_rows
                               if r["case_key"] in {c.case_key for c in found.cases}]
        done_now = len(store.cases_with_status("done"))
        store.end_run(run_id, status=status, n_cases=summary.total, n_done=done_now, n_failed=len(failed_rows),
                      n_skipped=summary.skipped)
        if cfg.metrics.textfile:
            summary.metrics_file = metrics.write_textfile(run_dir / "metrics.prom")
        if cfg.metrics.textfile_dir:
            metrics.write_textfile(Path(cfg.metrics.textfile_dir) / "ctpipe.prom")
    if cfg.report.enabled:
        summary.report_html = build_report([run_dir], run_dir / "report", bin_minutes=cfg.report.bin_minutes,
                                           hours_per_day=cfg.report.hours_per_day).html
    log.info("run %s finished: %d done, %d quarantined, %.1f s", run_id, summary.done, len(summary.quarantined),
             summary.elapsed_s, extra={"event": "run_end", "run_id": run_id})
    return summary


def _yaml(data: Mapping[str, Any]) -> str:
    import yaml

    head = "# effective configuration of the latest run (defaults < file < environment < command line)\n"
    return head + yaml.safe_dump(json.loads(json.dumps(dict(data))), sort_keys=False)
