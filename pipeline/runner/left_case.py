"""A case folder in place whose case the run store does not record committed, and the command that checks its
series again and adopts the folder (:meth:`LeftCase.fix`): said by the runner when it leaves such a folder as it is,
by the run report, and by ``ctpipe send`` (:mod:`pipeline.runner.left_unsent`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LeftCase:
    """A case folder in place whose case is not committed. ``status``: the run store's (``running``, ``pending``, or
    ``done`` not confirmed); ``source``: the store's source (redacted as the store keeps it); ``remote``, ``via``,
    ``series_uid``: where the series came from (None for a folder source)."""

    case_id: str
    status: str
    source: str | None
    remote: str | None = None
    via: str | None = None
    series_uid: str | None = None

    def fix(self, run_dir: str) -> str:
        """The command that checks the case's series again and adopts its folder (or analyses the series whole)."""
        if self.via == "c-store":
            return f"start ctpipe listen --out {run_dir} again (it processes the series it received again)"
        if self.remote and self.series_uid:
            retrieve = "&retrieve=get" if self.via == "c-get" else ""
            return f'ctpipe run "{self.remote}?series={self.series_uid}{retrieve}" --out {run_dir}'
        return f"ctpipe run {self.source or 'SOURCE'} --out {run_dir} (a run over the folder it came from)"


def adopting_command(db: sqlite3.Connection, case: Mapping[str, Any], run_dir: str) -> str:
    """:meth:`LeftCase.fix` of a run store ``cases`` row ``case`` (``case_key``, ``case_id``, ``status``, ``source``),
    with its PACS origin where ``db`` (the run store of ``run_dir``) records one: the command that checks its series
    again and adopts its folder, for a runner that leaves the folder as it is (its sources do not hold the series)."""
    origin = None
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'origins'").fetchone():
        origin = db.execute("SELECT remote, via, series_uid FROM origins WHERE case_key = ?", (case["case_key"],)).fetchone()
    remote, via, series_uid = tuple(origin) if origin is not None else (None, None, None)
    return LeftCase(str(case["case_id"]), str(case["status"]), case["source"], remote, via, series_uid).fix(run_dir)
