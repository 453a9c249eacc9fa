"""Retries with exponential backoff for PACS requests.

A request that fails for a transient reason (:class:`~pipeline.errors.PacsUnavailableError`: the
archive cannot be reached, a timeout, HTTP 5xx/429/408, an association that could not be set up) is
attempted again after ``backoff_s``, ``2 × backoff_s``, ``4 × backoff_s``, … up to ``retries`` extra
attempts; the last error is raised, naming the number of attempts, and, when the first attempt failed otherwise
(the connection lost mid-transfer, then the archive refusing connections: it went down), that first failure and its
fix, which tell what happened (the later ones are its consequence). Other errors
(:class:`~pipeline.errors.PacsRequestError`: HTTP 4xx, an association rejected, a DIMSE failure
status) are raised at once: trying again would not help.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import PacsUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: HTTP statuses worth another attempt
TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})


def backoff_delay(attempt: int, backoff_s: float, cap_s: float = 300.0) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` ≥ 1 failed attempts so far)."""
    return min(cap_s, backoff_s * (2 ** max(0, attempt - 1)))


def _kind(problem: str) -> str:
    """``problem`` without its figures (seconds waited, instances received): what kind of failure it is."""
    return re.sub(r"\d+(\.\d+)?", "#", problem)


def with_retries(
    fn: Callable[[], T], *, what: str, retries: int, backoff_s: float, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``fn()``, attempted up to ``1 + retries`` times while it raises :class:`PacsUnavailableError`."""
    attempt = 0
    first: PacsUnavailableError | None = None
    while True:
        attempt += 1
        try:
            return fn()
        except PacsUnavailableError as exc:
            first = first or exc
            if attempt > retries:
                if not retries:
                    raise
                if _kind(first.problem) != _kind(exc.problem):
                    raise PacsUnavailableError(
                        f"{first.problem}; then, at attempt {attempt}: {exc.problem} (gave up after {attempt} attempts)",
                        where=exc.where,
                        fix=first.fix,
                    ) from exc
                raise PacsUnavailableError(
                    f"{exc.problem} (gave up after {attempt} attempts)", where=exc.where, fix=exc.fix
                ) from exc
            delay = backoff_delay(attempt, backoff_s)
            log.warning(
                "%s failed (attempt %d of %d): %s; retrying in %.1f s",
                what,
                attempt,
                retries + 1,
                exc.problem,
                delay,
                extra={"event": "pacs_retry"},
            )
            sleep(delay)
