"""Session data built once per pytest run, also when pytest-xdist spreads the tests over several workers.

Each xdist worker has its own session, so a plain ``scope="session"`` fixture would build its data once per
worker. :func:`build_once` builds it in the run's common temporary folder under a file lock: the first worker
builds and records the result as JSON, the others wait for the lock and read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

PYTEST_DONT_REWRITE = True


def build_once(tmp_path_factory: Any, name: str, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """``build(folder)`` run once for the whole pytest run: ``(folder, its JSON-able result)``.

    ``folder`` starts empty and is shared by every worker, so the data must be read-only for the tests.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: its own temporary folder holds the run's data
        common = tmp_path_factory.getbasetemp()
    else:
        common = tmp_path_factory.getbasetemp().parent  # the run's folder, above every worker's own
    folder, done = common / name, common / f"{name}.json"
    with FileLock(str(common / f"{name}.lock")):
        if not done.is_file():
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
    return folder, json.loads(done.read_text())
