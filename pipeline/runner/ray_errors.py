"""Reading Ray's error messages: what made an actor fail to start (:func:`start_error`), the import error behind it
(:func:`import_failure`), and the one line that says why a task or actor failed (:func:`first_line`)."""

from __future__ import annotations

import re

#: Terminal colours in Ray's error messages.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The line of a Python traceback that names an import error (Ray's message ends with the remote traceback).
_IMPORT_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(ModuleNotFoundError|ImportError): (.+?)\s*$", re.MULTILINE)


def import_failure(exc: BaseException) -> str | None:
    """The import error for which a Ray actor could not start (``ModuleNotFoundError: No module named 'x'``): its class
    (ctpipe missing or another package in its place on the node), a stage given to it whose module the node lacks, or
    a module its setup imports; None for any other failure (a node lost, a process killed)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ImportError):
        return f"{type(cause).__name__}: {cause}"
    found = _IMPORT_ERROR.findall(ANSI.sub("", str(exc)))
    if not found:
        return None
    kind, what = found[-1]  # the innermost: Ray wraps it (a RuntimeError, a RaySystemError) before it
    return f"{kind}: {what}"


#: The last line of a Python traceback: the exception's class and the first line of its message.
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*): (.+?)\s*$", re.MULTILINE)


def start_error(exc: BaseException) -> str:
    """What made a Ray actor fail to start, on one line: ``FileNotFoundError: [Errno 2] ...`` for an exception raised
    in its ``place``/``setup`` (Ray's RayTaskError, whose ``cause`` it is) or in its ``__init__`` (an ActorDiedError
    whose message ends with the remote traceback); Ray's reason for any other death (its process killed)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        text = " ".join(str(cause).split()) or "(no message)"
        return f"{type(cause).__name__}: {text}"[:300]
    if getattr(exc, "actor_init_failed", False):
        found = _EXCEPTION_LINE.findall(ANSI.sub("", str(exc)).split("creation task,", 1)[-1])
        found = [f for f in found if not f[0].startswith("ray::")]
        if found:
            kind, what = found[-1]
            return f"{kind.rsplit('.', 1)[-1]}: {what}"[:300]
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Ray's actor-death messages put the reason after the actor's details ("The actor is dead because ...")
    reason = next((ln for ln in lines if "because" in ln), lines[0] if lines else type(exc).__name__)
    return reason[:300]
