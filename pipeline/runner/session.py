"""A run session: batch after batch into one run folder, with one executor (and its loaded models) kept.

``ctpipe listen`` hands the runner a few series at a time, whenever they complete. Each hand-over is an
ordinary :func:`~pipeline.runner.run_batch` (crash-safe, resumable, recorded in the run store), but
given a :class:`RunSession` (``run_batch(..., config=s.config, stages=s.stages, session=s)``) the executor that the first batch with work started (worker processes,
the detector loaded on its device) is kept for the next batches instead of being started again, so
the model is loaded once for the session's lifetime. An executor whose batch failed or was stopped is
closed, and the next batch starts a fresh one. :meth:`RunSession.close` stops the kept one.

``origins`` (where PACS-delivered folders came from) are matched to the discovered cases by source
folder (:func:`origins_of`) and recorded in the run store by ``run_batch`` itself, the store's only writer.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Config, from_dict, overrides_layer

if TYPE_CHECKING:  # pragma: no cover
    from .stage import CaseSpec, Stage

log = logging.getLogger(__name__)


def origins_of(cases: Iterable[CaseSpec], origins: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(case_key, origin)`` for each case whose source folder (compared as real paths) has an origin."""
    by_path = {os.path.realpath(k): v for k, v in origins.items()}
    out = []
    for c in cases:
        o = by_path.get(os.path.realpath(c.source)) if c.source else None
        if o is not None:
            out.append((c.case_key, o))
    return out


def refuse_incomplete(cases: Iterable[CaseSpec], origins: Mapping[str, Mapping[str, Any]]) -> list[CaseSpec]:
    """``cases`` with those whose origin (by source folder, as :func:`origins_of`) says ``incomplete`` (the deliverer's
    reason, with its fix: a sender cut off mid-series and never sending the rest) refused as a
    :class:`~pipeline.errors.PartialSeriesError`, so that they are quarantined at once, not processed and published as
    if whole. A case discovery refused already keeps its own error class and reason, followed by the deliverer's
    (``...; also: PartialSeriesError: ...``) unless that names the same error (a gap the deliverer saw too): a
    cut-off series whose slices also have a gap is quarantined with both facts."""
    by_path = {os.path.realpath(k): v.get("incomplete") for k, v in origins.items()}
    out = []
    for c in cases:
        why = by_path.get(os.path.realpath(c.source)) if c.source else None
        if why and c.rejected is None:
            c = replace(c, rejected=("PartialSeriesError", str(why)))
        elif why and c.rejected is not None and f"{c.rejected[0]}:" not in str(why):
            c = replace(c, rejected=(c.rejected[0], f"{c.rejected[1]}; also: PartialSeriesError: {why}"))
        out.append(c)
    return out


class RunSession:
    """Batches into the run folder ``out`` with one kept executor (see the module docstring).

    ``config``: the :class:`~pipeline.config.Config` of every batch, with ``overrides`` (short or dotted
    option names, as for ``run_batch``) applied once; ``stages``: custom stages (default: the standard
    pipeline of that configuration, built once); ``command``: recorded with each batch in the run store.
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        config: Config,
        stages: Sequence[Stage] | None = None,
        command: str | None = None,
        **overrides: Any,
    ):
        from .stages import build_stages

        if overrides:
            merged = config.to_dict()
            for sec, vals in overrides_layer({k: v for k, v in overrides.items() if v is not None}).items():
                merged.setdefault(sec, {}).update(vals)
            config = from_dict(merged, source="overrides")
        self.out = Path(out)
        self.config = config
        self.stages = list(stages) if stages is not None else build_stages(config)
        self.command = command
        self.executor: Any = None
        self.in_flight = 1
        self.executors_started = 0  # executors this session started (1 while no batch failed)
        # the secret of the patient tokens of every batch (:mod:`.redact`): the worker processes kept from batch to
        # batch were given it with the first, so a folder reads as the same token in their records and the main
        # process's throughout the session
        self.redaction_secret = secrets.token_hex(16)

    def after_batch(self, executor: Any, in_flight: int, *, keep: bool) -> None:
        """Called by ``run_batch`` when a batch ends: keep ``executor`` for the next batch, or close it."""
        if keep:
            if executor is not self.executor:
                if self.executor is not None:
                    self.executor.close()
                self.executor, self.in_flight = executor, in_flight
                self.executors_started += 1
                log.info("run session: executor kept for the next batches", extra={"event": "session_executor"})
            return
        if executor is self.executor:
            self.executor = None
            log.warning("run session: the batch did not complete; its executor is closed", extra={"event": "session_executor"})
        executor.close()

    def close(self) -> None:
        """Stop the kept executor (worker processes exit, models are released)."""
        if self.executor is not None:
            self.executor.close()
            self.executor = None

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
