"""``run_batch``: one run of the pipeline over sources into a run folder (what ``ctpipe run`` calls)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes, check_out_outside_sources, ensure_dir
from ..bundle import BundleConfig
from ..config import Config
from ..errors import ConfigError, FatalRunError, refuse_unexpanded_home, require_path
from .adopt import source_check
from .discover import Discovery, check_sources, discover, scanned_paths, source_list, worklist_root
from .end_signals import EndSignals
from .engine import Engine
from .faults import check_writable, environment_failure
from .logs import attach_jsonl, detach
from .metrics import NvmlSampler, RunMetrics
from .progress import Progress
from .redact import PathRedactor
from .redact_active import redacting
from .result_options import WEIGHTS_KEY, check_result_options, weights_digest
from .resume import RunLock, drop_cached, plan, reconcile, remove_quarantine
from .run_config import config_yaml, effective_config, recorded
from .run_end import (
    build_or_mark_report,
    crash,
    log_run_end,
    mark_report,
    quietly,
    raise_environment,
    record_end,
    still_written_rows,
)
from .run_host import no_gpu_here, resolve_devices, software_versions
from .run_summary import EXIT_ENVIRONMENT, EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_QUARANTINED, SHOWN, RunSummary
from .session import RunSession, origins_of, refuse_incomplete
from .source_roots import SourceRoots
from .stage import Stage, WorkerInfo, stage_list
from .stages import build_stages
from .store import RunStore
from .task_run import InlineExecutor
from .workers import ProcessExecutor

__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_FATAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_QUARANTINED",
    "SHOWN",
    "RunSummary",
    "no_gpu_here",
    "resolve_devices",
    "run_batch",
    "software_versions",
]

log = logging.getLogger(__name__)


def run_batch(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    config: str | os.PathLike[str] | Config | None = None,
    stages: Sequence[Stage] | None = None,
    progress: Callable[[Progress], Any] | None = None,
    command: str | None = None,
    session: RunSession | None = None,
    origins: Mapping[str, Mapping[str, Any]] | None = None,
    ended: Callable[[RunSummary, float], Any] | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run the pipeline over DICOM folders / worklist CSVs into the run folder ``out``.

    Re-running into the same folder resumes: completed cases are skipped, interrupted
    ones retried. ``overrides`` set options by short name (``workers=4``, ``device="cuda"``)
    or dotted name (``**{"report.enabled": False}``); they win over the environment and
    the ``config`` file. ``stages`` replaces the standard stages (for custom pipelines).
    ``session``: a :class:`~pipeline.runner.session.RunSession` whose executor (and loaded models)
    is reused and kept for its next batch; ``origins``: where PACS-delivered source folders came
    from (folder → origin, see :meth:`RunStore.record_origins`), recorded for their cases. ``ended``: called with the
    summary and the seconds the metrics endpoint is kept up for a last scrape (``metrics.linger_s``; 0: none) once the
    run's end is recorded (run store, metrics, report, ``run_end`` in run.log), before that wait; not for a run stopped
    by a signal, which raises KeyboardInterrupt. A stop signal (Ctrl-C, SIGTERM or SIGHUP) that comes once the run's
    work is over and its end is being recorded does not interrupt it (:mod:`.end_signals`): it ends that wait early,
    and reaches its handler (Python's: KeyboardInterrupt) once the run's end is recorded and ``ended`` has returned.
    Returns a :class:`RunSummary`; positions in all outputs are LPS mm.
    """
    t0, started_wall = time.monotonic(), time.time()  # the run starts with the command: its store record says the same
    srcs = source_list(sources)  # what is not a path: named before anything is read
    stages = stage_list(stages)  # a stage's name or class instead of a Stage: named before the run folder is made
    run_dir = require_path(out, where="out", error=ConfigError, what="the run folder", fix="pass a folder, e.g. out='runs/r1'")
    cfg = effective_config(config, overrides)
    check_sources(srcs, from_python=True)  # a mistyped source: one clear error, before the run folder is made
    # a run folder inside its source (or a worklist row's folder): read back as input by the next run
    check_out_outside_sources(
        scanned_paths(srcs, cfg),
        run_dir,
        later="run",
        reads_back="this run's own files (its DICOM SR and SEG, cache and reports) back as input",
        beside="runs",
    )
    if cfg.detector.bundle:  # a mistyped --bundle: one clear error now, not when the model stage starts
        BundleConfig.read(cfg.detector.bundle)
    if any(Path(src).suffix.lower() == ".csv" for src in srcs):
        worklist_root(cfg)  # a runner.worklist_root that is no folder: said before the run folder is made
    if cfg.metrics.textfile_dir:  # written at the end of the run: a path that cannot be a folder is said now
        ensure_dir(cfg.metrics.textfile_dir, what="metrics.textfile_dir")
    refuse_unexpanded_home(out, what="out")  # before any folder is made: not one named '~' in the working folder
    check_writable(run_dir)  # a read-only or full --out: one clear error, before anything else
    lock = RunLock(run_dir)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    summary = RunSummary(run_dir, run_id)
    try:
        handler = attach_jsonl(run_dir / "run.log", process="main")
    except OSError as exc:  # a folder named run.log, say: the run folder's problem, named with its fix
        lock.release()
        raise_environment(exc, run_dir)
        raise
    try:
        store = RunStore(run_dir)
    except (OSError, sqlite3.Error) as exc:
        detach(handler)
        lock.release()
        raise_environment(exc, run_dir)
        raise
    # a session's batches share its secret: its kept worker processes were given it with the first batch
    secret = session.redaction_secret if session is not None else None
    redactor = None if cfg.privacy.keep_identifiers else PathRedactor(secret=secret)
    summary.redactor = redactor
    end_signals = EndSignals()  # held once the run's end is being recorded: it cannot be interrupted from there on
    outer = sys.exc_info()[1]  # one the caller is handling as it calls run_batch, if any: not the run's
    try:
        with redacting(redactor):
            return _run(
                srcs,
                cfg,
                run_dir,
                run_id,
                store,
                summary,
                stages,
                progress,
                command,
                (t0, started_wall),
                session,
                origins,
                ended,
                end_signals,
            )
    except (OSError, sqlite3.Error) as exc:  # the run folder failed before any case started
        raise_environment(exc, run_dir)
        raise
    finally:
        try:
            if (crash := sys.exc_info()[1]) is not outer and crash is not None:  # named in run.log, still attached
                end_signals.crashed(crash)
            store.close()
            detach(handler)
            lock.release()
        finally:  # the run's end recorded: a stop signal held since reaches its own handler now (the crash stands)
            end_signals.release()


