"""Bone on the working grid: cortex, trabecular bone and marrow; not contrast-enhanced blood.

HU alone cannot tell bone from IV contrast: enhanced blood (150..500 HU) overlaps trabecular
bone (100..400 HU); only cortical bone is brighter. So bone is found by shape:

1. **Cortex seeds**: full-resolution voxels above ``SEED_HU`` with at least ``SEED_MIN_COUNT``
   such voxels in their 3x3x3 neighbourhood (noise in bright blood does not cluster),
   pooled onto the working grid.
2. **Blood pools**: thick regions above ``LOW_HU`` that are smooth inside and hardly rimmed by
   cortex, and run on along the body's axis, are contrast-enhanced blood (heart chambers, the
   aorta, pulmonary arteries); textured or cortex-rimmed ones are bone (vertebral bodies, the
   sternum). See :mod:`.blood_pools`. Pools (and their partial-volume rim where they touch bone)
   are excluded from everything below; the bone regions are bone.
3. **Rib pieces**: components above ``bone_hu`` without a seed or a bone region that are
   elongated, cross the body's axis and lie in the chest wall beyond a lung (or, below the lungs, thin
   and in the body wall) are bone too: a rib's anterolateral part, whose thin cortex no voxel resolves
   (see :mod:`.rib_pieces`).
4. **Bone**: the seeds and rib pieces, grown one voxel into voxels above ``bone_hu``, the thick bone regions,
   marrow enclosed by them in a slice (holes up to ``MARROW_MAX_MM2`` whose mean HU is above
   ``MARROW_HU``, or fatty marrow of any HU away from the body's x mid-line: a long bone's
   medullary cavity, not the spinal canal; see :mod:`.marrow`), then grown up to ``GROW_MM`` into
   voxels above ``LOW_HU`` that are not blood pools (trabecular bone behind a thin cortex); a rib's thin
   shaft that runs on beyond that reach is added where its voxels are at least half on it (above
   half-way from ``LOW_HU`` to ``bone_hu``; see :func:`.rib_pieces.rib_continuations`). Holes
   left in a slice are filled again (noise specks up to ``SPECK_MM2`` whatever their HU, and marrow as
   before); the in-plane outer layer is then kept only where it passes ``bone_hu`` (partial volume),
   metal (above ``METAL_HU``, with its one-voxel partial-volume rim) is taken out, and so are the bright
   streaks it draws across its slice between dark ones (:mod:`.metal_streaks`),
   components smaller than ``min_bone_ml`` dropped, and so are small components deep in the body
   apart from other bone: stones, calcified plaque, dense contrast (:mod:`.calcifications`).

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
soft tissue that bone mostly surrounds (:func:`.marrow.fill_rimmed_marrow`; an intervertebral disc,
below marrow's density and as smooth as the image noise, is not), and fatty marrow as dense as muscle
where bone rims it more and it lies off the spinal canal (a sacral ala's; :func:`.marrow.fill_fatty_marrow`), added after the
growth in step 4, and so is fatty marrow (0-70 HU) that leaks out through the cortex's gaps and the
foramina (a sacrum's interior): textured, enclosed by bone, off the spinal canal, and not the canal's
or the foramina's fat (:func:`.textured_marrow.fill_textured_marrow`), and a region of a slice as dense as
marrow with bone in the slices just above and below it (a low-density level where no cortex shows at all;
:func:`.marrow.fill_between_slices`); a resolved cortex always shows, so finer pixels need neither. On such pixels a pixel wholly on bone is mostly cancellous bone, often below the
surface threshold itself (120-250 HU on 3 mm pixels), so that threshold would trim bone that is
all there is: a pixel centred on the surface is half the bone beside it and half the tissue beside
it, and the outer layer is also kept where it is at least half-way between the two (the half
maximum of a blurred edge; :func:`half_way_hu`). On pixels where the cortex is resolved the same
half maximum is asked of the outer layer besides the surface threshold: a pixel above that threshold
but less than half-way from the tissue to a bright cortex beside it is less than half on bone (a
contrast-filled vessel one voxel wide running along the cortex, 350 HU beside 1200 HU).

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

from . import morph
from .blood_pools import LOW_HU, SEED_HU, blood_pools
from .calcifications import deep_calcifications
from .grid import Grid, bbox
from .local_hu import image_noise, in_plane_mean, in_plane_median_at, masked_in_plane_mean, sum3
from .marrow import (
    FATTY_MARROW_HU,
    MARROW_LOW_HU,
    SPECK_MM2,
    fill_between_slices,
    fill_fatty_marrow,
    fill_marrow,
    fill_rimmed_marrow,
    midline_x,
)
from .metal_streaks import metal_streaks
from .organs import SegmentParams
from .rib_pieces import rib_continuations, rib_pieces
from .textured_marrow import fill_textured_marrow

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

SEED_MIN_COUNT = 4  # seed voxels in a 3x3x3 neighbourhood (the voxel included)
GROW_MM = 8.0  # trabecular bone reaches this far from cortex or a bone region (mm)
NOISY_HU = 45.0  # image noise (HU, soft tissue) above which bone is segmented on the in-plane mean
METAL_HU = 2500.0  # metal (not bone) is above this (HU); cortical bone stays below
CORTEX_MM = 1.0  # cortical bone is about this thick (mm): a wider pixel holds only part of it (partial volume)
BROKEN_RING_SHARE = 0.5  # a cortex filling less than this share of a pixel leaves gaps in a vertebral body's ring


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
    inside = sum3(torch.ones_like(count, dtype=torch.int16), (0, 1, 2), zero_edges=True)  # 27 unless cut
    need_here = torch.ceil(need * inside.to(torch.float32) / 27.0)
    return (count > 0) & (sum3(count.to(torch.int16), (0, 1, 2), zero_edges=True) >= need_here)


def geodesic(seed: torch.Tensor, allowed: torch.Tensor, steps: int) -> torch.Tensor:
    """Grow ``seed`` by up to ``steps`` voxel layers (26-neighbourhood) inside ``allowed``."""
    grown = seed & allowed
    for _ in range(steps):
        nxt = morph.dilate(grown, (1, 1, 1)) & allowed
        if torch.equal(nxt, grown):
            break
        grown = nxt
    return grown


def half_way_hu(hu: torch.Tensor, bone: torch.Tensor, outer: torch.Tensor, body: torch.Tensor, slice_axis: int) -> torch.Tensor:
    """Per voxel, the HU half-way between the bone and the tissue beside it in its slice (in-plane 3x3).

    The bone's level is the mean HU of the voxel's in-plane neighbours in ``bone`` but not in its
    ``outer`` layer (for bone too thin to have any, of all its neighbours in ``bone``, the voxel
    included); the tissue's, of its neighbours in ``body`` outside ``bone`` (blood pools beside bone
    count as tissue and raise it). A pixel centred on the bone's surface holds half of each, so it
    is at least this bright. ``+inf`` where the voxel has no tissue neighbour. Tensors ``[k, j, i]``
    of one shape; ``slice_axis`` is the array axis across the slices.
    """
    inside, n_inside = masked_in_plane_mean(hu, bone & ~outer, slice_axis)
    whole, _ = masked_in_plane_mean(hu, bone, slice_axis)
    tissue, n_tissue = masked_in_plane_mean(hu, body & ~bone, slice_axis)
    bone_level = torch.where(n_inside > 0, inside, whole)
    return torch.where(n_tissue > 0, 0.5 * (bone_level + tissue), torch.full_like(hu, float("inf")))


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
    # rib pieces whose thin cortex no voxel resolves (no seed): elongated, in the chest wall beyond a lung.
    # Judged on the whole grid: the body's centre and the lungs reach beyond the box of bright voxels
    bright_all, found_all = torch.zeros_like(body), torch.zeros_like(body)
    bright_all[box], found_all[box] = above, shell | regions
    sp = grid.geometry.spacing
    spacing_kji = (float(sp[2]), float(sp[1]), float(sp[0]))
    smooth_all = in_plane_mean(hu_all, sa).cpu().numpy()
    pieces = rib_pieces(
        bright_all.cpu().numpy(),
        found_all.cpu().numpy(),
        body.cpu().numpy(),
        smooth_all,
        spacing=spacing_kji,
        slice_axis=sa,
    )
    shell |= morph.to_tensor(pieces[box], hu.device)
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
    # a rib's thin shaft beyond that reach (below the lungs, where no rib piece is told by the lung beside it):
    # its voxels at least half on it, half-way from LOW_HU to the cortex threshold (its partial-volume rim stays out)
    rest_all, grown_all = np.zeros(out.shape, dtype=bool), np.zeros(out.shape, dtype=bool)  # whole slices: the body's surface
    rest_all[box], grown_all[box] = (low & ~bone).cpu().numpy(), bone_np
    shafts = rib_continuations(rest_all, grown_all, body.cpu().numpy(), spacing=spacing_kji, slice_axis=sa)[box]
    bone_np = bone_np | (shafts & (hu_np > 0.5 * (LOW_HU + bone_hu)))
    if share < BROKEN_RING_SHARE:  # the cortex ring is broken by partial volume: its marrow joins the tissue outside
        dense = ((in_plane_mean(hu, sa) >= MARROW_LOW_HU) & body_b & ~pool).cpu().numpy()
        raw_np = raw_all[box].cpu().numpy()  # a disc is smooth where trabecular bone is not: judged unsmoothed
        bone_np = fill_rimmed_marrow(bone_np, dense, sa, pixel_mm2, hu=raw_np, noise_hu=noise)
        # fatty marrow (a sacral ala's, an iliac wing's) is as dense as muscle: more rim on bone, off the spinal canal
        fatty = ((in_plane_mean(hu, sa) >= FATTY_MARROW_HU) & body_b & ~pool).cpu().numpy()
        bone_np = fill_fatty_marrow(bone_np, fatty, sa, pixel_mm2, hu=raw_np, noise_hu=noise, midline=mid, x=x)
        # fatty marrow leaking out through the gaps and foramina (a sacrum's): textured and enclosed by bone
        plane_mm = [spacing_kji[a] for a in range(3) if a != sa]
        allowed = (body_b & ~pool).cpu().numpy()
        bone_np = fill_textured_marrow(bone_np, raw_np, allowed, sa, (plane_mm[0], plane_mm[1]), noise_hu=noise, midline=mid, x=x)
        # and a level of low density may show no cortex at all: its marrow lies between bone above and below
        bone_np = fill_between_slices(bone_np, dense, hu_np, sa, pixel_mm2, float(spacing[2 - sa]))
    bone_np = fill_marrow(bone_np, hu_np, sa, pixel_mm2, midline=mid, x=x, speck_mm2=SPECK_MM2)
    bone = morph.to_tensor(bone_np, hu.device) & body_b
    # the outer layer in-plane: a hole in the next slice makes no edge inside a vertebral body
    outer = bone & ~morph.erode(bone, tuple(0 if d == sa else 1 for d in range(3))) & ~cortex
    keep_hu = torch.full_like(hu, surface_hu)
    if share < BROKEN_RING_SHARE:  # a pixel wholly on bone is mostly cancellous: half-way to it is half on bone
        keep_hu = torch.minimum(keep_hu, half_way_hu(hu, bone, outer, body_b, sa))
    else:  # a resolved cortex: a pixel less than half-way to it (a vessel along it, 350 HU) is less than half on bone
        half = half_way_hu(hu, bone, outer, body_b, sa)
        keep_hu = torch.maximum(keep_hu, torch.where(torch.isinf(half), keep_hu, half))
    if noisy:  # the in-plane mean spreads a bright cortex one voxel out; the median does not
        outer &= ~(in_plane_median_at(raw_all[box], outer, sa) > keep_hu)
    else:
        outer &= ~(hu > keep_hu)
    bone &= ~outer
    metal = full_hu > METAL_HU
    if bool(metal.any()):
        metal_c = _pool_count(metal, grid.factors)[box] > 0
        bone &= ~morph.dilate(metal_c, tuple(0 if d == sa else 1 for d in range(3)))
        # the bright streaks metal draws across its slice between dark ones (seeded as cortex)
        streaks = metal_streaks(
            bone.cpu().numpy(),
            raw_all[box].cpu().numpy(),
            metal_c.cpu().numpy(),
            body_b.cpu().numpy(),
            spacing=spacing_kji,
            slice_axis=sa,
        )
        bone &= ~morph.to_tensor(streaks, hu.device)
    b = bone.cpu().numpy()
    labels, sizes = morph.label(b)
    keep = np.nonzero(sizes * grid.voxel_ml >= p.min_bone_ml)[0]
    out[box] = morph.keep_labels(labels, keep, sizes.size - 1)
    # a kidney stone, excreted or oral contrast, a calcified plaque: seeded like bone, but small, apart and deep
    out &= ~deep_calcifications(out, body.cpu().numpy(), smooth_all, spacing=spacing_kji, slice_axis=sa)
    return out
