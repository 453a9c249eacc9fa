"""The run store's database file, ``RUN_DIR/runs.sqlite`` (SQLite, WAL mode): its tables, schema version and
migrations, the connections to it, and :func:`remote_series`, the read-only lookup of remote series. The runner's
reads and writes of cases and runs are :class:`.store.RunStore`.

Tables
------
``runs``            one row per invocation of the runner on this folder (config, versions, device, start/end;
                    ``n_cases`` found, ``n_done`` completed by this run for the first time (a case done again, its
                    published folder removed, is not in it: the report counts it where it was first done; end
                    records of earlier ctpipe versions count it), ``n_failed`` of its cases quarantined by this run,
                    ``n_failed_earlier`` still quarantined by earlier runs and not retried,
                    ``n_skipped`` done by earlier runs).
``cases``           one row per case, keyed by ``case_key`` = SeriesInstanceUID + content fingerprint;
                    ``ended_at`` its latest end, ``first_done_at`` its first completion (a case done again, its
                    published folder removed, keeps it: the report counts a case there); ``found_by`` the latest
                    run whose discovery found the case among its sources (a killed run's cases left quarantined by
                    earlier runs are counted from it, not from every quarantined case of the folder).
``stage_attempts``  one row per stage attempt: wall time (s), queue wait (s), peak RSS and CUDA memory (MB),
                    and ``detail``: the stage's own sub-step times (JSON, s; model time from CUDA events on a GPU);
                    ``skip_reason``: why the attempt returned without its stage's work (detection of a scan without
                    lungs), recorded when it happened: no latency sample of the stage, whatever became of the case.
``findings``        the detector's findings of completed cases (centres in LPS mm).
``measurements``    per-case measurements (name, value, unit) of completed cases; ``reliable`` = 0 (with the
                    ``reason``) for figures a quality flag makes meaningless.
``quality_flags``   the quality flags of completed cases (code, severity, message); the case's lung coverage,
                    contrast phase and flag codes are also columns of ``cases``.
``skipped``         what discovery left out, per run: files (not DICOM, unreadable, link loops, ...) and series
                    not selected (localizers, too few slices, not CT), with the reason; and the series of cases
                    left for the next run because more of them arrived while they ran (kind ``still_written``).
``gpu_samples``     NVML utilisation (%) and memory (MB) sampled during runs.
``origins``         where a case came from when a PACS delivered it: the archive or sender (``remote``: a DICOMweb
                    URL or ``dimse://AET@HOST:PORT`` as written to logs, never with credentials; the calling AE title
                    for ``ctpipe listen``), how (``via``: wado-rs, c-move, c-get, c-store), the remote Study and
                    Series Instance UIDs and the number of instances. UIDs only: no patient ID, name or accession.
                    A rerun looks series up here by remote UID (:func:`remote_series`) and skips those done.
``deliveries``      the DICOM results (SR, SEG) sent to a PACS: per SOPInstanceUID and destination, ``sent``,
                    ``unconfirmed`` (stored on the archive's success answer, the query confirming it refused),
                    ``pending`` (a retry is due) or ``failed``, with the attempts and the last error.
``unconfirmed``     cases recorded done whose source series the runner is still checking once more, just after
                    that commit (a file landing as it was made takes the case back): not published to a PACS
                    until their row here is gone (:meth:`.store.RunStore.confirm_case`). A row a killed run left
                    is settled by the next run's check of the source.

``meta.schema_version`` is :data:`SCHEMA_VERSION`; a store written by an earlier version is migrated
when the runner opens it (new tables and columns added; nothing removed).

Only the runner's main process writes (:class:`.store.RunStore`, over :class:`StoreConnection`); readers (reports,
notebooks) open it with :func:`open_readonly` and see committed state only, thanks to WAL. Times are Unix seconds
(UTC).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import RunStoreError, missing_path_fix, printable
from .faults import environment_failure

log = logging.getLogger(__name__)

DB_NAME = "runs.sqlite"
SCHEMA_VERSION = 8

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started_at REAL NOT NULL, ended_at REAL, status TEXT NOT NULL,
    command TEXT, sources TEXT, config TEXT, versions TEXT, device TEXT, host TEXT, pid INTEGER,
    n_cases INTEGER DEFAULT 0, n_done INTEGER DEFAULT 0, n_failed INTEGER DEFAULT 0, n_skipped INTEGER DEFAULT 0,
    n_failed_earlier INTEGER DEFAULT 0, active_s REAL, active_at REAL
);
CREATE TABLE IF NOT EXISTS cases (
    case_key TEXT PRIMARY KEY, case_id TEXT NOT NULL UNIQUE, series_uid TEXT, fingerprint TEXT NOT NULL,
    source TEXT, status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    reason TEXT, error_class TEXT, failed_stage TEXT, attempts INTEGER NOT NULL DEFAULT 0, run_id TEXT,
    discovered_at REAL, started_at REAL, ended_at REAL, latency_s REAL, n_findings INTEGER, output_dir TEXT,
    lung_coverage TEXT, contrast_phase TEXT, flags TEXT, detect_skipped TEXT, first_done_at REAL, found_by TEXT
);
CREATE TABLE IF NOT EXISTS stage_attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, case_key TEXT NOT NULL, stage TEXT NOT NULL,
    attempt INTEGER NOT NULL, status TEXT NOT NULL, worker TEXT, device TEXT,
    ready_at REAL, started_at REAL, ended_at REAL, wall_s REAL, queue_wait_s REAL,
    peak_rss_mb REAL, peak_cuda_mb REAL, error TEXT, detail TEXT, skip_reason TEXT,
    UNIQUE (case_key, stage, attempt)
);
CREATE TABLE IF NOT EXISTS findings (
    case_key TEXT NOT NULL, idx INTEGER NOT NULL, data TEXT NOT NULL,
    center_x REAL, center_y REAL, center_z REAL, diameter_mm REAL, score REAL,
    PRIMARY KEY (case_key, idx)
);
CREATE TABLE IF NOT EXISTS measurements (
    case_key TEXT NOT NULL, name TEXT NOT NULL, value REAL, unit TEXT, reliable INTEGER NOT NULL DEFAULT 1, reason TEXT,
    PRIMARY KEY (case_key, name)
);
CREATE TABLE IF NOT EXISTS quality_flags (
    case_key TEXT NOT NULL, code TEXT NOT NULL, severity TEXT NOT NULL, message TEXT,
    PRIMARY KEY (case_key, code)
);
CREATE TABLE IF NOT EXISTS skipped (
    run_id TEXT NOT NULL, what TEXT NOT NULL, item TEXT NOT NULL, kind TEXT, reason TEXT, source TEXT,
    PRIMARY KEY (run_id, what, item)
);
CREATE TABLE IF NOT EXISTS gpu_samples (
    run_id TEXT NOT NULL, t REAL NOT NULL, gpu INTEGER NOT NULL, util_pct REAL, mem_used_mb REAL, mem_total_mb REAL
);
CREATE INDEX IF NOT EXISTS attempts_by_case ON stage_attempts (case_key);
CREATE TABLE IF NOT EXISTS origins (
    case_key TEXT PRIMARY KEY, remote TEXT NOT NULL, via TEXT NOT NULL, study_uid TEXT, series_uid TEXT NOT NULL,
    n_instances INTEGER, run_id TEXT, recorded_at REAL
);
CREATE INDEX IF NOT EXISTS origins_by_series ON origins (series_uid);
CREATE TABLE IF NOT EXISTS deliveries (
    sop_uid TEXT NOT NULL, destination TEXT NOT NULL, case_id TEXT, sop_class TEXT, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, error TEXT, updated_at REAL, PRIMARY KEY (sop_uid, destination)
);
CREATE TABLE IF NOT EXISTS unconfirmed (case_key TEXT PRIMARY KEY, case_id TEXT NOT NULL, done_at REAL NOT NULL);
"""

