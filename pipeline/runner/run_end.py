"""The end of a run of :func:`~pipeline.runner.batch.run_batch`: what it did counted from the run store (its summary,
its end record, the metrics' final values), its report built, and its summary line logged; and the writes to the run
folder that, should the folder fail (disk full), leave a note in the summary instead of a traceback.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config import Config
from .faults import environment_failure
from .metrics import RunMetrics, warn_if_rewritten
from .report import build_report, mark_not_rebuilt, mark_run_started
from .run_summary import EXIT_INTERRUPTED, RunSummary
from .stage import CaseSpec
from .store import RunStore

log = logging.getLogger(__name__)


def record_end(
    store: RunStore,
    summary: RunSummary,
    *,
    cfg: Config,
    run_dir: Path,
    run_id: str,
    keys: set[str],
    status: str,
    signalled: bool,
    started_wall: float,
    metrics: RunMetrics,
    node_file: Path | None,
) -> int:
    """Count what the run did with its cases ``keys`` (its discovery's case keys) from the store into ``summary``
    (quarantined, unfinished, done, done again), record the run's end (``status``; ended at ``started_wall`` +
    ``summary.elapsed_s``, Unix s) and set and write the metrics' final values; returns the run's exit status
    (:data:`EXIT_INTERRUPTED` when ``signalled``)."""
    failed_rows = store.cases_with_status("failed")
    # quarantined by this run (its latest attempt is this run's), or still from an earlier run and not retried
    summary.quarantined = [
        (r["case_id"], r["error_class"], r["reason"]) for r in failed_rows if r["case_key"] in keys and r["run_id"] == run_id
    ]
    summary.still_quarantined = [
        (r["case_id"], r["error_class"], r["reason"]) for r in failed_rows if r["case_key"] in keys and r["run_id"] != run_id
    ]
    summary.quarantined_in_folder = len(failed_rows)  # every source's: RUN_DIR/quarantine holds them all
    summary.unfinished = sum(r["case_key"] in keys for r in store.cases_with_status("pending", "running"))
    done_here = [r for r in store.cases_with_status("done") if r["case_key"] in keys and r["run_id"] == run_id]
    # done by this run, first done by an earlier one: a redo, not a new case
    summary.redone = sum((r["first_done_at"] or r["ended_at"]) < r["ended_at"] for r in done_here)
    if (summary.stopped or signalled) and not summary.done:  # stopped before the engine could count: the store's
        summary.done = len(done_here)
    summary.done = max(0, summary.done - summary.redone)  # cases completed for the first time: redos apart
    quietly(
        summary,
        run_dir,
        "the run's record",
        lambda: store.end_run(
            run_id,
            ended_at=started_wall + summary.elapsed_s,  # the summary line's time, so the report's active time is it
            status=status,
            n_cases=summary.total,
            n_done=summary.done,
            n_failed=len(summary.quarantined),
            n_skipped=summary.skipped,
            n_failed_earlier=len(summary.still_quarantined),
        ),
    )
    metrics.quarantined_at_end(len(summary.quarantined), len(summary.still_quarantined))
    exit_status = EXIT_INTERRUPTED if signalled else summary.exit_code
    metrics.run_ended(exit_status, ended_at=started_wall + summary.elapsed_s)  # the run's end, not the linger's
    if cfg.metrics.textfile:
        summary.metrics_file = quietly(summary, run_dir, "metrics.prom", lambda: metrics.write_textfile(run_dir / "metrics.prom"))
    if node_file is not None:
        warn_if_rewritten(node_file, since=started_wall, run_dir=run_dir)
        summary.node_metrics_file = quietly(summary, run_dir, node_file.name, lambda: metrics.write_textfile(node_file))
    return exit_status


def build_or_mark_report(summary: RunSummary, cfg: Config, run_dir: Path, run_id: str) -> None:
    """Build the run folder's report (``report.enabled``), else mark the one an earlier run left as not rebuilt."""
    if cfg.report.enabled:
        rep = quietly(
            summary,
            run_dir,
            "the report",
            lambda: build_report(
                [run_dir], run_dir / "report", bin_minutes=cfg.report.bin_minutes, hours_per_day=cfg.report.hours_per_day
            ),
        )
        summary.report_html = rep.html if rep is not None else None
    else:  # an earlier run's report stays, and says that its figures are not this run's
        mark_report(run_dir, not_rebuilt_by=run_id)


