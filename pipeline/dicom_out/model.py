"""What a case's DICOM results report: the findings at the operating point, with what ctpipe knows about each.

:func:`reported_findings` turns the detector's findings (LPS mm), the nodule segmentations and the
lung masks into :class:`ReportedFinding` records, shared by the SR (one measurement group each) and
the SEG (one segment each). Tracking UIDs are derived from the source images and the finding's place in
the detector's findings (:func:`~pipeline.dicom_out.uids.finding_uid`), not its measured centre, so an SR and a SEG
written separately for the same case, or by runs with other worker counts, name each nodule alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DicomOutputError
from ..reconstruction.nodule_geometry import (
    SIDES,
    AxialAxes,
    NoduleMask,
    axial_axes,
    boundary_voxels,
    cell_corners,
    half_axes_around,
    long_axis_mm,
    lung_side,
    nodule_mask,
)
from ..volume import Geometry, LabelMap
from .uids import finding_uid

if TYPE_CHECKING:  # pragma: no cover
    from ..detection.findings import Finding

log = logging.getLogger(__name__)

LOBES = {"left": ("upper", "lower"), "right": ("upper", "middle", "lower")}
COMPOSITIONS = ("solid", "part_solid", "ground_glass")
#: decimals of what the results state: positions (coordinates, the ellipsoid's half axes) in mm (0.01 mm), nodule
#: diameters and long axes in mm (0.1 mm, as a reader measures and the Fleischner and Lung-RADS categories use them),
#: nodule volumes in mm³ (1 mm³), scores (0.001). The same case on another machine or with another number of threads
#: gives boxes and scores that differ in their last digits (about 1e-5 mm, 1e-6); stated to these decimals, its results
#: state the same numbers under the same UIDs.
MM_DECIMALS = 2
LENGTH_DECIMALS = 1
VOLUME_MM3_DECIMALS = 0
SCORE_DECIMALS = 3


@dataclass(frozen=True)
class NoduleDetail:
    """What is known of a finding beyond the detector's box; every field optional.

    side: ``"left"`` or ``"right"`` (the patient's side). lobe: ``"upper"``, ``"middle"`` (right lung only) or
    ``"lower"``. composition: ``"solid"``, ``"part_solid"`` or ``"ground_glass"``.
    """

    side: str | None = None
    lobe: str | None = None
    composition: str | None = None

    def __post_init__(self) -> None:
        if self.side is not None and self.side not in SIDES:
            raise DicomOutputError(f"side {self.side!r} is not one of {SIDES}", where="NoduleDetail")
        if self.lobe is not None:
            allowed = LOBES.get(self.side or "", ("upper", "middle", "lower"))
            if self.side is None or self.lobe not in allowed:
                raise DicomOutputError(
                    f"lobe {self.lobe!r} with side {self.side!r} is not a lung lobe",
                    where="NoduleDetail",
                    fix="give side='left' with upper/lower, or side='right' with upper/middle/lower",
                )
        if self.composition is not None and self.composition not in COMPOSITIONS:
            raise DicomOutputError(f"composition {self.composition!r} is not one of {COMPOSITIONS}", where="NoduleDetail")


@dataclass(frozen=True)
class ReportedFinding:
    """One finding as the DICOM results report it (LPS mm throughout): positions to :data:`MM_DECIMALS` (mm), diameters
    and long axes to :data:`LENGTH_DECIMALS` (mm), volumes to :data:`VOLUME_MM3_DECIMALS` (mm³), the score to
    :data:`SCORE_DECIMALS`.

    rank: 1-based, by score. index: position in the detector's findings list. tracking_id / tracking_uid:
    name and UID of the nodule in the SR and the SEG. half_axes_mm: the SR ellipsoid's half axes along LPS x, y, z
    (mm), centred on ``center_lps``: around the nodule segmentation's voxel cells when ``measured``, else half the
    detector box's extent. diameter_mm: the equivalent-sphere diameter of the nodule segmentation when there is one (the
    volume's sphere), else the detector box's equivalent diameter (an estimate, often larger). max_extent_mm: the
    nodule's longest extent in 3-D, the longest distance between the centres of the nodule mask's voxels, at least
    ``diameter_mm`` and the long axis of ``axes`` (when ``measured``), else the box's longest edge. axes: the long and short axis on the slice where
    the segmented nodule is largest (:class:`~pipeline.reconstruction.nodule_geometry.AxialAxes`, LPS mm), as
    Fleischner and Lung-RADS size a nodule; None when not ``measured``. measured:
    whether those two come from a segmentation of the nodule; the SR states them only then (a box's size is no
    measurement a reader should take for one). volume_mm3: from the nodule segmentation, else None. slice_k: the
    volume slice nearest the centre.
    """

    rank: int
    index: int
    tracking_id: str
    tracking_uid: str
    center_lps: tuple[float, float, float]
    half_axes_mm: tuple[float, float, float]
    diameter_mm: float
    max_extent_mm: float
    volume_mm3: float | None
    score: float
    side: str | None
    lobe: str | None
    composition: str | None
    slice_k: int
    mask: NoduleMask | None = None
    measured: bool = False
    axes: AxialAxes | None = None


def stated_score(score: float) -> float:
    """A detector score (0..1) as the results state it: to :data:`SCORE_DECIMALS`, a score below 1 never rounded up to
    1 (certainty, which no detector states): 0.99999594 is 0.999."""
    stated = round(score, SCORE_DECIMALS)
    return min(stated, 1.0 - 10.0**-SCORE_DECIMALS) if score < 1.0 else stated


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _vec3(value: Any, name: str, where: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise DicomOutputError(f"{name} must be 3 finite numbers (LPS mm), got {value!r}", where=where)
    return arr


def as_bool_mask(mask: np.ndarray | LabelMap, geometry: Geometry, name: str) -> np.ndarray:
    """A boolean ``[k, j, i]`` array on ``geometry`` from an array or a binary :class:`LabelMap`."""
    if isinstance(mask, LabelMap):
        if not mask.geometry.same_grid(geometry):
            raise DicomOutputError(
                f"the {name} mask's grid differs from the volume's",
                where=name,
                fix="pass masks on the volume's geometry (as reconstruct() returns them)",
            )
        mask = mask.array
    arr = np.asarray(mask)
    if arr.shape != geometry.shape:
        raise DicomOutputError(
            f"the {name} mask has shape {arr.shape}, the volume {geometry.shape} [k, j, i]",
            where=name,
            fix="pass masks on the volume's geometry",
        )
    return arr if arr.dtype == bool else arr.astype(bool)


def reported_findings(
    findings: Sequence[Finding | Mapping[str, Any]],
    geometry: Geometry,
    *,
    series_uid: str,
    score_threshold: float,
    nodules: Sequence[Any] | None = None,
    organ_masks: Mapping[str, np.ndarray | LabelMap] | None = None,
    details: Mapping[int, NoduleDetail] | None = None,
    images: str = "",
) -> list[ReportedFinding]:
    """The findings with ``score >= score_threshold``, highest score first, as :class:`ReportedFinding` records.

    findings: detector findings (``center_lps``, ``box_min_lps``/``box_max_lps``, ``diameter_mm``, ``score``; LPS mm).
    nodules: nodule segmentations of the same findings list (``NoduleResult`` objects or their JSON, matched by
        ``index``), for volumes and masks. organ_masks: ``lung_left`` / ``lung_right`` masks set each finding's side
        when ``details`` does not. details: finding index → :class:`NoduleDetail`. series_uid and images (the source
        images' :func:`~pipeline.dicom_out.uids.images_key`) name the findings' tracking UIDs.
    """
    by_index = {int(_get(n, "index")): n for n in (nodules or ()) if _get(n, "index") is not None}
    lungs = {
        name: as_bool_mask(organ_masks[name], geometry, name)
        for name in ("lung_left", "lung_right")
        if organ_masks and name in organ_masks
    }
    details = details or {}
    kept = [(n, f) for n, f in enumerate(findings) if float(_get(f, "score")) >= score_threshold]
    kept.sort(key=lambda nf: -float(_get(nf[1], "score")))
    if len(kept) < len(findings):
        log.info(
            "%d of %d findings below the operating point %.3g are not reported",
            len(findings) - len(kept),
            len(findings),
            score_threshold,
        )
    out = []
    for rank, (n, f) in enumerate(kept, 1):
        where = f"finding {n}"
        center = np.round(_vec3(_get(f, "center_lps"), "center_lps", where), MM_DECIMALS)
        lo, hi = _get(f, "box_min_lps"), _get(f, "box_max_lps")
        diameter = float(_get(f, "diameter_mm") or 0.0)
        if lo is not None and hi is not None:
            half = np.abs(_vec3(hi, "box_max_lps", where) - _vec3(lo, "box_min_lps", where)) / 2
        else:
            half = np.full(3, diameter / 2)
        nod = by_index.get(n)
        nm = nodule_mask(nod, geometry, error=DicomOutputError) if nod is not None else None
        volume = _get(nod, "volume_mm3") if nod is not None else None
        measured = (_get(nod, "diameter_mm") or _get(nod, "equivalent_diameter_mm")) if nod is not None else None
        seg_diameter = float(measured) if measured is not None else float("nan")
        is_measured = bool(np.isfinite(seg_diameter) and seg_diameter > 0)
        if is_measured:
            diameter = seg_diameter  # the segmentation's, consistent with the volume and the long axis
        voxels = boundary_voxels(nm) if nm is not None else None
        is_measured = is_measured and voxels is not None
        extent, axes = None, None
        if is_measured and voxels is not None and nm is not None:  # the ellipsoid around the segmented nodule
            half = half_axes_around(cell_corners(voxels, geometry), center)
            extent = long_axis_mm(voxels, geometry, diameter)
            axes = axial_axes(nm, geometry)
            if axes is not None:  # a chord on one slice is no longer than the nodule's longest extent
                extent = max(extent, axes.long_mm)
        if extent is None:
            extent = float(2 * half.max())
        half = np.round(half, MM_DECIMALS)
        detail = details.get(n, NoduleDetail())
        side = detail.side or (lung_side(center, geometry, lungs) if lungs else None)
        k = int(np.clip(np.rint(geometry.lps_to_index(center)[2]), 0, geometry.shape[0] - 1))
        out.append(
            ReportedFinding(
                rank=rank,
                index=n,
                tracking_id=f"Nodule {rank}",
                tracking_uid=finding_uid(series_uid, n, images),
                center_lps=(float(center[0]), float(center[1]), float(center[2])),
                half_axes_mm=(float(half[0]), float(half[1]), float(half[2])),
                diameter_mm=round(diameter, LENGTH_DECIMALS),
                max_extent_mm=round(extent, LENGTH_DECIMALS),
                volume_mm3=None if volume is None else round(float(volume), VOLUME_MM3_DECIMALS),
                score=stated_score(float(_get(f, "score"))),
                side=side,
                lobe=detail.lobe,
                composition=detail.composition,
                slice_k=k,
                mask=nm,
                measured=is_measured,
                axes=axes,
            )
        )
    return out
