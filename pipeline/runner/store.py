"""The run store: :class:`RunStore`, the runner's reads and writes of runs and cases in ``RUN_DIR/runs.sqlite``.

Its parts: :mod:`.store_db` (the tables, schema version, migrations, connections and read-only access),
:mod:`.store_cases` (the changes of a case's status, and the transitions allowed), :mod:`.store_records` (stage
attempts, what discovery left out, PACS origins and deliveries, GPU samples); here: the runs, and the queries of
cases.

Only the runner's main process writes; readers (reports, notebooks) open it
read-only and see committed state only, thanks to WAL. Times are Unix seconds (UTC).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .redact_active import redact
from .store_cases import TRANSITIONS, CaseTransitions
from .store_db import DB_NAME, SCHEMA_VERSION, db_path, open_readonly, remote_series
from .store_records import ORIGIN_KEYS, RunRecords

__all__ = [
    "DB_NAME",
    "ORIGIN_KEYS",
    "SCHEMA_VERSION",
    "TRANSITIONS",
    "RunStore",
    "db_path",
    "open_readonly",
    "remote_series",
]


class RunStore(CaseTransitions, RunRecords):
    """Read/write access to ``RUN_DIR/runs.sqlite`` (used by the runner's main process)."""

    # -- runs ------------------------------------------------------------------------
    def start_run(
        self,
        run_id: str,
        *,
        command: str,
        sources: Sequence[str],
        config: Mapping[str, Any],
        versions: Mapping[str, str],
        device: str,
        host: str,
        pid: int,
        started_at: float | None = None,
    ) -> None:
        """Record the start of a run at ``started_at`` (Unix s; default now)."""
        with self.tx():
            self.db.execute(
                "INSERT INTO runs (run_id, started_at, status, command, sources, config, versions, device, host, pid)"
                " VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    time.time() if started_at is None else started_at,
                    redact(command),
                    json.dumps([redact(s) for s in sources]),
                    json.dumps(config),
                    json.dumps(versions),
                    device,
                    host,
                    pid,
                ),
            )

    def end_run(
        self,
        run_id: str,
        *,
        status: str,
        n_cases: int,
        n_done: int,
        n_failed: int,
        n_skipped: int,
        n_failed_earlier: int = 0,
        ended_at: float | None = None,
    ) -> None:
        """Record the end of a run at ``ended_at`` (Unix s; default now): ``n_done`` cases completed by this run for
        the first time (not those it did again after their published folder was removed), ``n_failed`` cases
        quarantined by this run,
        ``n_failed_earlier`` still quarantined by earlier runs of the folder and not retried by this one."""
        with self.tx():
            self.db.execute(
                "UPDATE runs SET ended_at=?, status=?, n_cases=?, n_done=?, n_failed=?, n_skipped=?, n_failed_earlier=?"
                " WHERE run_id=?",
                (
                    time.time() if ended_at is None else ended_at,
                    status,
                    n_cases,
                    n_done,
                    n_failed,
                    n_skipped,
                    n_failed_earlier,
                    run_id,
                ),
            )

    def running_run_ids(self) -> list[str]:
        """The runs recorded as running: with the folder's lock held, runs that a killed process left so."""
        return [r["run_id"] for r in self.db.execute("SELECT run_id FROM runs WHERE status='running'")]

    def mark_abandoned_runs(self) -> int:
        """Runs left 'running' by a killed process become 'interrupted'."""
        with self.tx():
            cur = self.db.execute("UPDATE runs SET status='interrupted' WHERE status='running'")
        return cur.rowcount

    def mark_active(self, run_id: str, *, active_s: float, at: float | None = None) -> None:
        """Record that run ``run_id`` has been at work ``active_s`` seconds, measured on the monotonic clock from its
        start (an NTP step or a resumed VM does not change it), at the Unix time ``at`` (default now): should the
        run be killed before its end record, its active time is this, not its last stage's wall-clock end less its
        wall-clock start."""
        self.db.execute(
            "UPDATE runs SET active_s=?, active_at=? WHERE run_id=?", (active_s, time.time() if at is None else at, run_id)
        )

    def mark_found(self, run_id: str, case_keys: Iterable[str]) -> None:
        """Record that run ``run_id``'s discovery found the cases ``case_keys`` among its sources (``cases.found_by``):
        what the run answers for, also when it is killed before its end record."""
        with self.tx():
            self.db.executemany("UPDATE cases SET found_by=? WHERE case_key=?", [(run_id, k) for k in case_keys])

    # -- cases -------------------------------------------------------------------------
    def case(self, case_key: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM cases WHERE case_key=?", (case_key,)).fetchone()

    def case_ids_in_use(self) -> dict[str, str]:
        return {r["case_id"]: r["case_key"] for r in self.db.execute("SELECT case_id, case_key FROM cases")}

    def cases_of_series(self, series_uid: str) -> list[sqlite3.Row]:
        """The cases recorded for one series (its key: SeriesInstanceUID, ``#n`` for a part), oldest first."""
        return list(self.db.execute("SELECT * FROM cases WHERE series_uid=? ORDER BY discovered_at, case_id", (series_uid,)))

    def unconfirmed_cases(self) -> list[sqlite3.Row]:
        """The cases recorded done and not yet confirmed (a run killed between the commit and the check after it)."""
        return list(
            self.db.execute(
                "SELECT c.* FROM cases c JOIN unconfirmed u ON u.case_key = c.case_key WHERE c.status='done' ORDER BY c.case_id"
            )
        )

    def completed_before(self, case_keys: Iterable[str]) -> set[str]:
        """Those of ``case_keys`` not done now that a run completed before (``first_done_at`` set: their published
        folder was removed, or they were reset since): what completes them again is a redo, not a new case."""
        keys = set(case_keys)
        rows = self.db.execute("SELECT case_key FROM cases WHERE status != 'done' AND first_done_at IS NOT NULL")
        return {k for (k,) in rows if k in keys}

    def cases_with_status(self, *statuses: str) -> list[sqlite3.Row]:
        marks = ",".join("?" * len(statuses))
        return list(self.db.execute(f"SELECT * FROM cases WHERE status IN ({marks}) ORDER BY case_id", statuses))

    def configs_of_done_cases(self) -> list[tuple[str, str | None, str | None, int]]:
        """``(run_id, configuration JSON, versions JSON, completed cases)`` of each run whose cases are done (the
        configuration and software their results were made with), oldest run first."""
        rows = self.db.execute(
            "SELECT r.run_id, r.config, r.versions, COUNT(*) FROM cases c JOIN runs r ON r.run_id = c.run_id"
            " WHERE c.status = 'done' GROUP BY r.run_id ORDER BY r.started_at"
        )
        return [(str(r[0]), r[1], r[2], int(r[3])) for r in rows]
