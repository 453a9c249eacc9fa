"""Bone on the working grid: cortex, trabecular bone and marrow; not contrast-enhanced blood.

HU alone cannot tell bone from IV contrast: enhanced blood (150..500 HU) overlaps trabecular
bone (100..400 HU); only cortical bone is brighter. So bone is found by shape:

1. **Cortex seeds**: full-resolution voxels above ``SEED_HU`` with at least ``SEED_MIN_COUNT``
   such voxels in their 3x3x3 neighbourhood (noise in bright blood does not cluster),
   pooled onto the working grid.
2. **Blood pools**: thick regions (in-plane smoothed HU above ``LOW_HU``, wider than
   ``2 * POOL_MM``, cortex and its small gaps excluded) are taken slice by slice (so that
   blood and bone never merge through a disc or a partial-volume bridge) and tested one by
   one (each grown in-plane from its own seed up to a rim brighter than ``SEED_HU - RIM_DELTA``,
   a voxel joining the seed that reaches it first; regions joined by a neck narrower than
   ``2 * SPLIT_MM`` have a seed each, so that a vertebral body and the aorta touching it where
   its cortex is faint stay two regions): a heart
   chamber, the aorta or a pulmonary artery is smooth inside (the median HU spread inside its
   core, from core voxels only, so that neither its partial-volume edge, nor a thin bright wall
   touching it, nor a streak across it counts, below ``TEXTURE_RATIO`` times the image noise of
   its slice, which streaks from metal raise) and hardly rimmed by cortex or by anything
   ``RIM_DELTA`` brighter than its inside (share of its in-plane rim below ``RIM_MIN``); a
   vertebral body or the sternum is textured (trabecular bone) or rimmed by cortex. Blood runs on
   along the body's axis: a smooth, unrimmed region is a pool only where its stack (the regions of
   adjacent slices that overlap it) is at least ``POOL_MIN_LENGTH_MM`` long, or is cut by the scan's
   first or last slice, or does not sit on bone: a shorter one whose end lies mostly on bone in the
   next slice (a vertebral endplate or the sternum on slices whose pixels blur its texture and
   cortex away) is left to the steps below. Pools
   (and their partial-volume rim where they touch bone) are excluded from everything below;
   textured or rimmed regions are bone.
3. **Bone**: the seeds, grown one voxel into voxels above ``bone_hu``, the thick bone regions,
   marrow enclosed by them in a slice (holes up to ``MARROW_MAX_MM2`` whose mean HU is above
   ``MARROW_HU``, or fatty marrow of any HU away from the body's x mid-line: a long bone's
   medullary cavity, not the spinal canal; see :mod:`.marrow`), then grown up to ``GROW_MM`` into
   voxels above ``LOW_HU`` that are not blood pools (trabecular bone behind a thin cortex). Holes
   left in a slice are filled again (noise specks up to ``SPECK_MM2`` whatever their HU, and marrow as
   before); the in-plane outer layer is then kept only where it passes ``bone_hu`` (partial volume),
   metal (above ``METAL_HU``, with its one-voxel partial-volume rim) is taken out, and
   components smaller than ``min_bone_ml`` dropped.

Pixels wider than the cortex (``CORTEX_MM``, in-plane, at full resolution) hold only part of it:
the cortex fills ``CORTEX_MM / pixel`` of each pixel it crosses (:func:`cortex_share`), so a pixel
on it is only that share of the way from the marrow or tissue beside it to the cortex. The cortex
thresholds (``SEED_HU``, and ``bone_hu`` for the shell) then move down towards ``LOW_HU`` by the
same share (:func:`partial_volume_hu`; on 3 mm pixels ``SEED_HU`` 600 becomes 300 HU, ``bone_hu``
300 becomes 200 HU). The outer-layer trim's ``bone_hu`` moves by twice that share (at most 1): a
pixel centred on the bone's outer surface has its inner half on the bone, which holds the whole
cortex until that half is wider than the cortex (unchanged up to 2 mm pixels, 250 HU on 3 mm
pixels). The extra seeds this finds are kept out of blood pools (which are judged on the seeds
above ``SEED_HU`` itself, so enhanced blood, 300-500 HU, never becomes a seed that rims it). Where
the cortex fills less than ``BROKEN_RING_SHARE`` of a pixel, a vertebral body's ring breaks into
pieces and its marrow is no longer a hole: marrow is then also a region of the slice denser than
soft tissue that bone mostly surrounds (:func:`.marrow.fill_rimmed_marrow`), added after the
growth in step 3, and so is a region of a slice as dense as marrow with bone in the slices just
above and below it (a low-density level where no cortex shows at all;
:func:`.marrow.fill_between_slices`); a resolved cortex always shows, so finer pixels need neither. On such pixels a pixel wholly on bone is mostly cancellous bone, often below the
surface threshold itself (120-250 HU on 3 mm pixels), so that threshold would trim bone that is
all there is: a pixel centred on the surface is half the bone beside it and half the tissue beside
it, and the outer layer is also kept where it is at least half-way between the two (the half
maximum of a blurred edge; :func:`half_way_hu`).

A noisy image (a sharp reconstruction kernel: the image noise measured in soft tissue above
``NOISY_HU``) is segmented on its in-plane 3x3 mean, as a radiologist reads bone on a
soft-tissue reconstruction; the cortex seeds still come from the full-resolution voxels, and
the outer layer is kept where the in-plane 3x3 median (which, unlike the mean, does not spread a
bright cortex one voxel out) passes ``bone_hu``.

Masks are boolean ``[k, j, i]`` arrays on the grid's geometry (LPS mm).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from scipy import ndimage

from . import morph
from .grid import Grid, bbox
from .marrow import MARROW_LOW_HU, SPECK_MM2, fill_between_slices, fill_marrow, fill_rimmed_marrow, midline_x
from .organs import SegmentParams

log = logging.getLogger(__name__)

__all__ = [
    "blood_pools",
    "cortex_seeds",
    "cortex_share",
    "geodesic",
    "half_way_hu",
    "image_noise",
    "in_plane_mean",
    "in_plane_median_at",
    "midline_x",
    "partial_volume_hu",
    "segment_bone",
]

SEED_HU = 600.0  # cortical bone (HU, full resolution)
SEED_MIN_COUNT = 4  # seed voxels in a 3x3x3 neighbourhood (the voxel included)
LOW_HU = 150.0  # trabecular bone and enhanced blood are above this (HU); enhanced liver and spleen are below
POOL_MM = 2.0  # a blood pool is wider than twice this in-plane (mm)
SPLIT_MM = 4.0  # thick regions joined by a neck narrower than twice this in-plane (mm) are judged apart
RIM_MIN = 0.45  # share of an in-plane rim on cortex above which a thick region is bone
RIM_DELTA = 100.0  # a rim voxel this much brighter (HU) than the region's inside is cortex too
TEXTURE_RATIO = 2.0  # local HU spread (x image noise) above which a thick region is bone
CORE_NEIGHBOURS_MIN = 6  # in-plane 3x3 neighbours (in a region's core) a voxel needs for its texture to count
GROW_MM = 8.0  # trabecular bone reaches this far from cortex or a bone region (mm)
NOISY_HU = 45.0  # image noise (HU, soft tissue) above which bone is segmented on the in-plane mean
SLICE_NOISE_MIN = 200  # soft-tissue pixels a slice needs for its own noise estimate
METAL_HU = 2500.0  # metal (not bone) is above this (HU); cortical bone stays below
CORTEX_MM = 1.0  # cortical bone is about this thick (mm): a wider pixel holds only part of it (partial volume)
BROKEN_RING_SHARE = 0.5  # a cortex filling less than this share of a pixel leaves gaps in a vertebral body's ring
POOL_MIN_LENGTH_MM = 20.0  # blood runs at least this far along the slice axis (a vessel, a heart chamber) (mm)
STACK_ON_BONE_MIN = 0.5  # share of a short smooth stack's end on bone, in the next slice, for it to be bone's end


def _sum3(t: torch.Tensor, dims: tuple[int, ...], *, zero_edges: bool = False) -> torch.Tensor:
    """Sum over a window of 3 along each of ``dims`` (edges replicated, or zero outside); separable."""
    out = t
    for d in dims:
        n = out.shape[d]
        first, last = out.narrow(d, 0, 1), out.narrow(d, n - 1, 1)
        if zero_edges:
            first, last = torch.zeros_like(first), torch.zeros_like(last)
        pad = torch.cat([first, out, last], dim=d)
        out = pad.narrow(d, 0, n) + pad.narrow(d, 1, n) + pad.narrow(d, 2, n)
    return out


def _pool_count(mask: torch.Tensor, factors: tuple[int, int, int]) -> torch.Tensor:
    """How many voxels of ``mask`` lie under each working-grid voxel (uint8; the grid's ``ceil`` pooling)."""
    m = mask.view(torch.uint8)
    for d, f in enumerate(factors):
        if f <= 1:
            continue
        pad = (-m.shape[d]) % f
        if pad:
            shape = list(m.shape)
            shape[d] = pad
            m = torch.cat([m, torch.zeros(shape, dtype=m.dtype, device=m.device)], dim=d)
        lead = (slice(None),) * d
        acc = m[(*lead, slice(0, None, f))].clone()
        for o in range(1, f):
            acc += m[(*lead, slice(o, None, f))]
        m = acc
    return m


def cortex_share(spacing_ijk: tuple[float, float, float], slice_axis: int) -> float:
    """Share of a pixel that a cortex of :data:`CORTEX_MM` fills (1 for pixels no wider than it).

    ``spacing_ijk`` is the full-resolution voxel spacing (mm, along i, j, k); the pixel is the
    mean of the two in-plane spacings (``slice_axis``: the array axis across the slices).
    """
    inplane = [float(spacing_ijk[2 - a]) for a in range(3) if a != slice_axis]
    return min(1.0, CORTEX_MM / (sum(inplane) / len(inplane)))


def partial_volume_hu(threshold_hu: float, share: float) -> float:
    """A cortex threshold (HU, set for a fully resolved cortex) for pixels the cortex fills ``share`` of.

    A pixel holding ``share`` of a cortex and trabecular bone or tissue for the rest is about
    ``share`` of the way from that tissue to the cortex, so the threshold moves the same share
    of the way down towards :data:`LOW_HU` (never below it: enhanced liver and spleen stay out).
    """
    return LOW_HU + (threshold_hu - LOW_HU) * share if threshold_hu > LOW_HU else threshold_hu


def cortex_seeds(
    full_hu: torch.Tensor, factors: tuple[int, int, int], *, seed_hu: float = SEED_HU, min_count: int = SEED_MIN_COUNT
) -> torch.Tensor:
    """Cortical bone on the working grid: clustered full-resolution voxels above ``seed_hu`` (HU).

    A working voxel is a seed when it holds a voxel above ``seed_hu`` and its 3x3x3 working
    neighbourhood holds at least ``min_count`` of them, plus one for each further
    full-resolution voxel a working voxel pools. Where the scan's first or last slice (or the
    image's edge) cuts the neighbourhood, the same share of it is asked of the part inside
    (3 of the 18 voxels left on the first slice, for 4 of 27): a rib crossing the end of the scan
    is bone as it is one slice further in.
    """
    count = _pool_count(full_hu > seed_hu, factors)
    need = min_count + int(np.prod(factors)) - 1
    inside = _sum3(torch.ones_like(count, dtype=torch.int16), (0, 1, 2), zero_edges=True)  # 27 unless cut
    need_here = torch.ceil(need * inside.to(torch.float32) / 27.0)
    return (count > 0) & (_sum3(count.to(torch.int16), (0, 1, 2), zero_edges=True) >= need_here)


def geodesic(seed: torch.Tensor, allowed: torch.Tensor, steps: int) -> torch.Tensor:
    """Grow ``seed`` by up to ``steps`` voxel layers (26-neighbourhood) inside ``allowed``."""
    grown = seed & allowed
    for _ in range(steps):
        nxt = morph.dilate(grown, (1, 1, 1)) & allowed
        if torch.equal(nxt, grown):
            break
        grown = nxt
    return grown


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
    hu: torch.Tensor, spread: torch.Tensor, core: torch.Tensor, labels: torch.Tensor, n: int, inplane: tuple[int, ...]
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
    w = core.to(hu.dtype)
    count = _sum3(w, inplane, zero_edges=True)
    c = count.clamp(min=1)
    m1 = _sum3(hu * w, inplane, zero_edges=True) / c
    inside_spread = (_sum3(hu * hu * w, inplane, zero_edges=True) / c - m1 * m1).clamp(min=0).sqrt()
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

    See the module docstring (step 2). ``hu`` and the masks are ``[k, j, i]`` tensors on the
    working grid (or a box of it). ``scan_ends``: whether the first and the last slice of ``hu``
    (along the slice axis) are the scan's own first and last slice, where a vessel may be cut
    short by the scan range (:func:`_long_stacks`).
    """
    sa = grid.geometry.array_axis(2)
    inplane = tuple(d for d in range(3) if d != sa)
    none = torch.zeros_like(body)
    closing_r = tuple(0 if d == sa else 2 for d in range(3))
    barrier = morph.dilate(morph.closing(cortex, closing_r), (1, 1, 1))  # cortex with its small gaps bridged
    smooth = _sum3(hu, inplane) / 9.0
    allowed = (smooth > LOW_HU) & body & ~barrier
    rk, rj, ri = (0 if d == sa else max(1, v) for d, v in enumerate(grid.radius(POOL_MM)))
    r = (rk, rj, ri)
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
    split_r = tuple(0 if d == sa else max(1, v) for d, v in enumerate(grid.radius(SPLIT_MM)))
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
    mean = _sum3(hu_b, inplane) / 9.0
    spread = (_sum3(hu_b * hu_b, inplane) / 9.0 - mean * mean).clamp(min=0).sqrt()
    soft = body_b & (mean > -100) & (mean < 100) & ~region
    values = spread[soft]
    values = values[:: max(1, values.numel() // 500_000)]
    noise = float(torch.quantile(values, 0.25)) if values.numel() else 20.0
    in_core = torch.where(core_b, labels, torch.zeros_like(labels)).ravel()
    size = torch.bincount(in_core, minlength=n + 1).clamp(min=1)
    level = torch.bincount(in_core, weights=hu_b.ravel(), minlength=n + 1) / size
    texture = _core_texture(hu_b, spread, core_b, labels, n, inplane)
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
    log.debug("bone: noise %.1f HU, %d thick regions, %d blood pools", noise, n, int(is_pool.sum()))
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
            "bone: smooth stack of %d slices, %.0f %% of an end on bone: %s",
            k1 - k0 + 1,
            100 * share,
            "pool" if keep[idx] else "not blood",
        )
    keep[0] = False
    return morph.to_tensor(keep[labels], candidate.device)


def half_way_hu(hu: torch.Tensor, bone: torch.Tensor, outer: torch.Tensor, body: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """Per voxel, the HU half-way between the bone and the tissue beside it in its slice (in-plane 3x3).

    The bone's level is the mean HU of the voxel's in-plane neighbours in ``bone`` but not in its
    ``outer`` layer (for bone too thin to have any, of all its neighbours in ``bone``, the voxel
    included); the tissue's, of its neighbours in ``body`` outside ``bone`` (blood pools beside bone
    count as tissue and raise it). A pixel centred on the bone's surface holds half of each, so it
    is at least this bright. ``+inf`` where the voxel has no tissue neighbour. Tensors ``[k, j, i]``
    of one shape; ``slice_axis`` is the array axis across the slices.
    """
    inplane = tuple(d for d in range(3) if d != slice_axis)

    def level(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = mask.to(hu.dtype)
        n = _sum3(w, inplane, zero_edges=True)
        return _sum3(hu * w, inplane, zero_edges=True) / n.clamp(min=1), n

    inside, n_inside = level(bone & ~outer)
    whole, _ = level(bone)
    tissue, n_tissue = level(body & ~bone)
    bone_level = torch.where(n_inside > 0, inside, whole)
    return torch.where(n_tissue > 0, 0.5 * (bone_level + tissue), torch.full_like(hu, float("inf")))


def in_plane_mean(hu: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """The 3x3 in-plane mean of ``hu`` (edges replicated); ``slice_axis`` is the array axis across the slices."""
    return _sum3(hu, tuple(d for d in range(3) if d != slice_axis)) / 9.0


def in_plane_median_at(hu: torch.Tensor, where: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """The 3x3 in-plane median of ``hu`` (edges replicated) at the voxels of ``where``, NaN elsewhere."""
    inplane = [d for d in range(3) if d != slice_axis]
    pad = [0, 0, 0, 0, 0, 0]  # F.pad order: last dim first
    for d in inplane:
        pad[2 * (2 - d)] = pad[2 * (2 - d) + 1] = 1
    padded = torch.nn.functional.pad(hu[None, None], pad, mode="replicate")[0, 0]
    n0, n1 = (hu.shape[d] for d in inplane)
    values = []
    for a in range(3):
        for b in range(3):
            view = padded.narrow(inplane[0], a, n0).narrow(inplane[1], b, n1)
            values.append(view[where])
    out = torch.full_like(hu, float("nan"))
    if values[0].numel():
        out[where] = torch.stack(values).median(dim=0).values
    return out


def image_noise(hu: torch.Tensor, body: torch.Tensor, slice_axis: int) -> float:
    """Image noise (HU): the lower quartile of the in-plane 3x3 standard deviation in soft tissue of ``body``."""
    inplane = tuple(d for d in range(3) if d != slice_axis)
    mean = _sum3(hu, inplane) / 9.0
    spread = (_sum3(hu * hu, inplane) / 9.0 - mean * mean).clamp(min=0).sqrt()
    values = spread[body & (mean > -100) & (mean < 100)]
    values = values[:: max(1, values.numel() // 500_000)]
    return float(torch.quantile(values, 0.25)) if values.numel() else 20.0


def segment_bone(grid: Grid, body: torch.Tensor, full_hu: torch.Tensor, p: SegmentParams) -> np.ndarray:
    """Bone on the working grid (bool ``[k, j, i]``), without contrast-enhanced blood.

    ``body`` is the body mask on the working grid (tensor), ``full_hu`` the full-resolution
    HU (the working grid's own HU when it is not pooled). The cortex thresholds are corrected for
    the partial volume of the full-resolution pixels (:func:`cortex_share`). See the module docstring.
    """
    sa = grid.geometry.array_axis(2)
    out = np.zeros(tuple(grid.hu.shape), dtype=bool)
    share = cortex_share(grid.full.geometry.spacing, sa)
    bone_hu = partial_volume_hu(p.bone_hu, share)  # on the cortex
    surface_hu = partial_volume_hu(p.bone_hu, min(1.0, 2.0 * share))  # half a pixel on the bone's outer surface
    cortex_all = cortex_seeds(full_hu, grid.factors) & body
    hu_all = grid.hu
    noise = image_noise(hu_all, body, sa)
    raw_all = hu_all
    noisy = noise > NOISY_HU
    if noisy:
        log.debug("bone: image noise %.0f HU, segmented on the in-plane mean", noise)
        hu_all = in_plane_mean(hu_all, sa)
    box = bbox((((hu_all > LOW_HU) & body) | cortex_all).cpu().numpy(), 2)
    if box is None:
        return out
    hu, body_b, cortex = hu_all[box], body[box], cortex_all[box]
    ends = (box[sa].start == 0, box[sa].stop == hu_all.shape[sa])
    pool, regions = blood_pools(hu, body_b, cortex, grid, scan_ends=ends)
    if share < 1.0:  # pixels wider than the cortex: its partial-volume pixels are seeds too, outside blood pools
        faint = cortex_seeds(full_hu, grid.factors, seed_hu=partial_volume_hu(SEED_HU, share))[box]
        cortex = cortex | (faint & body_b & ~morph.dilate(pool, (1, 1, 1)))
        log.debug("bone: pixels %.2f of the cortex, seeds above %.0f HU", share, partial_volume_hu(SEED_HU, share))
    above = (hu > bone_hu) & body_b & ~pool
    shell = geodesic(cortex, above | cortex, 1)
    closed = morph.closing(shell | regions, (1, 1, 1)) & body_b
    spacing = grid.geometry.spacing  # (i, j, k)
    pixel_mm2 = float(np.prod([spacing[2 - a] for a in range(3) if a != sa]))
    hu_np = hu.cpu().numpy()
    x_all = np.broadcast_to(grid.geometry.lps_coordinate(0), tuple(grid.hu.shape))
    mid = midline_x(body.cpu().numpy(), x_all, sa, 0.5 * max(spacing))[box[sa]]
    x = x_all[box]
    filled = fill_marrow(closed.cpu().numpy(), hu_np, sa, pixel_mm2, midline=mid, x=x)
    bone = shell | regions | (morph.to_tensor(filled, hu.device) & ~closed)
    low = (hu > LOW_HU) & body_b & ~pool
    steps = max(1, int(round(GROW_MM / min(spacing))))
    bone = geodesic(bone, low | bone, steps)
    bone_np = bone.cpu().numpy()
    if share < BROKEN_RING_SHARE:  # the cortex ring is broken by partial volume: its marrow joins the tissue outside
        dense = ((in_plane_mean(hu, sa) >= MARROW_LOW_HU) & body_b & ~pool).cpu().numpy()
        bone_np = fill_rimmed_marrow(bone_np, dense, sa, pixel_mm2)
        # and a level of low density may show no cortex at all: its marrow lies between bone above and below
        bone_np = fill_between_slices(bone_np, dense, hu_np, sa, pixel_mm2, float(spacing[2 - sa]))
    bone_np = fill_marrow(bone_np, hu_np, sa, pixel_mm2, midline=mid, x=x, speck_mm2=SPECK_MM2)
    bone = morph.to_tensor(bone_np, hu.device) & body_b
    # the outer layer in-plane: a hole in the next slice makes no edge inside a vertebral body
    outer = bone & ~morph.erode(bone, tuple(0 if d == sa else 1 for d in range(3))) & ~cortex
    keep_hu = torch.full_like(hu, surface_hu)
    if share < BROKEN_RING_SHARE:  # a pixel wholly on bone is mostly cancellous: half-way to it is half on bone
        keep_hu = torch.minimum(keep_hu, half_way_hu(hu, bone, outer, body_b, sa))
    if noisy:  # the in-plane mean spreads a bright cortex one voxel out; the median does not
        outer &= ~(in_plane_median_at(raw_all[box], outer, sa) > keep_hu)
    else:
        outer &= ~(hu > keep_hu)
    bone &= ~outer
    metal = full_hu > METAL_HU
    if bool(metal.any()):
        metal_c = _pool_count(metal, grid.factors)[box] > 0
        bone &= ~morph.dilate(metal_c, tuple(0 if d == sa else 1 for d in range(3)))
    b = bone.cpu().numpy()
    labels, sizes = morph.label(b)
    keep = np.nonzero(sizes * grid.voxel_ml >= p.min_bone_ml)[0]
    out[box] = morph.keep_labels(labels, keep, sizes.size - 1)
    return out
