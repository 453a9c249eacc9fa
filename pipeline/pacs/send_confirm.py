"""Whether a destination holds the results it answered success for: the result sender's confirming queries, right
after a send and again later for results recorded ``unconfirmed`` (see :mod:`pipeline.pacs.sender`, whose module
docstring says when, and :mod:`pipeline.pacs.recheck`). Records are logged as ``pipeline.pacs.sender``'s, as the
sending's own. Times are seconds since the epoch (UTC).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from pydicom.errors import InvalidDicomError

from ..errors import CtpipeError, PacsError, PacsRequestError
from . import recheck
from .archive import Archive
from .confirm import Confirmer, SentResult, read_sent
from .ledger import now
from .recheck import Asked, UnconfirmedRecheck
from .send_ledger import RESULT_SOP_CLASSES, SendLedger

log = logging.getLogger("pipeline.pacs.sender")


class ConfirmingSender(SendLedger):
    """Asks the destination which results it holds (the base of :class:`~pipeline.pacs.sender.ResultSender`, which
    sets these attributes and opens the archive)."""

    _archive: Archive | None
    _confirmer: Confirmer
    #: why the destination cannot confirm what it holds (it refused the query), and when it said so: the later
    #: cases are sent and recorded unconfirmed with it, not asked again, for RECHECK_S (a long-running listener
    #: asks again once that has passed: the archive may have been corrected)
    _cannot_confirm: tuple[str, float] | None
    #: whether results the destination listed nothing of, at any level, were said already (logged once)
    _said_uncertain: bool
    #: when results recorded unconfirmed (by this run or an earlier one) are asked for again
    _recheck: UnconfirmedRecheck

    def _connected(self) -> Archive:
        """The open archive (opened if none is)."""
        raise NotImplementedError

    def _last_sent(self) -> SentResult | None:
        """The last result recorded sent to this destination (by an earlier run too), if its file can still be read:
        what the confirming queries ask for again when the destination lists nothing of a case."""
        row = self.ledger.one(
            "SELECT path FROM sent WHERE destination = ? AND state = 'sent' ORDER BY updated_at DESC LIMIT 1", (self.key,)
        )
        if row is None or not row["path"]:
            return None
        try:
            return read_sent(self.run_dir / row["path"])
        except (OSError, InvalidDicomError):
            return None

    def confirm_unconfirmed(self) -> int:
        """Settle the results recorded ``unconfirmed`` for this destination (stored on its success answer, its
        confirming query refused), without sending them again, if their re-check is due; returns how many are now
        recorded sent. When, how often and until when they are asked for: :mod:`pipeline.pacs.recheck`."""
        return self._recheck.run()

    def refused_recently(self) -> bool:
        """Whether the destination refused a confirming query less than :data:`~pipeline.pacs.recheck.RECHECK_S` ago."""
        return self._cannot_confirm is not None and now() - self._cannot_confirm[1] < recheck.RECHECK_S

    def ask_again(self, rows: list[dict[str, Any]], asked: Asked) -> None:
        """Ask the destination for results recorded unconfirmed earlier (the same queries as right after a send, one
        per case), filling in ``asked``; those it answers it does not hold are failed as a drop. Raises
        :class:`~pipeline.errors.PacsError` when it cannot be reached."""
        try:
            self._confirmed(self._connected(), rows, later=asked)
        except (PacsError, CtpipeError):
            self._drop_archive()
            raise

    def _confirmed(self, archive: Archive, items: list[dict[str, Any]], *, later: Asked | None = None) -> set[str]:
        """The SOPInstanceUIDs of ``items`` (answered success) that the destination holds when asked right after
        (:class:`~pipeline.pacs.confirm.Confirmer`: one query per study, that is per case; one more by series when
        the archive finds none of them by instance). The others are recorded as a failed attempt, with the instance,
        the destination and the likely cause; a query that failed, as a failed attempt of all of them; a query the
        destination refused, as stored unconfirmed (:meth:`_unconfirmed`, naming ``pacs.verify_sent``, said once: the
        later cases are not asked for RECHECK_S)). ``later``: ``items`` are results recorded unconfirmed earlier
        (:meth:`confirm_unconfirmed`), what the queries said is filled in there: a query that failed or was refused
        leaves them so (a refusal is noted as above), as does an archive that lists nothing of them at any level;
        only those the destination answers it does not hold are failed (for good)."""
        studies: dict[str, list[tuple[dict[str, Any], SentResult]]] = defaultdict(list)
        for r in items:
            try:
                sent = read_sent(self.run_dir / r["path"])
            except (OSError, InvalidDicomError) as exc:
                if later is not None:  # its file gone since: what the archive stored is not asked for, it stays unconfirmed
                    log.debug("result %s stays unconfirmed: cannot read its StudyInstanceUID (%s)", r["path"], exc)
                else:
                    self._failed([r], f"sent, but not confirmed: cannot read its StudyInstanceUID ({exc})", final=True)
                continue
            studies[sent.study_uid].append((r, sent))
        held: set[str] = set()
        groups = list(studies.items())
        for n, (study, pairs) in enumerate(groups):
            try:
                asked = "asked again after it was stored unconfirmed" if later is not None else "right after the send"
                found, why, uncertain = self._confirmer.held(archive, study, [sent for _, sent in pairs], asked=asked)
            except PacsError as exc:  # this study's results and those not asked about yet: not confirmed
                unasked = [r for _, rest in groups[n:] for r, _ in rest]
                self._drop_archive()
                refused = isinstance(exc, PacsRequestError)  # asking again does not mend it, sending again neither
                reason = f"stored ({self.key} answered success), not confirmed: {type(exc).__name__}: {exc}"
                if refused:
                    self._cannot_confirm = (reason, now())
                if later is not None:
                    later.held, later.error = held, exc
                elif refused:
                    self._unconfirmed(unasked, reason)
                else:
                    self._failed(unasked, f"sent, but not confirmed: {type(exc).__name__}: {exc}")
                return held
            held |= found
            missing = [r for r, _ in pairs if r["sop_uid"] not in found]
            cause = not uncertain or self._confirmer.known is None  # a drop, or one that cannot be ruled out
            if later is not None and uncertain:  # lists nothing at all: not told from an archive that cannot say
                later.uncertain = why  # left as they are
                continue
            for r in missing:  # uncertain (nothing listed at all): failed at once, said for the first case only
                final = uncertain or later is not None
                self._failed([r], self._not_held(r, why, cause=cause), final=final, quiet=uncertain and self._said_uncertain)
            self._said_uncertain |= uncertain and bool(missing)
        if later is not None:
            later.held = held
        return held

    def _not_held(self, r: dict[str, Any], why: str, *, cause: bool = True) -> str:
        """Why a result the destination answered success for is not recorded sent, and what to do (``why``: what
        the confirming queries said; ``cause``: they show a drop, whose likely causes are named)."""
        what = RESULT_SOP_CLASSES.get(str(r["sop_class"]), str(r["sop_class"]))
        head = f"{what} {r['sop_uid']} ({r['path']}): {self.key} answered success but does not hold it ({why})."
        if not cause:
            return f"{head} Then `ctpipe send {self.run_dir} --retry-failed`"
        return (
            f"{head} Likely cause: a filter or routing rule on the archive dropped it (an Orthanc Lua "
            "ReceivedInstanceFilter, for one), or its storage failed after it answered; check the archive's log for "
            f"this SOPInstanceUID. Fix: let the archive keep ctpipe's results, then `ctpipe send {self.run_dir} "
            "--retry-failed`"
        )

    def _drop_archive(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive = None
