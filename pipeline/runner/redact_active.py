"""The redactor of the run going on in a process (:class:`.redact.PathRedactor`), and what it redacts.

:func:`redacting` makes a redactor the process's for a block and filters every handler of the root and
``pipeline`` loggers with it (:class:`RedactFilter`); :func:`redact` and :func:`redacted_data` rewrite text and
JSON-like data with it; :func:`held_back` holds back the records logged in a block until the block has found the
identifiers they may hold; :func:`redact_in_worker` sets up a worker process with the main process's components.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .redact import PathRedactor

#: LogRecord attributes that are not the record's message or its ``extra`` fields: never rewritten.
_RECORD_OWN = frozenset(logging.makeLogRecord({}).__dict__) - {"msg", "args"}
_active: PathRedactor | None = None


def redacted_data(data: Any) -> Any:
    """A JSON-like ``data`` (dicts, lists, strings, numbers) with every string in it redacted (:func:`redact`); keys
    are kept."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, list):
        return [redacted_data(x) for x in data]
    if isinstance(data, dict):
        return {k: redacted_data(x) for k, x in data.items()}
    return data


def redact(text: Any) -> Any:
    """``text`` as a run may write it outside ``dicom/``: its patient-named path components replaced while a run
    that redacts is going on (:func:`redacting`); anything but a string is returned as it is."""
    if _active is None or not isinstance(text, str):
        return text
    return _active(text)


def active() -> PathRedactor | None:
    """The redactor of the run going on in this process (None: none, or identifiers are kept)."""
    return _active


class RedactFilter(logging.Filter):
    """Rewrites a log record's message and its string ``extra`` fields (:func:`redact`) before a handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _active is None:
            return True
        record.msg, record.args = _active(record.getMessage()), None
        for key, value in list(record.__dict__.items()):
            if key not in _RECORD_OWN and key != "msg" and isinstance(value, str):
                setattr(record, key, _active(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _active(record.exc_text)
        return True


class _Hold(logging.Filter):
    """Keeps the records a handler gets, instead of letting it write them (see :func:`held_back`): the handler's first
    filter, so that its other filters (:class:`RedactFilter`) see a record only when it is written."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:  # its text as it is now (the arguments may change before it is written), not redacted yet
            try:
                record.msg, record.args = record.getMessage(), None
            except (TypeError, ValueError):  # a bad format: the handler says so when it writes the record
                pass
        self.records.append(record)
        return False


@contextmanager
def held_back() -> Iterator[None]:
    """While a run redacts: hold back the records logged in the block (a folder scan names the files it skips before
    their series' identifiers are read), then write them, redacted with what the block found (the redactor's
    components as they are at its end: a folder's token that a series found later in the block dropped is not in
    them), in their order. Nested, the outermost block writes them."""
    if _active is None:
        yield
        return
    loggers = (logging.getLogger(), logging.getLogger("pipeline"))
    holds = [_Hold(h) for lg in loggers for h in lg.handlers]
    for hold in holds:
        hold.handler.filters.insert(0, hold)  # before the redaction: a record is redacted when it is written
    try:
        yield
    finally:
        for hold in holds:
            hold.handler.removeFilter(hold)
        for hold in holds:
            for record in hold.records:
                hold.handler.handle(record)


@contextmanager
def redacting(redactor: PathRedactor | None) -> Iterator[None]:
    """Make ``redactor`` the process's (None: nothing redacted) and filter every handler of the root and ``pipeline``
    loggers with it for the block; the previous state afterwards."""
    global _active
    before, _active = _active, redactor
    filt = RedactFilter()
    loggers = (logging.getLogger(), logging.getLogger("pipeline"))  # run.log's handler is the second's
    handlers = [h for lg in loggers for h in lg.handlers] if redactor is not None else []
    for h in handlers:
        h.addFilter(filt)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(filt)
        _active = before


def redact_in_worker(components: dict[str, str]) -> None:
    """In a worker process (after its run.log handler is set up): redact its records with the main process's
    ``components`` (:attr:`PathRedactor.shared`) for the rest of its life."""
    global _active
    _active = PathRedactor.of(components)
    filt = RedactFilter()
    for h in logging.getLogger("pipeline").handlers:
        h.addFilter(filt)
