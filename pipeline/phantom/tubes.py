"""Tubes (vessels, airways, ribs, aorta) as chains of tapered segments, and their rasterisation.

A :class:`Tubes` set holds segments ``a → b`` (LPS mm) with radii ``ra → rb``
(mm). :func:`signed_distance` writes, on the canonical grid, the distance
(mm) from each voxel centre to the nearest tube surface, negative inside. Each
segment is evaluated only inside its own bounding box (vectorised numpy),
so the cost follows the tubes' volume, not the volume of the scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .scanner import CanonicalGrid


@dataclass
class Tubes:
    """Segments ``a[n] → b[n]`` (LPS mm, shape (n, 3)) with end radii ``ra[n]``, ``rb[n]`` (mm)."""

    a: list[np.ndarray] = field(default_factory=list)
    b: list[np.ndarray] = field(default_factory=list)
    ra: list[float] = field(default_factory=list)
    rb: list[float] = field(default_factory=list)

    def add(self, a: np.ndarray, b: np.ndarray, ra: float, rb: float | None = None) -> None:
        self.a.append(np.asarray(a, dtype=np.float64))
        self.b.append(np.asarray(b, dtype=np.float64))
        self.ra.append(float(ra))
        self.rb.append(float(ra if rb is None else rb))

    def add_polyline(self, points: np.ndarray, radii: np.ndarray | float) -> None:
        pts = np.asarray(points, dtype=np.float64)
        rad = np.broadcast_to(np.asarray(radii, dtype=np.float64), (len(pts),))
        for n in range(len(pts) - 1):
            self.add(pts[n], pts[n + 1], rad[n], rad[n + 1])

    def extend(self, other: Tubes) -> None:
        self.a += other.a
        self.b += other.b
        self.ra += other.ra
        self.rb += other.rb

    def __len__(self) -> int:
        return len(self.a)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.a:
            z = np.zeros((0, 3))
            return z, z, np.zeros(0), np.zeros(0)
        return np.array(self.a), np.array(self.b), np.array(self.ra), np.array(self.rb)

    def split(self, max_len: float) -> Tubes:
        """The same tubes cut into pieces no longer than ``max_len`` mm (tighter bounding boxes), in order."""
        a, b, ra, rb = self.arrays()
        d = b - a
        n = np.maximum(1, np.ceil(np.sqrt((d * d).sum(axis=1)) / max_len).astype(np.int64))
        first = np.cumsum(n) - n  # index of each tube's first piece
        pa = np.empty((int(n.sum()), 3))
        pb = np.empty_like(pa)
        pra = np.empty(len(pa))
        prb = np.empty(len(pa))
        for k in np.unique(n):  # few distinct piece counts
            idx = np.flatnonzero(n == k)
            ts = np.linspace(0.0, 1.0, k + 1)
            at = (first[idx, None] + np.arange(k)).ravel()
            pa[at] = (a[idx, None] + d[idx, None] * ts[None, :-1, None]).reshape(-1, 3)
            pb[at] = (a[idx, None] + d[idx, None] * ts[None, 1:, None]).reshape(-1, 3)
            dr = (rb - ra)[idx, None]
            pra[at] = (ra[idx, None] + dr * ts[None, :-1]).ravel()
            prb[at] = (ra[idx, None] + dr * ts[None, 1:]).ravel()
        return Tubes(list(pa), list(pb), pra.tolist(), prb.tolist())


def _index_boxes(grid: CanonicalGrid, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical-array index ranges ``[i0, i1)`` along ``(z, y, x)`` of the LPS boxes ``lo..hi`` (mm, shape
    ``(n, 3)`` in x, y, z), clipped to the grid: two ``(n, 3)`` int arrays (empty where ``i1 <= i0``)."""
    i0 = np.empty((len(lo), 3), dtype=np.int64)
    i1 = np.empty((len(lo), 3), dtype=np.int64)
    for col, (coords, a) in enumerate(((grid.zs, 2), (grid.ys, 1), (grid.xs, 0))):
        step = coords[1] - coords[0] if coords.size > 1 else 1.0
        i0[:, col] = np.maximum(np.floor((lo[:, a] - coords[0]) / step), 0)
        i1[:, col] = np.minimum(np.ceil((hi[:, a] - coords[0]) / step) + 1, coords.size)
    return i0, i1


