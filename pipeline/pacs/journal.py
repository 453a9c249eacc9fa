"""The listener's durable journal of received instances and series (tables ``instances`` and ``series``
of :mod:`pipeline.pacs.ledger`), and its folders ``RUN_DIR/pacs/incoming/<SeriesInstanceUID>/g<N>/``.

An instance is admitted (:meth:`ReceiveJournal.admit`: a duplicate SOPInstanceUID is recognised and
not stored again; one arriving while another copy of it is being written waits for that copy), written to its
series' open generation folder (:func:`~pipeline.pacs.spool.store_received`: renamed to its name, then its data
and folder entry synced) while its row, with the file's size and CRC-32, is written to the journal
(:meth:`ReceiveJournal.record`, synced); only once all three are durable is the sender told it was stored
(:meth:`ReceiveJournal.finish`). Syncing them together, not one after the other, lets the file system join
them in one commit. After a crash, a file may therefore stand under its name incomplete, with or without its
row; it was never acknowledged, and :meth:`ReceiveJournal.recover` removes it (a file the journal does not
list, or one that does not match its row's size and CRC-32), so the sender, told nothing, sends it again. An
instance the journal lists already (stored before, its file since removed) is synced before it is renamed and
recorded after, as recovery could not tell it from a complete one. A generation is
``open`` while it receives, ``handed`` once given to the runner (its folder no longer changes) and
``processed`` when the run has finished it. An instance of a series whose latest generation was
already handed opens generation N+1, whose folder starts with hard links to generation N's files:
the runner sees a changed series as a new case. After a crash, :meth:`ReceiveJournal.recover`
removes the files of instances never acknowledged, drops empty generations, and restarts the quiet
period of open series; handed generations are handed again (the run store skips done cases), but for those the
runner had not finished that the listener's count settings now hold (:meth:`ReceiveJournal.unhand`).

Once a generation is processed, its folder is removed (:meth:`ReceiveJournal.release`) unless
``pacs.keep_received`` keeps it (``all``; ``failed`` keeps those of quarantined or not selected
series); the instances stay in the journal. A generation handed over incomplete (missing slices after
``pacs.series_limit_s``, note :data:`INCOMPLETE_NOTE`) and quarantined keeps its folder for
``pacs.incomplete_keep_s`` after its last instance, while no newer generation exists: a sender that
sends the missing instances later (a modality's queue after a network outage) then completes it, since
the new generation starts from its files. A duplicate of an instance whose file is still kept is
answered with success and not stored again; one whose file was removed is stored again, into the
series' open generation or a new one: a series sent again in full after its files were removed
forms the same case (the run store skips it as done), and one sent again with more instances forms
a new case with all of them. :meth:`ReceiveJournal.recover` also removes generation folders the
journal does not know (a crash between creating one and recording it), temporary files of cut-short
writes in every generation folder, and folders of processed generations a crash left unremoved.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .address import valid_uid
from .ledger import Ledger, now
from .spool import fsync_dir

log = logging.getLogger(__name__)

#: Start of the note of a generation handed to the runner incomplete, after ``pacs.series_limit_s``.
INCOMPLETE_NOTE = "incomplete after"
#: Start of the note of an open generation whose sender's association ended without a release (cut off mid-series).
CUT_NOTE = "sender cut off:"
#: Start of the note of a generation opened again from a cut-off one that was quarantined: its sender has since sent
#: the series again on an association it released, every instance a duplicate (see :meth:`ReceiveJournal.reopen`).
RESENT_NOTE = "sent again whole:"
#: Start of the note of a generation opened again from one quarantined only as short of a count its instances give,
#: that count no longer checked (``pacs.abort_count_check`` or ``pacs.release_count_check`` changed, the listener
#: restarted): run again as it is.
RECOUNTED_NOTE = "count no longer checked:"
#: What joins a cut-off generation's :data:`CUT_NOTE` and why its slices do not form a volume (a gap, too few), when
#: both hold: the note keeps both facts, the cut-off first.
ALSO_NOTE = "; also: "


@dataclass(frozen=True)
class Admission:
    """Where an admitted instance goes (``duplicate``: already stored, nothing to write; ``listed``: the journal has
    a row for the SOPInstanceUID already, from a generation whose files were removed, so its file must be complete
    before it takes its name: see the module docstring)."""

    duplicate: bool
    series_uid: str
    generation: int = 0
    folder: Path | None = None
    sop_uid: str = ""
    listed: bool = False


class ReceiveJournal:
    """The listener's journal in ``ledger``; series folders under ``root`` (``RUN_DIR/pacs/incoming``)."""

    def __init__(self, ledger: Ledger, root: Path):
        self.ledger = ledger
        self.root = root
        self._writing: dict[tuple[str, int], int] = {}  # instances being written, by (series, generation)
        self._in_flight: set[str] = set()  # SOPInstanceUIDs being written
        self._landed = threading.Condition()  # notified when an instance is no longer being written

    def folder(self, series_uid: str, generation: int) -> Path:
        return self.root / series_uid / f"g{generation}"

    # -- receiving -------------------------------------------------------------------------
    def admit(self, sop_uid: str, series_uid: str, *, study_uid: str | None = None) -> Admission:
        """Decide where an incoming instance goes; opens a series or a new generation when needed.

        Another association writing the same SOPInstanceUID is waited for first (then this one is a duplicate, or,
        if that write failed, is written). Every admission that is not a duplicate ends with :meth:`commit`,
        :meth:`finish` (after :meth:`record`), :meth:`withdraw` or :meth:`abandon`."""
        with self._landed:
            while sop_uid in self._in_flight:
                self._landed.wait()
            self._in_flight.add(sop_uid)
        try:
            adm = self._admit(sop_uid, series_uid, study_uid)
        except BaseException:
            self._landed_one(sop_uid)
            raise
        if adm.duplicate:
            self._landed_one(sop_uid)
        return adm

    def _landed_one(self, sop_uid: str) -> None:
        with self._landed:
            self._in_flight.discard(sop_uid)
            self._landed.notify_all()

    def _admit(self, sop_uid: str, series_uid: str, study_uid: str | None) -> Admission:
        with self.ledger.tx() as db:
            seen = db.execute(
                "SELECT s.removed_at FROM instances i LEFT JOIN series s ON s.series_uid = i.series_uid "
                "AND s.generation = i.generation WHERE i.sop_uid = ?",
                (sop_uid,),
            ).fetchone()
            if seen is not None and seen["removed_at"] is None:
                return Admission(True, series_uid)
            row = db.execute(
                "SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (series_uid,)
            ).fetchone()
            t = now()
            if row is not None and row["state"] == "open":  # nothing to write: last_at moves at commit
                gen = int(row["generation"])
            else:
                gen = 1 if row is None else int(row["generation"]) + 1
                folder = self.folder(series_uid, gen)
                n_before = self._link_previous(row, folder)
                db.execute(
                    "INSERT INTO series (series_uid, generation, state, first_at, last_at, n_instances, folder, study_uid, "
                    "aborted) VALUES (?, ?, 'open', ?, ?, ?, ?, ?, '')",
                    (series_uid, gen, t, t, n_before, str(folder), study_uid),
                )
                if row is not None and seen is not None:  # an instance received before, its files since removed
                    log.info(
                        "series %s sent again after its received files were removed (generation %d); stored as "
                        "generation %d, whose case is processed again only if its instances differ from those processed",
                        series_uid,
                        int(row["generation"]),
                        gen,
                        extra={"event": "listen_resent"},
                    )
                elif row is not None:
                    log.warning(
                        "series %s grew after it was handed to the runner (generation %d); it is processed again "
                        "as generation %d",
                        series_uid,
                        int(row["generation"]),
                        gen,
                        extra={"event": "listen_regrow"},
                    )
            key = (series_uid, gen)
            self._writing[key] = self._writing.get(key, 0) + 1
            return Admission(False, series_uid, gen, self.folder(series_uid, gen), sop_uid=sop_uid, listed=seen is not None)

    def _link_previous(self, row: Any, folder: Path) -> int:
        if folder.exists():  # left by a crash between creating it and committing the row
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        fsync_dir(folder.parent)  # the new folder's own entry (and its series folder's) last as its files do
        fsync_dir(folder.parent.parent)
        if row is None or row["removed_at"] is not None:
            return 0
        n = 0
        for src in Path(row["folder"]).glob("*.dcm"):
            try:
                os.link(src, folder / src.name)
            except OSError:
                shutil.copy2(src, folder / src.name)
            n += 1
        return n

    def commit(
        self, adm: Admission, *, sop_uid: str, sop_class: str, calling_aet: str, size: int | None = None, crc32: int | None = None
    ) -> None:
        """Record a written, synced instance (after :meth:`admit`): :meth:`record`, then :meth:`finish`."""
        self.record(adm, sop_uid=sop_uid, sop_class=sop_class, calling_aet=calling_aet, size=size, crc32=crc32)
        self.finish(adm)

    def record(
        self, adm: Admission, *, sop_uid: str, sop_class: str, calling_aet: str, size: int | None = None, crc32: int | None = None
    ) -> None:
        """Write an admitted instance's row durably (``size``: of its file, bytes; ``crc32``: of its file's bytes,
        for :meth:`recover` to check the file against); the instance is still being written until :meth:`finish`
        (or :meth:`withdraw`, if its file could not be stored). The row may be written while the file is being
        synced, not after: the sender is answered only once both are durable, and recovery removes an instance
        whose file does not match its row. Rows of instances arriving on several associations at once are
        written in one transaction (:meth:`~pipeline.pacs.ledger.Ledger.batched`).
        """

        def write(db: Any) -> None:
            cur = db.execute(  # an instance stored again after its earlier file was removed moves to this generation
                "INSERT INTO instances (sop_uid, series_uid, generation, sop_class, calling_aet, received_at, size, crc32) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(sop_uid) DO UPDATE SET series_uid = excluded.series_uid, "
                "generation = excluded.generation, received_at = excluded.received_at, size = excluded.size, "
                "crc32 = excluded.crc32 "
                "WHERE instances.generation != excluded.generation OR instances.series_uid != excluded.series_uid",
                (sop_uid, adm.series_uid, adm.generation, sop_class, calling_aet, now(), size, crc32),
            )
            db.execute(
                "UPDATE series SET n_instances = n_instances + ?, last_at = ? WHERE series_uid = ? AND generation = ?",
                (1 if cur.rowcount else 0, now(), adm.series_uid, adm.generation),
            )

        self.ledger.batched(write)

    def finish(self, adm: Admission) -> None:
        """An instance recorded and its file synced: it may be acknowledged, and its generation handed over."""
        with self.ledger.locked():
            self._done_writing(adm)

    def withdraw(self, adm: Admission) -> None:
        """Remove the row :meth:`record` wrote for an admitted instance (not one the journal listed before it, see
        :attr:`Admission.listed`) whose file could not be stored, and end its admission."""
        with self.ledger.locked():
            with self.ledger.tx() as db:
                cur = db.execute(
                    "DELETE FROM instances WHERE sop_uid = ? AND series_uid = ? AND generation = ?",
                    (adm.sop_uid, adm.series_uid, adm.generation),
                )
                if cur.rowcount:
                    db.execute(
                        "UPDATE series SET n_instances = n_instances - 1 WHERE series_uid = ? AND generation = ?",
                        (adm.series_uid, adm.generation),
                    )
            self._done_writing(adm)

    def abandon(self, adm: Admission) -> None:
        """An admitted instance that could not be written (or recorded), with no row of its own."""
        with self.ledger.locked():
            self._done_writing(adm)

    def _done_writing(self, adm: Admission) -> None:
        key = (adm.series_uid, adm.generation)
        left = self._writing.get(key, 0) - 1
        if left > 0:
            self._writing[key] = left
        else:
            self._writing.pop(key, None)
        if adm.sop_uid:
            self._landed_one(adm.sop_uid)

    # -- handing series to the runner ------------------------------------------------------
    def quiet(self, quiet_s: float) -> list[dict[str, Any]]:
        """Open generations with no instance for ``quiet_s`` and none being written."""
        with self.ledger.tx() as db:
            rows = [dict(r) for r in db.execute("SELECT * FROM series WHERE state = 'open' AND last_at <= ?", (now() - quiet_s,))]
            return [r for r in rows if (r["series_uid"], r["generation"]) not in self._writing]

    def hand(self, rows: list[dict[str, Any]], note: str | None = None) -> list[dict[str, Any]]:
        """Mark generations handed to the runner (their folders are final from then on); returns those marked.

        A generation that received an instance since ``rows`` were read (or is receiving one) stays open.
        """
        out = []
        with self.ledger.tx() as db:
            for r in rows:
                if (r["series_uid"], r["generation"]) in self._writing:
                    continue
                cur = db.execute(
                    "UPDATE series SET state = 'handed', note = COALESCE(?, note) WHERE series_uid = ? "
                    "AND generation = ? AND state = 'open' AND last_at = ?",
                    (note, r["series_uid"], r["generation"], r["last_at"]),
                )
                if cur.rowcount:
                    out.append(dict(r, state="handed", note=note or r.get("note")))
        return out

    def note(self, row: dict[str, Any], note: str | None) -> None:
        with self.ledger.tx() as db:
            db.execute(
                "UPDATE series SET note = ? WHERE series_uid = ? AND generation = ?", (note, row["series_uid"], row["generation"])
            )

    def reopen(self, row: dict[str, Any], note: str) -> dict[str, Any] | None:
        """Open generation N+1 of a processed generation ``row`` whose files are still kept, with the same files (hard
        links) and ``note`` (:data:`RESENT_NOTE`): handed on once quiet, as a new arrival would be. None (nothing
        done) when the series has a newer generation or the files were removed."""
        with self.ledger.tx() as db:
            latest = db.execute(
                "SELECT * FROM series WHERE series_uid = ? ORDER BY generation DESC LIMIT 1", (row["series_uid"],)
            ).fetchone()
            if latest is None or int(latest["generation"]) != int(row["generation"]) or latest["removed_at"] is not None:
                return None
            gen = int(row["generation"]) + 1
            folder = self.folder(row["series_uid"], gen)
            n = self._link_previous(latest, folder)
            t = now()
            db.execute(
                "INSERT INTO series (series_uid, generation, state, first_at, last_at, n_instances, folder, study_uid, "
                "note, aborted) VALUES (?, ?, 'open', ?, ?, ?, ?, ?, ?, '')",
                (row["series_uid"], gen, t, t, n, str(folder), row.get("study_uid"), note),
            )
        return dict(row, generation=gen, state="open", first_at=t, last_at=t, n_instances=n, folder=str(folder), note=note)

    def handed(self) -> list[dict[str, Any]]:
        return self.ledger.rows("SELECT * FROM series WHERE state = 'handed' ORDER BY last_at")

    def unhand(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """Put a handed generation the runner did not finish back to ``open`` (at a restart, to be judged as an open
        one is), its quiet period restarted as :meth:`recover` restarts an open one's; None (nothing done) when it is
        no longer handed or a newer generation of its series exists."""
        t = now()
        with self.ledger.tx() as db:
            cur = db.execute(
                "UPDATE series SET state = 'open', last_at = ? WHERE series_uid = ? AND generation = ? AND state = 'handed' "
                "AND NOT EXISTS (SELECT 1 FROM series s WHERE s.series_uid = ? AND s.generation > ?)",
                (t, row["series_uid"], row["generation"], row["series_uid"], row["generation"]),
            )
        return dict(row, state="open", last_at=t) if cur.rowcount else None

    def processed(self, row: dict[str, Any], *, case_id: str | None, outcome: str) -> None:
        with self.ledger.tx() as db:
            db.execute(
                "UPDATE series SET state = 'processed', case_id = ?, outcome = ? WHERE series_uid = ? AND generation = ?",
                (case_id, outcome, row["series_uid"], row["generation"]),
            )

    def held(self, row: dict[str, Any], *, hold_s: float) -> bool:
        """Whether a processed generation's files wait for the rest of its series: handed over incomplete, quarantined,
        its last instance less than ``hold_s`` (s, ``pacs.incomplete_keep_s``) ago, and no newer generation yet."""
        if hold_s <= 0 or str(row.get("outcome")) != "failed" or not str(row.get("note") or "").startswith(INCOMPLETE_NOTE):
            return False
        if now() - float(row["last_at"]) >= hold_s:
            return False
        newer = self.ledger.one(
            "SELECT 1 FROM series WHERE series_uid = ? AND generation > ?", (row["series_uid"], row["generation"])
        )
        return newer is None

    def release(self, row: dict[str, Any], *, keep: str, hold_s: float = 0.0) -> bool:
        """Remove a processed generation's folder unless ``keep`` (``pacs.keep_received``) keeps it or it is
        :meth:`held` (``hold_s``: ``pacs.incomplete_keep_s``); True if removed."""
        if not should_remove(str(row.get("outcome") or ""), keep) or self.held(row, hold_s=hold_s):
            return False
        folder = Path(row["folder"])
        if folder.is_dir():
            shutil.rmtree(folder)
            fsync_dir(folder.parent)
        if folder.parent.is_dir() and not any(folder.parent.iterdir()):
            folder.parent.rmdir()
        with self.ledger.tx() as db:
            db.execute(
                "UPDATE series SET removed_at = ? WHERE series_uid = ? AND generation = ?",
                (now(), row["series_uid"], row["generation"]),
            )
        log.info(
            "series %s (generation %d, %s): received files removed",
            row["series_uid"],
            row["generation"],
            row.get("outcome"),
            extra={"event": "listen_released"},
        )
        return True

    def sender(self, row: dict[str, Any]) -> str:
        """The calling AE title that sent a generation's first instance (``(unknown)`` when only recovered ones)."""
        first = self.ledger.one(
            "SELECT calling_aet FROM instances WHERE series_uid = ? AND generation = ? AND calling_aet != '(recovered)' "
            "ORDER BY received_at LIMIT 1",
            (row["series_uid"], row["generation"]),
        )
        return str(first["calling_aet"]) if first else "(unknown)"

    def origin(self, row: dict[str, Any]) -> dict[str, Any]:
        """Where a generation came from, for the run store: the calling AE title, C-STORE, the UIDs, the count."""
        return {
            "remote": f"C-STORE from AE {self.sender(row)}",
            "via": "c-store",
            "study_uid": row.get("study_uid"),
            "series_uid": row["series_uid"],
            "n_instances": row.get("n_instances"),
        }

    # -- after a crash ---------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Bring journal and folders into agreement after a crash (see the module docstring); counts of what was done."""
        counts = {"unacknowledged": 0, "dropped": 0, "reopened": 0, "handed": 0, "orphans": 0}
        counts["orphans"] = self._remove_orphans()
        for row in self.ledger.rows("SELECT * FROM series WHERE state = 'open'"):
            folder = Path(row["folder"])
            for tmp in folder.glob(".*.tmp"):  # a write cut short: never acknowledged
                tmp.unlink(missing_ok=True)
            removed = self._remove_unsynced(row)
            for p in sorted(folder.glob("*.dcm")):
                if not valid_uid(p.stem) or self.ledger.one("SELECT 1 FROM instances WHERE sop_uid = ?", (p.stem,)):
                    continue
                # renamed, not committed: its content may not have reached the disk, and its sender was told
                # nothing (it sends it again)
                p.unlink(missing_ok=True)
                removed += 1
            counts["unacknowledged"] += removed
            if removed and folder.is_dir():
                fsync_dir(folder)
            with self.ledger.tx() as db:
                n = sum(1 for _ in folder.glob("*.dcm")) if folder.is_dir() else 0
                if n == 0:
                    db.execute(
                        "DELETE FROM series WHERE series_uid = ? AND generation = ?", (row["series_uid"], row["generation"])
                    )
                    shutil.rmtree(folder, ignore_errors=True)
                    counts["dropped"] += 1
                else:  # the sender may be sending the rest again: give it a full quiet period from now
                    db.execute(
                        "UPDATE series SET last_at = ?, n_instances = ? WHERE series_uid = ? AND generation = ?",
                        (now(), n, row["series_uid"], row["generation"]),
                    )
                    counts["reopened"] += 1
        counts["handed"] = len(self.handed())
        self._writing.clear()
        return counts

    def _remove_unsynced(self, row: dict[str, Any]) -> int:
        """Instances of an open generation whose file does not match the size and CRC-32 of their row (the row was
        written while the file was being synced, and the crash came first: never acknowledged); rows and files removed."""
        folder = Path(row["folder"])
        key = (row["series_uid"], row["generation"])
        listed = self.ledger.rows(
            "SELECT sop_uid, size, crc32 FROM instances WHERE series_uid = ? AND generation = ? AND size IS NOT NULL", key
        )
        bad = [r["sop_uid"] for r in listed if not _matches(folder / f"{r['sop_uid']}.dcm", r["size"], r["crc32"])]
        for sop_uid in bad:
            (folder / f"{sop_uid}.dcm").unlink(missing_ok=True)
            log.warning(
                "instance %s of series %s: its file is incomplete after a crash (never acknowledged); removed",
                sop_uid,
                row["series_uid"],
                extra={"event": "listen_unsynced"},
            )
        if bad:
            with self.ledger.tx() as db:
                db.executemany("DELETE FROM instances WHERE sop_uid = ?", [(u,) for u in bad])
        return len(bad)

    def _remove_orphans(self) -> int:
        """Generation folders the journal does not know, and temporary files of cut-short writes; how many removed."""
        if not self.root.is_dir():
            return 0
        rows = self.ledger.rows("SELECT series_uid, generation FROM series WHERE removed_at IS NULL")
        known = {(r["series_uid"], f"g{r['generation']}") for r in rows}
        n = 0
        for series_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for gen_dir in sorted(p for p in series_dir.iterdir() if p.is_dir()):
                if (series_dir.name, gen_dir.name) not in known:
                    log.info("removing %s: not in the journal (left by a crash)", gen_dir, extra={"event": "listen_orphan"})
                    shutil.rmtree(gen_dir, ignore_errors=True)
                    n += 1
                    continue
                for tmp in gen_dir.glob(".*.tmp"):  # a write cut short: never acknowledged
                    tmp.unlink(missing_ok=True)
                    n += 1
            if not any(series_dir.iterdir()):
                series_dir.rmdir()
        return n


def _matches(path: Path, size: int, crc32: int | None) -> bool:
    """Whether the file at ``path`` has ``size`` bytes whose CRC-32 is ``crc32`` (None: not checked)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return len(data) == size and (crc32 is None or zlib.crc32(data) == crc32)


def should_remove(outcome: str, keep: str) -> bool:
    """Whether ``pacs.keep_received = keep`` removes received files whose case ended with ``outcome``
    (``done``; ``failed`` or ``not selected: ...``; anything else, e.g. unfinished, is always kept)."""
    if keep == "all":
        return False
    if outcome == "done":
        return True
    return keep == "none" and (outcome == "failed" or outcome.startswith("not selected"))