#: Columns added since schema version 1 (version 3 added the tables ``origins`` and ``deliveries`` only; version 4
#: ``runs.n_failed_earlier``; version 5 ``runs.active_s`` and ``runs.active_at``: a run's time so far on the
#: monotonic clock, and the Unix time it was recorded at; version 6 ``cases.first_done_at``, the case's first completion,
#: which a completion again keeps, filled from ``ended_at`` for the cases done before; version 7
#: ``stage_attempts.skip_reason``; version 8 ``cases.found_by``, the latest run whose discovery found the case, empty
#: for the cases of runs before it): (table, column, declaration), added by :func:`migrate`.
ADDED_COLUMNS = (
    ("cases", "lung_coverage", "TEXT"),
    ("cases", "contrast_phase", "TEXT"),
    ("cases", "flags", "TEXT"),
    ("cases", "detect_skipped", "TEXT"),
    ("measurements", "reliable", "INTEGER NOT NULL DEFAULT 1"),
    ("measurements", "reason", "TEXT"),
    ("runs", "n_failed_earlier", "INTEGER DEFAULT 0"),
    ("runs", "active_s", "REAL"),
    ("runs", "active_at", "REAL"),
    ("cases", "first_done_at", "REAL"),
    ("stage_attempts", "skip_reason", "TEXT"),
    ("cases", "found_by", "TEXT"),
)


