"""Complete received series handed to the runner: the half of ``ctpipe listen`` that feeds the crash-safe runner
(:class:`~pipeline.pacs.listener.Listener` receives; see :mod:`pipeline.pacs.listener` for the whole).

Each round (:meth:`Handover.step`) hands over the series quiet for ``pacs.quiet_period_s`` that form a volume, and
those still incomplete ``pacs.series_limit_s`` after their first instance (reported in the log and
``RUN_DIR/pacs/incomplete/``, with the reason the runner quarantines them for); runs them as one batch of the
listener's :class:`~pipeline.runner.session.RunSession` (two generations of one series in batches of their own, the
older first: :func:`one_generation_each`); records each series' :class:`SeriesOutcome`; and removes the
received files that nothing keeps any more. Records are logged as ``pipeline.pacs.listener``'s, as the listener's own.
Times are seconds since the epoch (UTC), as the ledger stores them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes
from ..errors import CtpipeError, PartialSeriesError
from .expected_count import SHORT_NOTE, held_after, warn_quiet_hold
from .journal import ALSO_NOTE, CUT_NOTE, INCOMPLETE_NOTE, RECOUNTED_NOTE, RESENT_NOTE, ReceiveJournal
from .ledger import Ledger, now

log = logging.getLogger("pipeline.pacs.listener")

#: Seconds between two looks for held incomplete series whose pacs.incomplete_keep_s is over (between batches).
SWEEP_S = 60.0


def incomplete_reason(folder: Path, cfg: Any) -> str | None:
    """Why the series in ``folder`` does not form a volume yet (a gap, too few slices), or None."""
    from ..errors import MissingSliceError, SingleSliceError
    from ..ingest import SelectionRules, scan_directory

    rules = SelectionRules(min_slices=cfg.ingest.min_slices, allow_derived=cfg.ingest.allow_derived)
    scan = scan_directory(
        [folder],
        rules=rules,
        spacing_tolerance=cfg.ingest.spacing_tolerance,
        allow_gantry_tilt=cfg.ingest.allow_gantry_tilt,
        workers=1,
    )
    for r in scan.rejected:
        if isinstance(r.error, (MissingSliceError, SingleSliceError)):
            return f"{type(r.error).__name__}: {r.error.problem}"
    if not scan.selected:
        # too few slices *so far*: a series left out by min_slices alone (localizers and the like are not waited for)
        short = [
            s for s in scan.series if s.n_slices < cfg.ingest.min_slices and len(s.reasons) == 1 and "min_slices" in s.reasons[0]
        ]
        if short:
            return f"only {short[0].n_slices} slice(s) so far, fewer than ingest.min_slices = {cfg.ingest.min_slices}"
    return None


@dataclass(frozen=True)
class SeriesOutcome:
    """What became of one received series (one generation) handed to the runner.

    ``status``: ``done``, ``quarantined`` (``reason``: the error class and why), ``not selected`` (``reason``: why
    discovery left it out) or the case's state in the run store when it is neither (e.g. ``pending``: the run folder
    could not take it yet). ``case_id``: its case in the run folder (None when not selected). ``sender``: the calling
    AE title of its first instance."""

    series_uid: str
    generation: int
    n_instances: int
    sender: str
    status: str
    case_id: str | None = None
    reason: str | None = None

    def line(self) -> str:
        """One line for an operator: ``series UID (generation G, N instance(s) from AET): done, case ID``."""
        head = f"series {self.series_uid} (generation {self.generation}, {self.n_instances} instance(s) from {self.sender})"
        what = self.status if self.reason is None else f"{self.status} ({self.reason})"
        return f"{head}: {what}" + (f", case {self.case_id}" if self.case_id else "")


class Handover:
    """What :class:`~pipeline.pacs.listener.Listener` does with the series it received: hands them to the runner
    (see the module docstring). The attributes are the listener's."""

    run_dir: Path
    cfg: Any
    poll_s: float
    on_series: Callable[[SeriesOutcome], None] | None
    batches: int
    journal: ReceiveJournal | None
    session: Any
    _ledger: Ledger | None
    _sender: Any
    _stop: threading.Event
    _reported: set[tuple[str, int]]
    _checked: dict[tuple[str, int], tuple[float, str | None]]
    _quiet_held: set[tuple[str, int]]
    _swept: float

    def serve_forever(self) -> None:
        """Hand complete series to the runner until :meth:`stop` (or SIGTERM/Ctrl-C in the CLI)."""
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.poll_s)

    def step(self) -> list[dict[str, Any]]:
        """One round: hand over what is complete (and what a crash left handed); returns the series processed."""
        assert self.journal is not None
        batch = self.journal.handed()
        ready, incomplete = [], []
        quiet = self.journal.quiet(self.cfg.pacs.quiet_period_s)
        quiet_keys = {(r["series_uid"], int(r["generation"])) for r in quiet}
        self._checked = {k: v for k, v in self._checked.items() if k in quiet_keys}
        self._quiet_held &= quiet_keys  # one that received more since is warned of again once quiet, if still short
        for row in quiet:
            key = (row["series_uid"], int(row["generation"]))
            seen = self._checked.get(key)
            why = seen[1] if seen is not None and seen[0] == row["last_at"] else incomplete_reason(Path(row["folder"]), self.cfg)
            self._checked[key] = (row["last_at"], why)
            note = str(row.get("note") or "")
            if note.startswith(CUT_NOTE):  # not known to be whole, with or without a gap: both facts kept
                cut = note.split(ALSO_NOTE, 1)[0]
                why = cut if why is None else f"{cut}{ALSO_NOTE}{why}"
                if f", {SHORT_NOTE}: " in cut and held_after(cut) == "release" and key not in self._quiet_held:
                    self._quiet_held.add(key)  # held short after a release, and no more instances came: warned once
                    warn_quiet_hold(row, self.cfg)
            if why is None:
                ready.append(row)
            elif now() - float(row["first_at"]) >= self.cfg.pacs.series_limit_s:
                incomplete.append((row, why))
            elif row.get("note") != why:
                self.journal.note(row, why)
                log.info(
                    "series %s (generation %d) is quiet but incomplete (%s); waiting up to pacs.series_limit_s",
                    row["series_uid"],
                    row["generation"],
                    why,
                    extra={"event": "listen_waiting"},
                )
        batch += self.journal.hand(ready)
        for row, why in incomplete:
            handed = self.journal.hand([row], note=f"{INCOMPLETE_NOTE} {self.cfg.pacs.series_limit_s:g} s: {why}")
            if handed:
                self._report_incomplete(row, why)
                batch += handed
        self._report_never_quiet()
        for part in one_generation_each(batch):
            if not self._run(part):  # the rest stay handed, run in this order at a later round
                break
        if not batch and now() - self._swept >= SWEEP_S:  # held incomplete series whose time is up
            self._release_processed()
        return batch

    def _release(self, row: dict[str, Any]) -> bool:
        assert self.journal is not None
        return self.journal.release(row, keep=self.cfg.pacs.keep_received, hold_s=self.cfg.pacs.incomplete_keep_s)

    def _release_processed(self) -> int:
        """Remove the received files of processed series that nothing keeps any more (see
        :meth:`ReceiveJournal.release`); returns how many generations' files were removed."""
        assert self._ledger is not None
        self._swept = now()
        rows = self._ledger.rows("SELECT * FROM series WHERE state = 'processed' AND removed_at IS NULL")
        return sum(self._release(row) for row in rows)

    def _finished_by_runner(self, row: dict[str, Any]) -> bool:
        """Whether the runner finished the handed generation ``row`` before the listener stopped without recording it:
        its cases, found in its folder as the runner finds them, are done or quarantined in the run store, or their
        folders are in place, published by a runner stopped before it recorded them (the next run adopts them)."""
        from ..runner.discover import discover
        from ..runner.resume import read_manifest
        from ..runner.store import open_readonly

        assert self.session is not None
        try:
            keys = sorted({c.case_key for c in discover([row["folder"]], self.session.config).cases})
            db = open_readonly(self.run_dir) if keys else None
        except CtpipeError:  # its folder unreadable, or no run store yet: the runner never took a case of it
            return False
        if db is None:
            return False
        try:
            marks = ", ".join("?" * len(keys))
            found = db.execute(f"SELECT case_key, case_id, status FROM cases WHERE case_key IN ({marks})", keys).fetchall()
        finally:
            db.close()

        def published(key: str, case_id: str) -> bool:
            return (read_manifest(self.run_dir / "cases" / case_id) or {}).get("case_key") == key

        return len(found) == len(keys) and all(status in ("done", "failed") or published(k, c) for k, c, status in found)

    def _report_incomplete(self, row: dict[str, Any], why: str) -> None:
        limit = self.cfg.pacs.series_limit_s
        data = {
            "series_uid": row["series_uid"],
            "generation": row["generation"],
            "instances": row["n_instances"],
            "first_at": row["first_at"],
            "last_at": row["last_at"],
            "limit_s": limit,
            "reason": why,
            "folder": str(Path(row["folder"]).relative_to(self.run_dir)),
        }
        path = self.run_dir / "pacs" / "incomplete" / f"{row['series_uid']}.g{row['generation']}.json"
        atomic_write_bytes(path, json.dumps(data, indent=1).encode())
        log.error(
            "series %s did not complete within pacs.series_limit_s = %g s (%s); processed as it is, which "
            "quarantines it (nothing of it is published); fix: send the series again from the modality or PACS",
            row["series_uid"],
            limit,
            why,
            extra={"event": "listen_incomplete"},
        )

    def _report_never_quiet(self) -> None:
        assert self._ledger is not None
        limit = self.cfg.pacs.series_limit_s
        for row in self._ledger.rows("SELECT * FROM series WHERE state = 'open' AND first_at <= ?", (now() - limit,)):
            key = (row["series_uid"], int(row["generation"]))
            if key not in self._reported:
                self._reported.add(key)
                log.error(
                    "series %s is still receiving instances %g s after its first one (%d so far); it is handed to the "
                    "runner once it has been quiet for pacs.quiet_period_s",
                    row["series_uid"],
                    limit,
                    row["n_instances"],
                    extra={"event": "listen_never_quiet"},
                )

    def _origin(self, row: dict[str, Any]) -> dict[str, Any]:
        """The run store's origin of a handed generation; one handed over incomplete (note :data:`INCOMPLETE_NOTE`)
        also says ``incomplete`` (why, with the fix), so that the runner quarantines it even when what arrived has no
        gap (a sender cut off mid-series and never sending the rest): nothing incomplete is published."""
        assert self.journal is not None
        origin = self.journal.origin(row)
        note = str(row.get("note") or "")
        if note.startswith((RESENT_NOTE, RECOUNTED_NOTE)):  # its quarantined case (the same instances) is run again
            origin["retry"] = True
        if note.startswith(INCOMPLETE_NOTE):
            # a cut-off series' gap is left to the runner's discovery, which refuses the volume for it (naming the
            # slices) and adds this reason, the cut-off, after its own: the quarantine says both
            said = note.split(ALSO_NOTE, 1)[0] if f": {CUT_NOTE}" in note else note
            origin["incomplete"] = str(
                PartialSeriesError(
                    f"{row['n_instances']} instance(s) from {self.journal.sender(row)} received, not known to be the "
                    f"whole series ({said})",
                    where=f"series {row['series_uid']} (generation {row['generation']})",
                    fix="send the series again from the modality or PACS; the instances received are kept for "
                    f"pacs.incomplete_keep_s = {self.cfg.pacs.incomplete_keep_s:g} s and not stored twice",
                )
            )
        return origin

    def _run(self, batch: list[dict[str, Any]]) -> bool:
        """Run ``batch`` (handed generations, at most one of each series) as one batch of the listener's session and
        record each one's :class:`SeriesOutcome`; False when the runner could not take it (the series stay handed)."""
        from ..runner import open_run, run_batch
        from ..runner.end_signals import held_stop

        assert self.journal is not None and self.session is not None
        folders = [str(Path(r["folder"])) for r in batch]
        log.info("handing %d series to the runner", len(batch), extra={"event": "listen_batch"})
        try:
            summary = run_batch(
                folders,
                out=self.run_dir,
                config=self.session.config,
                stages=self.session.stages,
                command=self.session.command,
                session=self.session,
                origins={f: self._origin(r) for r, f in zip(batch, folders)},
            )
        except CtpipeError as exc:  # e.g. another ctpipe run holds the run folder: the series stay handed, tried again
            stop = held_stop(exc) is not None  # a stop signal (systemctl stop, Ctrl-C) came as the batch ended
            then = "stopping, as a stop signal came as the batch ended" if stop else "trying again"
            log.error("the runner could not take %d series: %s; %s", len(batch), exc, then, extra={"event": "listen_run_error"})
            if stop:  # the series stay handed, for the next start
                raise KeyboardInterrupt from exc
            self._stop.wait(max(5.0, self.poll_s))
            return False
        self.batches += 1
        if summary.fatal or summary.stopped:  # run folder unwritable (disk full...): the cases left pending stay queued
            log.error("run stopped: %s; the %d series stay queued", summary.fatal or summary.stopped, len(batch))
            self._stop.wait(30.0)
            return False
        cases = open_run(self.run_dir).cases
        # each folder's cases by their keys, not by the store's source, which shows a folder holding an identifier of
        # the patient (a SeriesInstanceUID built from the PatientID) as its token
        keys = {os.path.realpath(src): k for src, k in summary.case_keys.items()}
        outcomes = []
        for row, folder in zip(batch, folders):
            hits = cases[cases.case_key.isin(keys.get(os.path.realpath(folder), ()))]
            why = next((summary.redacted(n["why"]) for n in summary.not_selected if n["source"] == folder), None)
            if not len(hits) and why is None:  # the same instances as an earlier generation: that generation's case
                hits = cases[cases.series_uid == row["series_uid"]].sort_values("discovered_at")
            base = {"series_uid": row["series_uid"], "generation": int(row["generation"])}
            base.update(n_instances=int(row["n_instances"]), sender=self.journal.sender(row))
            if len(hits):
                case = hits.iloc[-1]
                outcomes.append(_outcome(base, case))
                self.journal.processed(row, case_id=str(case["case_id"]), outcome=str(case["status"]))
                if self.journal.held(dict(row, outcome=str(case["status"])), hold_s=self.cfg.pacs.incomplete_keep_s):
                    log.warning(
                        "series %s was quarantined incomplete; its %d received file(s) are kept for "
                        "pacs.incomplete_keep_s = %g s, so that the missing instances, when sent, complete it",
                        row["series_uid"],
                        row["n_instances"],
                        self.cfg.pacs.incomplete_keep_s,
                        extra={"event": "listen_held"},
                    )
            else:
                outcomes.append(SeriesOutcome(**base, status="not selected", reason=why or "no CT series found"))
                self.journal.processed(row, case_id=None, outcome=f"not selected: {why or 'no CT series found'}")
        self._release_processed()
        for line in summary.lines():
            log.info("%s", line, extra={"event": "listen_batch_done"})
        for outcome in outcomes:
            log.info("%s", outcome.line(), extra={"event": "listen_series_done", "series_uid": outcome.series_uid})
            if self.on_series is not None:
                self.on_series(outcome)
        if self._sender is not None:
            self._sender.notify()
        return True


