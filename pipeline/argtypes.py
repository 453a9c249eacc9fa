"""Argument types for the ``ctpipe`` sub-commands: numbers in their range, refused by argparse with the range; names
of a fixed set in any letter case (:func:`any_case`); a non-empty ``--out`` folder and sources; and the
``--keep-identifiers`` option the single-series commands share (:func:`add_keep_identifiers`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import devices


class NumberIn:
    """An argparse ``type`` reading ``kind`` (int or float) within ``lo..hi`` (either end open when ``None``).

    ``lo`` and ``hi`` stay readable, so that a command's ``--help`` can be checked to state the range it enforces.
    """

    def __init__(self, kind: type[int] | type[float], lo: float | None = None, hi: float | None = None) -> None:
        self.kind = kind
        self.lo = lo
        self.hi = hi
        self.__name__ = kind.__name__  # argparse names the type in its messages

    def span(self) -> str:
        """The range as the error message gives it: ``lo..hi``, ``>= lo`` or ``<= hi``."""
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            return f"{lo}..{hi}"
        return f">= {lo}" if lo is not None else f"<= {hi}"

    def __call__(self, text: str) -> float:
        kind, lo, hi = self.kind, self.lo, self.hi
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):  # float('nan') and float('inf') parse, and NaN passes every comparison
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range ({self.span()})")
        return value


def number_in(kind: type[int] | type[float], lo: float | None = None, hi: float | None = None) -> NumberIn:
    """An argparse ``type`` reading ``kind`` (int or float) within ``lo..hi`` (either end open when ``None``)."""
    return NumberIn(kind, lo, hi)


def as_choice(value: object, choices: Iterable[str]) -> str | None:
    """The one of ``choices`` that ``value`` names, in any letter case (``STL``, ``Dali``, ``hfs``), as the choice is
    spelt; None when it names none. Every option that takes names from a fixed set reads its value so, on the
    command line (:func:`any_case`, ``--formats``, ``--organs``, ``--dicom``), in ``--set``, the environment and config
    files (:func:`pipeline.config_check.check_value`), as the device names are read (:mod:`pipeline.devices`)."""
    if not isinstance(value, str):
        return None
    folded = value.casefold()
    return next((c for c in choices if c.casefold() == folded), None)


def any_case(choices: Iterable[str]) -> Callable[[str], str]:
    """An argparse ``type`` for an option with ``choices=``: the choice named in any letter case, as it is spelt
    (:func:`as_choice`); a text that names none is left as it is, for argparse to refuse with the choices."""
    names = tuple(choices)

    def choice(text: str) -> str:
        return as_choice(text, names) or text

    choice.__name__ = "choice"
    return choice


def device_name(text: str) -> str:
    """An argparse ``type`` for a one-process command's ``--device``: one of :data:`~pipeline.devices.DEVICE_WORDS` or
    ``cuda:N`` (any case), as the name torch reads (:func:`pipeline.devices.device_name`: ``gpu`` is ``cuda``); else
    the error naming the value and the ones allowed. Whether torch sees that GPU is checked when the command runs
    (exit status 1 there)."""
    name = devices.device_name(text)
    if name is None:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; allowed: {devices.allowed_devices()}")
    return name


def out_folder(text: str) -> str:
    """An argparse ``type`` for ``--out`` (and ``ctpipe phantom``'s OUT_DIR): the folder as typed (messages name it so, ``runs/night/`` too); an empty or
    blank value (``--out "$RUN_DIR"`` with the variable unset) is refused, as it would name the current folder and
    fill it with the command's files."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is empty: it would write into the current folder; give the folder to write, e.g. runs/r1"
        )
    return text


