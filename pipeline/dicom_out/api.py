"""Public entry points: write a case's SR, its SEG, or both, from ctpipe's results.

All positions are DICOM patient coordinates (LPS, mm); masks are ``[k, j, i]`` arrays on the
volume's grid. Files appear atomically (:mod:`pipeline.atomic`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import DicomOutputError
from ..reconstruction.nodule_geometry import SIDE_SEARCH_MM
from ..volume import CTVolume, LabelMap
from . import seg as seg_module
from . import sr as sr_module
from .kinds import OUTPUTS
from .model import NoduleDetail, ReportedFinding, as_bool_mask, reported_findings
from .seg import write_seg_object
from .sources import SourceSeries, check_source, read_source_series
from .sr import build_sr, save
from .uids import (
    add_mask,
    finding_identity,
    images_key,
    reported_measurements,
    source_images,
    stable_uid,
    without_measures,
)

log = logging.getLogger(__name__)

#: the masks that give each finding's lung side
SIDE_MASKS = ("lung_left", "lung_right")

__all__ = ["OUTPUTS", "write_dicom_outputs", "write_seg", "write_sr"]

SourceArg = SourceSeries | str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def _source(source: SourceArg, volume: CTVolume) -> SourceSeries:
    if isinstance(source, SourceSeries):
        check_source(source, volume)
        return source
    return read_source_series(source, volume)


def _findings(findings: Any, volume: CTVolume) -> list[Any]:
    """The reported findings as a list (``Findings`` iterates over those at its operating point); None gives []."""
    series = getattr(findings, "series_uid", None)
    # a part of a split series is named by its series key (``<uid>#<n>``)
    names = {volume.series_uid, volume.metadata.get("SeriesKey")} - {None}
    if series and volume.series_uid and series not in names:
        raise DicomOutputError(
            f"the findings belong to series {series}, the volume to {volume.series_uid}",
            where="findings",
            fix="pass the findings detected on this volume",
        )
    return list(findings or [])


def write_sr(
    path: str | os.PathLike[str],
    *,
    source: SourceArg,
    volume: CTVolume,
    findings: Any,
    model_name: str,
    model_version: str,
    score_threshold: float | None,
    nodules: Sequence[Any] | None = None,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None = None,
    measurements: Mapping[str, Any] | None = None,
    quality: Any = None,
    details: Mapping[int, NoduleDetail] | None = None,
    series_number: int = 901,
    image_library: bool = False,
) -> Path:
    """Write the case's Comprehensive 3D SR (TID 1500) to ``path`` and return it.

    source: the source series (a :class:`SourceSeries`, or its folder / files, read with :func:`read_source_series`).
    findings: the detector's findings (``Findings`` or a list of ``Finding``; LPS mm); those scoring at least
    ``score_threshold`` (the operating point; None: every finding) are reported, and with none the report says
    "Nodule: Absent". ``findings=None`` means no detector ran (a reconstruction alone): the report then makes no
    statement on nodules, and ``model_name`` / ``model_version`` name the reconstruction.
    nodules: nodule segmentations (``NoduleResult`` or their JSON) for volumes and long axes. organ_masks: the lung
    masks (``lung_left``, ``lung_right``) give each finding's side; without a reconstruction,
    :func:`~pipeline.dicom_out.case.lung_side_masks` segments them (without them the SR states no side).
    measurements: the reconstruction's measurements (lung volumes, emphysema index). quality: a ``QualityReport``.
    details: finding index → :class:`NoduleDetail` (side, lobe, composition).
    image_library: add a TID 1600 Image Library of the referenced images (see :func:`.sr.build_sr`).
    """
    src = _source(source, volume)
    reported = _reported(findings, volume, src, _threshold(score_threshold), nodules, organ_masks, details)
    return _write_sr(
        Path(path),
        src,
        reported,
        model_name=model_name,
        model_version=model_version,
        score_threshold=_threshold(score_threshold),
        measurements=measurements,
        quality=quality,
        series_number=series_number,
        image_library=image_library,
        nodules_assessed=findings is not None,
    )


def _reported(
    findings: Any,
    volume: CTVolume,
    source: SourceSeries,
    threshold: float,
    nodules: Sequence[Any] | None,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None,
    details: Mapping[int, NoduleDetail] | None,
) -> list[ReportedFinding]:
    """The findings at or above ``threshold`` as the SR and the SEG both report them (same ranks, same UIDs)."""
    return reported_findings(
        _findings(findings, volume),
        volume.geometry,
        series_uid=source.series_instance_uid,
        images=images_key(source),
        score_threshold=threshold,
        nodules=nodules,
        organ_masks=organ_masks,
        details=details,
    )


def _threshold(score_threshold: float | None) -> float:
    """The operating point of the report: ``None`` (no threshold applied, ``--all-candidates``) reports every finding."""
    return 0.0 if score_threshold is None else float(score_threshold)


def _write_sr(path: Path, source: SourceSeries, reported: Sequence[ReportedFinding], **options: Any) -> Path:
    sr = build_sr(reported, source, **options)
    out = save(sr, path)
    if options.get("nodules_assessed", True):
        log.info("SR %s: %d finding(s) at score >= %.3g", out, len(reported), options["score_threshold"])
    else:
        log.info("SR %s: measurements and quality flags; no detection, no statement on nodules", out)
    sideless = sum(f.side is None for f in reported)
    if sideless:
        log.info(
            "SR %s: %d of %d reported findings state no lung side: no lung mask given, or none within %g mm of them "
            "(without a reconstruction, organ_masks=lung_side_masks(volume) segments the lungs, as ctpipe detect does)",
            out,
            sideless,
            len(reported),
            SIDE_SEARCH_MM,
        )
    return out


def write_seg(
    path: str | os.PathLike[str],
    *,
    source: SourceArg,
    volume: CTVolume,
    score_threshold: float | None,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None = None,
    findings: Any = (),
    nodules: Sequence[Any] | None = None,
    details: Mapping[int, NoduleDetail] | None = None,
    omit_empty_frames: bool = True,
    series_number: int = 902,
    segment_codes: Mapping[str, tuple[Any, Any]] | None = None,
) -> Path:
    """Write the case's binary SEG (organ masks and nodule masks) to ``path`` and return it.

    Nodule segments are those of the findings scoring at least ``score_threshold`` that have a mask in
    ``nodules``; they are named ``Nodule <rank>`` with the tracking UIDs the SR uses for the same threshold.
    See :mod:`pipeline.dicom_out.seg` for ``omit_empty_frames`` and ``segment_codes``.
    """
    src = _source(source, volume)
    reported = _reported(findings, volume, src, _threshold(score_threshold), nodules, organ_masks, details)
    return write_seg_object(
        Path(path),
        source=src,
        volume=volume,
        organ_masks=organ_masks,
        findings=reported,
        omit_empty_frames=omit_empty_frames,
        series_number=series_number,
        segment_codes=segment_codes,
    )


def _stem(volume: CTVolume) -> str:
    key = str(volume.metadata.get("SeriesKey") or volume.series_uid or "case")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key)


def write_dicom_outputs(
    out_dir: str | os.PathLike[str],
    *,
    source: SourceArg,
    volume: CTVolume,
    findings: Any,
    model_name: str,
    model_version: str,
    score_threshold: float | None,
    reconstruction: Any = None,
    nodules: Sequence[Any] | None = None,
    quality: Any = None,
    measurements: Mapping[str, Any] | None = None,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None = None,
    side_masks: Mapping[str, np.ndarray | LabelMap] | None = None,
    details: Mapping[int, NoduleDetail] | None = None,
    outputs: Sequence[str] = OUTPUTS,
    stem: str | None = None,
    names: Mapping[str, str] | None = None,
    omit_empty_frames: bool = True,
    keep_identifiers: bool = True,
    uid_seed: str | Mapping[str, str] | None = None,
    created: datetime.datetime | None = None,
    stable_uids: bool = False,
) -> dict[str, Path]:
    """Write the requested DICOM results of one case into ``out_dir``: ``{"sr": <stem>_sr.dcm, "seg": <stem>_seg.dcm}``.

    findings: as for :func:`write_sr` (``None``: no detector ran; the SR makes no statement on nodules).
    reconstruction: a ``Reconstruction`` (its organ masks go to the SEG, its measurements and quality report to the
    SR). nodules: the ``NoduleResult`` list of its nodule segmentation (masks and volumes); without it the volumes are
    taken from the measurements' ``nodules`` and the SEG has no nodule segments. measurements, organ_masks, quality:
    the same parts given separately (they take precedence over the reconstruction's; e.g. as a run keeps them on
    disk); with neither quality report, the SR carries the findings' own quality flags (``Findings.flags``: thick
    slices). The organ masks' lungs (``lung_left``, ``lung_right``) give each finding's side; side_masks: the lung
    masks that give the sides instead, never written to the SEG (when the organs asked for leave out a lung:
    :func:`~pipeline.dicom_out.case.lung_side_masks`; bool ``[k, j, i]`` on the volume's grid). names: file name per
    output (default ``<stem>_sr.dcm``, ``<stem>_seg.dcm``). The source headers are read once for both objects. A SEG with nothing to hold (no organ mask, no nodule mask) is skipped with a warning.
    keep_identifiers: False writes both without the source's patient identifiers (see
    :meth:`SourceSeries.without_identifiers`; the study and frame of reference stay the source's).
    uid_seed: derive the series and instance UIDs from this text (and ctpipe's version) instead of making new ones, or
    from one text per output (``{"sr": ..., "seg": ...}``, each naming what that object holds): the same results
    written again are the same series; each instance's UID also derives from when it was made (``created``), which it
    states: made again at another time, it is a new instance of that series (one UID, one content), made at the
    same time the same file, and an archive that receives a file again keeps one copy; it derives from the output's
    layout version too (``SR_LAYOUT``, ``SEG_LAYOUT``), so that another layout of the same results is another instance.
    stable_uids: without ``uid_seed``, derive one per output from what it holds (:func:`content_seeds`: the source
    images and their patient and study, the reported findings; for the SR the measurements, quality, model and
    operating point, for the SEG the masks): the same results written again have the same series UIDs and, but for
    when they were made and the instance UID derived from it, the same content, whichever other outputs are written
    beside them.
    created: when the results were made, their instance creation, content and series date and time (local time;
    default now, one time for both; never the source's acquisition date). The series UIDs do not depend on it, the
    instance UIDs do; the same results written again with the same ``created`` are the same bytes.
    Raises :class:`~pipeline.errors.DicomOutputError` (:class:`~pipeline.errors.SourceMismatchError` for the source).
    """
    unknown = [o for o in outputs if o not in OUTPUTS]
    if unknown:
        raise DicomOutputError(f"unknown DICOM output(s) {unknown}", where="outputs", fix=f"choose from {list(OUTPUTS)}")
    out = Path(out_dir)
    stem = stem or _stem(volume)
    files = {o: (names or {}).get(o) or f"{stem}_{o}.dcm" for o in OUTPUTS}
    src = _source(source, volume)
    if not keep_identifiers:
        src = src.without_identifiers()
    masks = dict(organ_masks if organ_masks is not None else (getattr(reconstruction, "masks", {}) or {}))
    if measurements is None:
        measurements = getattr(reconstruction, "measurements", None)
    if quality is None:
        quality = getattr(reconstruction, "quality", None)
    if quality is None and getattr(findings, "flags", None):  # no quality report: the findings' own flags (thick slices)
        quality = {"flags": [{"code": code} for code in findings.flags]}
    if nodules is None and measurements:
        nodules = measurements.get("nodules")
    threshold = _threshold(score_threshold)
    sides = masks if side_masks is None else side_masks  # the SEG holds ``masks`` alone
    reported = _reported(findings, volume, src, threshold, nodules, sides, details)
    if stable_uids and uid_seed is None:
        uid_seed = content_seeds(
            src,
            reported,
            {name: as_bool_mask(m, volume.geometry, name) for name, m in masks.items()} if "seg" in outputs else {},
            sides={name: as_bool_mask(m, volume.geometry, name) for name, m in sides.items() if name in SIDE_MASKS},
            measurements=measurements,
            quality=quality,
            sr_options={
                "model": [model_name, model_version],
                "score_threshold": threshold,
                "nodules_assessed": findings is not None,
            },
            seg_options={"omit_empty_frames": omit_empty_frames},
        )
    # when the results were made (never the scan's date: a PACS lists them by it); one time for the SR and the SEG
    created = created or datetime.datetime.now().replace(microsecond=0)
    written: dict[str, Path] = {}
    if "sr" in outputs:
        written["sr"] = _write_sr(
            out / files["sr"],
            src,
            reported,
            model_name=model_name,
            model_version=model_version,
            score_threshold=threshold,
            measurements=measurements,
            quality=quality,
            nodules_assessed=findings is not None,
            created=created,
            series_uid=_uids("sr", uid_seed, created)[0],
            sop_instance_uid=_uids("sr", uid_seed, created)[1],
        )
    if "seg" in outputs:
        if not masks and not any(f.mask is not None for f in reported):
            log.warning("%s: no organ or nodule masks: no SEG written (run the reconstruction to get one)", out)
        else:
            written["seg"] = write_seg_object(
                out / files["seg"],
                source=src,
                volume=volume,
                organ_masks=masks,
                findings=reported,
                omit_empty_frames=omit_empty_frames,
                created=created,
                series_uid=_uids("seg", uid_seed, created)[0],
                sop_instance_uid=_uids("seg", uid_seed, created)[1],
            )
    return written


def content_seeds(
    source: SourceSeries,
    reported: Sequence[ReportedFinding],
    masks: Mapping[str, np.ndarray],
    *,
    sides: Mapping[str, np.ndarray] | None = None,
    measurements: Mapping[str, Any] | None,
    quality: Any,
    sr_options: Mapping[str, Any],
    seg_options: Mapping[str, Any],
) -> dict[str, str]:
    """SHA-256 digests of what each of a case's results is made of, by output (``sr``, ``seg``).

    Both: the source images (SOP Instance UIDs) and the patient and study attributes copied from them, and the reported
    findings' identities (:func:`~pipeline.dicom_out.uids.finding_identity`: which findings, their sides, lobes and
    compositions). The SR: what its measurements and quality report state (lungs, nodules, flags; not the measured
    numbers), the lung masks that give the findings' sides (``sides``) and the nodule masks (which its lung and nodule
    volumes are measured on), and ``sr_options``. The SEG: the nodule masks, the organ masks (``[k, j, i]`` on the volume's grid) and
    ``seg_options``. Equal for equal results, whatever the time, the run, the other output written beside, or the last
    digits in which the findings' centres and sizes (LPS mm) and scores differ between runs with other worker counts.
    """
    quality_doc = quality.to_json() if hasattr(quality, "to_json") else quality
    common = {
        "source": source_images(source),
        "patient_study": {k: str(v) for k, v in source.patient_study().items()},
        "findings": [finding_identity(f) for f in reported],
    }
    sr_parts = {
        **common,
        "measurements": without_measures(reported_measurements(measurements)),
        "quality": without_measures(quality_doc),
        "options": dict(sr_options),
    }
    sr = hashlib.sha256(json.dumps(sr_parts, sort_keys=True, default=str).encode())
    seg = hashlib.sha256(json.dumps({**common, "options": dict(seg_options)}, sort_keys=True, default=str).encode())
    for f in reported:
        if f.mask is not None:
            for digest in (sr, seg):
                add_mask(digest, f"nodule {f.rank}:{list(f.mask.offset_kji)}", f.mask.mask)
    for name in sorted(sides or {}):
        add_mask(sr, name, (sides or {})[name])
    for name in sorted(masks):
        add_mask(seg, name, masks[name])
    return {"sr": sr.hexdigest(), "seg": seg.hexdigest()}


def _uids(kind: str, seed: str | Mapping[str, str] | None, created: datetime.datetime) -> tuple[str | None, str | None]:
    """(series UID, instance UID) of output ``kind`` derived from ``seed`` (or from its entry for ``kind``); (None, None)
    without one: new UIDs. The series UID from the seed alone; the instance UID also from ``created`` (to the second,
    as the instance states it): an instance states one content, its dates included, so the same results made at
    another time are another instance of the same series, and made at the same time the same file. The instance UID
    derives from the output's layout as well (:data:`~pipeline.dicom_out.sr.SR_LAYOUT`,
    :data:`~pipeline.dicom_out.seg.SEG_LAYOUT`): a build that lays the same results out otherwise (more content groups)
    writes another document, under another instance UID, at the same ``created`` and with the same version string."""
    if isinstance(seed, Mapping):
        seed = seed.get(kind)
    if seed is None:
        return None, None
    made = created.strftime("%Y%m%d%H%M%S")
    layout = f"layout {sr_module.SR_LAYOUT if kind == 'sr' else seg_module.SEG_LAYOUT}"
    series = stable_uid(f"ctpipe-{kind}-series", __version__, seed)
    return series, stable_uid(f"ctpipe-{kind}", __version__, layout, seed, made)
