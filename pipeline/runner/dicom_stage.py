"""The ``dicom`` stage of ``ctpipe run``: each case's DICOM results, ``<case>/dicom/sr.dcm`` and ``seg.dcm``.

It runs last, once the case's other files are in its staging folder, when ``outputs.dicom``
names any result (:mod:`pipeline.dicom_out`):

* ``sr.dcm``: a TID 1500 Comprehensive 3D SR of the findings at the operating point (those of
  the findings JSON), each with its lung side and the size of its segmentation (written alone or
  beside the SEG alike), with the nodule volumes and the lung volumes of the measurements JSON and
  the case's quality flags; when detection was skipped (no lungs) it makes no statement on nodules;
* ``seg.dcm``: a binary SEG of the organ masks (kept in the case cache by ``reconstruct``) and of
  the nodule masks, segmented again from the findings inside the same lung mask as ``nodules``
  did (the same volume, findings and mask give the same masks as the measurements JSON's); only the
  organs of ``reconstruct.organs``. When those leave out a lung, the lungs the ``lungs`` stage kept
  give the SR's sides (never segments of the SEG). A run without reconstruction has only those
  lungs, which give the SR's sides: no SEG (one warning per case) and no nodule sizes.

Both reference the case's source files (matched slice by slice to the cached volume) and are new
series in the source's study and frame of reference. Each one's UIDs derive from the case and what
that result holds (:func:`_uid_seed`), so a case processed again (a resumed or repeated run, with or without
the other result) gives the same series with the same content, and an archive they are sent to keeps one series;
their creation, content and series date and time are when the stage wrote them (never the scan's), and each
instance's UID derives from that time too (one instance UID, one content: made again later, a new instance). They copy Patient and Study from the source, as DICOM
results must to be filed with their study; they are the only files of a run folder that carry
patient identifiers (``privacy.keep_identifiers`` governs everything else). The files are declared: the case is
published only with them. A source that no longer matches (a file deleted or changed since ingest, a header
without what the results must repeat) raises :class:`~pipeline.errors.DicomOutputError`, which
quarantines the case with that reason; a run folder that cannot be written stops the run as for
any stage (:mod:`.faults`). Positions are LPS mm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dicom_out.uids import add_mask, reported_measurements, source_images, without_measures
from .recon_stages import LUNGS, load_lung_mask, load_organ_masks, lungs_first, read_case_volume
from .stage import CaseContext, Stage, WorkerInfo

if TYPE_CHECKING:  # pragma: no cover
    from ..volume import CTVolume

log = logging.getLogger(__name__)

#: file names of the results in the case folder, by output
FILES = {"sr": "dicom/sr.dcm", "seg": "dicom/seg.dcm"}


def _measurements(ctx: CaseContext) -> dict[str, Any] | None:
    """The reconstruction's measurements JSON of the case (lungs, nodules, quality), or None without one."""
    path = ctx.workdir / "recon" / f"{ctx.case.case_id}_measurements.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def _findings(ctx: CaseContext) -> Any:
    """The case's ``Findings`` at its operating point, or None when no search ran (detection skipped)."""
    from ..detection.findings import Findings

    skipped = ctx.state.get("detect_skipped")
    doc = ctx.state.get("findings_doc")
    if skipped or doc is None:
        log.info("case %s: no detection (%s): the SR makes no statement on nodules", ctx.case.case_id, skipped or "not run")
        return None
    return Findings.from_json(doc)


