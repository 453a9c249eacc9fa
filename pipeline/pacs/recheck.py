"""Results stored ``unconfirmed`` asked for again: when, how often, and when no more.

A destination that answered success for a result and refused the query that would confirm it holds it (its query
permissions for ctpipe, or no query service) has the result recorded ``unconfirmed`` (:mod:`pipeline.pacs.sender`).
:class:`UnconfirmedRecheck` settles such results without sending them again. It asks at the first pass of each
process (``ctpipe send``, ``run`` or ``listen``), then, while some stay unconfirmed (the query refused again, the
destination unreachable, or it lists nothing of them at any level: an archive that lost them or stopped answering
ctpipe's queries cannot be told from one that never answers them), after :data:`RECHECK_S` (15 minutes), doubling
each time up to :data:`RECHECK_MAX_S` (a day): a listener running for weeks asks about 14 times in the first week,
not every 15 minutes. A result still unconfirmed :data:`GIVE_UP_S` (7 days) after it was recorded so is no longer
asked for: it is recorded ``failed`` with the last reason and the fix (``ctpipe send RUN_DIR --retry-failed`` sends
it again, which an archive that holds it takes as the same instance; or ``pacs.verify_sent: false``), said once in an
error. A re-check the destination refuses again is said once per destination in a warning, then at INFO.

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


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


class UnconfirmedRecheck:
    """The re-check schedule of one sender's destination (see the module docstring)."""

    def __init__(self, sender: _Sender):
        self.sender = sender
        #: when results recorded unconfirmed are next asked for (0: at the first pass)
        self.due_at = 0.0
        #: the wait after the next re-check that leaves some unconfirmed (doubles, up to RECHECK_MAX_S)
        self.wait_s = RECHECK_S
        #: whether a refused re-check was said in a warning already (then at INFO)
        self._warned_refused = False

    def run(self) -> int:
        """Settle the results recorded ``unconfirmed`` for the destination, if their re-check is due; returns how
        many are now recorded sent."""
        s = self.sender
        t = now()
        if t < self.due_at or (s.cfg.pacs.verify_sent and s.refused_recently()):
            return 0
        self.due_at = t + RECHECK_S  # those recorded from now on were refused just now
        rows = s.ledger.rows(
            "SELECT * FROM sent WHERE destination = ? AND state = 'unconfirmed' ORDER BY case_id, path", (s.key,)
        )
        if not rows:
            self.wait_s = RECHECK_S
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
        left = s.ledger.one(
            "SELECT COUNT(*) AS n, MIN(updated_at) AS first FROM sent WHERE destination = ? AND state = 'unconfirmed'",
            (s.key,),
        )
        if left is None or not left["n"]:
            self.wait_s = RECHECK_S
            return len(confirmed)
        self._said_left(int(left["n"]), float(left["first"]), t, asked)
        self.due_at = t + self.wait_s
        self.wait_s = min(2 * self.wait_s, RECHECK_MAX_S)
        return len(confirmed)

    def _said_left(self, n: int, first: float, t: float, asked: Asked) -> None:
        """Say why ``n`` results stay unconfirmed, when they are asked for next and when no more."""
        s = self.sender
        if asked.error is not None:
            why = f"{type(asked.error).__name__}: {asked.error}"
        else:
            why = asked.uncertain or "not found by the confirming queries"
        when = f"asked again at {_utc(t + self.wait_s)}, not after {_utc(first + GIVE_UP_S)}"
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
