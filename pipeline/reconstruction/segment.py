"""Classical chest-CT organ segmentation in torch (GPU when present, CPU otherwise).

Organs: ``body`` (outline incl. the lungs), ``lung_left`` / ``lung_right``
(left = the patient's left = larger LPS x, decided from the geometry, never from
array order), ``airway`` (trachea and main bronchi, grown from a trachea seed at
the top of the lungs) and ``bone``. Thresholds are in HU; sizes in mm or mL.
Masks are boolean arrays indexed ``[k, j, i]`` on the input volume's grid (LPS).

Large volumes are segmented on a coarser working grid (``work_voxel_mm``) and
then refined at full resolution in a band around each boundary, where the
decision is the full-resolution threshold again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ReconstructionError
from ..ingest.measured import continued_past_edge, measured_mask
from ..intensity import not_hu_hint
from ..volume import CTVolume, Geometry, default_device
from . import air as air_mod
from . import airway as airway_mod
from . import body as body_mod
from . import bone as bone_mod
from . import lung_surface, morph
from . import lungs as lungs_mod
from .grid import Grid, bbox
from .organs import ORGANS, SegmentParams, organ_names
from .quality import LUNGS_ABSENT_ML

log = logging.getLogger(__name__)


@dataclass
class Segmentation:
    """Organ masks (bool ``[k, j, i]`` on ``geometry``), per-organ errors and the values used."""

    geometry: Geometry
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[str, ReconstructionError] = field(default_factory=dict)
    info: dict[str, float | str] = field(default_factory=dict)


def _factors(geometry: Geometry, params: SegmentParams) -> tuple[int, int, int]:
    """Integer down-sampling factors (k, j, i) for the working grid."""
    if int(np.prod(geometry.shape)) < params.work_min_voxels:
        return (1, 1, 1)
    si, sj, sk = geometry.spacing
    fk, fj, fi = (max(1, int(round(params.work_voxel_mm / s))) for s in (sk, sj, si))
    return fk, fj, fi


def _upsample(t: torch.Tensor, factors: tuple[int, int, int], shape: tuple[int, ...]) -> torch.Tensor:
    for dim, f in enumerate(factors):
        if f > 1:
            t = t.repeat_interleave(f, dim=dim)
    return t[: shape[0], : shape[1], : shape[2]]


def _full_box(box: tuple[slice, slice, slice], factors: tuple[int, int, int], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The full-resolution slices covered by a working-grid box (clipped to ``shape``)."""
    return tuple(slice(b.start * f, min(n, b.stop * f)) for b, f, n in zip(box, factors, shape))


def _refine(
    coarse: np.ndarray,
    grid: Grid,
    full_hu: torch.Tensor,
    above: bool,
    threshold: float,
    inside: np.ndarray | None = None,
    outside: np.ndarray | None = None,
) -> np.ndarray:
    """Up-sample a working-grid mask to full resolution, redoing the threshold in its boundary band.

    Only the bounding box of the mask (plus one working voxel) is touched. In the band
    (one working voxel either side of the boundary) a full-resolution voxel belongs to
    the organ when its HU passes ``threshold`` (and it lies in ``inside``, a working-grid mask). No voxel in
    ``outside`` (a 2-D mask of the volume's own in-plane pixels, in-plane axes in array order, the same in every
    slice: the table zone) belongs to it.
    """
    if grid.factors == (1, 1, 1):
        return coarse
    box = bbox(coarse, 1)
    out = np.zeros(tuple(full_hu.shape), dtype=bool)
    if box is None:
        return out
    device = full_hu.device
    c = morph.to_tensor(coarse[box], device)
    band = morph.dilate(c, (1, 1, 1)) & ~morph.erode(c, (1, 1, 1))
    fbox = _full_box(box, grid.factors, tuple(full_hu.shape))
    hu = full_hu[fbox]
    shape = tuple(hu.shape)
    decide = hu > threshold if above else hu < threshold
    if inside is not None:
        decide &= _upsample(morph.to_tensor(inside[box], device), grid.factors, shape)
    res = torch.where(_upsample(band, grid.factors, shape), decide, _upsample(c, grid.factors, shape))
    if outside is not None:
        sa = grid.geometry.array_axis(2)
        plane = tuple(b for d, b in enumerate(fbox) if d != sa)
        res &= ~morph.to_tensor(np.ascontiguousarray(outside[plane]), device).unsqueeze(sa)
    out[fbox] = res.cpu().numpy()
    return out


