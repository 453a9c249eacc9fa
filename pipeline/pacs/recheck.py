"""Results stored ``unconfirmed`` asked for again: when, how often, and when no more.

A destination that answered success for a result and refused the query that would confirm it holds it (its query
permissions for ctpipe, or no query service) has the result recorded ``unconfirmed`` (:mod:`pipeline.pacs.sender`).
:class:`UnconfirmedRecheck` settles such results without sending them again. It asks at the first pass of each
process (``ctpipe send``, ``run`` or ``listen``; not when the destination has just refused a query, less than
:data:`RECHECK_S` ago), then each result on its own schedule (:func:`next_due`), when it is due, also while the later
cases are sent without the confirming query after a fresh refusal (that pause is the new cases', not the re-checks'), while it
stays unconfirmed (the query refused again, the destination unreachable, or it lists nothing of it at any level: an
archive that lost it or stopped answering ctpipe's queries cannot be told from one that never answers them):
:data:`RECHECK_S` (15 minutes) after it was recorded unconfirmed, the wait doubling each time up to
:data:`RECHECK_MAX_S` (a day), about 14 times in its first week, not every 15 minutes; a result recorded unconfirmed
late in a listener's life is asked for 15 minutes later, not when the earlier ones are next due. Its next re-check
is kept in the ledger (``sent.next_at``), so that a later process goes on with it. A result still unconfirmed
:data:`GIVE_UP_S` (7 days) after it was recorded so is no longer asked for: it is recorded ``failed`` with the last
reason and the fix (``ctpipe send RUN_DIR --retry-failed`` sends it again, which an archive that holds it takes as
the same instance; or ``pacs.verify_sent: false``), said once in an error. A re-check the destination refuses again
is said once per destination in a warning, then at INFO.

With ``pacs.verify_sent: false`` the destination's success answer alone counts: results recorded unconfirmed are
recorded sent at the first pass. Times are seconds since the epoch (UTC), as the ledger stores them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from ..errors import CtpipeError, PacsError, PacsRequestError
from .ledger import Ledger, now

log = logging.getLogger(__name__)

#: seconds for which a destination that refused the confirming query is taken at its word (later cases not asked),
#: and the first wait before results recorded unconfirmed are asked for again
RECHECK_S = 900.0
#: the longest wait between two re-checks of results recorded unconfirmed (the wait doubles from RECHECK_S)
RECHECK_MAX_S = 86_400.0
#: seconds after it was recorded unconfirmed that a result is no longer asked for (recorded failed, with the fix)
GIVE_UP_S = 7 * 86_400.0


@dataclass
class Asked:
    """What one re-check's confirming queries said of the results asked for (filled in by the sender)."""

    #: the SOPInstanceUIDs the destination holds
    held: set[str] = field(default_factory=set)
    #: the query failed or was refused (the results not asked about stay unconfirmed)
    error: PacsError | None = None
    #: why results the destination listed nothing of at any level stay unconfirmed (None: there were none)
    uncertain: str | None = None


class _Sender(Protocol):
    """What :class:`UnconfirmedRecheck` needs of :class:`~pipeline.pacs.sender.ResultSender`."""

    key: str
    cfg: Any
    ledger: Ledger
    run_dir: Any

    def refused_recently(self) -> bool: ...

    def ask_again(self, rows: list[dict[str, Any]], asked: Asked) -> None: ...

    def record(self, outcomes: Sequence[tuple[dict[str, Any], str, int, str | None]]) -> None: ...

    def fail_for_good(self, items: list[dict[str, Any]], error: str) -> None: ...


def next_due(recorded_at: float, t: float) -> float:
    """When a result recorded unconfirmed at ``recorded_at`` is next asked for, after a re-check at ``t`` (seconds
    since the epoch, UTC): the first point of its schedule after ``t``, the points :data:`RECHECK_S` after
    ``recorded_at``, then each wait twice the one before, up to :data:`RECHECK_MAX_S`."""
    due, wait = recorded_at + RECHECK_S, RECHECK_S
    if wait <= 0.0:  # no wait: due at once
        return max(due, t)
    while due <= t:
        wait = min(2 * wait, RECHECK_MAX_S)
        due += wait
    return due


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


