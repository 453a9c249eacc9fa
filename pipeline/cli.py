"""The ``ctpipe`` command: a thin dispatcher over each stage's sub-commands.

Each stage package has a ``cli`` module with ``register(subparsers)`` that adds
its sub-commands; a sub-command's ``func(args) -> int`` returns the exit status.
Heavy imports happen inside those functions, so ``ctpipe --help`` is fast.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import logging
import os
import select
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .argtypes import GIVEN, CommandParser
from .errors import CtpipeError, UsageError

# Stage command modules, in the order data flows through them.
COMMAND_MODULES = (
    "pipeline.phantom.cli",  # ctpipe phantom
    "pipeline.ingest.cli",  # ctpipe ingest
    "pipeline.detection.cli",  # ctpipe detect, ctpipe evaluate
    "pipeline.reconstruction.cli",  # ctpipe reconstruct
    "pipeline.runner.cli",  # ctpipe run, ctpipe report
    "pipeline.pacs.cli",  # ctpipe listen, ctpipe send; PACS addresses as sources of ctpipe run (after runner.cli)
)

log = logging.getLogger("pipeline")

VERBOSE_HELP = "more log output (-v info, -vv debug)"


def setup_logging(verbosity: int, *, quiet: bool = False, log_file: str | None = None) -> None:
    """Console logging for the CLI (warnings by default, -v info, -vv debug), timestamps in UTC (``...Z``)."""
    level = logging.WARNING
    if verbosity == 1:
        level = logging.INFO
    elif verbosity >= 2:
        level = logging.DEBUG
    if quiet:
        level = logging.ERROR
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers[0].setLevel(level)
    if log_file:
        fh = logging.FileHandler(log_file)
        fh.setLevel(logging.DEBUG)
        handlers.append(fh)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime  # UTC, as in run.log, the run store and the reports, whatever TZ says
    for h in handlers:
        h.setFormatter(formatter)
    logging.basicConfig(level=min(h.level for h in handlers) if log_file else level, handlers=handlers, force=True)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="ctpipe",
        description="Chest CT DICOM → lung-nodule findings, 3D organ reconstructions and throughput reports.",
    )
    parser.add_argument("--version", action="version", version=f"ctpipe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # each command a CommandParser too
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # stage not installed in this build
            raise
        module.register(sub)
    for command in sub.choices.values():  # -v also after the command (ctpipe run SRC --out DIR -v), as --quiet is
        command.add_argument("-v", "--verbose", dest="verbose_after", action="count", default=0, help=VERBOSE_HELP)
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an argument no option takes is refused by the command it was given to, below
    that command's usage (``ctpipe run: error: unrecognized arguments: --wrokers 4 (did you mean --workers?)``),
    rather than by ``ctpipe`` itself below its list of commands; exit status 2, as argparse's. A single-value option
    given twice with different values is refused so too (:class:`~pipeline.argtypes.StoreOnce`)."""
    args, extras = parser.parse_known_args(argv)
    vars(args).pop(GIVEN, None)
    if extras:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        command = sub.choices.get(args.command) if sub is not None and getattr(args, "command", None) else None
        if command is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        command.error(unrecognized_text(command, args.command, extras))
    return args


def unrecognized_text(command: argparse.ArgumentParser, name: str, extras: Sequence[str]) -> str:
    """The error for the arguments ``extras`` that no option of ``ctpipe name`` takes: them, the option an unknown
    ``--option`` most likely misspells, where a command's several sources go, and its ``--help``."""
    import difflib

    text = f"unrecognized arguments: {' '.join(extras)}"
    options = {
        o[2:]: o
        for action in command._actions
        if action.help != argparse.SUPPRESS  # an earlier name kept for old scripts is not suggested
        for o in action.option_strings
        if o.startswith("--")
    }
    for extra in extras:
        if extra.startswith("--") and extra != "--":
            close = difflib.get_close_matches(extra[2:].split("=", 1)[0], list(options), n=1, cutoff=0.6)
            if close:
                text += f" (did you mean {options[close[0]]}?)"
                break
    # a word after an unknown --option is taken for its value; another one is a source given apart from the others
    loose = [
        e
        for before, e in zip(["", *extras], extras)
        if not e.startswith("-") and not (before.startswith("--") and "=" not in before)
    ]
    several = [a for a in command._actions if not a.option_strings and a.nargs in ("+", "*")]
    if several and loose:
        metavar = several[0].metavar or several[0].dest.upper()
        text += f"; give every {metavar} together, all before or all after the options"
    return f"{text}; see ctpipe {name} --help"