def segment_organs(
    volume: CTVolume,
    *,
    organs: Iterable[str] = ORGANS,
    device: str | torch.device | None = None,
    params: SegmentParams | None = None,
) -> Segmentation:
    """Segment the chest organs of ``volume`` (HU, LPS) with thresholds, morphology and components.

    ``organs``: names from :data:`ORGANS`; a string is one name (or several separated by commas).
    Returns a :class:`Segmentation` whose ``masks`` are on the volume's own grid.
    An organ that cannot be found gets a :class:`ReconstructionError` in ``errors``
    instead of a mask; the other organs are still segmented. When no lungs are found in
    values that cannot be HU (none below 0), the lungs' errors say so
    (:func:`~pipeline.intensity.not_hu_hint`). On a tilt-corrected grid the voxels no image measured are read as
    each image continued past its edge (:func:`~pipeline.ingest.measured.continued_past_edge`), never as air, and
    are left out of every mask.
    """
    p = params or SegmentParams()
    dev = torch.device(device or default_device())
    measured = measured_mask(volume.geometry, volume.metadata)
    # a tilt-corrected grid's unmeasured wedge reads as each image continued past its edge, not as air that would join
    # lungs cut at the image's edge to the outside air; the masks then leave it out (_keep_measured)
    searched = volume if measured is None else volume.with_array(continued_past_edge(volume.array, measured))
    with morph.torch_threads(dev, p.cpu_threads):
        seg = _segment(searched, set(organ_names(organs)), dev, p)
    _keep_measured(seg, volume)
    _add_not_hu_hint(seg, volume)
    # a stable organ order (ORGANS), whatever the set iteration order was
    order = {name: n for n, name in enumerate(ORGANS)}
    seg.masks = dict(sorted(seg.masks.items(), key=lambda kv: order.get(kv[0], len(order))))
    seg.errors = dict(sorted(seg.errors.items(), key=lambda kv: order.get(kv[0], len(order))))
    return seg


def _keep_measured(seg: Segmentation, volume: CTVolume) -> None:
    """Leave out of every mask the voxels no image measured (the fill wedge of a tilt-corrected grid, whose edge
    voxels blend tissue with the fill value: :mod:`pipeline.ingest.measured`); nothing for any other volume."""
    measured = measured_mask(volume.geometry, volume.metadata)
    if measured is None:
        return
    for organ in list(seg.masks):
        seg.masks[organ] = seg.masks[organ] & measured
        if not seg.masks[organ].any():
            del seg.masks[organ]
            seg.errors.setdefault(organ, ReconstructionError(f"{organ} mask is empty", where=volume.series_uid or "volume"))


