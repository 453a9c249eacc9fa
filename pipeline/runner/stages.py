"""The real stages of ``ctpipe run``, in the order :func:`build_stages` chains them.

With reconstruction on (both lungs among ``reconstruct.organs``), the lungs come
first::

    ingest → reconstruct → load → detect → nodules → write

``reconstruct`` segments every organ once (one lung mask per case), measures and
meshes them and assesses the case's quality (:mod:`pipeline.reconstruction.quality`);
``load``/``detect`` then skip the search when the lungs are absent
(``lungs_absent``: never a search on gas); ``nodules`` segments and measures each
finding inside that same lung mask (kept in the case cache) and adds them to the
measurements JSON. With reconstruction off (or without both lungs among its
organs) a quick ``lungs`` stage segments the lungs alone and assesses their
quality before the search (organs other than the lungs are then reconstructed
after detection, with the findings)::

    ingest → lungs → load → detect → [reconstruct] → write

When ``outputs.dicom`` names any DICOM result, a last ``dicom`` stage
(:mod:`.dicom_stage`) writes the case's SR and SEG into ``<case>/dicom/``.

``load`` and ``detect`` (the model worker's stages) live in :mod:`.model_stages`,
``lungs``, ``reconstruct`` and ``nodules`` in :mod:`.recon_stages`. Volumes
travel between stages through the run's case cache (``RUN_DIR/cache/<case_id>.npy``
+ sidecar, HU ``[k, j, i]`` with LPS geometry); stage outputs passed along are
small (findings, measurements, quality). Files are written under the case's
staging folder only, and every stage declares the files it wrote (the case is
published only when they are all there). Positions are LPS mm.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from ..atomic import atomic_write_bytes
from ..cache import CaseCache
from ..config import Config
from ..errors import NoSeriesFoundError
from .dicom_stage import DicomStage
from .measurements import flatten_measurements
from .model_stages import DetectStage, LoadStage
from .recon_stages import LungsStage, NodulesStage, ReconstructStage, lungs_first, read_case_volume
from .redact_active import active, held_back
from .stage import CaseContext, CaseSpec, Stage, WorkerInfo

__all__ = [
    "DetectStage",
    "DicomStage",
    "IngestStage",
    "LoadStage",
    "LungsStage",
    "NodulesStage",
    "ReconstructStage",
    "WriteStage",
    "build_stages",
    "flatten_measurements",
]

log = logging.getLogger(__name__)


def _rules(cfg: Config) -> Any:
    from ..ingest import SelectionRules

    return SelectionRules(min_slices=cfg.ingest.min_slices, allow_derived=cfg.ingest.allow_derived)


def _find_series(scan: Any, case: CaseSpec) -> tuple[Any, bool]:
    """The case's series in a scan of its own files, and whether it is the scan's own (plan and verdict apply).

    A part ``<uid>#<n>`` of a split series is split off at discovery by the other files of its series
    (a scout under the same SeriesInstanceUID, a sub-stack at another pixel spacing); scanned alone, its
    files form a whole series ``<uid>``. It is found by its files and keeps its part key, as
    ``ctpipe ingest`` names it.
    """
    key = case.series_uid
    found = [s for s in scan.series if s.key == key]
    if found:
        return found[0], True
    uid, sep, part = (key or "").rpartition("#")
    if not sep or not part.isdigit():
        return None, False
    mine = {os.path.abspath(f) for f in case.files}
    same = [s for s in scan.series if s.uid == uid and {os.path.abspath(str(p)) for p in s.files} == mine]
    if len(same) != 1:
        return None, False
    return dataclasses.replace(same[0], key=key, part=int(part)), False


#: What to do about a series that changed in the source during the run.
_SOURCE_CHANGED_FIX = (
    "let the archive finish writing (or clean up) the source before the run, or set runner.stable_age_s; a series "
    "that changed is a new case: run the same command again"
)


def _check_files_there(case: CaseSpec) -> None:
    """Raise :class:`~pipeline.errors.SourceMismatchError` when files discovery found for ``case`` are gone (moved or
    deleted from the source during the run), naming how many and the first."""
    from ..errors import SourceMismatchError

    gone = [f for f in case.files if not os.path.lexists(f)]
    if gone:
        raise SourceMismatchError(
            f"{len(gone)} of the series' {len(case.files)} file(s) are gone from the source since the run found them "
            f"(the first: {gone[0]}): moved or deleted while the run went on",
            where=case.source,
            fix=_SOURCE_CHANGED_FIX,
        )


class IngestStage(Stage):
    """DICOM files of the case's series → validated HU volume in the case cache. A series whose files were moved or
    deleted since discovery found them raises :class:`~pipeline.errors.SourceMismatchError` saying so (the case is
    quarantined), rather than being ingested from what is left; one whose files were written again (an archive at work
    in the source during the run) raises :class:`~pipeline.errors.SeriesStillWrittenError` (the case is left for the
    next run)."""

    name = "ingest"
    group = "cpu"
    preload = ("pipeline.ingest",)

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.ingest  # noqa: F401 - import once per worker, not per case

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..errors import SeriesStillWrittenError
        from ..ingest import read_volume, scan_directory
        from ..ingest.build import build_volume
        from .arrivals import STILL_WRITTEN_FIX
        from .fingerprint import fingerprint_series

        cfg = ctx.config.ingest
        keep = ctx.config.privacy.keep_identifiers
        case = ctx.case
        _check_files_there(case)
        with held_back():  # a worker kept from an earlier batch (a listener's) learns this series' identifiers first
            scan = scan_directory(
                [*case.files] or case.source,
                rules=_rules(ctx.config),
                spacing_tolerance=cfg.spacing_tolerance,
                allow_gantry_tilt=cfg.allow_gantry_tilt,
                keep_identifiers=keep,
                workers=1,
            )
            if (redactor := active()) is not None:
                redactor.add_scan(scan.series)
        series, own = _find_series(scan, case)
        if series is None:
            raise NoSeriesFoundError(
                f"series {case.series_uid} is no longer among the {len(case.files)} file(s) discovered for it",
                where=case.source,
                fix="the files changed during the run; run the same command again",
            )
        if case.fingerprint and fingerprint_series(series) != case.fingerprint:
            raise SeriesStillWrittenError(
                f"series {case.series_uid} was still being written while the run processed it: it changed in the source "
                f"since the run found it ({len(case.files)} file(s) then, {len(series.files)} now, or a file's size or "
                "SOPInstanceUID differs)",
                where=case.source,
                fix=STILL_WRITTEN_FIX,
            )
        plan = None
        if own:
            rejected = [r for r in scan.rejected if r.series is series]
            if rejected:
                raise rejected[0].error
            plan = scan.plans.get(series.key)
        vol = (
            read_volume(plan, workers=1)
            if plan is not None
            else build_volume(
                series,
                spacing_tolerance=cfg.spacing_tolerance,
                allow_gantry_tilt=cfg.allow_gantry_tilt,
                keep_identifiers=keep,
                workers=1,
            )
        )
        entry = CaseCache(ctx.cache_dir, keep_identifiers=keep).write(
            case.case_id, vol, extra={"source": case.source, "series_key": series.key}
        )
        return {"volume_fingerprint": entry.fingerprint, "shape_kji": list(vol.shape), "spacing_ijk": list(vol.spacing)}


def _redacted_json(data: bytes) -> bytes:
    """A JSON document with every string in it redacted (:func:`pipeline.runner.redact_active.redacted_data`), also one
    stored with its non-ASCII characters escaped."""
    import json

    from .redact_active import active, redacted_data

    if active() is None:
        return data
    return json.dumps(redacted_data(json.loads(data)), indent=1).encode()


class WriteStage(Stage):
    """Findings JSON + CSV + one PNG per finding, and ``volume.json`` (geometry, DICOM metadata, fingerprint)."""

    name = "write"
    group = "cpu"
    preload = ("pipeline.detection.findings", "pipeline.detection.figures")

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..detection.findings import Findings

        doc = dict(ctx.state.get("findings_doc") or {"findings": []})
        findings = Findings.from_json(doc)
        findings.timings_ms = {}
        findings.write_json(ctx.workdir / "findings.json")
        findings.write_csv(ctx.workdir / "findings.csv")
        # the volume's sidecar: geometry (LPS mm), DICOM metadata and content fingerprint of what was analysed
        # (patient identifiers only where privacy.keep_identifiers kept them in the cache); the source folder's
        # patient-named components by their tokens, as everywhere a run writes outside dicom/ (the cache entry itself
        # names the source as it is, for the next run)
        sidecar = CaseCache(ctx.cache_dir).sidecar_path(ctx.case.case_id)
        atomic_write_bytes(ctx.workdir / "volume.json", _redacted_json(sidecar.read_bytes()))
        declared = ["findings.json", "findings.csv", "volume.json"]
        if ctx.config.detector.write_png and len(findings):
            from ..detection.figures import write_finding_pngs

            paths = write_finding_pngs(read_case_volume(ctx), findings, ctx.workdir / "findings_png")
            declared += [p.relative_to(ctx.workdir).as_posix() for p in paths]
        return {"declared": declared}


def build_stages(cfg: Config) -> list[Stage]:
    """The stages of ``ctpipe run`` for this configuration, in order (see the module docstring)."""
    rc = cfg.reconstruct
    group = "model" if rc.device == "model" else "cpu"
    first = lungs_first(cfg)
    stages: list[Stage] = [
        IngestStage(),
        ReconstructStage(group=group, before_detect=True) if first else LungsStage(group=group),
        LoadStage(),
        DetectStage(),
    ]
    if first:
        stages.append(NodulesStage())
    elif rc.enabled:
        stages.append(ReconstructStage(group=group))
    stages.append(WriteStage())
    if cfg.outputs.dicom:
        stages.append(DicomStage())
    return stages
