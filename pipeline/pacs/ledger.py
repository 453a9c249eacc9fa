"""The PACS ledger of a run folder: ``RUN_DIR/pacs/ledger.sqlite``.

It records, durably (SQLite, write-ahead log, ``synchronous=FULL``: a committed row survives a
crash or ``kill -9``), what crossed the network, by remote UID, so that nothing is fetched,
processed or sent twice:

``fetched``    one row per series retrieved from a PACS source: state ``fetched`` (complete, in
               ``pacs/spool/``), ``partial`` or ``failed`` (retried by the next run), ``removed`` (its case
               was processed and its spool folder removed, ``pacs.keep_received``), with counts;
``instances``  one row per instance the listener received (SOPInstanceUID, series, generation, and the size in
               bytes and CRC-32 of its file, checked after a crash);
``series``     the listener's series: one row per generation (a series that grows after it was
               handed to the runner gets a new generation), state ``open`` → ``handed`` → ``processed``,
               and ``removed_at`` once its received files were removed (``pacs.keep_received``); ``aborted``: the
               sender's A-ABORT or release that ended the last association to store instances of it, with the counts
               they gave (:mod:`pipeline.pacs.abort_record`; NULL in a row written before it was recorded);
``sent``       one row per result file and destination: ``pending``, ``sent``, ``unconfirmed`` (stored on the
               destination's success answer, its confirming query refused) or ``failed``;
``scanned``    case folders whose results have been queued for a destination.

Addresses are stored redacted (they never hold credentials anyway); no patient data is stored.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import RunStoreError
from ..locks import flock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fetched (
    series_uid TEXT PRIMARY KEY, study_uid TEXT, source TEXT, state TEXT NOT NULL, n_expected INTEGER,
    n_files INTEGER, folder TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 0, updated_at REAL);
CREATE TABLE IF NOT EXISTS instances (
    sop_uid TEXT PRIMARY KEY, series_uid TEXT NOT NULL, generation INTEGER NOT NULL, sop_class TEXT,
    calling_aet TEXT, received_at REAL, size INTEGER, crc32 INTEGER);
CREATE INDEX IF NOT EXISTS instances_series ON instances(series_uid);
CREATE TABLE IF NOT EXISTS series (
    series_uid TEXT NOT NULL, generation INTEGER NOT NULL, state TEXT NOT NULL, first_at REAL, last_at REAL,
    n_instances INTEGER NOT NULL DEFAULT 0, folder TEXT, case_id TEXT, outcome TEXT, note TEXT,
    study_uid TEXT, removed_at REAL, aborted TEXT, PRIMARY KEY (series_uid, generation));
CREATE TABLE IF NOT EXISTS sent (
    sop_uid TEXT NOT NULL, destination TEXT NOT NULL, case_id TEXT, path TEXT, sop_class TEXT, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_at REAL, error TEXT, updated_at REAL, PRIMARY KEY (sop_uid, destination));
CREATE TABLE IF NOT EXISTS scanned (
    case_id TEXT NOT NULL, destination TEXT NOT NULL, scanned_at REAL, PRIMARY KEY (case_id, destination));
"""
#: Columns added to ledgers written before them: (table, column, declaration).
_ADDED_COLUMNS = (
    ("series", "study_uid", "TEXT"),
    ("series", "removed_at", "REAL"),
    ("series", "aborted", "TEXT"),
    ("instances", "size", "INTEGER"),
    ("instances", "crc32", "INTEGER"),
)


