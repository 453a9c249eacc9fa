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
command (:func:`~pipeline.runner.left_case.adopting_command`, :meth:`LeftCase.fix`). A case whose run is still under way is its run's to finish and is not listed.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from ..errors import RunStoreError
from .left_case import LeftCase, adopting_command
from .resume import read_manifest
from .store import db_path, open_readonly
from .tables import process_alive

log = logging.getLogger("pipeline.pacs.sender")  # said with the result sender's records

__all__ = ["LeftCase", "adopting_command", "left_cases", "left_lines"]

#: How many cases :func:`left_lines` names one by one (the others are counted).
SHOWN = 10


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
