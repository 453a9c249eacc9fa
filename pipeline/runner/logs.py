"""Structured logs: one JSON object per line in ``RUN_DIR/run.log``.

Every record has ``t`` (ISO 8601, UTC), ``level``, ``logger``, ``process``,
``msg``, and the ``extra`` fields a caller passes (``event``, ``case_id``,
``stage``, ...). A record logged while a stage runs (:func:`log_context`) carries
that case's ``case_id`` and ``stage`` even when its caller knows neither. Each
process appends whole lines, so the main process and the workers can share the file.

Worker processes and Ray actors log to ``run.log`` only (:func:`log_as_worker`); the warnings and errors their
stages log are sent back with each stage's result (:func:`collect_for_console`) and shown by the main process
(:func:`to_console`), so that the console of ``ctpipe run`` shows the same whatever the number of workers.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Fields a record carries when its caller passes them. The run's end record (``run_end``) has the figures of the
#: summary line: ``cases`` (found by discovery), ``done`` (completed for the first time by this run), ``done_again``
#: (done again by this run because their published folder was removed), ``done_earlier`` (by earlier runs of the
#: folder), ``still_written`` (left for the next run: their series still being written), ``quarantined_new`` and ``quarantined_earlier`` (quarantined by this run, still from earlier runs),
#: ``unfinished`` (left for the next run), ``elapsed_s`` (s), ``run_status`` (completed, interrupted: Ctrl-C, SIGTERM,
#: SIGHUP or a run folder that could not be written, failed) and ``exit_status``. ``changed``: the options a refused
#: rerun would have changed (``result_options_changed``). ``series_uid``: the SeriesInstanceUID a record of ``ctpipe
#: listen`` or of a PACS retrieve is about (redacted as the message is); ``quality_flag``: the findings' quality flag a
#: detector warning is about (``thick_slices``, ``coarse_pixels``, ``lossy_compressed``).
_FIELDS: tuple[str, ...] = (
    "event",
    "case_id",
    "case_key",
    "series_uid",
    "quality_flag",
    "stage",
    "reason",
    "error_class",
    "run_id",
    "wall_s",
    "latency_s",
    "quarantined_new",
    "quarantined_earlier",
    "cases",
    "done",
    "done_again",
    "done_earlier",
    "still_written",
    "unfinished",
    "elapsed_s",
    "run_status",
    "exit_status",
    "changed",
)


_CONTEXT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("ctpipe_log_context", default=None)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (``case_id``, ``stage``, ...) to every JSON record logged inside the block."""
    token = _CONTEXT.set({**(_CONTEXT.get() or {}), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class JsonLinesFormatter(logging.Formatter):
    def __init__(self, process: str):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "t": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": self.process,
            "msg": record.getMessage(),
        }
        context = _CONTEXT.get() or {}
        for key in _FIELDS:
            if hasattr(record, key):
                data[key] = getattr(record, key)
            elif key in context:
                data[key] = context[key]
        if record.exc_info:
            data["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class _LineHandler(logging.FileHandler):
    """Appends one line per record and flushes it at once.

    A record that cannot be written (the disk is full, the folder became read-only) is dropped
    without the traceback that ``logging`` prints by default: the run itself reports the failure in
    one line. ``lost`` counts the records dropped.
    """

    lost = 0
    #: what :func:`attach_jsonl` changed on the ``pipeline`` logger for this handler (None: nothing)
    lowered: _Lowered | None = None

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.flush()

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            self.lost += 1

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # its last lines could not be written
            self.lost += 1

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            self.lost += 1
        else:  # a record that cannot be formatted is a bug: logging's own report
            super().handleError(record)


class _Forward(logging.Handler):
    """Passes the ``pipeline`` loggers' records at or above ``threshold`` on to the handlers above ``pipeline`` (the
    application's, e.g. the root logger's), as propagation would: while a run lowers the ``pipeline`` level for
    ``run.log``, the application keeps seeing only the records it saw before."""

    def __init__(self, threshold: int):
        super().__init__(logging.NOTSET)
        self.threshold = threshold
        self.pid = os.getpid()  # a worker forked from this process inherits it, and logs to run.log only

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self.threshold or os.getpid() != self.pid:
            return
        parent = logging.getLogger("pipeline").parent
        while parent is not None:
            for handler in parent.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            parent = parent.parent if parent.propagate else None


@dataclass
class _Lowered:
    """What :func:`attach_jsonl` changed on the ``pipeline`` logger, for :func:`detach` to put back."""

    level: int
    propagate: bool
    forward: _Forward | None


def attach_jsonl(path: Path, *, process: str, level: int = logging.INFO) -> logging.Handler:
    """Send the ``pipeline`` loggers' records (``level`` and above) to ``path`` as JSON lines. The run's main process
    first ends a last line that an earlier run left cut short (a full disk), so every later line parses.

    When the ``pipeline`` loggers are set to a higher level (an application's ``logging.basicConfig(level=WARNING)``),
    they are lowered to ``level`` for ``run.log`` while the application's handlers still get only what they got
    before; :func:`detach` restores the logger's level and propagation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if process == "main":
        end_last_line(path)
    handler = _LineHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(JsonLinesFormatter(process))
    handler.setLevel(level)
    root = logging.getLogger("pipeline")
    threshold = root.getEffectiveLevel()
    if threshold > level:
        # a worker stops propagating at once (it logs to run.log only); the main process talks to the application
        forward = _Forward(threshold) if root.propagate and process == "main" else None
        handler.lowered = _Lowered(root.level, root.propagate, forward)
        if forward is not None:
            root.addHandler(forward)
            root.propagate = False
        root.setLevel(level)
    root.addHandler(handler)
    return handler


def end_last_line(path: Path) -> bool:
    """Append a newline to ``path`` when its last byte is not one (a line cut short); whether one was added."""
    try:
        with open(path, "rb+") as fh:
            if fh.seek(0, os.SEEK_END) == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                return False
            fh.write(b"\n")
            return True
    except FileNotFoundError:
        return False


def detach(handler: logging.Handler) -> None:
    """Stop :func:`attach_jsonl`'s ``handler``; the ``pipeline`` logger's level and propagation are put back as they
    were before the first handler still attached lowered them."""
    root = logging.getLogger("pipeline")
    root.removeHandler(handler)
    handler.close()
    lowered = getattr(handler, "lowered", None)
    if lowered is None:
        return
    others = [h for h in root.handlers if isinstance(h, _LineHandler)]
    if others:  # another run in this process still writes its run.log: it restores the logger when it ends
        others[0].lowered = lowered
        return
    if lowered.forward is not None:
        root.removeHandler(lowered.forward)
    root.setLevel(lowered.level)
    root.propagate = lowered.propagate


_IN_WORKER = False  # this process is a worker process or a Ray actor: its console is the main process'


def log_as_worker(path: Path, *, process: str) -> None:
    """Set up logging in a worker process or Ray actor named ``process``: the ``pipeline`` loggers' records go to
    ``path`` (``run.log``) only, never to handlers inherited from the main process (a forked worker's copies of its
    run.log and console handlers would write each record twice), and the warnings of its stages are collected for
    the main process' console (:func:`collect_for_console`)."""
    global _IN_WORKER
    root = logging.getLogger("pipeline")
    for handler in list(root.handlers):
        if isinstance(handler, (_LineHandler, _Forward)):  # the main process' own, inherited by fork
            root.removeHandler(handler)
    attach_jsonl(path, process=process)
    root.propagate = False  # the main process talks to the user
    _IN_WORKER = True


class _Collect(logging.Handler):
    """Keeps the records it gets as plain, picklable dicts (see :func:`collect_for_console`)."""

    def __init__(self, records: list[dict[str, Any]]):
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        context = _CONTEXT.get() or {}
        data: dict[str, Any] = {
            "name": record.name,
            "levelno": record.levelno,
            "levelname": record.levelname,
            "msg": record.getMessage(),
            "created": record.created,
            "msecs": record.msecs,
        }
        for key in _FIELDS:
            value = getattr(record, key, context.get(key))
            if value is not None:
                data[key] = value
        self.records.append(data)


@contextmanager
def collect_for_console() -> Iterator[list[dict[str, Any]]]:
    """In a worker process or Ray actor (:func:`log_as_worker`): the warnings and errors of the ``pipeline`` loggers
    logged inside the block, as plain dicts that travel with a stage's result, for :func:`to_console` in the main
    process. Elsewhere (the stages run in the main process) the list stays empty: those records reach the console
    as they are logged."""
    records: list[dict[str, Any]] = []
    if not _IN_WORKER:
        yield records
        return
    root = logging.getLogger("pipeline")
    handler = _Collect(records)
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


def to_console(records: list[dict[str, Any]]) -> None:
    """Show records a worker collected (:func:`collect_for_console`) to the handlers above the ``pipeline`` logger
    (``ctpipe run``'s console, a notebook's handlers), as if logged in this process, at the level those handlers
    asked for; ``run.log`` has them already, from the worker."""
    root = logging.getLogger("pipeline")
    forward = next((h for h in root.handlers if isinstance(h, _Forward)), None)
    if forward is None and not root.propagate:  # the application keeps the pipeline's records from its handlers
        return
    for data in records:
        record = logging.makeLogRecord({**data, "args": None})
        threshold = forward.threshold if forward is not None else logging.getLogger(record.name).getEffectiveLevel()
        if record.levelno < threshold:
            continue
        parent = root.parent
        while parent is not None:
            for handler in parent.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            parent = parent.parent if parent.propagate else None