def _segment(volume: CTVolume, wanted: set[str], dev: torch.device, p: SegmentParams) -> Segmentation:
    unknown = wanted - set(ORGANS)
    if unknown:
        raise ReconstructionError(
            f"unknown organ name(s) {sorted(unknown)}", where="segment_organs(organs=...)", fix=f"choose from {list(ORGANS)}"
        )
    geom = volume.geometry
    seg = Segmentation(geometry=geom)
    if min(geom.shape) < 2:
        err = ReconstructionError(
            f"volume of shape {geom.shape} [k, j, i] is too thin for 3-D segmentation",
            where=volume.series_uid or "volume",
            fix="reconstruct a series with at least 2 voxels along every axis (a one-slice series has no 3-D organs)",
        )
        for organ in wanted:
            seg.errors[organ] = err
        return seg
    grid = Grid(volume, dev, _factors(geom, p))
    seg.info["work_factors_kji"] = str(grid.factors)
    full_hu = morph.to_tensor(volume.array, dev).to(torch.float32) if grid.factors != (1, 1, 1) else grid.hu
    where = volume.series_uid or "volume"

    body_c, table_zone = body_mod.body_and_table(grid, p)
    if not body_c.any():
        for organ in wanted:
            seg.errors[organ] = ReconstructionError(
                f"no body found (no voxels above {p.body_hu:g} HU)",
                where=where,
                fix="check that the input is a CT in Hounsfield units (rescale slope/intercept applied)",
            )
        if wanted & {"lung_left", "lung_right", "airway"}:  # nothing inside a patient: no lungs, no trachea
            seg.info.update({"lungs": "absent", "airway": "not_in_scan"})
        return seg
    body_t = morph.to_tensor(body_c, dev)
    if "body" in wanted:
        body_full = _refine(body_c, grid, full_hu, True, p.body_hu, outside=table_zone)
        if grid.factors == (1, 1, 1):
            body_full = morph.fill_holes(body_full, slice_axis=geom.array_axis(2))
        seg.masks["body"] = body_full

    if wanted & {"lung_left", "lung_right", "airway"}:
        _lungs_and_airway(seg, grid, full_hu, body_c, wanted, p, where)

    if "bone" in wanted:
        bone_c = bone_mod.segment_bone(grid, body_t, full_hu, p)
        if not bone_c.any():
            seed_hu = bone_mod.partial_volume_hu(bone_mod.SEED_HU, bone_mod.cortex_share(geom.spacing, geom.array_axis(2)))
            seg.errors["bone"] = ReconstructionError(
                f"no bone found (no cortical bone above {seed_hu:g} HU in a component larger than {p.min_bone_ml} mL)",
                where=where,
                fix="check the HU scaling; a scan of a phantom without bone has no bone surface",
            )
        else:  # the boundary band: above bone_hu, or above LOW_HU where the working voxel was bone
            seg.masks["bone"] = _refine(bone_c, grid, full_hu, True, p.bone_hu, inside=body_c) | _refine(
                bone_c, grid, full_hu, True, bone_mod.LOW_HU, inside=bone_c
            )
    for organ in list(seg.masks):
        if organ not in wanted:
            del seg.masks[organ]
        elif not seg.masks[organ].any():
            del seg.masks[organ]
            seg.errors.setdefault(organ, ReconstructionError(f"{organ} mask is empty", where=where))
    return seg


