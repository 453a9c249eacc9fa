"""Which task a Ray actor runs, kept where the driver can read it after the actor's process is gone.

A Ray actor runs the tasks queued to it in order. When its process dies (a case crashed it: a segfault, the
out-of-memory killer), the first task it held may have finished already, its reply lost with the process. So the
actor marks each task it starts and finishes (:func:`write_mark`) in one small file per actor,
``RUN_DIR/tmp/ray-actors/ACTOR.json`` (the run folder is on storage every node mounts at the same path), and the
driver reads it (:func:`read_mark`) to charge the death to the task that had started and not finished. The file is
replaced atomically (written beside it, then renamed): the driver reads the last whole mark, never a half-written one.
Unlike a result (:func:`pipeline.atomic.atomic_write_bytes`), it is not synced to disk on every task: it has to outlast
the actor's process, not the machine.
``RUN_DIR/tmp`` is removed at the start of every run, so no mark of an earlier run is read.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

#: The states a mark records: the task started in the actor's process, or it finished there (its reply on the way).
STARTED, FINISHED = "started", "finished"


class Mark(NamedTuple):
    """The last task an actor marked: its :attr:`.stage.Task.seq` and :data:`STARTED` or :data:`FINISHED`."""

    seq: int
    state: str


def marks_dir(run_dir: Path) -> Path:
    """The folder of the actors' marks in the run folder ``run_dir``."""
    return Path(run_dir) / "tmp" / "ray-actors"


def mark_path(run_dir: Path, actor: str) -> Path:
    """The mark of the actor named ``actor`` (unique in a run, e.g. ``model-3``)."""
    return marks_dir(run_dir) / f"{actor}.json"


def write_mark(run_dir: Path, actor: str, *, seq: int, state: str) -> None:
    """Mark the task ``seq`` :data:`STARTED` or :data:`FINISHED` on ``actor``. A mark that cannot be written is logged
    and left out (the task runs all the same; the driver then charges a death as if no actor marked anything)."""
    path = mark_path(run_dir, actor)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"seq": seq, "state": state}))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("Ray actor %s could not mark task %d %s in %s: %s", actor, seq, state, path, exc)


def read_mark(run_dir: Path, actor: str) -> Mark | None:
    """The last mark of ``actor``; None where it marked nothing (or its mark cannot be read)."""
    path = mark_path(run_dir, actor)
    try:
        data = json.loads(path.read_text())
        return Mark(int(data["seq"]), str(data["state"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("the mark of Ray actor %s in %s cannot be read (%s): taken as none", actor, path, exc)
        return None


def clear_mark(run_dir: Path, actor: str) -> None:
    """Remove the mark of ``actor`` (gone: nothing will read it again)."""
    try:
        mark_path(run_dir, actor).unlink(missing_ok=True)
    except OSError as exc:
        log.debug("the mark of Ray actor %s could not be removed: %s", actor, exc)
