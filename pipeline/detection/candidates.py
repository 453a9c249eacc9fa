"""Small-blob candidates from a multi-scale Laplacian-of-Gaussian filter (positions in LPS mm).

The RetinaNet proposes few boxes for nodules of 3-5 mm: on its 1-mm grid they are a
handful of voxels and look like vessel cross-sections. A scale-normalised LoG finds
every bright blob of that size in the lungs; the false-positive reduction stage
(:mod:`.fp_reduction`) then decides which blobs are nodules. This is the candidate
stage of the classic two-stage lung CAD scheme (candidate detection, then false-positive
reduction), used here to add candidates next to the network's own.

For radii ``r`` in ``radii_mm`` the HU volume (clipped to -1000..200 HU, so bone and
contrast do not dominate) is smoothed with a Gaussian of ``sigma = r / sqrt(3)`` mm (the
scale at which a ball of radius r gives the strongest response) and its Laplacian is
taken in mm units (anisotropic spacing honoured). The response ``-sigma^2 * Laplacian``
is in HU, comparable across scales. At each local maximum in the lungs (a
:class:`.lungs.LungRegion`, with a margin) the Hessian's eigenvalues tell a ball (three
similar curvatures) from a vessel (one near zero) or a wall (two near zero): the response
is weighted by the smallest over the largest curvature. The strongest maxima, at least
``min_distance_mm`` apart, are the candidates. Grids finer than about 1 mm are searched
every second (third...) voxel along those axes. The filters run on slabs of slices side by
side (:mod:`.parallel`), each slab reading enough slices beyond its ends that the result is
the same as in one pass; within a slab the Laplacian and the best scale are taken a few
slices at a time (``ROW_BLOCK``), so that their temporaries stay in the CPU's cache. Given a GPU (``device``), the
filters run there instead (:mod:`.candidates_device`: the same maxima to float32 rounding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage
from scipy.spatial import cKDTree

from ..volume import CTVolume
from .candidates_device import device_maxima, hessian_ratio
from .lungs import LungRegion
from .parallel import cpu_workers, run_all

log = logging.getLogger(__name__)

HU_CLIP = (-1000.0, 200.0)
GAUSS_TRUNCATE = 4.0  # Gaussian kernels reach this many sigma (SciPy's default)
ROW_BLOCK = 4  # rows of slices whose response is taken at once


@dataclass(frozen=True)
class BlobCandidates:
    """N blob candidates, strongest first.

    centers_lps: (N, 3) LPS mm. diameters_mm: (N,) ``2 * r`` of the best-responding scale.
    response_hu: (N,) scale-normalised LoG response (HU).
    """

    centers_lps: np.ndarray
    diameters_mm: np.ndarray
    response_hu: np.ndarray

    def __len__(self) -> int:
        return len(self.response_hu)


def _laplacian_mm(smoothed: np.ndarray, spacing_kji: np.ndarray, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Second-difference Laplacian of ``smoothed`` ``[k, j, i]`` in HU/mm^2 (0 on the outermost voxels), of rows
    ``rows[0] <= k < rows[1]`` (default: all)."""
    f = smoothed
    first, stop = rows if rows is not None else (0, f.shape[0])
    out = np.zeros((stop - first, *f.shape[1:]), dtype=f.dtype)
    a, b = max(first, 1), min(stop, f.shape[0] - 1)  # rows with a neighbour on both sides
    if b <= a:
        return out
    twice_c = 2.0 * f[a:b, 1:-1, 1:-1]
    inner = out[a - first : b - first, 1:-1, 1:-1]
    neighbours = (
        (f[a - 1 : b - 1, 1:-1, 1:-1], f[a + 1 : b + 1, 1:-1, 1:-1]),
        (f[a:b, :-2, 1:-1], f[a:b, 2:, 1:-1]),
        (f[a:b, 1:-1, :-2], f[a:b, 1:-1, 2:]),
    )
    for axis, (before, after) in enumerate(neighbours):
        d2 = np.add(before, after)
        d2 -= twice_c
        d2 *= np.float32(1.0 / float(spacing_kji[axis]) ** 2)
        inner += d2
    return out