def _run(
    srcs: list,
    cfg: Config,
    run_dir: Path,
    run_id: str,
    store: RunStore,
    summary: RunSummary,
    stages: Sequence[Stage] | None,
    progress_cb: Callable | None,
    command: str | None,
    clock: tuple[float, float],
    session: RunSession | None = None,
    origins: Mapping[str, Mapping[str, Any]] | None = None,
    ended: Callable[[RunSummary, float], Any] | None = None,
    end_signals: EndSignals | None = None,
) -> RunSummary:
    end_signals = end_signals or EndSignals()
    found: Discovery = discover(srcs, cfg)
    # a folder a killed run left before recording its case done for good: adopted once its series is checked again
    reconciled = reconcile(store, run_dir, source_check=source_check(found.cases, found.snapshot))
    weights = weights_digest(cfg.detector.bundle)
    check_result_options(store, cfg, run_dir, weights=weights)  # results made otherwise: refused before the run is recorded
    if origins:  # series a PACS delivered incomplete (a sender cut off mid-series): quarantined, never published
        found.cases = refuse_incomplete(found.cases, origins)
    summary.sources = [str(s) for s in srcs]
    for c in found.cases:
        summary.case_keys.setdefault(c.source, []).append(c.case_key)
    summary.not_selected = found.not_selected
    summary.skipped_files = found.skipped_files
    # a series quarantined as not known whole, which its PACS sender has since sent again whole (origin "retry")
    retry = {os.path.realpath(f) for f, o in (origins or {}).items() if o.get("retry")}
    pl = plan(store, found.cases, retry_failed=cfg.runner.retry_failed, retry=retry)
    for cid in pl.replaced:  # run again with the series' new content: no verdict or cached volume of the old one
        remove_quarantine(run_dir, cid)
        drop_cached(run_dir, cid)
    if pl.not_found:
        log.info(
            "%d case(s) recorded in this run folder are not among this run's sources (moved, deleted or not given); "
            "their results and records stay",
            pl.not_found,
            extra={"event": "not_found"},
        )
    summary.total = len({c.case_key for c in found.cases})  # a series reached through two sources is one case
    summary.skipped = len(pl.done)
    pipeline = list(stages) if stages is not None else build_stages(cfg)
    need_model = any(s.group == "model" for s in pipeline)
    cluster: Any = None  # runner.engine = ray: the Ray connection (joined before the run is recorded)
    if cfg.runner.engine == "ray" and pl.to_run:
        from .ray_connect import connect

        cluster = connect(
            cfg.runner.ray_address,
            timeout_s=cfg.runner.ray_timeout_s,
            reconnect_s=cfg.runner.ray_reconnect_s,
            set_by=cfg.source_of("runner.ray_address"),
            engine_set_by=cfg.source_of("runner.engine"),
        )
        devices, device_desc = ["cpu"], cluster.describe()
        share = [f"{n} {what}" for n, what in ((cfg.runner.ray_max_cpus, "CPU(s)"), (cfg.runner.ray_max_gpus, "GPU(s)")) if n]
        if share:  # runner.ray_max_cpus / ray_max_gpus: the run's part of a shared cluster
            device_desc += f"; this run's share: at most {' and '.join(share)}"
    else:
        devices, device_desc = resolve_devices(
            cfg.runner.device, need_model and bool(pl.to_run), set_by=cfg.source_of("runner.device")
        )
    workers = cfg.runner.workers
    n_procs = (max(1, workers) + (len(devices) if need_model else 0)) if workers else 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = cfg.runner.torch_threads or max(1, cores // n_procs)
    if workers > cores and cluster is None:
        log.warning(
            "runner.workers = %d but this machine gives the run %d CPU core(s): the workers compete for them (no "
            "faster, more memory); use --workers %d or fewer",
            workers,
            cores,
            cores,
            extra={"event": "config_warning"},
        )
    if cfg.metrics.port:
        RunMetrics.check_port(cfg.metrics.port, cfg.metrics.bind)  # a port in use stops the run before it is recorded
    atomic_write_bytes(run_dir / "config.yaml", config_yaml(cfg.to_dict(), cfg.sources).encode())
    t0, started_wall = clock  # monotonic and wall-clock (Unix s) time of the command's start
    store.start_run(
        run_id,
        started_at=started_wall,
        command=recorded(command or " ".join(sys.argv), cfg),
        sources=[recorded(str(s), cfg) for s in srcs],
        config=cfg.to_dict(),
        versions={**software_versions(), **({WEIGHTS_KEY: weights} if weights else {})},
        device=device_desc,
        host=socket.gethostname(),
        pid=os.getpid(),
    )
    if cfg.sources:  # run.log keeps, run after run, where each option not left at its default was set
        log.info(
            "options set: %s",
            "; ".join(f"{path} by {where}" for path, where in cfg.sources.items()),
            extra={"event": "config_sources", "run_id": run_id},
        )
    # until it ends, the report says a run is in progress and that its figures are older (report.enabled: false: the
    # report an earlier run left, if any, which this run's end then marks as not rebuilt)
    if cfg.report.enabled or (run_dir / "report" / "report.json").is_file():
        mark_report(run_dir)
    store.add_skipped(run_id, found.skipped_rows())
    store.mark_found(run_id, {c.case_key for c in found.cases})  # what this run answers for, should it be killed
    if origins:
        store.record_origins(run_id, origins_of(found.cases, origins))
    log.info(
        "run %s: %d case(s) to run, %d done earlier, %d quarantined earlier; device %s",
        run_id,
        len(pl.to_run),
        len(pl.done),
        len(pl.failed_before),
        device_desc,
        extra={"event": "run_start", "run_id": run_id},
    )
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell script (no job control)
        log.info(
            "SIGINT (Ctrl-C, kill -INT) is ignored by this process, as the shell that started it in the background "
            "asked; stop the run with SIGTERM (kill %d)",
            os.getpid(),
            extra={"event": "stop_signals", "run_id": run_id},
        )
    prog = Progress(total=len(pl.to_run) + len(pl.rejected), callback=progress_cb)
    metrics = RunMetrics()
    # counters go on from the last textfile (the node's, else the folder's): never lower than after the last run
    node_file = Path(cfg.metrics.textfile_dir) / cfg.metrics.textfile_name if cfg.metrics.textfile_dir else None
    metrics.carry_from(*([node_file] if node_file else []), run_dir / "metrics.prom")
    metrics.count_killed_runs(reconciled.uncounted)
    redos = store.completed_before({c.case_key for c in pl.to_run})
    metrics.expect_redos(redos)
    prog.expect_redos(redos)
    metrics.files_skipped(len(found.skipped_files), len(found.not_selected))
    if cfg.metrics.port:
        metrics.serve(cfg.metrics.port, cfg.metrics.bind)
    sampler = NvmlSampler(cfg.metrics.nvml_interval_s, metrics) if device_desc != "cpu" and cluster is None else None
    if sampler:
        sampler.start()
    executor: Any = None
    in_flight = 1
    status = "completed"
    signalled = False  # Ctrl-C, SIGTERM, SIGHUP: recorded, logged and reported like any end, then raised again
    threads_before: int | None = None  # the calling process' torch threads, when the stages run in it (workers=0)
    try:
        if workers == 0 and cluster is None and pl.to_run:  # the stages run in this process, with the run's threads
            import torch

            threads_before = torch.get_num_threads()
            torch.set_num_threads(threads)
        if not pl.to_run:  # nothing for the stages: no workers, no model
            executor = InlineExecutor([], WorkerInfo("main", "cpu", cfg, run_dir))
            in_flight = 1
        elif session is not None and session.executor is not None:  # started by an earlier batch of the session
            executor, in_flight = session.executor, session.in_flight
        elif cluster is not None:
            from .ray_executor import RayExecutor

            executor = RayExecutor(
                pipeline,
                config=cfg,
                run_dir=run_dir,
                cluster=cluster,
                queue_depth=cfg.runner.queue_depth,
                timeout_s=cfg.runner.ray_timeout_s,
            )
            in_flight = cfg.runner.max_in_flight or 2 * executor.capacity() + 2
        elif workers == 0:
            executor = InlineExecutor(pipeline, WorkerInfo("main", devices[0], cfg, run_dir))
            in_flight = 1
        else:
            executor = ProcessExecutor(
                pipeline,
                config=cfg,
                run_dir=run_dir,
                workers=workers,
                devices=devices,
                queue_depth=cfg.runner.queue_depth,
                start_method=cfg.runner.start_method,
                torch_threads=threads,
                stage_timeout_s=cfg.runner.stage_timeout_s,
            )
            in_flight = cfg.runner.max_in_flight or 2 * (workers + len(devices)) + 2
        engine = Engine(
            pipeline,
            executor,
            store,
            run_dir=run_dir,
            run_id=run_id,
            max_in_flight=in_flight,
            retries=cfg.runner.retries,
            keep_cache=cfg.runner.keep_cache,
            observers=[metrics, prog],
            sources=SourceRoots.of(srcs, cfg),  # a source mount that drops: the run stops, its cases wait for the next
            started=t0,
            snapshot=found.snapshot,  # files of a series that arrive while it runs: not published, left for the next run
        )
        if progress_cb is not None:
            progress_cb(prog)  # show the bar before the first case finishes
        result = engine.run(pl.to_run, pl.rejected)
        summary.done, summary.released = len(result.done), result.released
        summary.still_written = result.still_written
        if result.still_written:  # listed with the series discovery left out (the report's skipped.csv)
            store.add_skipped(run_id, still_written_rows(result.still_written, pl.to_run))
        if result.stopped:
            summary.stopped, status = result.stopped, "interrupted"
    except FatalRunError as exc:
        summary.fatal = str(exc)
        status = "failed"
        log.error("run stopped: %s", exc, extra={"event": "run_failed", "run_id": run_id})
    except KeyboardInterrupt:
        status, signalled = "interrupted", True
    except (OSError, sqlite3.Error) as exc:  # the main process could not write the run folder (store, files)
        env = environment_failure(exc, run_dir=run_dir)
        if env is None:
            summary.fatal, status = crash(exc, run_id), "failed"
            raise
        summary.stopped, status = env.describe(), "interrupted"
        log.error("run stopped: %s", env.describe(), extra={"event": "run_stopped", "run_id": run_id})
    except Exception as exc:  # any other error ends the run: recorded (store, metrics) as failed, then raised
        summary.fatal, status = crash(exc, run_id), "failed"
        raise
    finally:
        try:
            try:
                if threads_before is not None:  # the application's own setting again
                    import torch

                    torch.set_num_threads(threads_before)
                if executor is not None and session is not None:
                    session.after_batch(executor, in_flight, keep=bool(pl.to_run) and status == "completed")
                elif executor is not None:
                    executor.close()
                if cluster is not None and (session is None or session.executor is not executor):
                    cluster.close()
            finally:
                if sampler:
                    sampler.stop()
                    quietly(summary, run_dir, "GPU samples", lambda: store.add_gpu_samples(run_id, sampler.drain()))
        except KeyboardInterrupt:  # Ctrl-C while the workers close: the run stops there, recorded as interrupted
            status, signalled = "interrupted", True
        # the run's time: the idle serving of metrics.linger_s below is not the run's work, nor its throughput's
        summary.elapsed_s = time.monotonic() - t0
        if not signalled:  # the run's work is over (every case finished, or it failed or stopped on its own): its
            end_signals.hold()  # outcome is what is recorded next, which a Ctrl-C or SIGTERM from here on cannot change
        final = False  # whether the final values below are all set
        linger_s = 0.0  # s of serving the final metrics once the run's end is recorded
        try:
            exit_status = record_end(
                store,
                summary,
                cfg=cfg,
                run_dir=run_dir,
                run_id=run_id,
                keys={c.case_key for c in found.cases},
                status=status,
                signalled=signalled,
                started_wall=started_wall,
                metrics=metrics,
                node_file=node_file,
            )
            final = True
        finally:
            # served once the final values are set (counters, run end time, exit status): a last scrape takes them,
            # else the run's last cases and its end never reach Prometheus
            if final and cfg.metrics.port and cfg.metrics.linger_s > 0 and status != "interrupted":
                linger_s = cfg.metrics.linger_s
            else:
                metrics.stop()
    try:
        build_or_mark_report(summary, cfg, run_dir, run_id)
        log_run_end(summary, run_id=run_id, status=status, signalled=signalled, exit_status=exit_status)
        wait_s = linger_s if end_signals.noted is None else 0.0  # a stop signal since the run's work was over: no wait
        if wait_s > 0:
            log.info("serving the final metrics for %g s", wait_s, extra={"event": "metrics_linger"})
        if ended is not None and not signalled:  # the summary first: the console need not wait for the linger
            ended(summary, wait_s)
        if wait_s > 0 and end_signals.wait(wait_s):  # the final metrics served; a stop signal ends that early
            log.info("stopped serving the final metrics early (Ctrl-C or a stop signal)", extra={"event": "metrics_linger_ended"})
        elif end_signals.noted is not None:
            log.info(
                "%s came after the run's work was over: the run stays recorded as %s (exit status %d)",
                signal.Signals(end_signals.noted).name,
                status,
                exit_status,
                extra={"event": "stop_after_end", "run_id": run_id},
            )
    finally:
        if linger_s > 0:
            metrics.stop()
    if signalled:  # the caller (ctpipe run: exit status 130) learns of the interruption as it would have without us
        raise KeyboardInterrupt
    return summary