def one_generation_each(batch: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``batch`` (handed generations) split into the batches the runner takes one after the other, each holding at most
    one generation of a series, the older generations first (otherwise in ``batch``'s order). The runner's discovery
    takes the instances of one SeriesInstanceUID in several folders as one case: two generations of a series in one
    batch would be one case, the newer generation's, and the older one's outcome that case's (a generation handed over
    incomplete said done). Apart, each generation is its own case, the newer one taking the older one's place."""
    generations: dict[str, list[int]] = {}
    for row in batch:
        generations.setdefault(row["series_uid"], []).append(int(row["generation"]))
    parts: list[list[dict[str, Any]]] = [[] for _ in range(max(map(len, generations.values()), default=0))]
    for row in batch:
        parts[sorted(generations[row["series_uid"]]).index(int(row["generation"]))].append(row)
    return parts


def _outcome(base: dict[str, Any], case: Any) -> SeriesOutcome:
    """The :class:`SeriesOutcome` of a series whose case is the run store's row ``case`` (``open_run(...).cases``)."""
    status, case_id = str(case["status"]), str(case["case_id"])
    if status == "done":
        return SeriesOutcome(**base, status="done", case_id=case_id)
    if status == "failed":
        reason = f"{case['error_class']}: {case['reason']}" if case.get("error_class") else str(case.get("reason"))
        return SeriesOutcome(**base, status="quarantined", case_id=case_id, reason=reason)
    return SeriesOutcome(**base, status=status, case_id=case_id)
