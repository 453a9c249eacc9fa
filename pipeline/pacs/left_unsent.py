"""Results a killed run left in place but not committed: said by ``ctpipe send`` and ``ctpipe run``, never left silent.

A run puts a case's folder in place (``cases/<case_id>``), then records the case done and checks its source series
once more (:mod:`pipeline.runner.adopt`). A run killed in between leaves a complete folder whose case is not
committed (still ``running``, or recorded done and not confirmed); only the result sender's
(:func:`~pipeline.pacs.send_ledger.committed_cases`) committed cases are sent, and the next run adopts such a folder
only when its own sources hold the series, to check it first. A series that is never again among a run's sources (a
nightly ``studydate=yesterday`` query, a folder run once) would leave its results unsent for ever: :func:`left_cases`
finds them and :func:`left_lines` says, per case, the command that checks and adopts it (a run over its source: its
PACS address with ``?series=UID``, the source folder, or the listener started again), after which ``ctpipe send``
sends its results. The runner's warning for a folder it leaves so and the run report's line of its case name the same
command (:func:`adopting_command`, :meth:`LeftCase.fix`). A case whose run is still under way is its run's to finish and is not listed.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunStoreError
from ..runner.resume import read_manifest
from ..runner.store import db_path, open_readonly
from ..runner.tables import process_alive

log = logging.getLogger("pipeline.pacs.sender")

#: How many cases :func:`left_lines` names one by one (the others are counted).
SHOWN = 10


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


def left_cases(run_dir: str | Path) -> list[LeftCase]:
    """The case folders of ``run_dir`` whose manifest is in place and whose case the run store does not record
    committed (see the module docstring), the cases of a run still under way left out; [] without a run store."""
    run = Path(run_dir)
    cases = run / "cases"
    if not db_path(run).is_file() or not cases.is_dir():
        return []
    try:
        db = open_readonly(run)
    except RunStoreError as exc:
        log.error("case folders not checked for uncommitted results: %s", exc, extra={"event": "send_error"})
        return []
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        unconfirmed = "c.case_key IN (SELECT case_key FROM unconfirmed)" if "unconfirmed" in tables else "0"
        origin = "o.remote, o.via, o.series_uid AS origin_series" if "origins" in tables else "NULL, NULL, NULL"
        join = "LEFT JOIN origins o ON o.case_key = c.case_key" if "origins" in tables else ""
        query = (
            f"SELECT c.case_id, c.case_key, c.status, c.source, {unconfirmed} AS unconfirmed, {origin}, r.pid, r.host, "
            f"r.started_at, r.ended_at FROM cases c {join} LEFT JOIN runs r ON r.run_id = c.run_id "
            "WHERE c.status IN ('running', 'pending') OR " + unconfirmed
        )
        uncommitted = {str(r["case_id"]): r for r in db.execute(query)}  # one query: committed folders are not read
        out = []
        for folder in sorted(p for p in cases.iterdir() if p.name in uncommitted and p.is_dir()):
            row = uncommitted[folder.name]
            man = read_manifest(folder)
            if man is None or man.get("case_key") != row["case_key"]:
                continue
            if row["ended_at"] is None and row["started_at"] is not None:
                if process_alive(row["pid"], row["host"], since=float(row["started_at"])):
                    continue  # its run is under way: the case is its to record
            out.append(LeftCase(folder.name, str(row["status"]), row["source"], row["remote"], row["via"], row["origin_series"]))
        return out
    except sqlite3.Error as exc:
        log.error("case folders not checked for uncommitted results: %s", exc, extra={"event": "send_error"})
        return []
    finally:
        db.close()


def left_lines(run_dir: str, destination: str, left: list[LeftCase]) -> list[str]:
    """What ``ctpipe send`` and ``ctpipe run`` print of ``left`` (from :func:`left_cases`): how many, why, and per
    case the command that lets its results be sent to ``destination``."""
    if not left:
        return []
    lines = [
        f"{len(left)} case folder(s) in {run_dir}/cases hold results not sent to {destination}: a run was killed as it "
        "recorded their cases, before it checked their series in the source once more, and no run since had those "
        f"series among its sources; fix: run the command given for each, then ctpipe send {run_dir}"
    ]
    for case in left[:SHOWN]:
        series = f", series {case.series_uid}" if case.series_uid else ""
        lines.append(f"  case {case.case_id} ({case.status}{series}): {case.fix(run_dir)}")
    if len(left) > SHOWN:
        lines.append(f"  ... and {len(left) - SHOWN} more")
    return lines