def db_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / DB_NAME


def _text_params(params: Any) -> Any:
    """Statement parameters with every string made writable as UTF-8 (see :func:`pipeline.errors.printable`)."""
    if isinstance(params, Mapping):
        return {k: printable(v) if isinstance(v, str) else v for k, v in params.items()}
    return tuple(printable(v) if isinstance(v, str) else v for v in params)


class _Connection(sqlite3.Connection):
    """A connection whose statements store a text holding a file name's undecodable bytes (lone surrogates, which
    SQLite refuses) with those bytes escaped, instead of failing the write (and the run) on it."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return super().execute(sql, _text_params(parameters))

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        return super().executemany(sql, (_text_params(p) for p in parameters))


def connect(run_dir: Path) -> sqlite3.Connection:
    """A read-write connection to ``run_dir``'s store (created when absent): WAL mode, every table of
    :data:`SCHEMA_SQL`, a store of an earlier schema version migrated. :class:`RunStoreError` when the file is not
    a readable run store (an environment failure, such as a full disk, is raised as it is)."""
    path = db_path(run_dir)
    try:
        db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, factory=_Connection)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA_SQL)
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        else:
            migrate(db, int(row[0]), path)
    except sqlite3.DatabaseError as exc:
        if environment_failure(exc, run_dir=run_dir) is not None:
            raise
        raise RunStoreError(
            f"the run database is unreadable ({exc})",
            where=path,
            fix="use a new --out folder; this file is damaged or not a ctpipe run store",
        ) from exc
    return db


def migrate(db: sqlite3.Connection, version: int, path: Path) -> None:
    """Bring a store of an earlier schema version up to :data:`SCHEMA_VERSION` (adds columns; removes nothing).

    New tables are created by the schema script itself (``CREATE TABLE IF NOT EXISTS``) before this runs.
    """
    if version > SCHEMA_VERSION:
        raise RunStoreError(
            f"the run database has schema version {version}; this ctpipe reads up to {SCHEMA_VERSION}",
            where=path,
            fix="use the ctpipe version that wrote this run folder, or a new --out folder",
        )
    if version == SCHEMA_VERSION:
        return
    with Transaction(db):
        for table, column, decl in ADDED_COLUMNS:
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        # a case done before version 6 was first done at its recorded end (the only completion time it kept)
        db.execute("UPDATE cases SET first_done_at=ended_at WHERE status='done' AND first_done_at IS NULL")
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
    log.info("run store migrated from schema version %d to %d", version, SCHEMA_VERSION, extra={"event": "store_migrated"})


class Transaction:
    """``with Transaction(db):`` runs the statements inside as one atomic transaction (rolled back on an exception)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")


class StoreConnection:
    """The runner's read-write connection to ``RUN_DIR/runs.sqlite`` (over :func:`connect`) and its transactions:
    what :class:`.store.RunStore` and its parts (:mod:`.store_cases`, :mod:`.store_records`) write through."""

    def __init__(self, run_dir: str | Path, *, create: bool = True):
        self.run_dir = Path(run_dir)
        path = db_path(self.run_dir)
        if not create and not path.is_file():
            raise not_a_run(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.db = connect(self.run_dir)

    def close(self) -> None:
        self.db.close()

    def tx(self) -> Transaction:
        """``with store.tx():`` runs the statements inside as one atomic transaction."""
        return Transaction(self.db)


def not_a_run(run_dir: str | Path) -> RunStoreError:
    """The error for a run folder without a run database, saying whether the folder is missing or a file."""
    run_dir = Path(run_dir)
    fix = "give a folder written by `ctpipe run --out`"
    if not run_dir.exists():
        return RunStoreError(
            "no run database here: the folder does not exist",
            where=db_path(run_dir),
            fix=missing_path_fix(run_dir, f"check the path; {fix}"),
        )
    if not run_dir.is_dir():
        return RunStoreError("no run database here: this is a file, not a run folder", where=run_dir, fix=fix)
    return RunStoreError("no run database here", where=db_path(run_dir), fix=fix)


def open_readonly(run_dir: str | Path) -> sqlite3.Connection:
    """A read-only connection to a run store (safe while a run is writing), also in a folder this process cannot
    write (nightly folders of another user, an archive on a read-only share; see :func:`_unwritable_folder_store`).

    It is opened as SQLite's writers are and then refuses writes (``PRAGMA query_only``): SQLite's ``mode=ro`` makes
    the WAL store's ``-shm`` and ``-wal`` files beside it and, unable to remove them, leaves them there when closed,
    owned by the reading user; a connection that may write removes them when it is the store's last one, leaving the
    run folder as it found it."""
    path = db_path(run_dir)
    if not path.is_file():
        raise not_a_run(run_dir)
    try:
        try:
            db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=30.0)  # rw: never creates a store
            try:
                db.execute("PRAGMA query_only = ON")
            except sqlite3.Error:
                db.close()
                raise
            db = _checked(db)
        except sqlite3.OperationalError:
            if os.access(path.parent, os.W_OK):
                raise
            db = _unwritable_folder_store(path)
    except sqlite3.DatabaseError as exc:
        raise RunStoreError(
            f"the run database is unreadable ({exc})", where=path, fix="check that it is a ctpipe run store"
        ) from exc
    return db


