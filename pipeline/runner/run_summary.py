"""What a run of the batch runner did (:class:`RunSummary`, returned by :func:`~pipeline.runner.batch.run_batch`) and
the exit codes of ``ctpipe run`` it maps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ingest.image import image_suffix
from .discover import STILL_WRITTEN
from .source_roots import SOURCE_GONE

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_QUARANTINED = 3
EXIT_ENVIRONMENT = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM, SIGHUP: the same command resumes
#: Lines of the summary that name not-selected series one by one (the report and the store list them all).
SHOWN = 20
#: the per-case lines (quarantined, not selected, ...) its repr shows
REPR_SHOWN = 3


@dataclass
class RunSummary:
    """What a run did. ``exit_code``: 0 all cases done, 3 some quarantined (by this run, or by an earlier run of the
    folder and not retried: ``quarantined`` and ``still_quarantined`` tell them apart), 4 the run folder could not be
    written (disk full, read-only, no permission) or a source folder went away (a network mount that dropped): the
    run stopped early; the same command resumes, without ``--retry-failed``), 1 the run could not
    proceed (bad source or configuration, a model that cannot load). A series still being written into the source
    while its case ran (``still_written``: not published, left for the next run, which takes it whole) is no failure:
    like a series discovery left for the next run (``runner.stable_age_s``), it leaves the exit status 0, and the
    summary names it.

    Its fields hold the paths and reasons as they are, for the caller's code to act on (``skipped_files`` to move or
    unpack them, ``not_selected``'s ``source`` to match a folder): ``lines()`` and its repr, what a notebook shows,
    replace the patient's identifiers in them by the run's tokens, as the run's files do; :meth:`redacted` does it for
    a field's text that is shown or stored elsewhere."""

    run_dir: Path
    run_id: str
    total: int = 0
    done: int = 0  # completed by this run for the first time (a case done again is in ``redone``, not here)
    #: cases done again by this run, first completed by an earlier one (their published folder was removed): not in
    #: ``done``; the report counts them where they were first done (runs.csv ``n_redone``), not as new cases
    redone: int = 0
    skipped: int = 0  # done by an earlier run of this folder
    quarantined: list[tuple[str, str, str]] = field(default_factory=list)  # by this run: (case_id, error class, reason)
    #: quarantined by an earlier run of the folder and not retried by this one (no --retry-failed): as ``quarantined``
    still_quarantined: list[tuple[str, str, str]] = field(default_factory=list)
    #: cases quarantined in the run folder at the run's end, those of every source run into it (``RUN_DIR/quarantine``
    #: holds one file each): more than ``quarantined`` and ``still_quarantined`` where other sources' runs share it
    quarantined_in_folder: int = 0
    not_selected: list[dict[str, Any]] = field(default_factory=list)
    skipped_files: list[dict[str, str]] = field(default_factory=list)  # path, kind, reason
    released: list[tuple[str, str]] = field(default_factory=list)  # (case_id, why): left for the next run
    #: (case_id, why): not published because its series was still being written into the source; the next run takes it
    still_written: list[tuple[str, str]] = field(default_factory=list)
    elapsed_s: float = 0.0
    report_html: Path | None = None
    metrics_file: Path | None = None
    node_metrics_file: Path | None = None  # the copy in metrics.textfile_dir, for node_exporter
    fatal: str | None = None
    stopped: str | None = None  # the run folder could not be written, or a source folder went away: why
    unfinished: int = 0  # cases of this run neither done nor quarantined (left for the next run)
    notes: list[str] = field(default_factory=list)  # outputs of the run itself that could not be written
    sources: list[str] = field(default_factory=list)  # as given to the run
    #: the run store's ``case_key`` of each case discovery found, by its source folder as discovery names it (never
    #: redacted, unlike the store's ``source``, which may show a patient-named folder as its token): what a caller
    #: matches a folder it gave to its cases by
    case_keys: dict[str, list[str]] = field(default_factory=dict)
    #: the run's patient-named path components and their tokens (:mod:`.redact`; None: identifiers kept)
    redactor: Any = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        if self.fatal:
            return EXIT_FATAL
        if self.stopped:
            return EXIT_ENVIRONMENT
        # a case quarantined earlier and not retried is still unresolved: 3 as well (the summary says it is not new)
        return EXIT_QUARANTINED if self.quarantined or self.still_quarantined else EXIT_OK

    @property
    def skipped_where(self) -> str:
        """Where the full list of what discovery left out is."""
        rep = self.run_dir / "report" / "skipped.csv"
        return f"{rep} and the run store (open_run(...).skipped)" if self.report_html else "the run store (open_run(...).skipped)"

    @property
    def cases_per_hour(self) -> float:
        """Cases completed for the first time (``done``, redos apart) per hour of the run's elapsed time."""
        return 3600.0 * self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        still = (
            f"{len(self.still_quarantined)} still quarantined from earlier runs (ctpipe run --retry-failed to retry them), "
            if self.still_quarantined
            else ""
        )
        left = f"{len(self.still_written)} left for the next run ({STILL_WRITTEN}), " if self.still_written else ""
        again = f"{self.redone} done again (its published folder was removed; counted where first done), " if self.redone else ""
        out = [
            f"run {self.run_id}: {self.done} case(s) done, {again}{len(self.quarantined)} newly "
            f"quarantined, {still}{left}"
            f"{self.skipped} already done earlier, of {self.total}, in {self.elapsed_s:.1f} s"
        ]
        if self.fatal:
            out.append(f"run stopped: {self.fatal}")
        elif not self.total and not self.stopped:
            where = ", ".join(self.sources) or "the sources"
            writing = sum(str(n.get("why", "")).startswith(STILL_WRITTEN) for n in self.not_selected)
            if writing:
                out.append(f"no CT series ready in {where}: {writing} series {STILL_WRITTEN}, left for the next run")
            elif self.not_selected:  # series there, each left out for a reason (too few slices, not CT, derived, ...)
                out.append(
                    f"no CT series selected in {where}: {len(self.not_selected)} series found and not selected, nothing "
                    f"to do (why: listed in {self.skipped_where})"
                )
            else:
                out.append(f"no CT series found in {where}: nothing to do")
            images = [f["path"] for f in self.skipped_files if image_suffix(f["path"])]
            if images:
                out.append(
                    f"  NIfTI/MHA/NRRD images are not DICOM series ({len(images)}, such as {images[0]}): ctpipe run "
                    "reads DICOM; analyse an image with `ctpipe detect FILE` or `ctpipe reconstruct FILE`"
                )
        if self.stopped and self.stopped.startswith(SOURCE_GONE):  # its own fix: mount the source again
            out.append(f"run stopped early: {self.stopped}; {self.unfinished} case(s) not finished")
        elif self.stopped and self.unfinished:
            out.append(
                f"run stopped early: {self.stopped}; {self.unfinished} case(s) not finished: {self._fix()} and run the "
                "same command again to finish them (no --retry-failed needed)"
            )
        elif self.stopped:  # the run's own files at its end (metrics, report): a rerun with nothing to do writes them
            out.append(f"the run folder could not be written: {self.stopped}; {self._fix()} and run the same command again")
        for cid, cls, reason in self.quarantined:
            out.append(f"  quarantined {cid}: {cls}: {reason}")
        for cid, cls, reason in self.still_quarantined[:SHOWN]:
            out.append(f"  still quarantined from an earlier run {cid}: {cls}: {reason}")
        if len(self.still_quarantined) > SHOWN:
            more = len(self.still_quarantined) - SHOWN
            out.append(
                f"  still quarantined from earlier runs: {more} more, listed in {self.run_dir / 'quarantine'}{self._shared()}"
            )
        for cid, why in self.still_written[:SHOWN]:
            out.append(f"  left for the next run {cid}: {why}")
        if len(self.still_written) > SHOWN:
            out.append(f"  left for the next run: {len(self.still_written) - SHOWN} more, listed in {self.skipped_where}")
        for ns in self.not_selected[:SHOWN]:
            out.append(f"  not selected {ns['series']} ({ns['source']}): {ns['why']}")
        if self.skipped_files or len(self.not_selected) > SHOWN:
            kinds: dict[str, int] = {}
            for f in self.skipped_files:
                kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
            what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(kinds.items()))
            out.append(
                f"  skipped by discovery: {len(self.skipped_files)} file(s) ({what or 'none'}) and "
                f"{len(self.not_selected)} series not selected, listed with reasons in {self.skipped_where}"
            )
        out.extend(f"  {note}" for note in self.notes)
        return [self.redacted(line) for line in out]

    def redacted(self, text: str) -> str:
        """``text`` (one of this summary's fields, such as a not-selected series' ``why``) as the run wrote it
        outside ``dicom/``: its patient-named path components and identifiers in series descriptions replaced by their
        tokens, unless identifiers are kept (:mod:`.redact`)."""
        return self.redactor(text) if self.redactor is not None else text

    def _shared(self) -> str:
        """Where other sources' runs also quarantined cases in the run folder: how many of its cases are this run's."""
        mine = len(self.quarantined) + len(self.still_quarantined)
        if self.quarantined_in_folder <= mine:
            return ""
        return (
            f" ({mine} of its {self.quarantined_in_folder} quarantined case(s) are of this run's sources; the others "
            "are of other sources run into this folder)"
        )

    def _fix(self) -> str:
        """What to do about :attr:`stopped` (the run folder could not be written) before running again."""
        stopped = self.stopped or ""
        if "(EFBIG)" in stopped:
            return "raise the file-size limit (ulimit -f unlimited; LimitFSIZE=infinity in a systemd unit)"
        if "(ENOTDIR)" in stopped or "(EISDIR)" in stopped:
            return "move the file or folder named above out of the run folder"
        return "free the space (or fix the folder's permissions)"

    def __repr__(self) -> str:  # short: a notebook echoes the summary of a batch of thousands of cases
        lines = self.lines()
        own = [line for line in lines if not line.startswith("  ")]
        detail = [line.strip() for line in lines if line.startswith("  ")]
        more = [f"{len(detail) - REPR_SHOWN} more in .lines()"] if len(detail) > REPR_SHOWN else []
        return "RunSummary(" + "; ".join(own + detail[:REPR_SHOWN] + more) + f"; report={self.report_html})"
