"""Fatty marrow that leaks out of its bone: the interior of a sacrum, slice by slice, without its canal or foramina.

An elderly sacrum's cancellous interior is fatty marrow (0-70 HU on 3 mm pixels) crossed by
trabeculae, and its cortex, thinner than such pixels, shows only in pieces: the interior joins
the tissue outside through the gaps and through the sacral foramina, so it is no hole of the bone
(:func:`.marrow.fill_marrow`) and no region mostly rimmed by it (:func:`.marrow.fill_fatty_marrow`).
:func:`fill_textured_marrow` still tells it from what lies around it, on the HU of each voxel's in-plane
neighbours that are not bone (a window of about ``WINDOW_MM``, so a bright cortex beside it adds nothing):

* **density**: their mean is at least ``FATTY_FLOOR_HU``; the fat of the sacral canal and of the
  foramina (-100..-20 HU), as fat anywhere, is below;
* **texture**: trabeculae spread their HU at least ``TEXTURE_SPREAD`` times the image noise; muscle, the
  spinal cord and CSF, and contrast-filled vessels are as smooth as the noise;
* **no gas**: none of the voxel's in-plane 3x3 neighbours is below ``GAS_HU`` (bowel content, whose
  mottled gas and stool are as textured);
* **enclosure**: bone lies within ``ENCLOSE_MM`` in at least ``ENCLOSED_DIRECTIONS`` of the 8 in-plane
  directions (rows, columns and diagonals), as it does all round the interior of a bone; tissue beside a
  bone's outer surface, a vessel or bowel in front of the sacrum, has open directions;
* **off the canal**: the voxel lies more than ``CANAL_RIM_MM`` (in its slice) from the hole of the bone that holds
  no such marrow (:func:`canal_hole`): the spinal canal, whose cord, nerve roots and epidural fat
  are as dense and as textured at its rim, enclosed by the vertebral arch or the sacrum, wherever it lies (a patient
  lying rotated, a scoliosis), and followed through the slices: on each slice only a hole continuous with the canal
  of the slices next to it is the canal (a hip bone's fatty cavity beside the spine is not, even where it is the only
  hole). A slice where no such hole lies within ``CANAL_SEARCH_SHARE`` of the body's half x extent of its mid-line
  (an arch too broken to enclose its canal, a canal of a pixel or two) falls back to the mid-line: the voxel lies at
  least ``CANAL_HALF_MM`` from it (a slice whose mid-line is unknown gets nothing then).

Such voxels are added where they connect, in their slice, to bone within ``GROW_MM``. The bone's gaps of a
pixel or two are then bridged by an in-plane closing, and what it encloses (holes up to
:data:`.marrow.MARROW_MAX_MM2`), with the bridges themselves, is marrow where it is that dense and textured
and off the canal; a hole of a few pixels (up to ``SMALL_HOLE_MM2``) left inside is marrow whatever its HU, off the canal
too: nothing on the canal or its rim (or, where it is not found, within ``CANAL_HALF_MM`` of the mid-line) is ever added.
Masks and HU are ``[k, j, i]`` arrays (LPS mm geometry); ``slice_axis`` is the array axis across the slices.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import ndimage

from . import morph
from .marrow import MARROW_MAX_MM2

TEXTURE_SPREAD = 2.5  # textured marrow spreads its HU at least this many times the image noise
FATTY_FLOOR_HU = 0.0  # fatty marrow's mean HU is at least this (the canal's and foramina's fat are below)
WINDOW_MM = 15.0  # the in-plane window (mm, about) whose voxels that are not bone give a voxel's mean and spread
GAS_HU = -300.0  # a voxel with an in-plane neighbour below this (bowel gas) is not marrow
ENCLOSE_MM = 45.0  # bone within this distance (mm) along an in-plane direction encloses a voxel that way
ENCLOSED_DIRECTIONS = 6  # of the 8 in-plane directions, at least this many enclosed by bone
GROW_MM = 12.0  # textured marrow is added this far (mm, in its slice) from bone
CANAL_HALF_MM = 12.0  # where its canal is not found, the spine's canal lies within this distance (mm) of the body's mid-line
CANAL_MIN_MM2 = 50.0  # the spinal canal's hole is at least this (mm²): a smaller hole may be marrow's, or a vessel's
CANAL_STEP_MM = 10.0  # the canal's centre moves at most this far (mm, in-plane) from one slice where it is found to the next
CANAL_MAX_MM2 = 700.0  # the spinal canal's cross-section is at most this (mm²; a lumbar canal's is about 300)
CANAL_RIM_MM = 6.0  # nothing within this distance (mm, in its slice) of the canal's hole is marrow: its rim
CANAL_SEARCH_SHARE = 0.35  # the canal lies within this share of the body's half x extent of its mid-line (a scoliosis's)
SMALL_HOLE_MM2 = 30.0  # a hole of a slice of bone up to this area (mm²) inside the marrow is marrow


def _shifted(mask: np.ndarray, axes: tuple[int, int], step: tuple[int, int]) -> np.ndarray:
    """``mask`` moved so that each voxel holds its neighbour ``step`` (rows, columns) away; False past the edge."""
    out = np.zeros_like(mask)
    src: list[slice] = [slice(None)] * mask.ndim
    dst: list[slice] = [slice(None)] * mask.ndim
    for axis, s in zip(axes, step):
        n = mask.shape[axis]
        if abs(s) >= n:
            return out
        src[axis] = slice(s, n) if s >= 0 else slice(0, n + s)
        dst[axis] = slice(0, n - s) if s >= 0 else slice(-s, n)
    out[tuple(dst)] = mask[tuple(src)]
    return out


def enclosed_directions(bone: np.ndarray, slice_axis: int, reach: tuple[int, int]) -> np.ndarray:
    """Per voxel (uint8, shaped like ``bone``): of the 8 in-plane directions, how many meet ``bone`` within ``reach``.

    ``reach``: how many pixels along the slice's two array axes (in their order) make :data:`ENCLOSE_MM`; a
    diagonal step moves one pixel along each, as far as the shorter of the two reaches.
    """
    axes = tuple(a for a in range(3) if a != slice_axis)
    count = np.zeros(bone.shape, dtype=np.uint8)
    for dj in (-1, 0, 1):
        for di in (-1, 0, 1):
            if dj == 0 and di == 0:
                continue
            n = min(r for r, d in zip(reach, (dj, di)) if d != 0)
            seen = np.zeros_like(bone)
            for s in range(1, n + 1):
                seen |= _shifted(bone, (axes[0], axes[1]), (dj * s, di * s))
            count += seen.astype(np.uint8)
    return count


def fill_textured_marrow(
    mask: np.ndarray,
    hu: np.ndarray,
    allowed: np.ndarray,
    slice_axis: int,
    pixel_mm: tuple[float, float],
    *,
    noise_hu: float,
    midline: np.ndarray,
    x: np.ndarray,
) -> np.ndarray:
    """``mask`` with the textured fatty marrow it encloses added (bool ``[k, j, i]``, like ``mask``; see the module).

    ``hu``: the unsmoothed HU of every voxel; ``allowed``: the voxels that may be bone (the body, blood pools left
    out); ``pixel_mm``: the pixel's size (mm) along the slice's two array axes, in their order; ``noise_hu``: the
    image noise (HU, :func:`.local_hu.image_noise`); ``midline``: per slice, the body's mid-line
    (:func:`.marrow.midline_x`); ``x``: the LPS x (mm) of every voxel, broadcastable to ``mask``.
    """
    if noise_hu <= 0.0:
        return mask
    plane = [a for a in range(3) if a != slice_axis]
    window = [1 if a == slice_axis else 2 * max(1, int(round(0.5 * WINDOW_MM / pixel_mm[plane.index(a)]))) + 1 for a in range(3)]
    cells = float(np.prod(window))
    free = (~mask).astype(np.float64)
    values = hu.astype(np.float64)
    n = ndimage.uniform_filter(free, window, mode="constant") * cells
    mean = ndimage.uniform_filter(values * free, window, mode="constant") * cells / np.maximum(n, 1.0)
    square = ndimage.uniform_filter(values**2 * free, window, mode="constant") * cells / np.maximum(n, 1.0)
    spread = np.sqrt(np.maximum(square - mean**2, 0.0))
    marrow_like = (n >= 3.0) & (mean >= FATTY_FLOOR_HU) & (spread >= TEXTURE_SPREAD * noise_hu)
    off_canal = allowed & _off_canal(mask, ~marrow_like, slice_axis, pixel_mm, midline=midline, x=x)
    fatty = off_canal & ~mask & marrow_like
    gas_free = ndimage.minimum_filter(hu, [1 if a == slice_axis else 3 for a in range(3)], mode="nearest") > GAS_HU
    textured = fatty & gas_free
    reach = (max(1, int(round(ENCLOSE_MM / pixel_mm[0]))), max(1, int(round(ENCLOSE_MM / pixel_mm[1]))))
    textured &= enclosed_directions(mask, slice_axis, reach) >= ENCLOSED_DIRECTIONS
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[tuple(1 if a == slice_axis else slice(None) for a in range(3))] = True  # in-plane 8-neighbourhood
    grown = mask.copy()
    for _ in range(max(1, int(round(GROW_MM / min(pixel_mm))))):
        nxt = grown | (ndimage.binary_dilation(grown, structure) & textured)
        if np.array_equal(nxt, grown):
            break
        grown = nxt
    # gaps of a pixel or two bridged: what the bridged bone encloses, and the bridges, where dense enough
    closed = grown | ndimage.binary_closing(grown, structure, border_value=0)
    pixel_mm2 = float(pixel_mm[0] * pixel_mm[1])
    grown |= _holes(closed, slice_axis, MARROW_MAX_MM2 / pixel_mm2) & fatty
    grown |= closed & fatty
    return grown | (_holes(grown, slice_axis, SMALL_HOLE_MM2 / pixel_mm2) & off_canal)


class _Candidate(NamedTuple):
    """A hole of one slice that may be the spinal canal: its centre (mm along the slice's two array axes), size
    (pixels), distance from the slice's mid-line (mm, LPS x) and flat voxel indices in its slice."""

    cj: float
    ci: float
    size: int
    off: float
    voxels: np.ndarray


def _continuous(a: _Candidate, b: _Candidate) -> bool:
    """Whether two candidates of different slices are one canal: they overlap in-plane, or their centres lie within
    :data:`CANAL_STEP_MM` of each other."""
    near = bool(np.hypot(a.cj - b.cj, a.ci - b.ci) <= CANAL_STEP_MM)
    return near or np.intersect1d(a.voxels, b.voxels, assume_unique=True).size > 0


def _canal_track(found: list[list[_Candidate]]) -> dict[int, _Candidate]:
    """The spinal canal followed through the slices: per slice (index into ``found``, the candidates of each slice),
    the canal's candidate, for the slices where one is continuous with it.

    Each candidate is linked to the candidates continuous with it (:func:`_continuous`) in the nearest slice, above
    and below, that holds any: slices between where no candidate is (an arch too broken to enclose the canal), or
    where only others are (a fatty cavity of a hip bone beside the spine), are bridged. The linked candidates make
    tracks; the canal runs on along the whole spine, so its track is the one on the most slices (of two as long,
    the nearer the mid-line). A track on one slice alone is no canal.
    """
    flat = [(k, c) for k, cs in enumerate(found) for c in cs]
    index = {(k, j): n for n, (k, j) in enumerate((k, j) for k, cs in enumerate(found) for j in range(len(cs)))}
    parent = list(range(len(flat)))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for k, cs in enumerate(found):
        for j, c in enumerate(cs):
            for way in (range(k + 1, len(found)), range(k - 1, -1, -1)):  # the nearest such slice, either side
                for kk in way:
                    linked = [jj for jj, o in enumerate(found[kk]) if _continuous(c, o)]
                    for jj in linked:
                        parent[root(index[(kk, jj)])] = root(index[(k, j)])
                    if linked:
                        break
    tracks: dict[int, list[int]] = {}
    for n in range(len(flat)):
        tracks.setdefault(root(n), []).append(n)
    best: list[int] = []
    best_key = (1, 0.0)  # a track must hold more than one slice
    for members in tracks.values():
        key = (len({flat[n][0] for n in members}), -float(np.mean([flat[n][1].off for n in members])))
        if key > best_key:
            best, best_key = members, key
    canal: dict[int, _Candidate] = {}
    for n in best:
        k, c = flat[n]
        if k not in canal or (c.size, -c.off) > (canal[k].size, -canal[k].off):
            canal[k] = c  # of the track's holes in a slice (the bone's and its closing's), the largest
    return canal


def canal_hole(
    mask: np.ndarray,
    not_marrow: np.ndarray,
    slice_axis: int,
    pixel_mm: tuple[float, float],
    *,
    midline: np.ndarray,
    x: np.ndarray,
) -> np.ndarray:
    """Per slice, the spinal canal: the hole of the bone that holds no fatty marrow (bool, shaped like ``mask``).

    Candidates are the holes (4-connected in their slice, off the slice's edges) of ``mask`` and of its in-plane
    closing (a gap of a pixel or two in the arch bridged) from :data:`CANAL_MIN_MM2` to :data:`CANAL_MAX_MM2` whose
    voxels are mostly ``not_marrow`` (too fatty or too smooth for textured marrow: the canal's fat, CSF and cord,
    but also a sacral foramen's fat or a long bone's or a hip bone's fatty cavity) and whose centre lies within
    :data:`CANAL_SEARCH_SHARE` of the body's half x extent of the slice's mid-line (``midline``:
    :func:`.marrow.midline_x`; ``x``: the LPS x, mm, of every voxel, broadcastable to ``mask``). The canal is
    followed through the slices (:func:`_canal_track`): on each slice it is the candidate continuous with the canal
    of the slices next to it (overlapping it, or its centre within :data:`CANAL_STEP_MM`), on the track that runs on
    through the most slices; a slice with no such candidate, or whose mid-line is unknown, has none, whatever other
    hole it holds (a hip bone's fatty cavity beside the spine, the only candidate there). ``pixel_mm``: the pixel's
    size (mm) along the slice's two array axes.
    """
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[tuple(1 if a == slice_axis else slice(None) for a in range(3))] = True  # in-plane 8-neighbourhood
    closed = mask | ndimage.binary_closing(mask, structure, border_value=0)
    cross = morph.in_plane_cross(slice_axis)[tuple(1 if a == slice_axis else slice(None) for a in range(3))]
    out = np.zeros_like(mask)
    by_slice = [np.moveaxis(a, slice_axis, 0) for a in (mask, closed, not_marrow, np.broadcast_to(x, mask.shape), out)]
    n_slices = mask.shape[slice_axis]
    found: list[list[_Candidate]] = [[] for _ in range(n_slices)]
    for k in range(n_slices):
        mid, half = midline[k]
        if not np.isfinite(mid):
            continue
        for bone in (by_slice[0][k], by_slice[1][k]):
            labels, n = ndimage.label(~bone, structure=cross)
            if n == 0:
                continue
            flat = labels.ravel()
            size = np.bincount(flat, minlength=n + 1)
            share = np.bincount(flat, weights=by_slice[2][k].ravel().astype(np.float64), minlength=n + 1)
            off = np.abs(np.bincount(flat, weights=by_slice[3][k].ravel(), minlength=n + 1) / np.maximum(size, 1) - mid)
            area = size * pixel_mm[0] * pixel_mm[1]
            keep = (area >= CANAL_MIN_MM2) & (area <= CANAL_MAX_MM2) & (share >= 0.5 * size)
            keep &= off <= CANAL_SEARCH_SHARE * half
            keep[np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))] = False
            keep[0] = False
            for label in np.nonzero(keep)[0]:
                voxels = np.flatnonzero(flat == label)
                cj, ci = np.unravel_index(voxels, labels.shape)
                found[k].append(
                    _Candidate(cj.mean() * pixel_mm[0], ci.mean() * pixel_mm[1], int(size[label]), float(off[label]), voxels)
                )
    for k, c in _canal_track(found).items():
        by_slice[4][k].ravel()[c.voxels] = True
    return out