def _lungs_and_airway(
    seg: Segmentation, grid: Grid, full_hu: torch.Tensor, body_c: np.ndarray, wanted: set[str], p: SegmentParams, where: str
) -> None:
    """Air regions → airway (or "not in scan") → lung regions and sides, then full-resolution refinement.

    Records ``seg.info["airway"]`` ("found", "failed" or "not_in_scan": no trachea in the field of
    view, no airway mask and no error) and ``seg.info["lungs"]`` ("found", "one_side" or "absent"; an
    absent lung gets a "no lungs found" entry in ``seg.errors`` naming why, and no mask; with lung on one side only
    the other side has no mask and no error: the quality flag ``one_lung`` states it).

    The airway is the chest's (trachea and bronchi): in a scan without lung (a head or neck scan,
    whose pharynx and larynx look like a trachea) it is "not_in_scan". Without an airway, lungs of less
    than :data:`~pipeline.reconstruction.quality.LUNGS_ABSENT_ML` together are "absent", as the quality
    flags call them (e.g. sinus air that reads denser than air: not lungs to measure).
    """
    dev = full_hu.device
    regions = air_mod.air_regions(grid, body_c, p)
    seg.info["air_level_hu"] = regions.air_level_hu
    aw: airway_mod.Airway | None = None
    failure: ReconstructionError | None = None
    try:
        aw = airway_mod.grow_airway(grid.hu, regions, body_c, grid.geometry, p)
    except ReconstructionError as exc:
        failure = ReconstructionError(f"airway: {exc.problem}", where=where, fix=exc.fix)
    lung_ids = lungs_mod.lung_regions(regions, None if aw is None else aw.mask, grid, p)
    if lung_ids.size == 0 and (aw is not None or failure is not None):
        log.debug(
            "airway: a tube of air without lungs (%s): not the chest's airway", "grown" if aw is not None else "growth failed"
        )
        aw, failure = None, None
    if failure is not None:
        seg.info["airway"] = "failed"
        seg.errors["airway"] = failure
    else:
        seg.info["airway"] = "not_in_scan" if aw is None else "found"
        if aw is not None:
            seg.info.update(aw.info)
    air_full = np.zeros(full_hu.shape, dtype=bool)
    if aw is not None:
        thr = float(aw.info["airway_threshold_hu"])
        air_full = _regrow(aw.mask, grid, full_hu, thr) if grid.factors != (1, 1, 1) else aw.mask
        box = bbox(air_full, 1)
        if box is not None:
            air_full[box] = airway_mod.add_edge_ring(air_full[box], full_hu[box].cpu().numpy(), float(aw.info["airway_edge_hu"]))
        if "airway" in wanted:
            seg.masks["airway"] = air_full
    if not wanted & {"lung_left", "lung_right"}:
        return
    lungs = lungs_mod.select_lungs(
        regions, None if aw is None else aw.mask, None if aw is None else aw.seed_x_mm, body_c, grid, p, ids=lung_ids
    )
    seg.info.update(lungs.info)
    if not lungs.found:
        _no_lungs(seg, wanted, where, lungs.why)
        return
    thr = lung_surface.boundary_threshold(grid.hu.cpu().numpy(), lungs.left | lungs.right, p)
    seg.info["lung_boundary_hu"] = round(thr, 1)
    not_gas = np.ones(lungs.left.shape, dtype=bool)
    if lungs.gas is not None and lungs.gas.any():  # keep the boundary out of bowel gas's rim
        not_gas = ~morph.dilate(morph.to_tensor(lungs.gas, dev), (1, 1, 1)).cpu().numpy()
    full: dict[str, np.ndarray] = {}
    for name, m, other in (("lung_left", lungs.left, lungs.right), ("lung_right", lungs.right, lungs.left)):
        if not m.any():
            full[name] = np.zeros(full_hu.shape, dtype=bool)
            continue
        near = morph.dilate(morph.to_tensor(m, dev), (1, 1, 1)).cpu().numpy() & ~other & (m | not_gas)
        if grid.factors != (1, 1, 1):
            fm = _refine(m, grid, full_hu, False, thr, inside=near)
            box = bbox(fm, 1)  # vessels the band threshold cut out of the lung's rim
            if box is not None:
                near_full = _upsample(morph.to_tensor(near, dev), grid.factors, tuple(full_hu.shape)).cpu().numpy()
                filled = morph.fill_holes(fm[box], slice_axis=seg.geometry.array_axis(2))
                fm[box] |= filled & near_full[box]  # not what the working grid left out (a liver dome)
        else:
            fm = lung_surface.adjust_boundary(m, grid.hu.cpu().numpy(), thr, near)
        if lungs.kept is not None and (lungs.kept & m).any():  # vessels and nodules at the pleura stay in
            kept = lungs.kept & m
            if grid.factors != (1, 1, 1):
                kept = _upsample(morph.to_tensor(kept, dev), grid.factors, tuple(full_hu.shape)).cpu().numpy()
            fm |= kept
        full[name] = fm & ~air_full
    full["lung_right"] &= ~full["lung_left"]
    voxel_ml = float(np.prod(seg.geometry.spacing)) / 1000.0
    for name in full:
        full[name] = _drop_specks(full[name], voxel_ml)
    total_ml = float(np.count_nonzero(full["lung_left"]) + np.count_nonzero(full["lung_right"])) * voxel_ml
    if aw is None and total_ml < LUNGS_ABSENT_ML:  # air connected to a trachea is lung whatever its size
        _no_lungs(
            seg,
            wanted,
            where,
            f"{total_ml:.1f} mL of lung-like air inside the patient, less than {LUNGS_ABSENT_ML:g} mL (not lungs to measure)",
        )
        return
    for name in wanted & {"lung_left", "lung_right"}:
        if full[name].any():
            seg.masks[name] = full[name]
        else:  # a fact of the case (a pneumonectomy?), not a failure: the quality flag one_lung names the side
            log.info("%s: no %s lung found: lung air on one side of the patient only", where, name.split("_")[1])


