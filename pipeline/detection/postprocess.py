"""The detector's findings from the network's boxes to the candidates it reports (LPS mm).

:func:`boxes_to_findings` turns the RetinaNet's boxes (input voxel indices) and scores into :class:`Finding` objects
as the bundle's postprocessing does (``ClipBoxToImage`` with ``remove_empty``, then ``AffineBoxToWorldCoordinate``),
drops those farther than the lung filter margin from the lungs, and names each finding's nearest source slice.
After the re-scoring, :func:`calibrate_scores` maps a thick-slice series' scores onto the thin-slice scale and
:func:`limit_to_lungs` drops the candidates outside the lungs the findings are limited to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..load import InputGeometry
from ..volume import CTVolume, float3, slice_thickness_mm
from .findings import Finding, Findings, slice_fields
from .lungs import LungRegion
from .score_calibration import ScoreCalibration

log = logging.getLogger(__name__)


def boxes_to_findings(
    boxes: np.ndarray,
    scores: np.ndarray,
    grid: InputGeometry,
    metadata: Mapping[str, Any],
    region: LungRegion | None,
    *,
    lung_filter_margin_mm: float,
) -> list[Finding]:
    """Findings (LPS mm, highest score first) for ``boxes`` (N, 6: input indices, min then max along x, y, z) scoring
    ``scores``; with ``region``, those whose centres lie farther than ``lung_filter_margin_mm`` from its lungs are
    dropped. ``metadata`` (the series' DICOM metadata) names each finding's slice (:func:`.findings.slice_fields`)."""
    # ClipBoxToImage (remove_empty) as the bundle's postprocessing does
    size = np.asarray(grid.shape, dtype=np.float64)
    boxes = boxes.astype(np.float64)
    boxes[:, :3] = np.clip(boxes[:, :3], 0, size)
    boxes[:, 3:] = np.clip(boxes[:, 3:], 0, size)
    keep = np.all(boxes[:, 3:] > boxes[:, :3], axis=1)
    boxes, scores = boxes[keep], scores[keep]
    if len(boxes) == 0:
        return []
    centres_xyz = (boxes[:, :3] + boxes[:, 3:]) / 2.0
    a = grid.input_index_to_lps(boxes[:, :3])
    b = grid.input_index_to_lps(boxes[:, 3:])
    bmin, bmax = np.minimum(a, b), np.maximum(a, b)
    centres = grid.input_index_to_lps(centres_xyz)
    ijk = grid.input_index_to_source_index(centres_xyz)
    if region is not None:
        inside = region.near(ijk, lung_filter_margin_mm)
        if not inside.all():
            log.debug("lung filter dropped %d of %d candidates", int((~inside).sum()), len(inside))
        centres, bmin, bmax, ijk, scores = centres[inside], bmin[inside], bmax[inside], ijk[inside], scores[inside]
    size_ijk = np.asarray(grid.source.size_ijk)
    vox = np.clip(np.round(ijk).astype(int), 0, size_ijk - 1)
    findings = []
    order = np.argsort(-scores, kind="stable")
    for n in order:
        ext = bmax[n] - bmin[n]
        k = int(vox[n, 2])
        findings.append(
            Finding(
                center_lps=float3(centres[n]),
                box_min_lps=float3(bmin[n]),
                box_max_lps=float3(bmax[n]),
                diameter_mm=float(np.cbrt(np.prod(np.maximum(ext, 0.0)))),
                score=float(scores[n]),
                voxel_ijk=(int(vox[n, 0]), int(vox[n, 1]), k),
                **slice_fields(k, metadata, int(size_ijk[2])),
            )
        )
    return findings


def limit_to_lungs(volume: CTVolume, findings: Findings, region: LungRegion | None, *, margin_mm: float) -> Findings:
    """``findings`` less the candidates that do not reach ``region``'s ``limit`` (the segmented lungs): whose centre
    (LPS mm) lies farther from it than the finding's radius (half its ``diameter_mm``) or than ``margin_mm`` (the lung
    filter margin), whichever is less (:meth:`LungRegion.keeps`); as they are without a region or a limit."""
    if region is None or region.limit is None or not len(findings.candidates):
        return findings
    ijk = volume.lps_to_index(np.array([f.center_lps for f in findings.candidates]))
    radius = np.array([0.5 * f.diameter_mm for f in findings.candidates])
    keep = region.keeps(ijk, margin_mm, radius_mm=radius)
    if not keep.all():
        log.debug("lung limit dropped %d of %d candidates not reaching the lungs", int((~keep).sum()), len(keep))
    return findings.with_candidates([f for f, k in zip(findings.candidates, keep) if k])


def calibrate_scores(volume: CTVolume, findings: Findings, calibration: ScoreCalibration | None) -> Findings:
    """``findings`` with every candidate's score mapped by ``calibration`` when ``volume``'s slices are thick enough
    for it (:func:`pipeline.volume.slice_thickness_mm`), else as they are."""
    if calibration is None:
        return findings
    out = calibration.apply(findings, slice_thickness_mm(volume.geometry, volume.metadata))
    if out is not findings:
        log.info("case %s: %s", findings.case_id or findings.series_uid or "?", out.score_calibration)
    return out