class UnconfirmedRecheck:
    """The re-check schedule of one sender's destination (see the module docstring)."""

    def __init__(self, sender: _Sender):
        self.sender = sender
        #: whether this process asked already (its first pass asks for every result recorded unconfirmed)
        self._asked_once = False
        #: whether a refused re-check was said in a warning already (then at INFO)
        self._warned_refused = False

    def run(self) -> int:
        """Settle the results recorded ``unconfirmed`` for the destination, if their re-check is due; returns how
        many are now recorded sent."""
        s = self.sender
        t = now()
        # a refusal less than RECHECK_S ago (for a new case, or a re-check) spares this process's first ask-all: the
        # archive has just said no; the results due are asked all the same, when due (it pauses new cases' queries only)
        if s.cfg.pacs.verify_sent and s.refused_recently():
            self._asked_once = True
        every = not self._asked_once or not s.cfg.pacs.verify_sent  # else those due, or to be given up
        rows = s.ledger.rows(
            "SELECT * FROM sent WHERE destination = ? AND state = 'unconfirmed' AND (? OR COALESCE(next_at, 0) <= ? "
            "OR COALESCE(updated_at, 0) <= ?) ORDER BY case_id, path",
            (s.key, every, t, t - GIVE_UP_S),
        )
        if not rows:
            return 0
        if not s.cfg.pacs.verify_sent:
            self._mark_sent(rows)
            log.info(
                "%d result file(s) recorded stored at %s but not confirmed count as sent: pacs.verify_sent is false, "
                "so its success answer suffices (not sent again)",
                len(rows),
                s.key,
                extra={"event": "sent_unconfirmed"},
            )
            return len(rows)
        rows = self._give_up(rows, t)
        self._asked_once = True
        if not rows:
            return 0
        asked = Asked()
        try:
            s.ask_again(rows, asked)
        except (PacsError, CtpipeError) as exc:  # cannot reach it now: they stay unconfirmed, asked again later
            asked.error = exc if isinstance(exc, PacsError) else PacsError(str(exc))
        confirmed = [r for r in rows if r["sop_uid"] in asked.held]
        self._mark_sent(confirmed)
        if confirmed:
            log.info(
                "case(s) %s: %d result file(s) recorded stored at %s unconfirmed are now confirmed held there: "
                "recorded sent (not sent again)",
                ", ".join(sorted({str(r["case_id"]) for r in confirmed})),
                len(confirmed),
                s.key,
                extra={"event": "sent_confirmed_later"},
            )
        asked_uids = [r["sop_uid"] for r in rows]
        with s.ledger.tx() as db:
            for r in rows:
                db.execute(
                    "UPDATE sent SET next_at = ? WHERE sop_uid = ? AND destination = ? AND state = 'unconfirmed'",
                    (next_due(float(r["updated_at"] or t), t), r["sop_uid"], s.key),
                )
        marks = ", ".join("?" * len(asked_uids))
        left = s.ledger.one(
            f"SELECT COUNT(*) AS n, MIN(updated_at) AS first, MIN(next_at) AS due FROM sent WHERE destination = ? "
            f"AND state = 'unconfirmed' AND sop_uid IN ({marks})",
            (s.key, *asked_uids),
        )
        if left is not None and left["n"]:
            self._said_left(int(left["n"]), float(left["first"]), float(left["due"]), asked)
        return len(confirmed)

    def _said_left(self, n: int, first: float, due: float, asked: Asked) -> None:
        """Say why ``n`` results stay unconfirmed, when they are asked for next (``due``) and when no more (``first``:
        when the first of them was recorded unconfirmed)."""
        s = self.sender
        if asked.error is not None:
            why = f"{type(asked.error).__name__}: {asked.error}"
        else:
            why = asked.uncertain or "not found by the confirming queries"
        when = f"asked again from {_utc(due)}, not after {_utc(first + GIVE_UP_S)}"
        if isinstance(asked.error, PacsRequestError) and not self._warned_refused:
            self._warned_refused = True
            log.warning(
                "%d result file(s) stored at %s stay unconfirmed: it refused the confirming query again (%s); %s "
                "(further refusals are logged at INFO)",
                n,
                s.key,
                why,
                when,
                extra={"event": "send_unconfirmed_refused"},
            )
            return
        log.info("%d result file(s) stored at %s stay unconfirmed (%s); %s", n, s.key, why, when)

    def _give_up(self, rows: list[dict[str, Any]], t: float) -> list[dict[str, Any]]:
        """Record failed the rows recorded unconfirmed GIVE_UP_S or more before ``t`` (with their reason and the
        fix, said once in an error); returns the others."""
        s = self.sender
        old = [r for r in rows if t - float(r["updated_at"] or 0.0) >= GIVE_UP_S]
        if not old:
            return rows
        days = GIVE_UP_S / 86_400.0
        for r in old:
            s.fail_for_good(
                [r],
                f"stored at {s.key} on its success answer, not confirmed {days:g} days after it was recorded unconfirmed "
                f"({_utc(float(r['updated_at'] or 0.0))}), so no longer asked for; last: {r['error'] or 'no reason kept'}. "
                f"Fix: let the archive answer ctpipe's confirming queries (its query permissions and filters for "
                f"ctpipe's AE title or user) and check that it keeps ctpipe's results, then `ctpipe send {s.run_dir} "
                "--retry-failed` (an archive that holds it takes it as the same instance); or set pacs.verify_sent: "
                "false to record results sent on its success answer alone",
            )
        log.error(
            "case(s) %s: %d result file(s) stored at %s stayed unconfirmed for %g days: no longer asked for, recorded "
            "failed. Fix: let the archive answer ctpipe's confirming queries, then `ctpipe send %s --retry-failed` "
            "(or set pacs.verify_sent: false)",
            ", ".join(sorted({str(r["case_id"]) for r in old})),
            len(old),
            s.key,
            days,
            s.run_dir,
            extra={"event": "send_unconfirmed_given_up"},
        )
        gone = {r["sop_uid"] for r in old}
        return [r for r in rows if r["sop_uid"] not in gone]

    def _mark_sent(self, items: list[dict[str, Any]]) -> None:
        """Record ``items`` sent now, not counting an attempt (they were sent earlier, the answer was success)."""
        s = self.sender
        with s.ledger.tx() as db:
            for r in items:
                db.execute(
                    "UPDATE sent SET state = 'sent', error = NULL, updated_at = ? WHERE sop_uid = ? AND destination = ?",
                    (now(), r["sop_uid"], s.key),
                )
        s.record([(r, "sent", int(r["attempts"]), None) for r in items])
