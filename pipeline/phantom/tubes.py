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
        """The same tubes cut into pieces no longer than ``max_len`` mm (tighter bounding boxes)."""
        out = Tubes()
        for a, b, ra, rb in zip(self.a, self.b, self.ra, self.rb):
            n = max(1, int(np.ceil(np.linalg.norm(b - a) / max_len)))
            ts = np.linspace(0.0, 1.0, n + 1)
            for t0, t1 in zip(ts[:-1], ts[1:]):
                out.add(a + (b - a) * t0, a + (b - a) * t1, ra + (rb - ra) * t0, ra + (rb - ra) * t1)
        return out


def index_box(grid: CanonicalGrid, lo: np.ndarray, hi: np.ndarray) -> tuple[slice, slice, slice] | None:
    """Canonical-array slices ``[z, y, x]`` covering the LPS box lo..hi (mm), or None if outside."""
    out = []
    for coords, a in ((grid.zs, 2), (grid.ys, 1), (grid.xs, 0)):
        step = coords[1] - coords[0] if coords.size > 1 else 1.0
        i0 = int(np.floor((lo[a] - coords[0]) / step))
        i1 = int(np.ceil((hi[a] - coords[0]) / step)) + 1
        i0, i1 = max(i0, 0), min(i1, coords.size)
        if i1 <= i0:
            return None
        out.append(slice(i0, i1))
    return out[0], out[1], out[2]


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
    for a, b, ra, rb in zip(a_all, b_all, ra_all, rb_all):
        r = max(ra, rb) + pad
        bb = index_box(grid, np.minimum(a, b) - r, np.maximum(a, b) + r)
        if bb is None:
            continue
        e = (b - a).astype(np.float32)
        ee = float(e @ e)
        dx = (xs[bb[2]] - np.float32(a[0]))[None, None, :]
        dy = (ys[bb[1]] - np.float32(a[1]))[None, :, None]
        dz = (zs[bb[0]] - np.float32(a[2]))[:, None, None]
        if ee > 0:
            t = dx * (e[0] / ee) + dy * (e[1] / ee)
            t = t + dz * (e[2] / ee)
            np.clip(t, 0.0, 1.0, out=t)
            qx = dx - t * e[0]
            qy = dy - t * e[1]
            qz = dz - t * e[2]
            d = np.sqrt(qx * qx + qy * qy + qz * qz)
            d -= np.float32(ra) + t * np.float32(rb - ra)
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
