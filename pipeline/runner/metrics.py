"""Prometheus metrics of a run, an optional HTTP endpoint, the node_exporter textfile, and NVML sampling.

Metrics (one registry per run, so several runs in one process do not mix):

* ``ctpipe_cases_processed_total`` — cases completed for the first time: chart "cases completed" from it, as the
  report counts them (a case counts once, where it was first completed).
* ``ctpipe_cases_redone_total`` — cases done again because their published folder was removed: work done, but no new
  case (the report's ``n_redone`` and, per day and hour, ``cases_redone``, the summary line's "done again"; the
  dashboard charts it per hour and per day beside the new cases); the two added up are the completions of the
  runs, the work done, as ``ctpipe_case_latency_seconds_count`` counts them.
* ``ctpipe_cases_failed_total{reason}`` — cases quarantined, by error class.
* ``ctpipe_cases_quarantined{when}`` — at the run's end, the cases of its sources that are quarantined: ``this_run``
  (quarantined by this run) and ``earlier_runs`` (quarantined by an earlier run of the folder and not retried; the exit
  status is 3 for them too, so alert on new failures with ``when="this_run"``).
* ``ctpipe_cases_released_total`` — cases left unfinished for the next run because the run folder could not be
  written (disk full, read-only, no permission) or a source folder went away, or because their series was still
  being written into the source while they ran (nothing of them published; the next run takes them whole).
* ``ctpipe_case_flags_total{flag,severity}`` — quality flags of completed cases (``severity``: warning or info).
* ``ctpipe_discovery_skipped{what}`` — what discovery left out in this run: ``file`` (not DICOM, unreadable, ...)
  and ``series`` (not selected: localizers, too few slices, not CT).
* ``ctpipe_stage_latency_seconds{stage}`` — histogram of stage wall time (s).
* ``ctpipe_stage_queue_wait_seconds{stage}`` — histogram of time a ready stage waited for a worker (s).
* ``ctpipe_case_latency_seconds`` — histogram of a case's end-to-end time (s), every completion: cases done again
  included (the work was done); its ``_count`` is processed plus redone, not the cases completed.
* ``ctpipe_stage_peak_rss_bytes{stage}`` — largest peak RSS seen per stage.
* ``ctpipe_gpu_utilization_ratio{gpu}`` (0..1: the share of the last sample period a kernel ran, NVML's utilisation
  percentage / 100), ``ctpipe_gpu_memory_used_bytes{gpu}`` — NVML samples (only where a GPU and
  ``pynvml``/``nvidia-ml-py`` are present).
* ``ctpipe_run_start_time_seconds``, ``ctpipe_run_last_update_time_seconds`` — Unix time (the last case event;
  the start until the first one).
* ``ctpipe_run_end_time_seconds``, ``ctpipe_run_exit_status`` — when the run ended (Unix time) and its exit status
  (0 all done, 3 some quarantined, 4 the run folder could not be written, 1 could not proceed, 130 interrupted);
  only in the textfiles written at the end (alert on a nightly run that did not end, or did not end with 0).

Names follow Prometheus' conventions: base units only (seconds, bytes, ratios 0..1), named as the last word before
``_total`` / ``_bucket``; ``_total`` on counters only; a point in time is Unix seconds (``*_time_seconds``); a count
has no unit.

Counters and histograms go on from the previous run's textfile (``metrics.textfile_name`` in ``metrics.textfile_dir``, else
``RUN_DIR/metrics.prom``; :mod:`.metrics_carry`): they never go down from one run to the next, so ``increase()``
over a week of nightly textfiles counts every night's cases; gauges are the run's own.

Every series also carries ``node``: the node's id, from ``$CTPIPE_NODE`` or else the host name, so that one
Prometheus scraping every node of a cluster tells them apart (``sum by (node) (...)``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .stage import CaseSpec, TaskResult

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
#: Environment variable naming this node in the metrics' ``node`` label (default: the host name).
NODE_ENV = "CTPIPE_NODE"


def node_id(node: str | None = None) -> str:
    """The ``node`` label: ``node`` if given, else ``$CTPIPE_NODE``, else the host name."""
    return node or os.environ.get(NODE_ENV) or socket.gethostname()


class RunMetrics:
    """Engine observer that keeps Prometheus metrics for one run, every series labelled with ``node``
    (:func:`node_id`)."""

    def __init__(self, *, node: str | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.node = node_id(node)
        self.registry = CollectorRegistry()
        r, n = self.registry, self.node
        self.processed = Counter(
            "ctpipe_cases_processed", "Cases completed for the first time (redos apart)", ["node"], registry=r
        ).labels(n)
        self.redone = Counter(
            "ctpipe_cases_redone", "Cases done again because their published folder was removed", ["node"], registry=r
        ).labels(n)
        self._redos: set[str] = set()  # case keys of cases completed before (see expect_redos)
        self.failed = Counter("ctpipe_cases_failed", "Cases quarantined, by error class", ["node", "reason"], registry=r)
        self.released = Counter(
            "ctpipe_cases_released",
            "Cases left for the next run: the run folder or source failed, or the series was still being written",
            ["node"],
            registry=r,
        ).labels(n)
        self.quarantined = Gauge(
            "ctpipe_cases_quarantined",
            "Cases quarantined at the run's end: by this run (this_run) or still from earlier runs (earlier_runs)",
            ["node", "when"],
            registry=r,
        )
        self.flags = Counter("ctpipe_case_flags", "Quality flags of completed cases", ["node", "flag", "severity"], registry=r)
        self.skipped = Gauge(
            "ctpipe_discovery_skipped", "Files and series discovery left out in this run", ["node", "what"], registry=r
        )
        self.stage_latency = Histogram(
            "ctpipe_stage_latency_seconds", "Stage wall time per case", ["node", "stage"], buckets=_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "ctpipe_stage_queue_wait_seconds",
            "Time a ready stage waited for a worker",
            ["node", "stage"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.case_latency = Histogram(
            "ctpipe_case_latency_seconds", "End-to-end time per case", ["node"], buckets=_BUCKETS, registry=r
        ).labels(n)
        self.peak_rss = Gauge(
            "ctpipe_stage_peak_rss_bytes", "Largest peak resident memory per stage", ["node", "stage"], registry=r
        )
        self.gpu_util = Gauge(
            "ctpipe_gpu_utilization_ratio", "GPU utilisation (NVML), 0..1 of the sample period", ["node", "gpu"], registry=r
        )
        self.gpu_mem = Gauge("ctpipe_gpu_memory_used_bytes", "GPU memory used (NVML)", ["node", "gpu"], registry=r)
        self.started = Gauge("ctpipe_run_start_time_seconds", "Start of the run (Unix time)", ["node"], registry=r).labels(n)
        self.updated = Gauge(
            "ctpipe_run_last_update_time_seconds", "Last case event, the start before the first (Unix time)", ["node"], registry=r
        ).labels(n)
        self._ended = Gauge("ctpipe_run_end_time_seconds", "End of the run (Unix time)", ["node"], registry=r)
        self._exit = Gauge(
            "ctpipe_run_exit_status",
            "Exit status of the run: 0 done, 3 quarantined, 4 folder, 1 failed, 130 interrupted",
            ["node"],
            registry=r,
        )
        self.started.set(time.time())
        self.updated.set(time.time())  # a run without case events (nothing new tonight) is not "last updated in 1970"
        self._server: Any = None
        self._peaks: dict[str, float] = {}
        self.exposed: CollectorRegistry = r  # what the endpoint and the textfiles show (see carry_from)

    def carry_from(self, *paths: Path) -> None:
        """Go on from the counters and histograms of the first of ``paths`` (an earlier run's textfile) that exists:
        the endpoint and the textfiles show them with this run's increments added, so that they never go down from
        one run to the next (:mod:`.metrics_carry`). Call it before :meth:`serve`."""
        from .metrics_carry import carrying_registry

        self.exposed = carrying_registry(self.registry, paths, self.node)

    # observer interface
    def on_stage(self, result: TaskResult) -> None:
        if not result.ok or result.wall_s is None:
            return
        self.stage_latency.labels(self.node, result.stage).observe(result.wall_s)
        if result.started_at is not None:
            self.queue_wait.labels(self.node, result.stage).observe(max(0.0, result.started_at - result.ready_at))
        if result.peak_rss_mb is not None:
            peak = max(self._peaks.get(result.stage, 0.0), result.peak_rss_mb * 2**20)
            self._peaks[result.stage] = peak
            self.peak_rss.labels(self.node, result.stage).set(peak)

    def expect_redos(self, case_keys: Iterable[str]) -> None:
        """The cases of this run that an earlier run completed (``case_keys``; their published folder was removed):
        done again, they count in ``ctpipe_cases_redone_total``, not as cases processed."""
        self._redos.update(case_keys)

    def on_case_done(self, case: CaseSpec, latency_s: float, n_findings: int) -> None:
        (self.redone if case.case_key in self._redos else self.processed).inc()
        self.case_latency.observe(latency_s)
        self.updated.set(time.time())

    def count_killed_runs(self, cases: Iterable[Mapping[str, Any]]) -> None:
        """Count the cases that earlier runs, killed before they wrote their metrics, finished (``status`` done, with
        ``latency_s`` in s where known, or failed, with its ``error_class``): their counts are in no textfile. A done
        case whose ``first_done_at`` (Unix s) is before its ``ended_at`` was done again: ``ctpipe_cases_redone_total``."""
        for case in cases:
            if case["status"] == "done":
                first, ended = case.get("first_done_at"), case.get("ended_at")
                again = first is not None and ended is not None and first < ended
                (self.redone if again else self.processed).inc()
                if case.get("latency_s") is not None:
                    self.case_latency.observe(case["latency_s"])
            else:
                self.failed.labels(self.node, case.get("error_class") or "Error").inc()

    def on_case_failed(self, case: CaseSpec, reason: str, error_class: str) -> None:
        self.failed.labels(self.node, error_class).inc()
        self.updated.set(time.time())

    def on_case_released(self, case: CaseSpec, reason: str) -> None:
        self.released.inc()
        self.updated.set(time.time())

    def on_case_quality(self, case: CaseSpec, quality: Mapping[str, Any]) -> None:
        for flag in quality.get("flags", ()):
            self.flags.labels(self.node, flag["code"], flag.get("severity", "warning")).inc()

    def files_skipped(self, files: int, series: int) -> None:
        self.skipped.labels(self.node, "file").set(files)
        self.skipped.labels(self.node, "series").set(series)

    def quarantined_at_end(self, this_run: int, earlier_runs: int) -> None:
        """The cases quarantined at the run's end: by this run, and by earlier runs of the folder (not retried)."""
        self.quarantined.labels(self.node, "this_run").set(this_run)
        self.quarantined.labels(self.node, "earlier_runs").set(earlier_runs)

    def run_ended(self, exit_status: int, *, ended_at: float | None = None) -> None:
        """The run is over, with ``exit_status`` (``ctpipe run``'s): for the textfiles written next. ``ended_at``: when
        the run's work ended (Unix time, s; default now), before any ``metrics.linger_s`` of serving."""
        self._ended.labels(self.node).set(time.time() if ended_at is None else ended_at)
        self._exit.labels(self.node).set(exit_status)

    def gpu_sample(self, gpu: int, util_pct: float, mem_used_mb: float) -> None:
        """One NVML sample of GPU ``gpu``: utilisation in percent (0..100, as NVML gives it; exposed as a ratio 0..1)
        and memory used in MB (exposed in bytes)."""
        self.gpu_util.labels(self.node, str(gpu)).set(util_pct / 100.0)
        self.gpu_mem.labels(self.node, str(gpu)).set(mem_used_mb * 2**20)

    # exposure
    @staticmethod
    def check_port(port: int, bind: str = "127.0.0.1") -> None:
        """Raise :class:`~pipeline.errors.ConfigError` when ``bind:port`` cannot be listened on (in use, no such
        address), before a run is recorded; :meth:`serve` takes the port moments later."""
        try:
            with socket.create_server((bind, port)):
                pass
        except OSError as exc:
            raise _port_error(bind, port, exc) from exc

    def serve(self, port: int, bind: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` over HTTP on ``bind:port`` for the rest of the run."""
        from prometheus_client import start_http_server

        try:
            out = start_http_server(port, addr=bind, registry=self.exposed)
        except OSError as exc:
            raise _port_error(bind, port, exc) from exc
        self._server = out[0] if isinstance(out, tuple) else None
        log.info("metrics on http://%s:%d/metrics", bind, port, extra={"event": "metrics_server"})

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.exposed).decode()

    def write_textfile(self, path: Path) -> Path:
        """Write the metrics in the text exposition format, atomically (node_exporter's textfile collector)."""
        from prometheus_client import write_to_textfile

        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.exposed)
        return path


def warn_if_rewritten(path: Path, *, since: float, run_dir: Path) -> bool:
    """Warn (and return True) when the node's textfile ``path`` was written after ``since`` (Unix s, this run's start):
    another job wrote it while this run of ``run_dir`` was under way, and this run's values are about to replace
    its own (its gauges lost, its counters without this run's increments, or the other way round)."""
    try:
        written = path.stat().st_mtime
    except FileNotFoundError:
        return False
    if written <= since:
        return False
    log.warning(
        "%s was written by another job while this run of %s was under way: whichever ends last replaces the other's "
        "values; give each job that may run at the same time on this node its own metrics.textfile_name "
        "(e.g. --set metrics.textfile_name=ctpipe-%s.prom)",
        path,
        run_dir,
        run_dir.name or "run",
        extra={"event": "metrics_textfile_shared"},
    )
    return True


class NvmlSampler:
    """Samples GPU utilisation (%) and memory (MB) every ``interval_s`` in a thread, when NVML is available."""

    def __init__(self, interval_s: float, metrics: RunMetrics | None = None):
        self.interval_s = interval_s
        self.metrics = metrics
        self.samples: deque[tuple[float, int, float, float, float]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self.available = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
            self.available = bool(self._handles)
        except ImportError:
            log.info("pynvml (nvidia-ml-py) is not installed: no GPU utilisation samples")
        except Exception as exc:  # noqa: BLE001 - any NVML failure (no driver, no GPU) just disables sampling
            log.info("NVML unavailable (%s): no GPU utilisation samples", exc)

    def start(self) -> None:
        if self.available:
            self._thread = threading.Thread(target=self._loop, name="ctpipe-nvml", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            t = time.time()
            for i, h in enumerate(self._handles):
                try:
                    util = nv.nvmlDeviceGetUtilizationRates(h).gpu
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                except nv.NVMLError as exc:
                    log.warning("NVML sampling stopped: %s", exc)
                    return
                sample = (t, i, float(util), mem.used / 2**20, mem.total / 2**20)
                self.samples.append(sample)
                if self.metrics is not None:
                    self.metrics.gpu_sample(i, float(util), mem.used / 2**20)
            self._stop.wait(self.interval_s)

    def drain(self) -> list[tuple[float, int, float, float, float]]:
        out = []
        while self.samples:
            out.append(self.samples.popleft())
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


def _port_error(bind: str, port: int, exc: OSError) -> ConfigError:
    """Why ``bind:port`` cannot be served, naming the option at fault: ``metrics.bind`` for an address that is not
    this machine's or a host name that does not resolve, else ``metrics.port`` (in use, or below 1024 without root)."""
    why = exc.strerror or str(exc)  # a resolver error's own words: its errno is not one os.strerror knows
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            f"cannot serve metrics on {bind}:{port}: {bind!r} is not an address of this machine ({why})",
            where="metrics.bind",
            fix="set metrics.bind to an address of this machine: 127.0.0.1 (this machine only) or 0.0.0.0 (every "
            "interface, for a Prometheus on another machine)",
        )
    if exc.errno == errno.EACCES:
        return ConfigError(
            f"cannot serve metrics on {bind}:{port} ({why}): ports below 1024 need root",
            where="metrics.port",
            fix="choose a port of 1024 or more (--metrics-port), e.g. 9108",
        )
    return ConfigError(
        f"cannot serve metrics on {bind}:{port} ({why})",
        where="metrics.port",
        fix="choose a free port (--metrics-port) or stop what holds it",
    )