def _fill_rows(
    arr: np.ndarray,
    radii_mm: tuple[float, ...],
    spacing_kji: np.ndarray,
    rows: tuple[int, int],
    smoothed_out: list[np.ndarray],
    best_out: np.ndarray,
    scale_out: np.ndarray,
) -> None:
    """Rows ``rows[0] <= k < rows[1]`` of the outputs: ``arr`` smoothed at each scale (Gaussian, sigma ``r / sqrt(3)``
    mm), the strongest scale-normalised response ``-sigma^2 * Laplacian`` (HU) and the index of its scale (a tie
    keeps the smaller). Enough rows beyond each end are read (the Gaussian's reach plus one) that the values equal
    those of the whole array."""
    first, stop = rows
    for n, r in enumerate(radii_mm):
        sigma_mm = r / np.sqrt(3.0)
        sigma_vox = sigma_mm / spacing_kji
        halo = int(GAUSS_TRUNCATE * float(sigma_vox[0]) + 0.5) + 1
        lo, hi = max(first - halo, 0), min(stop + halo, arr.shape[0])
        smoothed = ndimage.gaussian_filter(arr[lo:hi], sigma_vox, mode="nearest", truncate=GAUSS_TRUNCATE)
        smoothed_out[n][first:stop] = smoothed[first - lo : stop - lo]
        for a in range(first, stop, ROW_BLOCK):  # a few rows at a time: the temporaries stay in the CPU's cache
            b = min(a + ROW_BLOCK, stop)
            resp = _laplacian_mm(smoothed, spacing_kji, (a - lo, b - lo))
            resp *= np.float32(-(sigma_mm**2))
            if n == 0:
                best_out[a:b] = resp
                continue
            better = np.greater(resp, best_out[a:b])
            np.copyto(best_out[a:b], resp, where=better)
            np.copyto(scale_out[a:b], np.uint8(n), where=better)


def _local_maxima(values: np.ndarray) -> np.ndarray:
    """True where ``values`` equals the maximum of its 3 x 3 x 3 neighbourhood (at the edge, of the voxels there):
    ``ndimage.maximum_filter(values, size=3, mode="nearest") == values``, as shifted maxima along each axis."""
    top = values.copy()
    for axis in range(3):
        n = top.shape[axis]
        if n < 2:
            continue
        head = tuple(slice(0, n - 1) if a == axis else slice(None) for a in range(3))
        tail = tuple(slice(1, n) if a == axis else slice(None) for a in range(3))
        prev = top.copy()
        np.maximum(top[tail], prev[head], out=top[tail])
        np.maximum(top[head], prev[tail], out=top[head])
    return np.equal(values, top)