class Ledger:
    """The ledger of ``run_dir`` (created on first use); safe to share between threads of one process."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "pacs" / "ledger.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
            for table, column, decl in _ADDED_COLUMNS:
                if column not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        except sqlite3.Error as exc:
            raise RunStoreError(
                f"cannot open the PACS ledger ({exc})",
                where=self.path,
                fix="check that the run folder is writable and not on a network file system",
            ) from exc
        self._lock = threading.RLock()
        self._group = threading.Condition()  # guards _queued and _committing (see batched)
        self._queued: list[_Work] = []
        self._committing = False

    def batched(self, work: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``work(db)`` in a transaction, durable on return, shared with the calls other threads make meanwhile
        (group commit): while one transaction commits, the calls that arrive wait, and the first of them then
        commits them all at once, so concurrent writers pay one sync of the ledger, not one each. A transaction
        that fails is tried again one call at a time, so that a call fails only for its own error."""
        mine = _Work(work)
        with self._group:
            self._queued.append(mine)
            while self._committing and not mine.done:
                self._group.wait()
            if not mine.done:
                self._committing = True
                batch, self._queued = self._queued, []
        if not mine.done:
            try:
                self._commit_batch(batch)
            finally:
                with self._group:
                    self._committing = False
                    self._group.notify_all()
        if mine.error is not None:
            raise mine.error

    def _commit_batch(self, batch: list[_Work]) -> None:
        try:
            try:
                with self.tx() as db:
                    for w in batch:
                        w.work(db)
                for w in batch:
                    w.ok = True
            except Exception as exc:  # noqa: BLE001 - raised again in the thread whose work it is
                if len(batch) == 1:
                    batch[0].error = exc
                    return
                for w in batch:
                    try:
                        with self.tx() as db:
                            w.work(db)
                        w.ok = True
                    except Exception as own:  # noqa: BLE001 - raised again in the thread whose work it is
                        w.error = own
        finally:
            for w in batch:
                if not w.ok and w.error is None:  # the committing thread was interrupted
                    w.error = RunStoreError(
                        "a ledger transaction was interrupted", where=self.path, fix="the instance is refused; send it again"
                    )
                w.done = True

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction (``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on error)."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock that :meth:`tx` takes, across transactions (no other thread's transaction runs meanwhile)."""
        with self._lock:
            yield

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self.db.execute(sql, tuple(args)).fetchall()]

    def one(self, sql: str, args: Sequence[Any] = ()) -> dict[str, Any] | None:
        found = self.rows(sql, args)
        return found[0] if found else None

    def close(self) -> None:
        with self._lock:
            self.db.close()

    # -- fetched series (PACS sources of ctpipe run) ----------------------------------------
    def fetched(self, series_uid: str) -> dict[str, Any] | None:
        return self.one("SELECT * FROM fetched WHERE series_uid = ?", (series_uid,))

    def record_fetch(
        self,
        series_uid: str,
        *,
        study_uid: str,
        source: str,
        state: str,
        n_expected: int | None,
        n_files: int | None,
        folder: str | None,
        error: str | None,
    ) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO fetched (series_uid, study_uid, source, state, n_expected, n_files, folder, error, attempts, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT(series_uid) DO UPDATE SET study_uid = excluded.study_uid, "
                "source = excluded.source, state = excluded.state, n_expected = excluded.n_expected, n_files = excluded.n_files, "
                "folder = excluded.folder, error = excluded.error, attempts = fetched.attempts + 1, updated_at = excluded.updated_at",
                (series_uid, study_uid, source, state, n_expected, n_files, folder, error, time.time()),
            )


class _Work:
    """One call of :meth:`Ledger.batched`: its work, and how it ended."""

    def __init__(self, work: Callable[[sqlite3.Connection], None]):
        self.work = work
        self.done = False
        self.ok = False
        self.error: BaseException | None = None


def now() -> float:
    """Seconds since the epoch (UTC), as stored in the ledger."""
    return time.time()


class PacsLock:
    """An exclusive lock on ``RUN_DIR/pacs/.lock`` (one fetching run or listener per run folder; released
    by the OS if the process dies)."""

    def __init__(self, run_dir: str | Path, *, holder: str):
        import fcntl

        path = Path(run_dir) / "pacs" / ".lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a+")  # noqa: SIM115 - held for the lock's lifetime
        try:
            flock(
                self.fh.fileno(),
                fcntl.LOCK_EX | fcntl.LOCK_NB,
                where=path.parent.parent,
                error=RunStoreError,
                what="two processes never fetch into or listen for one run folder at once",
            )
        except RunStoreError:
            self.fh.close()
            raise
        except BlockingIOError as exc:
            self.fh.seek(0)
            other = self.fh.read().strip()
            self.fh.close()
            raise RunStoreError(
                f"another ctpipe process ({other or 'unknown'}) is fetching into or listening for this run folder",
                where=path.parent.parent,
                fix="wait for it to finish, or choose another --out folder",
            ) from exc
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"{holder} pid {os.getpid()}")
        self.fh.flush()

    def release(self) -> None:
        import fcntl

        if not self.fh.closed:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
