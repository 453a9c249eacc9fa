"""What the run store records beside the status of cases: :class:`RunRecords`, part of :class:`.store.RunStore`.

Each stage attempt (times, memory, errors), what discovery left out, where cases came from when a PACS delivered
them and the DICOM results sent to one, and the GPU samples of runs. Times are Unix seconds (UTC), memory MB.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import RunStoreError
from .redact_active import redact
from .store_db import StoreConnection, db_path

#: Keys of an origin (``run_batch(origins=...)``, :meth:`RunStore.record_origins`); nothing else is stored.
ORIGIN_KEYS = ("remote", "via", "study_uid", "series_uid", "n_instances")


class RunRecords(StoreConnection):
    """The records of stage attempts, skipped items, origins, deliveries and GPU samples."""

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
