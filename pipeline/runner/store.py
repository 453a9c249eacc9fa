"""The run store: :class:`RunStore`, the runner's reads and writes of runs and cases in ``RUN_DIR/runs.sqlite``
(its tables, schema version, migrations and read-only access are :mod:`.store_db`).

A case's ``status`` moves only along these transitions (anything else raises
:class:`~pipeline.errors.RunStoreError` and changes nothing)::

    (discovered) → pending
    pending, running, failed → running     begin_case (a new attempt; ``failed`` only when failures are retried)
    pending, running → done                 complete_case (``pending``: recovered from a published folder)
    running, failed → failed                fail_case
    running → pending                       release_case (the run folder could not be written, or the series was
                                            still being written into the source: retried next run)
    done → pending                          reset_case (its published folder is gone)
    done → as before complete_case          uncomplete_case (its series changed in the moment it was committed)
    done (unconfirmed) → done               confirm_case (its series checked once more after the commit: unchanged)
    done (unconfirmed) → pending            withdraw_unconfirmed (its series changed before it was confirmed)
    pending, running, failed → (replaced)  replace_case (its series was found again with other content: the
                                            new content takes the case's id, the old attempts stay as history)

Only the runner's main process writes; readers (reports, notebooks) open it
read-only and see committed state only, thanks to WAL. Times are Unix seconds (UTC).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import RunStoreError
from .redact import redact
from .store_db import DB_NAME, SCHEMA_VERSION, Transaction, connect, db_path, not_a_run, open_readonly, remote_series

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

#: The case statuses each state change starts from (see the module docstring).
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "begin": ("pending", "running", "failed"),
    "complete": ("pending", "running"),
    "fail": ("running", "failed"),
    "release": ("running",),
    "reset": ("done",),
    "uncomplete": ("done",),
    "confirm": ("done",),
    "withdraw": ("done",),
    "replace": ("pending", "running", "failed"),
}

#: The columns of ``cases`` that :meth:`RunStore.complete_case` sets.
_COMPLETED = (
    "status", "ended_at", "first_done_at", "latency_s", "n_findings", "output_dir", "reason", "error_class",
    "failed_stage", "lung_coverage", "contrast_phase", "flags", "detect_skipped",
)  # fmt: skip

#: Keys of an origin (``run_batch(origins=...)``, :meth:`RunStore.record_origins`); nothing else is stored.
ORIGIN_KEYS = ("remote", "via", "study_uid", "series_uid", "n_instances")


class RunStore:
    """Read/write access to ``RUN_DIR/runs.sqlite`` (used by the runner's main process)."""

    def __init__(self, run_dir: str | Path, *, create: bool = True):
        self.run_dir = Path(run_dir)
        path = db_path(self.run_dir)
        if not create and not path.is_file():
            raise not_a_run(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.db = connect(self.run_dir)

    def close(self) -> None:
        self.db.close()

    # -- transactions ------------------------------------------------------------
    def tx(self) -> Transaction:
        """``with store.tx():`` runs the statements inside as one atomic transaction."""
        return Transaction(self.db)

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

    # -- cases -------------------------------------------------------------------------
    def case(self, case_key: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM cases WHERE case_key=?", (case_key,)).fetchone()

    def case_ids_in_use(self) -> dict[str, str]:
        return {r["case_id"]: r["case_key"] for r in self.db.execute("SELECT case_id, case_key FROM cases")}

    def upsert_discovered(self, *, case_key: str, case_id: str, series_uid: str | None, fingerprint: str, source: str) -> None:
        self.db.execute(
            "INSERT INTO cases (case_key, case_id, series_uid, fingerprint, source, status, discovered_at)"
            " VALUES (?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT (case_key) DO UPDATE SET source=excluded.source",
            (case_key, case_id, series_uid, fingerprint, redact(source), time.time()),
        )

    def mark_found(self, run_id: str, case_keys: Iterable[str]) -> None:
        """Record that run ``run_id``'s discovery found the cases ``case_keys`` among its sources (``cases.found_by``):
        what the run answers for, also when it is killed before its end record."""
        with self.tx():
            self.db.executemany("UPDATE cases SET found_by=? WHERE case_key=?", [(run_id, k) for k in case_keys])

    def cases_of_series(self, series_uid: str) -> list[sqlite3.Row]:
        """The cases recorded for one series (its key: SeriesInstanceUID, ``#n`` for a part), oldest first."""
        return list(self.db.execute("SELECT * FROM cases WHERE series_uid=? ORDER BY discovered_at, case_id", (series_uid,)))

    def replace_case(self, old_key: str, *, case_key: str, fingerprint: str, source: str) -> None:
        """An unfinished case (pending, interrupted or failed) whose series now has other content (slices added,
        removed or replaced): the new content becomes a pending case under the same ``case_id``; the old case's
        attempts stay as history, marked ``superseded``. Call inside :meth:`tx`, with the registration of the
        other cases found (as :func:`pipeline.runner.resume.plan` does)."""
        self._expect(old_key, "replace")
        row = self.db.execute("SELECT case_id, series_uid FROM cases WHERE case_key=?", (old_key,)).fetchone()
        self.db.execute(
            "UPDATE stage_attempts SET status='superseded' WHERE case_key=? AND status IN ('ok', 'running')", (old_key,)
        )
        for table in ("cases", "findings", "measurements", "quality_flags", "origins"):
            self.db.execute(f"DELETE FROM {table} WHERE case_key=?", (old_key,))
        self.upsert_discovered(
            case_key=case_key, case_id=row["case_id"], series_uid=row["series_uid"], fingerprint=fingerprint, source=source
        )

    def begin_case(self, case_key: str, run_id: str) -> int:
        """Mark a case running; returns its attempt number (1, 2, ...). Earlier unfinished attempts are closed."""
        with self.tx():
            self._expect(case_key, "begin")
            self.db.execute(
                "UPDATE stage_attempts SET status = CASE status WHEN 'running' THEN 'interrupted' ELSE 'superseded' END"
                " WHERE case_key=? AND status IN ('running', 'ok')",
                (case_key,),
            )
            # a retry within the same run keeps the first attempt's start: the case's latency runs end to end
            self.db.execute(
                "UPDATE cases SET status='running', attempts=attempts+1,"
                " started_at=CASE WHEN run_id=? AND started_at IS NOT NULL AND status != 'done' THEN started_at ELSE ? END,"
                " run_id=?, ended_at=NULL, reason=NULL, error_class=NULL, failed_stage=NULL WHERE case_key=?",
                (run_id, time.time(), run_id, case_key),
            )
            return int(self.db.execute("SELECT attempts FROM cases WHERE case_key=?", (case_key,)).fetchone()[0])

    def mark_active(self, run_id: str, *, active_s: float, at: float | None = None) -> None:
        """Record that run ``run_id`` has been at work ``active_s`` seconds, measured on the monotonic clock from its
        start (an NTP step or a resumed VM does not change it), at the Unix time ``at`` (default now): should the
        run be killed before its end record, its active time is this, not its last stage's wall-clock end less its
        wall-clock start."""
        self.db.execute(
            "UPDATE runs SET active_s=?, active_at=? WHERE run_id=?", (active_s, time.time() if at is None else at, run_id)
        )

    def record_attempt(
        self,
        *,
        run_id: str,
        case_key: str,
        stage: str,
        attempt: int,
        status: str,
        worker: str,
        device: str,
        ready_at: float | None,
        started_at: float | None,
        ended_at: float | None,
        wall_s: float | None,
        peak_rss_mb: float | None,
        peak_cuda_mb: float | None,
        error: str | None = None,
        detail: Mapping[str, Any] | None = None,
        skip_reason: str | None = None,
    ) -> None:
        """Record one stage attempt (times Unix s, memory MB). ``skip_reason``: why the stage returned without its
        work (detection of a scan without lungs), or None: such an attempt is no sample of the stage's latency."""
        wait = None if ready_at is None or started_at is None else max(0.0, started_at - ready_at)
        self.db.execute(
            "INSERT INTO stage_attempts (run_id, case_key, stage, attempt, status, worker, device, ready_at, started_at,"
            " ended_at, wall_s, queue_wait_s, peak_rss_mb, peak_cuda_mb, error, detail, skip_reason)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (case_key, stage, attempt) DO UPDATE SET status=excluded.status, worker=excluded.worker,"
            " device=excluded.device, started_at=excluded.started_at, ended_at=excluded.ended_at, wall_s=excluded.wall_s,"
            " queue_wait_s=excluded.queue_wait_s, peak_rss_mb=excluded.peak_rss_mb, peak_cuda_mb=excluded.peak_cuda_mb,"
            " error=excluded.error, detail=excluded.detail, skip_reason=excluded.skip_reason",
            (
                run_id,
                case_key,
                stage,
                attempt,
                status,
                worker,
                device,
                ready_at,
                started_at,
                ended_at,
                wall_s,
                wait,
                peak_rss_mb,
                peak_cuda_mb,
                redact(error),
                redact(json.dumps(detail)) if detail else None,
                redact(skip_reason),
            ),
        )

    def complete_case(
        self,
        case_key: str,
        *,
        output_dir: str,
        findings: Iterable[Mapping[str, Any]],
        measurements: Iterable[Sequence[Any]],
        ended_at: float | None = None,
        quality: Mapping[str, Any] | None = None,
        detect_skipped: str | None = None,
        latency_s: float | None = None,
        before_commit: Callable[[], None] | None = None,
        unconfirmed: bool = False,
    ) -> None:
        """Mark a case done with its findings, measurements and quality flags, in one transaction. ``ended_at`` (Unix
        s) is also its ``first_done_at`` unless it was done before (its published folder removed and done again): a
        case counts at its first completion.

        ``latency_s``: the case's end-to-end time (s) as the runner measured it on a monotonic clock; None: its end
        less its recorded start (Unix s; wrong by as much as the wall clock was stepped in between).

        ``measurements``: ``(name, value, unit)`` or ``(name, value, unit, reliable, reason)`` each;
        ``quality``: the case's :meth:`QualityReport.to_json` (lung coverage, contrast phase, flags);
        ``detect_skipped``: why detection did not run (e.g. no lungs in the scan), or None;
        ``before_commit``: called inside the transaction, once everything is written and just before it commits: an
        exception it raises rolls the whole completion back (the case stays as it was) and is raised here;
        ``unconfirmed``: recorded done with it still to be confirmed (table ``unconfirmed``), as the runner records a
        case whose source it checks once more after the commit: not published to a PACS until :meth:`confirm_case`.
        """
        ended = time.time() if ended_at is None else ended_at
        flags = list((quality or {}).get("flags") or [])
        with self.tx():
            self._expect(case_key, "complete")
            for table in ("findings", "measurements", "quality_flags"):
                self.db.execute(f"DELETE FROM {table} WHERE case_key=?", (case_key,))
            n = 0
            for n, f in enumerate(findings, start=1):
                c = f.get("center_lps") or [None, None, None]
                self.db.execute(
                    "INSERT INTO findings VALUES (?,?,?,?,?,?,?,?)",
                    (case_key, n, json.dumps(f), c[0], c[1], c[2], f.get("diameter_mm"), f.get("score")),
                )
            self.db.executemany(
                "INSERT OR REPLACE INTO measurements (case_key, name, value, unit, reliable, reason) VALUES (?,?,?,?,?,?)",
                [(case_key, *_measurement_row(m)) for m in measurements],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO quality_flags VALUES (?,?,?,?)",
                [(case_key, f["code"], f.get("severity", "warning"), f.get("message")) for f in flags],
            )
            self.db.execute(
                "UPDATE cases SET status='done', ended_at=?, first_done_at=COALESCE(first_done_at, ?), latency_s=COALESCE(?, ? - started_at), n_findings=?, output_dir=?,"
                " reason=NULL, error_class=NULL, failed_stage=NULL, lung_coverage=?, contrast_phase=?, flags=?,"
                " detect_skipped=? WHERE case_key=?",
                (
                    ended,
                    ended,
                    latency_s,
                    ended,
                    n,
                    output_dir,
                    (quality or {}).get("lung_coverage"),
                    (quality or {}).get("contrast_phase"),
                    ",".join(f["code"] for f in flags) if quality is not None else None,
                    detect_skipped,
                    case_key,
                ),
            )
            self.db.execute("DELETE FROM unconfirmed WHERE case_key=?", (case_key,))
            if unconfirmed:
                self.db.execute(
                    "INSERT INTO unconfirmed (case_key, case_id, done_at) SELECT case_key, case_id, ? FROM cases"
                    " WHERE case_key=?",
                    (ended, case_key),
                )
            if before_commit is not None:
                before_commit()

    def confirm_case(self, case_key: str) -> None:
        """A case recorded done ``unconfirmed`` (:meth:`complete_case`) is done for good: its series was checked
        once more after the commit and is unchanged. Its results may now be published (sent to a PACS)."""
        with self.tx():
            self._expect(case_key, "confirm")
            self.db.execute("DELETE FROM unconfirmed WHERE case_key=?", (case_key,))

    def withdraw_unconfirmed(self, case_key: str, *, reason: str) -> None:
        """A case recorded done unconfirmed whose series changed in the source before it was confirmed (a run killed
        between its commit and the check after it): back to 'pending' with ``reason`` (``SeriesStillWrittenError``),
        without its results; a first completion's ``first_done_at`` empty again. The next run analyses it."""
        with self.tx():
            self._expect(case_key, "withdraw")
            done_at = self.db.execute("SELECT done_at FROM unconfirmed WHERE case_key=?", (case_key,)).fetchone()
            if done_at is None:
                raise RunStoreError(
                    f"cannot withdraw case {case_key!r}: it is confirmed done",
                    where=db_path(self.run_dir),
                    fix="only a case recorded done unconfirmed is withdrawn; see RunStore.unconfirmed_cases",
                )
            for table in ("findings", "measurements", "quality_flags", "unconfirmed"):
                self.db.execute(f"DELETE FROM {table} WHERE case_key=?", (case_key,))
            self.db.execute(
                "UPDATE stage_attempts SET status='superseded' WHERE case_key=? AND status IN ('ok','running')", (case_key,)
            )
            self.db.execute(
                "UPDATE cases SET status='pending', reason=?, error_class='SeriesStillWrittenError', failed_stage='publish',"
                " output_dir=NULL, ended_at=NULL, n_findings=NULL,"
                " first_done_at=CASE WHEN first_done_at=? THEN NULL ELSE first_done_at END WHERE case_key=?",
                (redact(reason), done_at[0], case_key),
            )

    def unconfirmed_cases(self) -> list[sqlite3.Row]:
        """The cases recorded done and not yet confirmed (a run killed between the commit and the check after it)."""
        return list(
            self.db.execute(
                "SELECT c.* FROM cases c JOIN unconfirmed u ON u.case_key = c.case_key WHERE c.status='done' ORDER BY c.case_id"
            )
        )

    def uncomplete_case(self, case_key: str, *, before: Mapping[str, Any]) -> None:
        """Undo :meth:`complete_case` just made: the case's series changed in the source in the moment it was
        committed. The columns it set are put back as they were in ``before`` (the case's row just before it, status
        'running' as a rule; a first completion's ``first_done_at`` empty again), and the findings, measurements and
        quality flags it recorded are removed."""
        with self.tx():
            self._expect(case_key, "uncomplete")
            self.db.execute("DELETE FROM unconfirmed WHERE case_key=?", (case_key,))
            for table in ("findings", "measurements", "quality_flags"):
                self.db.execute(f"DELETE FROM {table} WHERE case_key=?", (case_key,))
            self.db.execute(
                f"UPDATE cases SET {', '.join(f'{c}=?' for c in _COMPLETED)} WHERE case_key=?",
                (*(before[c] for c in _COMPLETED), case_key),
            )

    def release_case(self, case_key: str, *, reason: str, stage: str | None, error_class: str | None = None) -> None:
        """Back to 'pending' without a verdict: the run folder could not be written while the case ran
        (``error_class`` None: recorded as ``RunEnvironmentError``), or its series was still being written into the
        source (``SeriesStillWrittenError``).

        Not a quarantine: the next run retries the case (no ``--retry-failed`` needed); ``reason`` says why
        it was left unfinished until then.
        """
        with self.tx():
            self._expect(case_key, "release")
            self.db.execute("UPDATE stage_attempts SET status='interrupted' WHERE case_key=? AND status='running'", (case_key,))
            self.db.execute(
                "UPDATE cases SET status='pending', reason=?, error_class=?, failed_stage=?,"
                " ended_at=NULL, output_dir=NULL WHERE case_key=?",
                (redact(reason), error_class or "RunEnvironmentError", stage, case_key),
            )

    def add_skipped(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Record what discovery left out in run ``run_id`` (and the series left for the next run because they were
        still being written, kind ``still_written``): rows with ``what`` ('file' or 'series'), ``item`` (the path or
        series key), ``kind``, ``reason`` and ``source``."""
        data = [
            (run_id, r["what"], redact(str(r["item"])), r.get("kind"), redact(r.get("reason")), redact(r.get("source")))
            for r in rows
        ]
        if data:
            with self.tx():
                self.db.executemany("INSERT OR REPLACE INTO skipped VALUES (?,?,?,?,?,?)", data)

    def fail_case(self, case_key: str, *, reason: str, error_class: str, stage: str | None, measured: bool = True) -> None:
        """Mark a case failed (quarantined) with the stage, error class and reason. ``measured``: False for a case
        refused at discovery, which no stage worked on: its latency stays empty (not measured), not the moment between
        two writes of the store."""
        now = time.time()
        with self.tx():
            self._expect(case_key, "fail")
            self.db.execute(
                "UPDATE cases SET status='failed', reason=?, error_class=?, failed_stage=?, ended_at=?,"
                " latency_s=CASE WHEN ? THEN ? - COALESCE(started_at, ?) END WHERE case_key=?",
                (redact(reason), error_class, stage, now, measured, now, now, case_key),
            )

    def reset_case(self, case_key: str) -> None:
        """Back to 'pending' (e.g. its output folder vanished); its attempts stay as history."""
        with self.tx():
            self._expect(case_key, "reset")
            self.db.execute("DELETE FROM unconfirmed WHERE case_key=?", (case_key,))
            self.db.execute(
                "UPDATE stage_attempts SET status='superseded' WHERE case_key=? AND status IN ('ok','running')", (case_key,)
            )
            self.db.execute("UPDATE cases SET status='pending', output_dir=NULL WHERE case_key=?", (case_key,))

    def _expect(self, case_key: str, change: str) -> None:
        """Refuse a state change the case's current status does not allow (inside the change's transaction)."""
        row = self.db.execute("SELECT case_id, status FROM cases WHERE case_key=?", (case_key,)).fetchone()
        allowed = TRANSITIONS[change]
        if row is None:
            raise RunStoreError(
                f"cannot {change} case {case_key!r}: no such case in the run store",
                where=db_path(self.run_dir),
                fix="register the case (upsert_discovered) first",
            )
        if row["status"] not in allowed:
            raise RunStoreError(
                f"cannot {change} case {row['case_id']} ({case_key}): its status is {row['status']!r}, "
                f"and {change} starts from {' or '.join(repr(s) for s in allowed)}",
                where=db_path(self.run_dir),
                fix="check the case's status first; see the transitions in pipeline/runner/store.py",
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

    # -- PACS: origins of cases, deliveries of results ------------------------------------
    def record_origins(self, run_id: str, origins: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """Record where cases came from: ``(case_key, origin)`` pairs, ``origin`` with the keys of
        :data:`ORIGIN_KEYS` (other keys are ignored, so no patient data can slip in); returns how many."""
        rows = []
        for case_key, o in origins:
            remote, via, series = o.get("remote"), o.get("via"), o.get("series_uid")
            if not (remote and via and series):
                raise RunStoreError(
                    f"origin of case {case_key!r} lacks remote, via or series_uid: {sorted(o)}",
                    where=db_path(self.run_dir),
                    fix="give every origin remote, via and series_uid (see ORIGIN_KEYS)",
                )
            n = o.get("n_instances")
            rows.append((case_key, str(remote), str(via), o.get("study_uid"), str(series), None if n is None else int(n), run_id))
        if rows:
            with self.tx():
                self.db.executemany(
                    "INSERT OR REPLACE INTO origins (case_key, remote, via, study_uid, series_uid, n_instances, run_id,"
                    " recorded_at) SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM cases WHERE case_key = ?)",
                    [(*r, time.time(), r[0]) for r in rows],
                )
        return len(rows)

    def record_delivery(
        self,
        *,
        sop_uid: str,
        destination: str,
        case_id: str | None,
        sop_class: str | None,
        state: str,
        attempts: int,
        error: str | None,
    ) -> None:
        """Record the state of one result file sent to ``destination`` (a redacted address)."""
        with self.tx():
            self.db.execute(
                "INSERT OR REPLACE INTO deliveries VALUES (?,?,?,?,?,?,?,?)",
                (sop_uid, destination, case_id, sop_class, state, attempts, error, time.time()),
            )

    # -- GPU samples -------------------------------------------------------------------
    def add_gpu_samples(self, run_id: str, samples: Iterable[tuple[float, int, float, float, float]]) -> None:
        rows = [(run_id, *s) for s in samples]
        if rows:
            with self.tx():
                self.db.executemany("INSERT INTO gpu_samples VALUES (?,?,?,?,?,?)", rows)


def _measurement_row(m: Sequence[Any]) -> tuple[str, float, str, int, str | None]:
    name, value, unit, *rest = m
    reliable = bool(rest[0]) if rest else True
    return str(name), float(value), str(unit), int(reliable), (rest[1] if len(rest) > 1 and not reliable else None)
