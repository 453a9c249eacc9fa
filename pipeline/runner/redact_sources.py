"""What ``ctpipe detect``, ``reconstruct`` and ``ingest`` show and write of the sources they are given: their
patient-named path components as tokens (:class:`pipeline.runner.redact.PathRedactor`, the rule of ``ctpipe run``),
on the console, in their logs, in the files they write and in the error that ends them, unless identifiers are kept."""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO, cast

from ..errors import CtpipeError
from .redact import PathRedactor
from .redact_active import redacting


class _Drop(logging.Filter):
    """Drops every record a handler gets (see :func:`sources_redactor`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def sources_redactor(sources: Iterable[str | os.PathLike[str]]) -> PathRedactor:
    """A redactor of the patient-named components of ``sources`` (the folders and files a command was given: ``ctpipe
    detect``, ``reconstruct``, ``ingest``), from a scan of their DICOM headers (the headers only: about 0.06 s for
    143 files), made before the command reads them so that everything it logs or prints is redacted from its first
    line; a case-cache entry (``<case>.npy`` / ``.json``) stands for the DICOM folder it was ingested from; a file
    given that is not DICOM (an image file) reads, its folders and all, as its name's token, as in ``ctpipe run``
    (:meth:`PathRedactor.add_skipped`'s ``given_alone``). The scan's own log records are dropped (the command's scan
    logs them again); a source that cannot be scanned (it does not exist, it is not DICOM) adds nothing, and the
    command says what is wrong with it."""
    from ..ingest.scan import scan_directory

    redactor = PathRedactor()
    roots: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_file() and path.suffix in (".npy", ".json"):
            from ..dicom_out.case import dicom_source_of

            try:
                origin = dicom_source_of(path)
            except (CtpipeError, OSError, ValueError):  # not a cache entry: the command says so
                origin = None
            path = origin if origin is not None else path
        if path.exists():
            roots.append(path)
    if not roots:
        return redactor
    drop = _Drop()
    handlers = [h for lg in (logging.getLogger(), logging.getLogger("pipeline")) for h in lg.handlers]
    for h in handlers:
        h.addFilter(drop)
    try:
        scan = scan_directory(roots, validate=False)
    except (CtpipeError, OSError):
        return redactor
    finally:
        for h in handlers:
            h.removeFilter(drop)
    redactor.add_scan(scan.series)
    # a file given that is not DICOM (an image file): no header was checked against its folders either
    redactor.add_skipped(((f.path, f.kind) for f in scan.skipped_files), roots=scan.roots, given_alone=True)
    return redactor


class _RedactingStream(io.TextIOBase):
    """A text stream (the console's) that writes what it is given redacted by ``redactor``."""

    def __init__(self, stream: TextIO, redactor: PathRedactor) -> None:
        super().__init__()
        self._stream, self._redactor = stream, redactor

    def write(self, text: str) -> int:
        self._stream.write(self._redactor(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding


def _redact_error(exc: BaseException, redactor: PathRedactor) -> None:
    """Rewrite the text of ``exc`` (a :class:`CtpipeError`'s problem, where and fix; an OSError's file names) in
    place, so that whoever prints it shows the patient-named components as tokens."""
    if isinstance(exc, CtpipeError):
        exc.problem = redactor(exc.problem)
        exc.where = redactor(exc.where) if exc.where is not None else None
        exc.fix = redactor(exc.fix) if exc.fix is not None else None
        exc.args = tuple(redactor(a) if isinstance(a, str) else a for a in exc.args)
    elif isinstance(exc, OSError):
        for attr in ("filename", "filename2"):
            value = getattr(exc, attr)
            if isinstance(value, str):
                setattr(exc, attr, redactor(value))


@contextmanager
def redacting_sources(sources: Iterable[str | os.PathLike[str]], *, keep_identifiers: bool = False) -> Iterator[None]:
    """For a command given ``sources`` (``ctpipe detect``, ``reconstruct``, ``ingest``): unless ``keep_identifiers``,
    the patient-named components of their paths (:func:`sources_redactor`, the rule of ``ctpipe run``) read as their
    tokens, for the block, in the log records (:func:`.redact_active.redacting`), in what it prints on stdout and stderr, in
    what it writes through :func:`.redact_active.redact` and :func:`.redact_active.redacted_data`, and in the error (a
    :class:`CtpipeError` or an OSError) that ends it."""
    if keep_identifiers:
        yield
        return
    redactor = sources_redactor(sources)
    out, err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _RedactingStream(out, redactor))
    sys.stderr = cast(TextIO, _RedactingStream(err, redactor))
    try:
        with redacting(redactor):
            yield
    except (CtpipeError, OSError) as exc:
        _redact_error(exc, redactor)
        raise
    finally:
        sys.stdout, sys.stderr = out, err
