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
from ..volume import CTVolume, Geometry, default_device
from . import airway as airway_mod
from . import lungs as lungs_mod
from . import morph
from .grid import Grid, bbox
from .organs import ORGANS, SegmentParams

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


def _full_box(box: tuple[slice, slice, slice], factors: tuple[int, int, int],
              shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The full-resolution slices covered by a working-grid box (clipped to ``shape``)."""
    return tuple(slice(b.start * f, min(n, b.stop * f)) for b, f, n in zip(box, factors, shape))


def _refine(coarse: np.ndarray, grid: Grid, full_hu: torch.Tensor, above: bool, threshold: float,
            inside: np.ndarray | None = None) -> np.ndarray:
    """Up-sample a working-grid mask to full resolution, redoing the threshold in its boundary band.

    Only the bounding box of the mask (plus one working voxel) is touched. In the band
    (one working voxel either side of the boundary) a full-resolution voxel belongs to
    the organ when its HU passes ``threshold`` (and it lies in ``inside``, a working-grid mask).
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

    Returns a :class:`Segmentation` whose ``masks`` are on the volume's own grid.
    An organ that cannot be found gets a :class:`ReconstructionError` in ``errors``
    instead of a mask; the other organs are still segmented.
    """
    p = params or SegmentParams()
    dev = torch.device(device or default_device())
    with morph.torch_threads(dev, p.cpu_threads):
        seg = _segment(volume, set(organs), dev, p)
    # a stable organ order (ORGANS), whatever the set iteration order was
    order = {name: n for n, name in enumerate(ORGANS)}
    seg.masks = dict(sorted(seg.masks.items(), key=lambda kv: order.get(kv[0], len(order))))
    seg.errors = dict(sorted(seg.errors.items(), key=lambda kv: order.get(kv[0], len(order))))
    return seg


def _segment(volume: CTVolume, wanted: set[str], dev: torch.device, p: SegmentParams) -> Segmentation:
    unknown = wanted - set(ORGANS)
    if unknown:
        raise ReconstructionError(f"unknown organ name(s) {sorted(unknown)}", fix=f"choose from {list(ORGANS)}")
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

    body_c = _body(grid, p)
    if not body_c.any():
        for organ in wanted:
            seg.errors[organ] = ReconstructionError(
                f"no body found (no voxels above {p.body_hu:g} HU)", where=where,
                fix="check that the input is a CT in Hounsfield units (rescale slope/intercept applied)",
            )
        return seg
    body_t = morph.to_tensor(body_c, dev)
    if "body" in wanted:
        body_full = _refine(body_c, grid, full_hu, True, p.body_hu)
        if grid.factors == (1, 1, 1):
            body_full = morph.fill_holes(body_full, slice_axis=geom.array_axis(2))
        seg.masks["body"] = body_full

    if wanted & {"lung_left", "lung_right", "airway"}:
        _lungs_and_airway(seg, grid, full_hu, body_c, wanted, p, where)

    if "bone" in wanted:
        bone_c = _bone(grid, body_t, p)
        if not bone_c.any():
            seg.errors["bone"] = ReconstructionError(
                f"no bone found (no component above {p.bone_hu:g} HU larger than {p.min_bone_ml} mL)", where=where,
                fix="check the HU scaling; a scan of a phantom without bone has no bone surface",
            )
        else:
            seg.masks["bone"] = _refine(bone_c, grid, full_hu, True, p.bone_hu, inside=body_c)
    for organ in list(seg.masks):
        if organ not in wanted:
            del seg.masks[organ]
        elif not seg.masks[organ].any():
            del seg.masks[organ]
            seg.errors.setdefault(organ, ReconstructionError(f"{organ} mask is empty", where=where))
    return seg


def _lungs_and_airway(seg: Segmentation, grid: Grid, full_hu: torch.Tensor, body_c: np.ndarray,
                      wanted: set[str], p: SegmentParams, where: str) -> None:
    """Lung candidates → airway growth → left/right split, then full-resolution refinement."""
    dev = full_hu.device
    body_t = morph.to_tensor(body_c, dev)
    air_c = ((grid.hu < p.lung_hu) & body_t).cpu().numpy()
    try:
        cand = lungs_mod.lung_candidates(air_c, grid.geometry, p)
    except ReconstructionError as exc:
        for organ in wanted & {"lung_left", "lung_right", "airway"}:
            seg.errors[organ] = ReconstructionError(exc.problem, where=where, fix=exc.fix)
        return
    aw_c = np.zeros_like(cand)
    try:
        aw_c, aw_info = airway_mod.grow_airway(grid.hu, air_c, cand, body_c, grid.geometry, p)
        seg.info.update(aw_info)
    except ReconstructionError as exc:
        seg.errors["airway"] = ReconstructionError(f"airway: {exc.problem}", where=where, fix=exc.fix)
    air_full = np.zeros(full_hu.shape, dtype=bool)
    if aw_c.any():
        thr = float(seg.info.get("airway_threshold_hu", p.lung_hu))
        air_full = _regrow(aw_c, grid, full_hu, thr) if grid.factors != (1, 1, 1) else aw_c
        edge = float(seg.info.get("airway_edge_hu", thr))
        box = bbox(air_full, 1)
        if box is not None:
            air_full[box] = airway_mod.add_edge_ring(air_full[box], full_hu[box].cpu().numpy(), edge)
        if "airway" in wanted:
            seg.masks["airway"] = air_full
    if not wanted & {"lung_left", "lung_right"}:
        return
    try:
        left_c, right_c = lungs_mod.split_lungs(cand & ~aw_c, grid, p)
    except ReconstructionError as exc:
        for organ in wanted & {"lung_left", "lung_right"}:
            seg.errors[organ] = ReconstructionError(exc.problem, where=where, fix=exc.fix)
        return
    full: dict[str, np.ndarray] = {}
    for name, m in (("lung_left", left_c), ("lung_right", right_c)):
        near = morph.dilate(morph.to_tensor(m, dev), (1, 1, 1)).cpu().numpy()
        fm = _refine(m, grid, full_hu, False, p.lung_hu, inside=near)
        if grid.factors != (1, 1, 1):  # vessels the band threshold cut out of the lung's rim
            box = bbox(fm, 1)
            if box is not None:
                fm[box] = morph.fill_holes(fm[box], slice_axis=seg.geometry.array_axis(2))
        full[name] = fm & ~air_full
    full["lung_right"] &= ~full["lung_left"]
    for name in wanted & {"lung_left", "lung_right"}:
        seg.masks[name] = full[name]


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


def _body(grid: Grid, p: SegmentParams) -> np.ndarray:
    """Body outline on the working grid: tissue above ``body_hu``, largest component, holes filled per slice."""
    tissue = grid.hu > p.body_hu
    tissue = morph.opening(tissue, grid.radius(p.body_open_mm))
    body = morph.largest_component(tissue.cpu().numpy())
    if not body.any():
        return body
    return morph.fill_holes(body, slice_axis=grid.geometry.array_axis(2))


def _bone(grid: Grid, body: torch.Tensor, p: SegmentParams) -> np.ndarray:
    """Bone on the working grid: HU above ``bone_hu`` inside the body, small components dropped."""
    bone = ((grid.hu > p.bone_hu) & body).cpu().numpy()
    labels, sizes = morph.label(bone)
    keep = np.nonzero(sizes * grid.voxel_ml >= p.min_bone_ml)[0]
    bone = morph.keep_labels(labels, keep, sizes.size - 1)
    return morph.fill_holes(bone, slice_axis=grid.geometry.array_axis(2))