def _checked(db: sqlite3.Connection) -> sqlite3.Connection:
    """``db``, its rows as :class:`sqlite3.Row`, once it has read the ``cases`` table (closed if it cannot)."""
    try:
        db.row_factory = sqlite3.Row
        db.execute("SELECT 1 FROM cases LIMIT 1")
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


class _Snapshot(sqlite3.Connection):
    """A connection to a private copy of a run store (:func:`_unwritable_folder_store`), removed when closed."""

    folder: Path | None = None

    def close(self) -> None:
        super().close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _unwritable_folder_store(path: Path) -> sqlite3.Connection:
    """A read-only connection to the store ``path`` in a folder this process cannot write, where SQLite cannot make
    the shared-memory file (``-shm``) a reader of a WAL store needs beside it. Without a write-ahead log (``-wal``:
    a run ended and closed its store), the file is read as it is (SQLite's ``immutable``); with one (a run killed
    before SQLite moved its log into the file, the folder copied as it was), the file and its log are copied to a
    private temporary folder and read there, so that what the log holds is read too."""
    wal = path.with_name(path.name + "-wal")
    if not wal.is_file() or wal.stat().st_size == 0:
        log.debug("%s: its folder cannot be written; read as it is", path)
        return _checked(sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=30.0))
    folder = Path(tempfile.mkdtemp(prefix="ctpipe-store-"))
    try:
        for src in (path, wal):
            shutil.copyfile(src, folder / src.name)
        db = sqlite3.connect(str(folder / path.name), timeout=30.0, factory=_Snapshot)
    except (OSError, sqlite3.Error):
        shutil.rmtree(folder, ignore_errors=True)
        raise
    db.folder = folder
    log.debug("%s: its folder cannot be written; its log read from a copy in %s", path, folder)
    return _checked(db)


def remote_series(run_dir: str | Path, series_uids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What the run store knows of remote series, by SeriesInstanceUID: the latest case made from each
    (``case_id``, ``status``, ``n_instances``, ``remote``, ``via``, and ``unconfirmed``: recorded done and not yet
    confirmed, its run killed before it checked the source once more). Series never seen are absent, and so is
    everything when the folder has no store (or one older than schema version 3). Read-only."""
    wanted = list(dict.fromkeys(series_uids))
    if not wanted or not db_path(run_dir).is_file():
        return {}
    db = open_readonly(run_dir)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='origins'").fetchone():
            return {}
        has_unconfirmed = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='unconfirmed'").fetchone()
        unconfirmed = "c.case_key IN (SELECT case_key FROM unconfirmed)" if has_unconfirmed else "0"
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            rows = db.execute(
                "SELECT o.series_uid, o.remote, o.via, o.n_instances, c.case_id, c.status,"
                f" {unconfirmed} AS unconfirmed FROM origins o"
                f" JOIN cases c USING (case_key) WHERE o.series_uid IN ({','.join('?' * len(chunk))})"
                " ORDER BY o.recorded_at",
                chunk,
            )
            for r in rows:  # the latest origin of a series wins
                out[r["series_uid"]] = {k: r[k] for k in ("case_id", "status", "n_instances", "remote", "via")}
                out[r["series_uid"]]["unconfirmed"] = bool(r["unconfirmed"])
        return out
    finally:
        db.close()