def log_run_end(summary: RunSummary, *, run_id: str, status: str, signalled: bool, exit_status: int) -> None:
    """The run's summary line in the log (a warning for a run stopped by a signal), its figures also as fields."""
    log.log(
        logging.WARNING if signalled else logging.INFO,
        "run %s %s: %d done%s, %d newly quarantined, %d still quarantined from earlier runs (not retried), "
        "%d unfinished (left for the next run), %d already done earlier, of %d, %.1f s",
        run_id,
        "interrupted (Ctrl-C, SIGTERM or SIGHUP; the same command resumes it)" if signalled else "finished",
        summary.done,
        f", {summary.redone} done again (published folder removed)" if summary.redone else "",
        len(summary.quarantined),
        len(summary.still_quarantined),
        summary.unfinished,
        summary.skipped,
        summary.total,
        summary.elapsed_s,
        extra={  # the summary line's figures as fields, for log pipelines that read them without parsing msg
            "event": "run_end",
            "run_id": run_id,
            "cases": summary.total,
            "done": summary.done,
            "done_again": summary.redone,
            "done_earlier": summary.skipped,
            "quarantined_new": len(summary.quarantined),
            "quarantined_earlier": len(summary.still_quarantined),
            "unfinished": summary.unfinished,
            "still_written": len(summary.still_written),
            "elapsed_s": summary.elapsed_s,
            "run_status": status,
            "exit_status": exit_status,
        },
    )


def still_written_rows(written: Sequence[tuple[str, str]], cases: Sequence[CaseSpec]) -> list[dict[str, Any]]:
    """Rows of the run store's ``skipped`` table for the cases left for the next run because their series was still
    being written into the source while they ran (kind ``still_written``)."""
    by_id = {c.case_id: c for c in cases}
    rows = []
    for cid, why in written:
        case = by_id.get(cid)
        item = (case.series_uid if case is not None else None) or cid
        rows.append({"what": "series", "item": item, "kind": "still_written", "reason": why, "source": case and case.source})
    return rows


def mark_report(run_dir: Path, *, not_rebuilt_by: str | None = None) -> None:
    """Mark the run folder's report as in progress (:func:`.report.mark_run_started`), or, with ``not_rebuilt_by``
    (the id of a run that ended with ``report.enabled: false``), as not rebuilt by that run
    (:func:`.report.mark_not_rebuilt`); should that fail, the run goes on and the log says why."""
    try:
        if not_rebuilt_by is None:
            mark_run_started(run_dir / "report", run_dir)
        else:
            mark_not_rebuilt(run_dir / "report", run_dir, run_id=not_rebuilt_by)
    except (OSError, sqlite3.Error) as exc:
        log.warning(
            "could not mark the report in %s as %s (%s: %s)%s",
            run_dir / "report",
            "in progress" if not_rebuilt_by is None else f"not rebuilt by run {not_rebuilt_by}",
            type(exc).__name__,
            exc,
            "; it is rebuilt when the run ends" if not_rebuilt_by is None else "; ctpipe report rebuilds it",
            extra={"event": "write_failed"},
        )


def crash(exc: BaseException, run_id: str) -> str:
    """An unexpected error of the main process, logged (its traceback at info level: run.log, not the console); its
    one-line text for the summary."""
    text = f"{type(exc).__name__}: {exc}"
    log.error("run %s ended by an error: %s", run_id, text, extra={"event": "run_failed", "run_id": run_id})
    log.info("run %s: traceback of the error that ended it", run_id, exc_info=exc, extra={"run_id": run_id})
    return text


def quietly(summary: RunSummary, run_dir: Path, what: str, write: Callable[[], Any]) -> Any:
    """``write()``; when the run folder cannot take it (disk full, ...), a note in the summary instead of a traceback."""
    try:
        return write()
    except (OSError, sqlite3.Error) as exc:
        env = environment_failure(exc, run_dir=run_dir)
        if env is None:
            raise
        note = f"not written: {what} ({env.describe()})"
        summary.notes.append(note)
        if summary.stopped is None:
            summary.stopped = env.describe()
        log.error("%s", note, extra={"event": "write_failed"})
        return None


def raise_environment(exc: BaseException, run_dir: Path) -> None:
    """Raise :class:`RunEnvironmentError` for an environmental ``exc`` (the caller re-raises anything else)."""
    env = environment_failure(exc, run_dir=run_dir)
    if env is not None:
        raise env.error() from exc
