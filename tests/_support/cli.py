"""Running ``ctpipe`` in the test's process for its error: the exit status and what it printed on stderr."""

from __future__ import annotations

from typing import Any

from pipeline.cli import main


def cli_error(capsys: Any, *argv: str) -> tuple[int, str]:
    """``ctpipe *argv``'s exit status and stderr; a traceback there fails the test (user mistakes get a message)."""
    rc = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.err