def blob_candidates(
    volume: CTVolume,
    region: LungRegion | None,
    *,
    radii_mm: tuple[float, ...] = (1.5, 2.25, 3.25),
    max_candidates: int = 150,
    min_response_hu: float = 40.0,
    min_distance_mm: float = 2.5,
    lung_margin_mm: float = 4.0,
    device: str | torch.device | None = None,
) -> BlobCandidates:
    """Bright blobs of radius ``radii_mm`` in ``volume`` (HU) near the lungs; see the module docstring.

    ``region`` limits the search to the lungs' box and keeps maxima within ``lung_margin_mm``
    of the lung mask (``None``: the whole volume). Returns at most ``max_candidates``
    (LPS mm), strongest first; responses below ``min_response_hu`` are dropped. ``device``: a torch device
    other than the CPU filters there (:mod:`.candidates_device`, the same maxima; on the CPU after all, with a
    warning, where the device runs out of memory); ``None`` or a CPU: NumPy and SciPy in threads.
    """
    size_ijk = volume.geometry.size_ijk
    if region is not None and not region.empty:
        lo, hi = region.bbox_ijk(lung_margin_mm + 2.0 * max(radii_mm), size_ijk)
    else:
        lo, hi = np.zeros(3, int), np.asarray(size_ijk)
    # sub-millimetre grids are sampled every few voxels (to about 1 mm): blobs of 3 mm and more stay visible
    step = np.maximum(1, (1.0 / np.asarray(volume.spacing) + 0.25).astype(int))  # (i, j, k)
    arr = np.array(
        volume.array[lo[2] : hi[2] : step[2], lo[1] : hi[1] : step[1], lo[0] : hi[0] : step[0]], dtype=np.float32
    )  # a copy: clipped below
    empty = BlobCandidates(np.zeros((0, 3)), np.zeros(0), np.zeros(0))
    if arr.size == 0 or min(arr.shape) < 3:
        return empty
    np.clip(arr, *HU_CLIP, out=arr)
    spacing_kji = (np.asarray(volume.spacing, dtype=np.float64) * step)[::-1]
    maxima = None
    if device is not None and torch.device(device).type != "cpu":
        try:
            maxima = device_maxima(
                arr, radii_mm, spacing_kji, min_response_hu=min_response_hu, truncate=GAUSS_TRUNCATE, device=device
            )
        except torch.OutOfMemoryError:
            log.warning(
                "small-blob search: %s ran out of memory filtering %s voxels; searched on the CPU instead (the same candidates)",
                device,
                "x".join(str(n) for n in arr.shape),
            )
            torch.cuda.empty_cache()
    kji, resp, which, ratio = maxima if maxima is not None else _cpu_maxima(arr, radii_mm, spacing_kji, min_response_hu)
    if len(kji) == 0:
        return empty
    ijk = kji[:, ::-1] * step + lo
    if region is not None and not region.empty:
        keep = region.near(ijk, lung_margin_mm)
        ijk, resp, which, ratio = ijk[keep], resp[keep], which[keep], ratio[keep]
    strength = resp * ratio
    order = _suppress(ijk * np.asarray(volume.spacing), strength, min_distance_mm, max_candidates)
    radii = np.asarray(radii_mm, dtype=np.float64)[which[order]]
    log.debug("%d blob candidates (of %d maxima)", len(order), len(resp))
    return BlobCandidates(volume.index_to_lps(ijk[order].astype(np.float64)).reshape(-1, 3), 2.0 * radii, strength[order])


def _cpu_maxima(
    arr: np.ndarray, radii_mm: tuple[float, ...], spacing_kji: np.ndarray, min_response_hu: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The local maxima (M, 3; k, j, i) of the best response of ``arr`` at or above ``min_response_hu``, their
    response (HU), scale index and Hessian ratio, filtered in slabs of rows side by side (:mod:`.parallel`)."""
    smoothed_by_scale = [np.empty_like(arr) for _ in radii_mm]
    best = np.empty_like(arr)
    scale = np.zeros(arr.shape, dtype=np.uint8)
    cuts = np.linspace(0, arr.shape[0], min(cpu_workers(), arr.shape[0]) + 1).astype(int)
    slabs = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]
    run_all(lambda rows: _fill_rows(arr, radii_mm, spacing_kji, rows, smoothed_by_scale, best, scale), slabs, workers=len(slabs))
    peaks = np.empty(arr.shape, dtype=bool)

    def find_peaks(rows: tuple[int, int]) -> None:  # a slab and one row on each side: as in one pass
        a, b = rows
        lo_row = max(a - 1, 0)
        peaks[a:b] = _local_maxima(best[lo_row : b + 1])[a - lo_row : b - lo_row]
        peaks[a:b] &= best[a:b] >= min_response_hu

    run_all(find_peaks, slabs, workers=len(slabs))
    kji = np.argwhere(peaks)
    resp = best[tuple(kji.T)].astype(np.float64)
    which = scale[tuple(kji.T)]
    ratio = np.zeros(len(kji))
    for n in range(len(radii_mm)):
        sel = which == n
        if sel.any():
            ratio[sel] = hessian_ratio(smoothed_by_scale[n], kji[sel], spacing_kji)
    return kji, resp, which, ratio


def _suppress(points_mm: np.ndarray, strength: np.ndarray, min_distance_mm: float, limit: int) -> np.ndarray:
    """Indices of the strongest points, each at least ``min_distance_mm`` from every stronger kept one."""
    order = np.argsort(-strength, kind="stable")
    order = order[strength[order] > 0]
    tree = cKDTree(points_mm[order])
    kept: list[int] = []
    dropped = np.zeros(len(order), dtype=bool)
    for n in range(len(order)):
        if dropped[n]:
            continue
        kept.append(n)
        if len(kept) >= limit:
            break
        dropped[tree.query_ball_point(points_mm[order[n]], min_distance_mm)] = True
    return order[np.asarray(kept, dtype=int)]
