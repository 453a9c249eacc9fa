"""Crash safety and resume: the run-folder lock, reconciling after a crash, and choosing what to run.

Layout of a run folder::

    RUN_DIR/runs.sqlite        the run store (see store.py)
    RUN_DIR/cases/<case_id>/   outputs of completed cases (each with manifest.json)
    RUN_DIR/tmp/               staging folders of cases in progress (deleted on start)
    RUN_DIR/cache/             cached HU arrays (and lung masks) of cases in progress
    RUN_DIR/quarantine/        one JSON per quarantined case (reason, source, fix)

A case's outputs are written into ``tmp/<case_id>.a<attempt>/``; when every
stage is done, ``manifest.json`` is written there last, the folder is renamed
to ``cases/<case_id>`` (atomic), and only then is the case marked done in the
store. So after a crash at any moment either the case is done in both places,
or it has a complete folder not yet marked done (fixed here from its manifest:
done when the manifest was written, not when the run that finds it started,
so the report counts it on its own day with its own latency), or it has no
folder and is run again. A complete folder not yet marked done, or marked done
and not yet confirmed (the run killed between the store's commit and its check
of the source after it), is adopted only once the run has checked its source
series again (:mod:`.adopt`): a file that landed as the run was killed has the
folder withdrawn and the case analysed whole.

Leftovers of a killed process are removed when the next run starts (it holds
the folder's lock, so no other writer is there): the staging folders, the
temporary files of unfinished atomic writes (``.<name>.<random>.tmp``, see
:mod:`pipeline.atomic`, and the metrics text file's ``metrics.prom.<pid>.<tid>``)
in the run folder, its report, cache and quarantine folders, and the quarantine
files of cases that are no longer quarantined (retried, or done since).
Published case folders never hold temporary files: they are renamed into place
complete.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes
from ..errors import RunStoreError, SeriesStillWrittenError
from ..locks import flock
from .adopt import NOT_FOUND, SourceCheck
from .arrivals import STILL_WRITTEN_FIX
from .redact_active import redact
from .stage import CaseSpec
from .store import RunStore

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: Cached files of a case: sidecar first (a cache entry exists only while its sidecar does), array, lung mask,
#: organ masks (for the DICOM SEG), the lungs that give the SR's sides, what the nodules' renderings are drawn from.
CACHE_SUFFIXES = (".json", ".npy", ".lungs.npy", ".organs.npz", ".sides.npz", ".render.npz")
#: Temporary files: atomic writes (``tempfile.mkstemp``: 8 random characters) and prometheus_client's textfile.
_TEMP_FILE = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$|^metrics\.prom\.\d+\.\d+$|^\.write-probe-\d+\.tmp$")
#: Folders of the run folder that may hold temporary files (published case folders never do).
_TEMP_FOLDERS = (".", "report", "cache", "quarantine")


#: Seconds a run refused by a run folder's lock waits for the holder's pid to appear in the lock file.
LOCK_PID_WAIT_S = 2.0


class RunLock:
    """An exclusive lock on a run folder (released by the OS if the process dies)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / ".lock"
        self.fh = open(self.path, "a+")  # noqa: SIM115 - held for the run's lifetime
        try:
            flock(
                self.fh.fileno(),
                fcntl.LOCK_EX | fcntl.LOCK_NB,
                where=run_dir,
                error=RunStoreError,
                what="two runs never write one run folder at once",
            )
        except RunStoreError:
            self.fh.close()
            raise
        except BlockingIOError as exc:
            holder = self._holder()
            self.fh.close()
            pid = f" (pid {holder})" if holder.isdigit() else ""
            stop = f" (or stop it with kill -TERM {holder}: it resumes later)" if holder.isdigit() else ""
            raise RunStoreError(
                f"another ctpipe run{pid} is using this folder",
                where=run_dir,
                fix=f"wait for it to finish{stop}, or choose another --out folder",
            ) from exc
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(str(os.getpid()))
        self.fh.flush()

    def _holder(self) -> str:
        """The pid the run holding the lock wrote into the lock file; it writes it just after it locks, so a run
        starting at the same moment waits up to :data:`LOCK_PID_WAIT_S` for it ("" if none comes)."""
        deadline = time.monotonic() + LOCK_PID_WAIT_S
        while True:
            self.fh.seek(0)
            holder = self.fh.read().strip()
            if holder or time.monotonic() >= deadline:
                return holder
            time.sleep(0.05)

    def release(self) -> None:
        fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(case_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((case_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def publish(staging: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last into ``staging``, then rename it to ``final`` atomically."""
    atomic_write_bytes(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    _fsync_dir(staging)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():  # stale folder of an earlier, abandoned attempt: move it out of the way first
        trash = staging.parent / f".trash-{final.name}-{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(staging, final)
    _fsync_dir(final.parent)


def withdraw(final: Path, trash_dir: Path) -> None:
    """Take a case folder just published back out of ``cases/`` (renamed away at once, then removed): its series
    changed in the source while it was published (see :mod:`.arrivals`)."""
    trash_dir.mkdir(parents=True, exist_ok=True)
    trash = trash_dir / f".trash-{final.name}-{os.getpid()}"
    os.rename(final, trash)
    _fsync_dir(final.parent)
    shutil.rmtree(trash, ignore_errors=True)


def _published_at(folder: Path) -> float | None:
    """When a case folder was published (Unix s): its manifest's modification time (the manifest is written last,
    just before the folder is renamed into place); None when it cannot be read."""
    try:
        return (folder / MANIFEST).stat().st_mtime
    except OSError:
        return None


@dataclass
class Reconciled:
    recovered: list[str] = field(default_factory=list)  # complete folders marked done
    redo: list[str] = field(default_factory=list)  # marked done but their folder is gone
    interrupted: list[str] = field(default_factory=list)  # left 'running' by a killed run
    #: folders a killed run left in place before recording their case done for good, whose series changed in the
    #: source: withdrawn, the case pending (analysed again)
    withdrawn: list[str] = field(default_factory=list)
    #: such folders whose series this run's sources do not hold: left as they are, not adopted
    unchecked: list[str] = field(default_factory=list)
    temp_files: list[Path] = field(default_factory=list)  # temporary files of killed writers, removed
    stale_quarantine: list[str] = field(default_factory=list)  # quarantine files of cases not quarantined, removed
    #: cases done or quarantined by runs killed before they wrote their metrics (status, latency_s, error_class,
    #: first_done_at and ended_at each)
    uncounted: list[dict[str, Any]] = field(default_factory=list)


def drop_cached(run_dir: Path, case_id: str) -> None:
    """Remove a case's cached files (sidecar first)."""
    for suffix in CACHE_SUFFIXES:
        (run_dir / "cache" / f"{case_id}{suffix}").unlink(missing_ok=True)


def remove_quarantine(run_dir: Path, case_id: str) -> None:
    """Remove a case's quarantine file (the case is retried, or was done since)."""
    (run_dir / "quarantine" / f"{case_id}.json").unlink(missing_ok=True)


def remove_temp_files(run_dir: Path) -> list[Path]:
    """Remove the temporary files that killed writers left in the run folder (see the module docstring)."""
    removed: list[Path] = []
    for sub in _TEMP_FOLDERS:
        folder = run_dir / sub
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for e in entries:
            if _TEMP_FILE.match(e.name) and e.is_file(follow_symlinks=False):
                Path(e.path).unlink(missing_ok=True)
                removed.append(Path(e.path))
    if removed:
        log.info(
            "removed %d temporary file(s) left by an interrupted run: %s",
            len(removed),
            ", ".join(str(p.relative_to(run_dir)) for p in removed[:5]),
            extra={"event": "cleanup"},
        )
    return removed


def _sync_quarantine(store: RunStore, run_dir: Path) -> list[str]:
    """Quarantine files of cases that are not quarantined in the store are leftovers: remove them."""
    folder = run_dir / "quarantine"
    if not folder.is_dir():
        return []
    failed = {r["case_id"] for r in store.cases_with_status("failed")}
    stale = [p for p in sorted(folder.glob("*.json")) if not p.name.startswith(".") and p.stem not in failed]
    for p in stale:
        p.unlink(missing_ok=True)
    if stale:
        log.info("removed %d quarantine file(s) of cases no longer quarantined", len(stale), extra={"event": "cleanup"})
    return [p.stem for p in stale]


def _checked(
    store: RunStore,
    run_dir: Path,
    row: Any,
    man: dict[str, Any] | None,
    check: SourceCheck | None,
    out: Reconciled,
) -> str | None:
    """What becomes of the folder of a case a killed run left in place before recording it done for good: "adopt"
    (its source series unchanged, or not checked), "left" (not adopted: this run's sources do not hold the series, or
    it changed and the folder was withdrawn, the case left pending with the reason), or None (no folder of it)."""
    if man is None or man.get("case_key") != row["case_key"]:
        return None
    why = check(row, man) if check is not None else None
    if why is None:
        return "adopt"
    if why == NOT_FOUND:
        from .left_case import adopting_command

        out.unchecked.append(row["case_id"])
        log.warning(
            "case %s: its folder, left by a run killed as it recorded the case, is not adopted: its series is not "
            "among this run's sources, to be checked for files that landed meanwhile; a run over its source checks "
            "it and adopts the folder: %s",
            row["case_id"],
            adopting_command(store.db, row, str(run_dir)),
            extra={"event": "reconcile_unchecked", "case_id": row["case_id"]},
        )
        return "left"
    reason = str(SeriesStillWrittenError(why, where=row["source"], fix=STILL_WRITTEN_FIX))
    withdraw(run_dir / "cases" / row["case_id"], run_dir / "tmp")  # first: killed before the next step, checked again
    if row["status"] == "done":
        store.withdraw_unconfirmed(row["case_key"], reason=reason)
    elif row["status"] == "running":
        store.release_case(row["case_key"], reason=reason, stage="publish", error_class=SeriesStillWrittenError.__name__)
    drop_cached(run_dir, row["case_id"])
    out.withdrawn.append(row["case_id"])
    log.warning(
        "case %s: its folder, left by a run killed as it recorded the case, is withdrawn: %s",
        row["case_id"],
        reason,
        extra={"event": "reconcile_withdrawn", "case_id": row["case_id"]},
    )
    return "left"


def reconcile(store: RunStore, run_dir: Path, *, source_check: SourceCheck | None = None) -> Reconciled:
    """Bring store and folders back in agreement after a crash (see the module docstring).

    ``source_check``: how this run checks the source series of a case folder a killed run left in place before the
    case was recorded done for good (:func:`.adopt.source_check`): adopted when unchanged, withdrawn (the case
    pending, analysed again) when changed, left as it is when this run's sources do not hold it. None: adopted
    unchecked."""
    out = Reconciled()
    shutil.rmtree(run_dir / "tmp", ignore_errors=True)
    out.temp_files = remove_temp_files(run_dir)
    killed = set(store.running_run_ids())
    n = store.mark_abandoned_runs()
    if n:
        log.warning("%d earlier run(s) of this folder ended without finishing; resuming", n, extra={"event": "resume"})
    for row in store.cases_with_status("running", "pending"):
        folder = run_dir / "cases" / row["case_id"]
        man = read_manifest(folder)
        verdict = _checked(store, run_dir, row, man, source_check, out)
        if verdict == "adopt":
            assert man is not None
            store.complete_case(
                row["case_key"],
                output_dir=str(folder.relative_to(run_dir)),
                findings=man.get("findings", []),
                measurements=[tuple(m) for m in man.get("measurements", [])],
                quality=man.get("quality"),
                detect_skipped=man.get("detect_skipped"),
                ended_at=_published_at(folder),
            )
            out.recovered.append(row["case_id"])
        elif verdict == "left":
            continue
        elif row["status"] == "running":
            out.interrupted.append(row["case_id"])
            drop_cached(run_dir, row["case_id"])  # its cached volume may be stale or half-made: ingest again
    for row in store.cases_with_status("done"):
        folder = run_dir / "cases" / row["case_id"]
        man = read_manifest(folder)
        if man is None or man.get("case_key") != row["case_key"]:
            store.reset_case(row["case_key"])
            out.redo.append(row["case_id"])
    for row in store.unconfirmed_cases():  # killed between the commit and the check after it
        verdict = _checked(store, run_dir, row, read_manifest(run_dir / "cases" / row["case_id"]), source_check, out)
        if verdict == "adopt":
            store.confirm_case(row["case_key"])
            out.recovered.append(row["case_id"])
    out.stale_quarantine = _sync_quarantine(store, run_dir)
    if killed:  # a killed run never wrote its metrics textfile: what it finished is counted by this run's
        out.uncounted = [
            {k: row[k] for k in ("status", "latency_s", "error_class", "first_done_at", "ended_at")}
            for row in store.cases_with_status("done", "failed")
            if row["run_id"] in killed
        ]
    if out.recovered or out.redo or out.interrupted or out.withdrawn:
        log.warning(
            "resume: %d complete case(s) recovered, %d interrupted case(s) to retry, %d case(s) with missing outputs to redo",
            len(out.recovered),
            len(out.interrupted),
            len(out.redo),
            extra={"event": "reconcile"},
        )
    return out


@dataclass
class Plan:
    """What a run does with the cases it found: ``to_run``; ``done`` and ``failed_before`` (ids, left as they are);
    ``rejected`` (quarantined at once); ``replaced``: ids of unfinished or failed cases whose series came back with
    other content, run again under the same id; ``changed_done``: ``(earlier id, new id)`` of analysed series whose
    content changed since (the earlier results stay); ``not_found``: how many recorded cases this run's sources no
    longer hold (moved, deleted, or not among the sources given)."""

    to_run: list[CaseSpec]
    done: list[str]
    failed_before: list[str]
    rejected: list[CaseSpec]
    replaced: list[str] = field(default_factory=list)
    changed_done: list[tuple[str, str]] = field(default_factory=list)
    not_found: int = 0


def _register(store: RunStore, case: CaseSpec, ids: dict[str, str], seen: set[str], out: Plan) -> CaseSpec:
    """Record a case seen for the first time. A series seen before with other content replaces its unfinished or
    failed case (same id, run again); an analysed one keeps its results and the new content gets its own case.
    ``seen``: the keys found earlier in this run (another copy of the series among the sources is not a change)."""
    earlier = [r for r in store.cases_of_series(case.series_uid) if r["case_key"] not in seen] if case.series_uid else []
    unfinished = [r for r in earlier if r["status"] != "done"]
    if unfinished:
        row = unfinished[-1]
        store.replace_case(row["case_key"], case_key=case.case_key, fingerprint=case.fingerprint, source=case.source)
        ids[row["case_id"]] = case.case_key
        out.replaced.append(row["case_id"])
        log.warning(
            "series %s has other content than when case %s was %s (files added, removed or replaced): it is run again as case %s",
            case.series_uid,
            row["case_id"],
            "quarantined" if row["status"] == "failed" else "started",
            row["case_id"],
            extra={"event": "series_changed", "case_id": row["case_id"]},
        )
        return case.with_id(row["case_id"])
    cid = case.case_id
    if cid in ids and ids[cid] != case.case_key:
        cid = f"{cid}-{case.fingerprint[:8]}"
    case = case.with_id(cid)
    ids[cid] = case.case_key
    store.upsert_discovered(
        case_key=case.case_key, case_id=cid, series_uid=case.series_uid, fingerprint=case.fingerprint, source=case.source
    )
    for row in earlier:  # all done here
        out.changed_done.append((row["case_id"], cid))
        log.warning(
            "series %s has other content than when case %s was analysed (files added, removed or replaced): it is "
            "analysed again as case %s; the results of %s stay in cases/%s",
            case.series_uid,
            row["case_id"],
            cid,
            row["case_id"],
            row["case_id"],
            extra={"event": "series_changed", "case_id": cid},
        )
    return case


def plan(store: RunStore, cases: Iterable[CaseSpec], *, retry_failed: bool, retry: Collection[str] = ()) -> Plan:
    """Register discovered cases and pick those to run: skip done ones (and earlier failures unless asked, or unless
    their source folder is in ``retry``: a series a PACS sender has since confirmed whole); a series whose content
    changed is run again (see :class:`Plan`)."""
    ids = store.case_ids_in_use()
    seen_keys: set[str] = set()
    out = Plan([], [], [], [])
    with store.tx():
        for case in cases:
            if case.case_key in seen_keys:
                continue  # the same series reached through two sources
            seen_keys.add(case.case_key)
            row = store.case(case.case_key)
            if row is None:
                case = _register(store, case, ids, seen_keys, out)
            else:
                case = case.with_id(row["case_id"])
                if row["status"] == "done":
                    out.done.append(case.case_id)
                    continue
                if row["status"] == "failed" and not (retry_failed or os.path.realpath(case.source) in retry):
                    out.failed_before.append(case.case_id)
                    continue
            if case.rejected is not None:
                out.rejected.append(case)
            else:
                out.to_run.append(case)
    out.not_found = len(set(store.case_ids_in_use().values()) - seen_keys)
    return out


def write_quarantine(run_dir: Path, case: CaseSpec, *, reason: str, error_class: str, stage: str | None) -> Path:
    """``RUN_DIR/quarantine/<case_id>.json``: why a case was set aside, and where it came from."""
    path = run_dir / "quarantine" / f"{case.case_id}.json"
    data = {
        "case_id": case.case_id,
        "case_key": case.case_key,
        "series_uid": case.series_uid,
        "source": redact(case.source),
        "stage": stage,
        "error_class": error_class,
        "reason": redact(reason),
        "files": len(case.files),
    }
    atomic_write_bytes(path, json.dumps(data, indent=1).encode())
    return path