#: Pieces of a full-resolution lung mask smaller than this (mL) are dropped: partial-volume voxels the boundary
#: band takes beside the trachea, the oesophagus and the mediastinum (on a real planning chest 381 pieces of 1-2
#: voxels, 1.3 mL in all), which split a lung's mesh into hundreds of parts and put its top at the scan's first slice.
MIN_LUNG_PIECE_ML = 0.5


def _drop_specks(mask: np.ndarray, voxel_ml: float) -> np.ndarray:
    """``mask`` without its 26-connected pieces under :data:`MIN_LUNG_PIECE_ML` (the largest always kept)."""
    box = bbox(mask, 0)
    if box is None:
        return mask
    labels, sizes = morph.label(mask[box], structure=np.ones((3, 3, 3), dtype=bool))
    keep = np.flatnonzero((sizes * voxel_ml >= MIN_LUNG_PIECE_ML) | (sizes == sizes.max()))
    if keep.size == sizes.size - 1:  # every piece stays
        return mask
    out = np.zeros_like(mask)
    out[box] = morph.keep_labels(labels, keep, sizes.size - 1)
    return out


def _no_lungs(seg: Segmentation, wanted: set[str], where: str, why: str) -> None:
    """Record ``lungs = "absent"``: an error naming ``why`` for each lung asked for, and no lung mask."""
    seg.info["lungs"] = "absent"
    seg.info.pop("lung_sides_from", None)
    for organ in wanted & {"lung_left", "lung_right"}:
        seg.errors[organ] = ReconstructionError(
            f"no lungs found: {why}",
            where=where,
            fix="nothing to do for a scan without lungs (e.g. an abdomen or head scan); check the HU scaling otherwise",
        )


def _add_not_hu_hint(seg: Segmentation, volume: CTVolume) -> None:
    """Append :func:`~pipeline.intensity.not_hu_hint` to the lungs' "no lungs found" errors when it applies."""
    if seg.info.get("lungs") != "absent":
        return
    hint = not_hu_hint(volume.array)
    if not hint:
        return
    for organ, exc in list(seg.errors.items()):
        if organ in ("lung_left", "lung_right") and exc.problem.startswith("no lungs found"):
            seg.errors[organ] = ReconstructionError(
                exc.problem + hint,
                where=exc.where,
                fix="pass the volume in Hounsfield units (load_series returns HU)",
            )


def _regrow(coarse: np.ndarray, grid: Grid, full_hu: torch.Tensor, threshold: float) -> np.ndarray:
    """Redo a region growing at full resolution near a working-grid result (thin tubes such as airways).

    Full-resolution voxels darker than ``threshold`` within one working voxel of ``coarse`` that are
    connected to its eroded core make the result.
    """
    box = bbox(coarse, 2)
    out = np.zeros(tuple(full_hu.shape), dtype=bool)
    if box is None:
        return out
    dev = full_hu.device
    c = morph.to_tensor(coarse[box], dev)
    fbox = _full_box(box, grid.factors, tuple(full_hu.shape))
    shape = tuple(full_hu[fbox].shape)
    dark = (full_hu[fbox] < threshold) & _upsample(morph.dilate(c, (1, 1, 1)), grid.factors, shape)
    core = _upsample(c, grid.factors, shape) & dark
    dark_np, core_np = dark.cpu().numpy(), core.cpu().numpy()
    labels, sizes = morph.label(dark_np)
    ids = np.unique(labels[core_np])
    out[fbox] = morph.keep_labels(labels, ids[ids > 0], sizes.size - 1)
    return out