def in_folder(text: str) -> str:
    """An argparse ``type`` for a folder or file a command reads (a source, a run folder), as typed; an empty or blank
    value (a variable left unset) is refused, as it would name the current folder: read as the source, or taken for
    the folder the message names."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is empty: it would name the current folder; give the folder or file to read, e.g. scans/case1"
        )
    return text


def in_path(text: str) -> Path:
    """:func:`in_folder` as a :class:`~pathlib.Path`."""
    return Path(in_folder(text))


def out_path(text: str) -> Path:
    """:func:`out_folder` as a :class:`~pathlib.Path`, for the commands that join file names to it."""
    return Path(out_folder(text))


#: The help of ``--keep-identifiers`` of ``ctpipe detect`` and ``ctpipe reconstruct`` (:func:`add_keep_identifiers`).
KEEP_IDENTIFIERS_HELP = (
    "keep folder and file names that hold a patient identifier (the PatientID, AccessionNumber, a part of the "
    "PatientName or the PatientBirthDate of the source's DICOM headers) as they are on the console, in errors and "
    "logs and in the files written outside the DICOM results (findings JSON and CSV, PNGs, measurements), for "
    "outputs kept where identifiers may be, and names an image file's outputs by the file's name; by default each "
    "such name reads <patient:xxxxxx> (a skipped file <file:xxxxxx>.pdf, a folder below the source holding only "
    "skipped files <folder:xxxxxx>), as ctpipe run writes "
    "them without --keep-identifiers, and an image file's outputs are named image-<12 hex digits>, a digest of the image"
)


def add_keep_identifiers(parser: argparse.ArgumentParser) -> None:
    """Add ``--keep-identifiers`` (``args.keep_identifiers``, default False) to a command that reads its sources
    through :func:`pipeline.runner.redact_sources.redacting_sources`."""
    parser.add_argument("--keep-identifiers", action="store_true", help=KEEP_IDENTIFIERS_HELP)


#: The :class:`argparse.Namespace` attribute where :class:`StoreOnce` notes each option given so far (removed by
#: :func:`pipeline.cli.parse_command_line`).
GIVEN = "_given_once"


class StoreOnce(argparse._StoreAction):
    """argparse's ``"store"`` action for a single-value option (``--workers N``, ``--to ADDRESS``), but an option given
    twice on one command line with different values (``--workers 2 --workers 4``) is a bad argument (exit status 2)
    naming both and the fix, as a flag and a ``--set`` item that disagree are, rather than the last one taken without
    a word; the same value twice is taken. Options sharing a destination (an earlier name kept for old scripts, as
    ``ctpipe ingest --workers`` for ``--threads``) count as one. Every ``ctpipe`` command's parser
    (:class:`CommandParser`) stores with it; repeatable options (``action="append"``) are not concerned."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, tuple[str, Any]] = getattr(namespace, GIVEN, None) or {}
        label = option_string or self.dest
        if self.dest in given and given[self.dest][1] != values:
            raise argparse.ArgumentError(None, self._twice(given[self.dest], (label, values)))
        given[self.dest] = (label, values)
        setattr(namespace, GIVEN, given)
        super().__call__(parser, namespace, values, option_string)

    def _twice(self, first: tuple[str, Any], second: tuple[str, Any]) -> str:
        """The message for the option given as ``first`` and as ``second`` (each (flag, value)): the flag(s), both
        values as read and the fix, as :class:`~pipeline.errors.UsageError` words it."""
        from .errors import UsageError
        from .pacs.address import redact

        (flag, value), (other_flag, other) = first, second
        a, b = redact(self._shown(value)), redact(self._shown(other))
        where = flag if flag == other_flag else f"{flag} and {other_flag}"
        return str(
            UsageError(
                f"given twice, as {a} and as {b}",
                where=where,
                fix=f"give it once: either {flag} {a} or {other_flag} {b}, not both",
            )
        )

    def _shown(self, value: Any) -> str:
        """``value`` as the command line gives it: several values (``nargs``) apart, a list one value holds
        (``--dicom sr,seg``) joined by commas."""
        if isinstance(value, (list, tuple)):
            if self.nargs not in (None, argparse.OPTIONAL):
                return " ".join(map(str, value))
            return ",".join(map(str, value)) or "none"
        return str(value)


class CommandParser(argparse.ArgumentParser):
    """The parser of ``ctpipe`` and of each of its commands: an option argparse would store (no ``action=``, or
    ``action="store"``) is stored by :class:`StoreOnce`, so that none of them takes the last of two different values
    without a word."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)
