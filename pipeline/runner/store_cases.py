"""A case's life in the run store: :class:`CaseTransitions`, the changes of a case's status in ``cases`` (with the
findings, measurements and quality flags a completion records), part of :class:`.store.RunStore`.

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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import RunStoreError
from .redact_active import redact
from .store_db import StoreConnection, db_path

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


class CaseTransitions(StoreConnection):
    """The changes of a case's status (see the module docstring), each in one transaction."""

    def upsert_discovered(self, *, case_key: str, case_id: str, series_uid: str | None, fingerprint: str, source: str) -> None:
        """Register a case discovery found: a new case is ``pending``; a case already known keeps its status and
        takes the new ``source``."""
        self.db.execute(
            "INSERT INTO cases (case_key, case_id, series_uid, fingerprint, source, status, discovered_at)"
            " VALUES (?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT (case_key) DO UPDATE SET source=excluded.source",
            (case_key, case_id, series_uid, fingerprint, redact(source), time.time()),
        )

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
                fix="check the case's status first; see the transitions in pipeline/runner/store_cases.py",
            )


def _measurement_row(m: Sequence[Any]) -> tuple[str, float, str, int, str | None]:
    name, value, unit, *rest = m
    reliable = bool(rest[0]) if rest else True
    return str(name), float(value), str(unit), int(reliable), (rest[1] if len(rest) > 1 and not reliable else None)