def _uid_seed(
    ctx: CaseContext,
    source: Any,
    measurements: Any,
    masks: Mapping[str, np.ndarray] | None = None,
    nodules: Sequence[Any] | None = None,
    *,
    sides: Mapping[str, np.ndarray] | None = None,
    patient_study: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Digests of what each of the case's results is made of, by output (``sr``, ``seg``); their UIDs derive from them.

    Both: the source images (:func:`~pipeline.dicom_out.uids.source_images`: the series and its SOP instances, not the
    files, so a series retrieved another way gives the same results the same UIDs), the patient and study attributes the results copy from the source
    (``patient_study``: :meth:`SourceSeries.patient_study`; a corrected PatientID or name, which may leave every file's
    size as it was, gives new UIDs rather than reusing those filed under the old patient) and its reported findings as
    the results report them (:func:`_stated_findings`). The SR: what the quality report and the measurements it
    reports (lungs, nodules) state, without their measured numbers (the masks they are measured on are part), the lung masks that give each finding's side (``sides`` when given, else those of
    ``masks``) and the nodule masks (their sizes). The SEG: every
    organ mask, the nodule masks (with their place on the volume's grid) and ``outputs.seg_omit_empty_frames``. Options
    that leave a result as it is (meshes, renderings, PNGs, ``privacy``, whether the other result is written, organs
    the SR does not report on) do not change its UIDs, so the same case processed again gives an archive the same
    series."""
    masks = masks or {}
    common = {
        "source": source_images(source),
        "patient_study": {k: str(v) for k, v in (patient_study or {}).items()},
        "findings": _stated_findings(ctx.state.get("findings_doc")),
    }
    sr = {
        **common,
        "quality": without_measures(ctx.state.get("quality")),
        "measurements": without_measures(reported_measurements(measurements)),
        "masks": _masks_digest({o: m for o, m in (sides if sides is not None else masks).items() if o in LUNGS}, nodules or ()),
    }
    seg = {
        **common,
        "omit_empty_frames": bool(ctx.config.outputs.seg_omit_empty_frames),
        "masks": _masks_digest(masks, nodules or ()),
    }
    return {
        kind: hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
        for kind, parts in (("sr", sr), ("seg", seg))
    }


def _stated_findings(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What identifies the findings the results report (a findings JSON document): the model, operating point, reason
    and flags, and which findings are reported (their places in the detector's findings, highest score first). Not
    their measured centres, boxes, sizes and scores (LPS mm), whose last digits differ between runs with other worker
    counts and, stated to 0.01 mm, round the other way now and again; nor the candidates below the operating point,
    the device or the timings, which no result holds."""
    if doc is None:
        return None
    return {
        **{key: doc.get(key) for key in ("model", "score_threshold", "reason", "flags")},
        "findings": list(range(len(doc.get("findings") or ()))),
    }


def _masks_digest(masks: Mapping[str, np.ndarray], nodules: Sequence[Any]) -> str:
    """SHA-256 of the organ masks (by name) and the nodule masks (with their place on the volume's grid, LPS mm)."""
    digest = hashlib.sha256()
    for name in sorted(masks):
        add_mask(digest, name, masks[name])
    for result in nodules:
        origin = getattr(result.geometry, "origin", None)
        add_mask(digest, f"nodule {result.index}:{None if origin is None else list(origin)}", result.mask)
    return digest.hexdigest()


def _check_unchanged(ctx: CaseContext) -> None:
    """Raise :class:`~pipeline.errors.SourceMismatchError` when files of the case are gone since discovery, and
    :class:`~pipeline.errors.SeriesStillWrittenError` when they differ from what discovery fingerprinted (a file
    truncated or written again since: SOPInstanceUIDs and sizes; the case is left for the next run), so that no result
    is published that its source no longer holds."""
    import os

    from ..errors import SeriesStillWrittenError, SourceMismatchError
    from .arrivals import STILL_WRITTEN_FIX
    from .fingerprint import files_fingerprint_now

    case = ctx.case
    if not case.files or case.series_uid is None:
        return
    if files_fingerprint_now(case.series_uid, case.files) == case.fingerprint:
        return
    gone = [f for f in case.files if not os.path.lexists(f)]
    if gone:
        raise SourceMismatchError(
            f"the series' {len(case.files)} file(s) changed since they were ingested: a file is gone ({len(gone)} of "
            f"them, the first: {gone[0]})",
            where=case.source,
            fix="run the case again once the archive has written the series completely: a changed series is a new case",
        )
    raise SeriesStillWrittenError(
        f"series {case.series_uid} was still being written while the run processed it: its {len(case.files)} file(s) "
        "changed since they were ingested (a file's size or SOPInstanceUID differs)",
        where=case.source,
        fix=STILL_WRITTEN_FIX,
    )


def source_as_discovered(ctx: CaseContext, volume: CTVolume) -> Any:
    """The case's source series (:func:`~pipeline.dicom_out.read_source_series`) while its files are still those that
    discovery fingerprinted: a file removed or replaced since (the series' folder deleted during the run) is named as
    such, rather than as a file that cannot be read."""
    from ..dicom_out import read_source_series
    from ..errors import SourceMismatchError

    try:
        source = read_source_series(list(ctx.case.files) or ctx.case.source, volume)
    except SourceMismatchError:
        _check_unchanged(ctx)  # the clearer error when the files changed since discovery
        raise
    _check_unchanged(ctx)
    return source


class DicomStage(Stage):
    """The case's SR and SEG into ``<case>/dicom/`` (see the module docstring)."""

    name = "dicom"
    group = "cpu"
    preload = ("pipeline.dicom_out.api",)

    def setup(self, worker: WorkerInfo) -> None:
        import pipeline.dicom_out.api  # noqa: F401 - pydicom and highdicom once per worker, not per case

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        from ..dicom_out.case import write_case_dicom

        outputs = tuple(ctx.config.outputs.dicom)
        if not outputs:
            return {}
        case_id = ctx.case.case_id
        t0 = time.perf_counter()
        volume = read_case_volume(ctx)
        findings = _findings(ctx)
        # the organ masks are the SEG's segments; the lungs also give each finding's side in the SR, and the nodule
        # masks its segmented size (diameter, long axis, ellipsoid): an SR alone reports them as one beside a SEG does
        # without the reconstruction, the lungs the ``lungs`` stage kept: the SR's sides; nothing to measure or to segment
        reconstructed = bool(ctx.config.reconstruct.enabled)
        masks = load_organ_masks(ctx.cache_dir, case_id, volume.shape)
        if "seg" not in outputs or not reconstructed:
            masks = {o: m for o, m in masks.items() if o in LUNGS}
        # the reconstruction without both lungs (or none): the lungs the ``lungs`` stage kept give the sides, apart
        sides = (None if lungs_first(ctx.config) else load_organ_masks(ctx.cache_dir, case_id, volume.shape, sides=True)) or None
        nodules = None
        if findings is not None and len(findings) and reconstructed:
            nodules = self._nodules(ctx, volume, findings, masks)
        if "seg" in outputs and (not reconstructed or (not masks and not nodules)):
            log.warning(
                "case %s: no organ or nodule masks (%s): no SEG written",
                case_id,
                "the reconstruction segmented none" if ctx.config.reconstruct.enabled else "reconstruction off",
                extra={"case_id": case_id, "stage": self.name},
            )
            outputs = tuple(o for o in outputs if o != "seg")
        source = source_as_discovered(ctx, volume)
        measurements = _measurements(ctx)
        paths = write_case_dicom(
            ctx.workdir / "dicom",
            source=source,
            volume=volume,
            findings=findings,
            outputs=outputs,
            measurements=measurements,
            organ_masks=masks,
            side_masks=sides,
            nodules=nodules,
            quality=ctx.state.get("quality"),
            names={o: Path(f).name for o, f in FILES.items()},
            omit_empty_frames=ctx.config.outputs.seg_omit_empty_frames,
            keep_identifiers=True,  # DICOM results belong with their study: Patient and Study copied from the source
            uid_seed=_uid_seed(ctx, source, measurements, masks, nodules, sides=sides, patient_study=source.patient_study()),
        )
        declared = [FILES[o] for o in paths]
        return {"declared": declared, "timings": {"dicom": round(time.perf_counter() - t0, 6)}}

    @staticmethod
    def _nodules(ctx: CaseContext, volume: Any, findings: Any, masks: dict[str, np.ndarray]) -> list[Any]:
        """The nodule masks of the findings, inside the lung mask the ``nodules`` stage (or the reconstruction) used."""
        from ..reconstruction.nodules import segment_findings

        lungs = load_lung_mask(ctx.cache_dir, ctx.case.case_id, volume.shape)
        if lungs is None:
            parts = [masks[o] for o in LUNGS if o in masks]
            lungs = np.logical_or.reduce(parts) if parts else None
        # the nodules stage segmented the same findings in the same mask and warned of those that fail
        found = segment_findings(volume, list(findings), lung_mask=lungs, case_id=ctx.case.case_id, report_failures=False)
        return [r for r in found if r.mask is not None]
