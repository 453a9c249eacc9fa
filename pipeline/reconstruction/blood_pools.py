"""Blood pools: which thick bright regions of a CT are contrast-enhanced blood, and which are bone.

On a contrast-enhanced scan the blood of the heart chambers, the aorta and the pulmonary
arteries (150..500 HU) is as bright as trabecular bone (100..400 HU), so HU alone cannot keep it
out of the bone mask; this module tells the two apart by shape and texture, on the working grid
(tensors ``[k, j, i]``, LPS mm geometry; HU; lengths in mm).

Thick regions (in-plane 3x3 mean HU above :data:`LOW_HU`, wider than ``2 * POOL_MM`` mm, the
cortex and its small gaps excluded) are taken slice by slice (so that blood and bone never merge
through a disc or a partial-volume bridge) and tested one by one. Each is grown in-plane from its
own seed up to a rim brighter than ``SEED_HU - RIM_DELTA`` HU, a voxel joining the seed that
reaches it first; regions joined by a neck narrower than ``2 * SPLIT_MM`` mm have a seed each, so
that a vertebral body and the aorta touching it where its cortex is faint stay two regions.

* A heart chamber, the aorta or a pulmonary artery is **smooth** inside: the median HU spread
  inside its core, from core voxels only (so that neither its partial-volume edge, nor a thin
  bright wall touching it, nor a streak across it counts), is below ``TEXTURE_RATIO`` times the
  image noise of its slice (which streaks from metal raise). It is **hardly rimmed** by cortex or
  by anything ``RIM_DELTA`` HU brighter than its inside (share of its in-plane rim below
  ``RIM_MIN``).
* A vertebral body or the sternum is textured (trabecular bone) or rimmed by cortex: bone.
* Blood runs on along the body's axis: a smooth, unrimmed region is a pool only where its stack
  (the regions of adjacent slices that overlap it) is at least ``POOL_MIN_LENGTH_MM`` mm long, or
  is cut by the scan's first or last slice, or does not sit on bone. A shorter one whose end lies
  mostly (``STACK_ON_BONE_MIN``) on bone in the next slice (a vertebral endplate or the sternum on
  slices whose pixels blur its texture and cortex away) is neither pool nor bone region: the bone
  segmentation (:mod:`.bone`) decides it.

Pools, with their partial-volume rim where they touch bone, are kept out of the bone that
:func:`.bone.segment_bone` grows; the textured or rimmed regions are bone.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy import ndimage

from . import morph
from .grid import Grid, bbox
from .local_hu import in_plane_mean, in_plane_spread, masked_in_plane_mean, noise_hu, soft_tissue

log = logging.getLogger(__name__)

__all__ = ["LOW_HU", "SEED_HU", "blood_pools"]

SEED_HU = 600.0  # cortical bone (HU, full resolution)
LOW_HU = 150.0  # trabecular bone and enhanced blood are above this (HU); enhanced liver and spleen are below
POOL_MM = 2.0  # a blood pool is wider than twice this in-plane (mm)
SPLIT_MM = 4.0  # thick regions joined by a neck narrower than twice this in-plane (mm) are judged apart
RIM_MIN = 0.45  # share of an in-plane rim on cortex above which a thick region is bone
RIM_DELTA = 100.0  # a rim voxel this much brighter (HU) than the region's inside is cortex too
TEXTURE_RATIO = 2.0  # local HU spread (x image noise) above which a thick region is bone
CORE_NEIGHBOURS_MIN = 6  # in-plane 3x3 neighbours (in a region's core) a voxel needs for its texture to count
SLICE_NOISE_MIN = 200  # soft-tissue pixels a slice needs for its own noise estimate
POOL_MIN_LENGTH_MM = 20.0  # blood runs at least this far along the slice axis (a vessel, a heart chamber) (mm)
STACK_ON_BONE_MIN = 0.5  # share of a short smooth stack's end on bone, in the next slice, for it to be bone's end


def _ring_labels(labels: torch.Tensor, region: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """For voxels outside ``region``: the largest label among their neighbours along ``dims`` (0 inside)."""
    out = torch.zeros_like(labels)
    for d in dims:
        n = labels.shape[d]
        a = out.narrow(d, 1, n - 1)
        a.copy_(torch.maximum(a, labels.narrow(d, 0, n - 1)))
        a = out.narrow(d, 0, n - 1)
        a.copy_(torch.maximum(a, labels.narrow(d, 1, n - 1)))
    return torch.where(region, torch.zeros_like(out), out)


def _label_median(labels: torch.Tensor, values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per label ``0..n``: (median of ``values`` over its voxels, voxel count); 1-D tensors of equal length in."""
    v = values.to(torch.float64)
    span = float(v.max() - v.min()) + 1.0 if v.numel() else 1.0
    order = torch.argsort(labels.to(torch.float64) * span + (v - v.min() if v.numel() else v))  # by label, then value
    sorted_values = values[order]
    count = torch.bincount(labels, minlength=n + 1)
    start = torch.cumsum(count, 0) - count
    mid = (start + (count - 1).clamp(min=0) // 2).clamp(max=max(0, sorted_values.numel() - 1))
    med = sorted_values[mid] if sorted_values.numel() else torch.zeros(n + 1, dtype=values.dtype, device=values.device)
    return torch.where(count > 0, med, torch.zeros_like(med)), count


def _core_texture(
    hu: torch.Tensor, spread: torch.Tensor, core: torch.Tensor, labels: torch.Tensor, n: int, slice_axis: int
) -> torch.Tensor:
    """Per label ``0..n``: the median in-plane 3x3 HU spread (HU) inside ``core``, from core neighbours only.

    Neither the region's partial-volume edge nor a thin bright structure touching it (an enhanced
    vessel wall) enters the spread: only voxels of ``core`` with at least
    :data:`CORE_NEIGHBOURS_MIN` in-plane neighbours (themselves included) in ``core`` count, each
    with the spread of those neighbours; the median keeps the few streaks from metal that cross
    a blood pool from making it textured (trabecular bone is textured throughout). Labels without
    such a voxel get the mean plain 3x3 spread over their core voxels (``spread``: the in-plane
    3x3 standard deviation of ``hu``).
    """
    m1, count = masked_in_plane_mean(hu, core, slice_axis)
    m2, _ = masked_in_plane_mean(hu * hu, core, slice_axis)
    inside_spread = (m2 - m1 * m1).clamp(min=0).sqrt()
    use = core & (count >= CORE_NEIGHBOURS_MIN)
    texture, use_n = _label_median(labels[use], inside_spread[use], n)
    in_core = torch.where(core, labels, torch.zeros_like(labels)).ravel()
    core_n = torch.bincount(in_core, minlength=n + 1).clamp(min=1)
    plain = torch.bincount(in_core, weights=spread.ravel(), minlength=n + 1) / core_n
    return torch.where(use_n > 0, texture, plain)


def blood_pools(
    hu: torch.Tensor,
    body: torch.Tensor,
    cortex: torch.Tensor,
    grid: Grid,
    *,
    scan_ends: tuple[bool, bool] = (True, True),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(blood pools, thick bone regions) among the thick regions above ``LOW_HU`` (bool tensors like ``hu``).

    See the module docstring. ``hu`` and the masks are ``[k, j, i]`` tensors on the
    working grid (or a box of it). ``scan_ends``: whether the first and the last slice of ``hu``
    (along the slice axis) are the scan's own first and last slice, where a vessel may be cut
    short by the scan range (:func:`_long_stacks`).
    """
    sa = grid.geometry.array_axis(2)
    inplane = tuple(d for d in range(3) if d != sa)
    none = torch.zeros_like(body)
    closing_r = tuple(0 if d == sa else 2 for d in range(3))
    barrier = morph.dilate(morph.closing(cortex, closing_r), (1, 1, 1))  # cortex with its small gaps bridged
    smooth = in_plane_mean(hu, sa)
    allowed = (smooth > LOW_HU) & body & ~barrier
    r = grid.in_plane_radius(POOL_MM)
    structure = morph.in_plane_cross(sa)  # regions are taken slice by slice: no merging along z
    core = morph.erode(allowed, r)
    if not bool(core.any()):
        return none, none
    box = bbox(core.cpu().numpy(), max(r) + 2)
    if box is None:
        return none, none
    hu_b, core_b, allowed_b, body_b, barrier_b = hu[box], core[box], allowed[box], body[box], barrier[box]
    # each core's region, grown in-plane out to its rim. Cores are split at necks narrower than 2 * SPLIT_MM
    # (a vertebral body and the aorta touching it, where its cortex is faint or missing): each part grows from
    # its own seed (the core eroded by SPLIT_MM, or the whole core where nothing survives that), a voxel
    # joining the seed that reaches it first
    inner = (allowed_b & (hu_b < SEED_HU - RIM_DELTA)).cpu().numpy()  # a faint cortex stops the region (its rim)
    core_np = core_b.cpu().numpy()
    split_r = grid.in_plane_radius(SPLIT_MM)
    seeds = morph.erode(core_b, split_r).cpu().numpy()
    lab_np, n = ndimage.label(seeds, structure=structure)
    core_lab, n_core = ndimage.label(core_np, structure=structure)
    seeded = np.zeros(n_core + 1, dtype=bool)
    seeded[core_lab[seeds]] = True
    unseeded = core_np & ~seeded[core_lab]
    extra, n_extra = ndimage.label(unseeded, structure=structure)
    lab_np = np.where(unseeded, extra + n, lab_np)
    n += n_extra
    footprint = np.ones(tuple(1 if d == sa else 3 for d in range(3)), dtype=bool)
    for within, steps in ((core_np, max(split_r) + 1), (inner, max(r) + 2)):
        for _ in range(steps):
            reach = ndimage.grey_dilation(lab_np, footprint=footprint)
            lab_np = np.where(within, np.where(lab_np > 0, lab_np, reach), 0)
    labels = morph.to_tensor(lab_np, hu.device).to(torch.int64)
    region = labels > 0
    mean, spread = in_plane_spread(hu_b, sa)
    soft = soft_tissue(mean, body_b & ~region)
    noise = noise_hu(spread, soft)
    in_core = torch.where(core_b, labels, torch.zeros_like(labels)).ravel()
    size = torch.bincount(in_core, minlength=n + 1).clamp(min=1)
    level = torch.bincount(in_core, weights=hu_b.ravel(), minlength=n + 1) / size
    texture = _core_texture(hu_b, spread, core_b, labels, n, sa)
    # the rim: in-plane neighbours outside the region; cortex, or brighter than the region's inside
    ring = _ring_labels(labels, region, inplane)
    on_ring = ring > 0
    bright = barrier_b | (hu_b >= level[ring] + RIM_DELTA)
    ring_n = torch.bincount(ring[on_ring], minlength=n + 1)
    rim_n = torch.bincount(ring[on_ring & bright], minlength=n + 1)
    rim = rim_n.to(torch.float32) / ring_n.clamp(min=1)
    # streaks from metal raise the noise of their slices: each region is judged against its slice's noise
    sa_b = grid.geometry.array_axis(2)
    slice_noise = torch.full((hu_b.shape[sa_b],), noise, dtype=spread.dtype, device=spread.device)
    for k in range(hu_b.shape[sa_b]):
        v = spread.select(sa_b, k)[soft.select(sa_b, k)]
        if v.numel() >= SLICE_NOISE_MIN:
            slice_noise[k] = max(noise, float(torch.quantile(v, 0.25)))
    k_idx = torch.arange(hu_b.shape[sa_b], device=labels.device).view([-1 if d == sa_b else 1 for d in range(3)])
    first_k = torch.zeros(n + 1, dtype=torch.int64, device=labels.device)
    first_k[labels.ravel()] = k_idx.expand_as(labels).ravel()
    smooth_inside = texture < TEXTURE_RATIO * slice_noise[first_k]
    is_pool = (rim < RIM_MIN) & smooth_inside
    is_pool[0] = False
    pool_b = is_pool[labels]
    first_slice = box[sa].start == 0 and scan_ends[0]
    last_slice = box[sa].stop == hu.shape[sa] and scan_ends[1]
    is_bone = ~is_pool & ((rim >= RIM_MIN) | ~smooth_inside)
    is_bone[0] = False
    pool_b &= _long_stacks(pool_b, is_bone[labels] | barrier_b, grid, cut=(first_slice, last_slice))
    pool_b |= morph.dilate(pool_b, (1, 1, 1)) & barrier_b & ~cortex[box] & (hu_b > LOW_HU)  # the pool's rim next to bone
    log.debug("blood pools: noise %.1f HU, %d thick regions, %d blood pools", noise, n, int(is_pool.sum()))
    pool, bone = none.clone(), none.clone()
    pool[box] = pool_b
    bone[box] = is_bone[labels]
    return pool, bone


def _long_stacks(candidate: torch.Tensor, bone: torch.Tensor, grid: Grid, *, cut: tuple[bool, bool]) -> torch.Tensor:
    """The voxels of ``candidate`` but those of stacks shorter than :data:`POOL_MIN_LENGTH_MM` that sit on ``bone``.

    A stack is a 3-D face-connected component of ``candidate`` (regions of adjacent slices that
    overlap). Blood pools are vessels and heart chambers, which run on for centimetres along the
    body's axis; a smooth region a few millimetres long whose end lies mostly (at least
    :data:`STACK_ON_BONE_MIN` of it) on ``bone`` in the next slice along the slice axis is no vessel
    but the end of a bone (a vertebral endplate on slices thicker than its cortex, whose texture
    and rim partial volume blurs away). A short stack that a vessel continues (blood below the
    thick-region threshold in the next slices) does not sit on bone and stays. A stack that reaches
    the first (``cut[0]``) or last (``cut[1]``) slice may be cut short by the scan range: it stays.
    """
    sa = grid.geometry.array_axis(2)
    mask = candidate.cpu().numpy()
    labels, n = ndimage.label(mask, structure=ndimage.generate_binary_structure(3, 1))
    if n == 0:
        return candidate
    on_bone = bone.cpu().numpy()
    slice_mm = float(grid.geometry.spacing[2 - sa])
    keep = np.ones(n + 1, dtype=bool)
    last = mask.shape[sa] - 1
    for idx, sl in enumerate(ndimage.find_objects(labels), start=1):
        k0, k1 = sl[sa].start, sl[sa].stop - 1
        if (k1 - k0 + 1) * slice_mm >= POOL_MIN_LENGTH_MM or (cut[0] and k0 == 0) or (cut[1] and k1 == last):
            continue
        share = 0.0
        for k, beyond in ((k0, k0 - 1), (k1, k1 + 1)):
            if 0 <= beyond <= last:
                face = np.take(labels, k, axis=sa) == idx
                share = max(share, float(np.take(on_bone, beyond, axis=sa)[face].mean()))
        keep[idx] = share < STACK_ON_BONE_MIN
        log.debug(
            "blood pools: smooth stack of %d slices, %.0f %% of an end on bone: %s",
            k1 - k0 + 1,
            100 * share,
            "pool" if keep[idx] else "not blood",
        )
    keep[0] = False
    return morph.to_tensor(keep[labels], candidate.device)