def index_box(grid: CanonicalGrid, lo: np.ndarray, hi: np.ndarray) -> tuple[slice, slice, slice] | None:
    """Canonical-array slices ``[z, y, x]`` covering the LPS box lo..hi (mm), or None if outside."""
    i0, i1 = _index_boxes(grid, np.asarray(lo, dtype=np.float64)[None], np.asarray(hi, dtype=np.float64)[None])
    if np.any(i1[0] <= i0[0]):
        return None
    return slice(int(i0[0, 0]), int(i1[0, 0])), slice(int(i0[0, 1]), int(i1[0, 1])), slice(int(i0[0, 2]), int(i1[0, 2]))


def union_box(grid: CanonicalGrid, tubes: Tubes, pad: float) -> tuple[slice, slice, slice] | None:
    """Canonical-array slices enclosing all tubes grown by ``pad`` mm."""
    if not len(tubes):
        return None
    a, b, ra, rb = tubes.arrays()
    r = np.maximum(ra, rb)[:, None] + pad
    lo = np.minimum(a, b) - r
    hi = np.maximum(a, b) + r
    return index_box(grid, lo.min(axis=0), hi.max(axis=0))


def signed_distance(grid: CanonicalGrid, tubes: Tubes, out: np.ndarray, *, pad: float) -> tuple[slice, slice, slice] | None:
    """Write into ``out`` (float32, canonical shape) the signed distance (mm) to the tubes' surface.

    Only voxels within ``pad`` mm of a tube are exact; the rest of the union
    box holds ``pad`` (``out`` is reset there first). Returns the union box.
    """
    box = union_box(grid, tubes, pad)
    if box is None:
        return None
    out[box] = pad
    xs = grid.xs.astype(np.float32)
    ys = grid.ys.astype(np.float32)
    zs = grid.zs.astype(np.float32)
    a_all, b_all, ra_all, rb_all = tubes.arrays()
    r_all = (np.maximum(ra_all, rb_all) + pad)[:, None]
    i0_all, i1_all = _index_boxes(grid, np.minimum(a_all, b_all) - r_all, np.maximum(a_all, b_all) + r_all)
    inside = np.all(i1_all > i0_all, axis=1)
    for a, b, ra, rb, i0, i1 in zip(a_all[inside], b_all[inside], ra_all[inside], rb_all[inside], i0_all[inside], i1_all[inside]):
        bb = (slice(i0[0], i1[0]), slice(i0[1], i1[1]), slice(i0[2], i1[2]))
        e = (b - a).astype(np.float32)
        ee = float(e @ e)
        dx = (xs[bb[2]] - np.float32(a[0]))[None, None, :]
        dy = (ys[bb[1]] - np.float32(a[1]))[None, :, None]
        dz = (zs[bb[0]] - np.float32(a[2]))[:, None, None]
        if ee > 0:
            # the distance to the segment, with each full-box intermediate written into one of two buffers
            # (the same operations in the same order as the plain expressions, so the same float32 values)
            t = dx * (e[0] / ee) + dy * (e[1] / ee)
            t = t + dz * (e[2] / ee)
            np.minimum(np.maximum(t, 0.0, out=t), 1.0, out=t)  # np.clip, without its Python-level overhead
            d = np.multiply(t, e[0])
            np.subtract(dx, d, out=d)
            np.multiply(d, d, out=d)  # qx²
            tmp = np.multiply(t, e[1])
            np.subtract(dy, tmp, out=tmp)
            np.multiply(tmp, tmp, out=tmp)
            d += tmp  # + qy²
            np.multiply(t, e[2], out=tmp)
            np.subtract(dz, tmp, out=tmp)
            np.multiply(tmp, tmp, out=tmp)
            d += tmp  # + qz²
            np.sqrt(d, out=d)
            np.multiply(t, np.float32(rb - ra), out=tmp)
            tmp += np.float32(ra)
            d -= tmp  # minus the radius at t
        else:
            d = np.sqrt(dx * dx + dy * dy + dz * dz) - np.float32(ra)
        view = out[bb]
        np.minimum(view, d, out=view)
    return box


def coverage(sd: np.ndarray, pixel: float) -> np.ndarray:
    """Fraction (0..1, float32) of a voxel inside the surface, from the signed distance (mm)."""
    alpha = np.float32(0.5) - sd * np.float32(1.0 / pixel)
    np.clip(alpha, 0.0, 1.0, out=alpha)
    return alpha
