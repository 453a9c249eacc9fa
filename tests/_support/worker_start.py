"""A stage whose worker process announces two moments of its life by creating a file, and waits there until the test
creates another: its start (the stage being unpickled by the spawn or forkserver bootstrap, or the fork bootstrap's
after-fork hooks running, before ``worker_main`` runs, as a worker importing torch and MONAI is) and its exit (multiprocessing's exit handlers, once ``worker_main`` has
returned). A test then sends its signal exactly while the worker is at that moment."""

from __future__ import annotations

import time
from multiprocessing import util
from pathlib import Path
from typing import Any

from pipeline.runner.stage import CaseContext, Stage, WorkerInfo


def wait_for(path: Path, *, timeout_s: float = 60.0) -> None:
    """Poll until ``path`` exists (at most ``timeout_s`` seconds)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


class HeldWorkerStage(Stage):
    """``folder``: where the worker creates ``starting`` (then waits for ``go``) as it starts, when ``at`` is
    ``"start"``; when ``at`` is ``"exit"``, ``set_up`` once its stage is set up and ``exiting`` (then waits for ``go``)
    in its exit handlers."""

    name = "held"
    group = "cpu"

    def __init__(self, folder: str, at: str):
        self.folder, self.at = folder, at
        if at == "start":  # the fork start method copies the stage rather than unpickling it: its bootstrap runs this
            util.register_after_fork(self, HeldWorkerStage._forked)

    def _forked(self) -> None:
        _announce_then_wait(Path(self.folder), "starting")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.at == "start":
            _announce_then_wait(Path(self.folder), "starting")

    def setup(self, worker: WorkerInfo) -> None:
        if self.at == "exit":  # run by util._exit_function after worker_main has returned
            util.Finalize(None, _announce_then_wait, args=(Path(self.folder), "exiting"), exitpriority=100)
            (Path(self.folder) / "set_up").touch()

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        return {}


def _announce_then_wait(folder: Path, moment: str) -> None:
    (folder / moment).touch()
    wait_for(folder / "go")
