"""Which of the paths given to ``ctpipe report`` are run folders.

A manager's glob (``ctpipe report RUNS/* --out ...``) also catches what a nightly job's folder holds beside its
run folders: a cron log, a README, an earlier report's folder, a ``latest`` link to a folder cleaned up since.
:func:`run_folders` leaves out what is plainly not a run folder (a file; a folder without a run store), each
with the reason, and keeps the errors that must stay loud: a path that does not exist (a mistyped run folder),
a folder that looks like a run folder whose store is missing or damaged (its SQLite companions are there), and
no run folder at all among the paths. The report counts what it left out per reason (:func:`counted`) and never
names it: a folder beside the run folders may be an archive export named after the patient
(``SMITH^JOHN_1234567/``), and the report, unlike a run, has read no header to redact it by
(:mod:`.redact`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RunStoreError
from .store_db import DB_NAME, db_path, not_a_run

__all__ = ["counted", "run_folders"]

#: Files SQLite keeps beside a run store while it is in use: found without the store, the store was lost.
_COMPANIONS = ("-wal", "-shm", "-journal")


def _left_out_reason(path: Path) -> str | None:
    """Why ``path`` (an existing path, or a dangling link) is plainly not a run folder, or None when it holds a run
    store (damaged or not: for :func:`.store_db.open_readonly` to read or name); :class:`RunStoreError` for a folder
    whose store is gone while SQLite's companion files of it are there."""
    if path.is_symlink() and not path.exists():
        return "a link to a path that does not exist"  # not the target's name: it may name a patient
    if not path.is_dir():
        return "a file, not a run folder"
    if db_path(path).exists() or path.joinpath(DB_NAME).is_symlink():
        return None
    companions = [path / (DB_NAME + s) for s in _COMPANIONS if path.joinpath(DB_NAME + s).exists()]
    if companions:  # SQLite's files without the store: a run folder that lost its store
        raise RunStoreError(
            f"this looks like a run folder ({companions[0].name} is there) but its run store {DB_NAME} is missing",
            where=path,
            fix=f"restore {DB_NAME} from a backup of the folder, or leave the folder out of the report",
        )
    what = "a folder without a run store"
    if (path / "report.json").is_file() and (path / "report.html").is_file():
        what = "the folder of a ctpipe report, without a run store"
    elif (path / "report.json").is_file():
        what = "a folder of ctpipe report files, without a run store"
    return f"{what} ({DB_NAME}): not a run folder"


def counted(left_out: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    """What :func:`run_folders` left out as the report says it: ``{"reason": why, "count": how many}`` per reason,
    in the order first met, without the paths."""
    counts: dict[str, int] = {}
    for e in left_out:
        counts[e["reason"]] = counts.get(e["reason"], 0) + 1
    return [{"reason": r, "count": n} for r, n in counts.items()]


def run_folders(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], list[dict[str, str]]]:
    """The run folders among ``paths`` (file-system paths, resolved; each folder once, in the order given) and the
    entries left out as plainly not run folders: ``{"path": as given, "reason": why}``.

    A run folder is a folder holding the run store (``runs.sqlite``; one that cannot be read is named when it is
    read). Raises :class:`~pipeline.errors.RunStoreError` for a path that does not exist (not a dangling link: that
    is left out), for a folder with the store's SQLite companion files (``runs.sqlite-wal``, ...) but not the store,
    and when no run folder remains, naming what was left out and why.
    """
    folders: list[Path] = []
    left_out: list[dict[str, str]] = []
    for given in paths:
        path = Path(given)
        if not path.exists() and not path.is_symlink():
            raise not_a_run(path)
        reason = _left_out_reason(path)
        if reason is not None:
            left_out.append({"path": str(given), "reason": reason})
        elif path.resolve() not in folders:  # a run folder named twice (or by two paths) is one run
            folders.append(path.resolve())
    if not folders and len(paths) == 1:
        raise not_a_run(Path(paths[0]))
    if not folders:
        named = "; ".join(f"{e['path']}: {e['reason']}" for e in left_out)
        raise RunStoreError(
            f"no run folder among the {len(left_out)} path(s) given ({named})",
            where=None,
            fix="give folders written by `ctpipe run --out` (e.g. runs/2026-11-*)",
        )
    return folders, left_out
