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


class ConfigOnlyListener:
    """Stands in for the C-STORE listener (``pipeline.pacs.listener.Listener``, patched in): records the
    configuration ``ctpipe listen`` built in :attr:`seen`, serves nothing and stops at once."""

    seen: list[Any] = []

    def __init__(self, run_dir: Any, cfg: Any, *, on_series: Any = None):
        self.seen.append(cfg)
        self.run_dir, self.port, self.allowed = run_dir, 0, ["X"]

    def start(self) -> None:
        pass

    def serve_forever(self) -> None:
        raise KeyboardInterrupt

    def close(self) -> None:
        pass