def main(argv: Sequence[str] | None = None, *, exits: bool = False) -> int:
    """Run the ``ctpipe`` command line ``argv`` (default: the process' arguments); its exit status. ``exits``: the
    process exits with that status right after (:func:`console_main`), so a command may keep its own signal handling
    until then instead of putting the caller's back."""
    parser = build_parser()
    args = parse_command_line(parser, argv)
    args.exits = exits
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _tolerant_console()
    setup_logging(args.verbose + getattr(args, "verbose_after", 0), quiet=getattr(args, "quiet", False))
    out = getattr(args, "out", None)
    new_folders = _missing_folders(out) if isinstance(out, (str, Path)) else []
    code = 1
    try:
        code = int(args.func(args) or 0)
    except UsageError as exc:  # a value on the command line that is not allowed: a bad argument, as argparse's own
        print(f"ctpipe {args.command}: error: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except CtpipeError as exc:
        print(f"ctpipe {args.command}: error: {exc}", file=sys.stderr)
    except OSError as exc:  # a file or folder the command reads or writes: named, with the system's reason
        if isinstance(exc, BrokenPipeError) and _stdout_closed():  # ctpipe ingest ... | head: the reader went away
            code = EXIT_STDOUT_CLOSED
        else:
            print(f"ctpipe {args.command}: error: {_os_error_text(exc)}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    finally:  # also when an unforeseen exception ends the command (code still 1)
        if code != 0:
            _remove_if_empty(new_folders)
    return code


def _os_error_text(exc: OSError) -> str:
    """The error line of an :class:`OSError` a command met: the file or folder, the system's reason and the fix; a
    full disk, a spent quota, a file-size limit or a read-only file system (the machine's, not the path's) named as
    such, with what to do about it."""
    from .runner.faults import WRITE_ERRNOS, EnvironmentFailure

    if exc.errno in WRITE_ERRNOS and exc.filename:
        target = Path(os.fsdecode(exc.filename))
        folder = target if target.is_dir() else target.parent
        return str(EnvironmentFailure(exc.errno, str(folder)).error())
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}. Fix: check the path"


def _tolerant_console() -> None:
    """Let the console print what its encoding cannot hold as escapes (``\\udce4``, ``\\u80ba``) rather than stop
    the command with UnicodeEncodeError: a file name whose bytes are not valid UTF-8, or a SeriesDescription in a
    script the terminal's character set lacks."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


#: Exit status of a bad command line: argparse's own for a malformed one, and ours for a value that is not allowed.
EXIT_USAGE = 2

#: Exit status when whoever read the standard output closed it early (``| head``): 128 + SIGPIPE, as the shell's own.
EXIT_STDOUT_CLOSED = 141


def _stdout_closed() -> bool:
    """Whether the standard output's reader is gone; if so, what is left to print goes nowhere, without a second
    error when Python flushes it at exit."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        closed = any(events & select.POLLERR for _, events in poll.poll(0))  # a pipe whose reading end is closed
        if closed:
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        return closed
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's capture), no poll (Windows)
        return False


def _missing_folders(out: str | Path) -> list[Path]:
    """The folders on the way to ``out`` (``out`` included) that do not exist yet, deepest first: those a command
    creating ``out`` makes (``--out new/runs/a`` makes ``new`` and ``new/runs`` too)."""
    missing: list[Path] = []
    folder = Path(out)
    while folder.name not in ("", "..") and not os.path.lexists(folder):  # never above a '..' of the path
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folders: Sequence[Path]) -> None:
    """Remove those of ``folders`` (deepest first: :func:`_missing_folders`) that a failed command created and that
    hold nothing, so that no empty output folder stays behind a refused source; a folder with anything in it is
    kept, and so are the folders above it."""
    for folder in folders:
        try:
            if not os.path.lexists(folder):  # not made (the command stopped before it): the one above may have been
                continue
            if folder.is_symlink() or not folder.is_dir() or any(folder.iterdir()):
                return
            folder.rmdir()
        except OSError as exc:
            log.debug("the empty folder %s stays (%s)", folder, exc.strerror or exc)
            return


def console_main() -> None:
    """The ``ctpipe`` command (console script and ``python -m pipeline``): :func:`main`, then exit with its status.

    The objects still alive are frozen first (``gc.freeze``): the interpreter's final garbage collections would
    otherwise walk every object of torch and MONAI once more, about a second of CPU at each exit.
    """
    code = main(exits=True)
    try:
        sys.stdout.flush()  # here, not at exit, where a closed pipe would end in a traceback
    except BrokenPipeError:
        if _stdout_closed():
            code = code or EXIT_STDOUT_CLOSED
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()