def _off_canal(
    mask: np.ndarray,
    not_marrow: np.ndarray,
    slice_axis: int,
    pixel_mm: tuple[float, float],
    *,
    midline: np.ndarray,
    x: np.ndarray,
) -> np.ndarray:
    """Voxels more than :data:`CANAL_RIM_MM` from the canal (:func:`canal_hole`) in their slice; in a slice where
    it is not found, at least :data:`CANAL_HALF_MM` from the mid-line (none where that is unknown)."""
    canal = canal_hole(mask, not_marrow, slice_axis, pixel_mm, midline=midline, x=x)
    r = [int(CANAL_RIM_MM // p) for p in pixel_mm]
    dj, di = np.meshgrid(np.arange(-r[0], r[0] + 1) * pixel_mm[0], np.arange(-r[1], r[1] + 1) * pixel_mm[1], indexing="ij")
    near = ndimage.binary_dilation(canal, np.expand_dims(np.hypot(dj, di) <= CANAL_RIM_MM, slice_axis))
    found = canal.any(axis=tuple(a for a in range(3) if a != slice_axis), keepdims=True)
    ks = np.arange(mask.shape[slice_axis]).reshape([-1 if a == slice_axis else 1 for a in range(3)])
    with np.errstate(invalid="ignore"):  # False where the mid-line is unknown (NaN)
        return ~near & (found | (np.abs(x - midline[ks, 0]) >= CANAL_HALF_MM))


def _holes(mask: np.ndarray, slice_axis: int, max_pixels: float) -> np.ndarray:
    """The in-plane holes of ``mask`` (4-connected in their slice, off the slice's edges) of at most ``max_pixels``."""
    labels, n = ndimage.label(~mask, structure=morph.in_plane_cross(slice_axis))
    if n == 0:
        return np.zeros_like(mask)
    size = np.bincount(labels.ravel(), minlength=n + 1)
    fill = (size <= max_pixels) & ~morph.labels_on_border(labels, n, slice_axis=slice_axis)
    fill[0] = False
    return fill[labels]
