"""Closed, outward-oriented organ surfaces in LPS mm from boolean masks.

Pipeline per organ: crop the mask to its bounding box and pad it by one empty
voxel (so the surface always closes), optionally resample it to a coarser grid
(this is how a target triangle count is reached), extract the 0.5 iso-surface
with marching cubes (Lewiner, topologically consistent, hence manifold), smooth
with Taubin's λ|μ filter (sparse-matrix, vectorised), restore the enclosed
volume to the mask's voxel volume with a uniform offset along the vertex
normals, map the vertices to LPS mm and orient every face outward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from skimage import measure

from ..errors import ReconstructionError
from ..volume import Geometry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mesh:
    """A triangle surface: ``vertices`` (n, 3) LPS mm float64, ``faces`` (m, 3) int64, counter-clockwise seen from outside."""

    name: str
    vertices: np.ndarray
    faces: np.ndarray

    def __repr__(self) -> str:
        return f"Mesh({self.name!r}, {self.n_vertices:,} vertices, {self.n_triangles:,} faces, LPS mm)"

    @property
    def n_vertices(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def n_triangles(self) -> int:
        return int(self.faces.shape[0])

    def face_normals(self, *, unit: bool = True) -> np.ndarray:
        """Per-face normals ``(m, 3)`` along LPS x, y, z: unit length, or with ``unit=False`` of length twice the
        face's area in mm²."""
        v = self.vertices[self.faces]
        n = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
        if unit:
            n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
        return n

    def volume(self) -> float:
        """Signed enclosed volume in mm³ (positive for outward faces)."""
        return signed_volume(self.vertices, self.faces)

    def area(self) -> float:
        """Surface area in mm²."""
        return float(0.5 * np.linalg.norm(self.face_normals(unit=False), axis=1).sum())

    def is_watertight(self) -> bool:
        """Every undirected edge is shared by exactly two faces, with opposite directions (consistent orientation)."""
        return mesh_is_watertight(self.faces)


def signed_volume(vertices: np.ndarray, faces: np.ndarray) -> float:
    """Enclosed volume by the divergence theorem (mm³ for LPS mm vertices)."""
    v = vertices[faces]
    return float(np.einsum("ij,ij->i", v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() / 6.0)


def mesh_is_watertight(faces: np.ndarray) -> bool:
    """True when each directed edge occurs once and its reverse occurs once (closed, oriented 2-manifold edges)."""
    if faces.size == 0:
        return False
    e = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    n = int(faces.max()) + 1
    directed = e[:, 0].astype(np.int64) * n + e[:, 1]
    reverse = e[:, 1].astype(np.int64) * n + e[:, 0]
    uniq, counts = np.unique(directed, return_counts=True)
    if counts.max() != 1:
        return False
    return bool(np.isin(reverse, uniq, assume_unique=False).all())


def _adjacency(faces: np.ndarray, n: int) -> sp.csr_matrix:
    """Row-normalised vertex adjacency (uniform Laplacian weights) of a closed, oriented mesh.

    On such a mesh every edge occurs once in each direction among the faces' directed edges,
    so those 3·F pairs are exactly the adjacency entries, without duplicates.
    """
    rows = faces.ravel()
    cols = faces[:, [1, 2, 0]].ravel()
    deg = np.bincount(rows, minlength=n).astype(np.float64)
    data = 1.0 / np.maximum(deg, 1.0)[rows]
    return sp.csr_matrix((data, (rows, cols)), shape=(n, n))


def taubin_smooth(
    vertices: np.ndarray, faces: np.ndarray, *, iterations: int = 20, lam: float = 0.5, mu: float = -0.53
) -> np.ndarray:
    """Taubin λ|μ smoothing (low-pass, nearly shrink-free), vectorised as sparse matrix products."""
    if iterations <= 0:
        return vertices
    w = _adjacency(faces, vertices.shape[0])
    v = vertices.copy()
    for _ in range(iterations):
        v = v + lam * (w @ v - v)
        v = v + mu * (w @ v - v)
    return v


def vertex_normals(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Area-weighted unit vertex normals (outward for outward faces)."""
    v = vertices[faces]
    fn = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    n = vertices.shape[0]
    idx = faces.ravel()
    vn = np.stack([np.bincount(idx, weights=np.repeat(fn[:, c], 3), minlength=n) for c in range(3)], axis=1)
    return vn / np.maximum(np.linalg.norm(vn, axis=1, keepdims=True), 1e-12)


def _restore_volume(vertices: np.ndarray, faces: np.ndarray, target: float, rounds: int = 1) -> np.ndarray:
    """Offset vertices along their normals so the enclosed volume equals ``target`` (first order: dV = A·d)."""
    v = vertices
    for _ in range(rounds):
        tri = v[faces]
        cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
        vol = float(np.einsum("ij,ij->", tri[:, 0], cross)) / 6.0  # v0·(e1×e2) = v0·(v1×v2) summed
        area = 0.5 * float(np.linalg.norm(cross, axis=1).sum())
        if area <= 0 or abs(vol - target) <= 1e-5 * abs(target):
            break
        n = v.shape[0]
        idx = faces.ravel()
        vn = np.stack([np.bincount(idx, weights=np.repeat(cross[:, c], 3), minlength=n) for c in range(3)], axis=1).astype(
            np.float64, copy=False
        )
        vn /= np.maximum(np.linalg.norm(vn, axis=1, keepdims=True), 1e-12)
        v = v + ((target - vol) / area) * vn
    return v


def _field(mask: np.ndarray, factor: float, device: torch.device | str) -> tuple[np.ndarray, float]:
    """The scalar field for marching cubes and the step (in voxels) of its grid."""
    padded = np.pad(mask, 1)
    if factor <= 1.0:
        return padded.astype(np.float32), 1.0
    t = torch.from_numpy(padded).to(device).to(torch.float32)[None, None]
    k = 2 * int(factor // 2) + 1  # odd box blur ≈ the new voxel, keeps the centre aligned
    t = F.avg_pool3d(t, kernel_size=k, stride=1, padding=k // 2, count_include_pad=True)
    size = [max(2, int(np.ceil((n - 1) / factor)) + 1) for n in padded.shape]
    # sample at old positions 0, factor, 2*factor, ... (align_corners=True over the stretched range)
    span = [(s - 1) * factor for s in size]
    grid_axes = [
        torch.linspace(0, sp_, s, device=t.device) / max(n - 1, 1) * 2 - 1 for sp_, s, n in zip(span, size, padded.shape)
    ]
    gk, gj, gi = torch.meshgrid(*grid_axes, indexing="ij")
    grid = torch.stack([gi, gj, gk], dim=-1)[None]
    out = F.grid_sample(t, grid, mode="bilinear", padding_mode="zeros", align_corners=True)[0, 0]
    out = F.pad(out, (1, 1, 1, 1, 1, 1))  # keep the surface closed
    return out.cpu().numpy(), factor


def mesh_from_mask(
    mask: np.ndarray,
    geometry: Geometry,
    *,
    name: str = "organ",
    smoothing_iterations: int = 20,
    target_triangles: int | None = None,
    preserve_volume: bool = True,
    device: str | torch.device = "cpu",
) -> Mesh:
    """Surface of ``mask`` (bool ``[k, j, i]`` on ``geometry``) as a closed, outward mesh in LPS mm.

    ``target_triangles`` caps the triangle count by extracting the surface on a
    coarser grid; ``preserve_volume`` makes the enclosed volume equal the mask's
    voxel volume (count × voxel volume, mm³) after smoothing.
    Raises :class:`ReconstructionError` for an empty mask.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != geometry.shape:
        raise ReconstructionError(f"{name}: mask shape {mask.shape} differs from the volume grid {geometry.shape}")
    nz = [np.nonzero(mask.any(axis=tuple(a for a in range(3) if a != ax)))[0] for ax in range(3)]
    if any(x.size == 0 for x in nz):
        raise ReconstructionError(
            f"{name}: mask is empty, there is no surface to extract",
            fix="check the segmentation of this organ; the other organs are still meshed",
        )
    lo = np.array([x[0] for x in nz])
    hi = np.array([x[-1] + 1 for x in nz])
    crop = mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    target_vox = float(crop.sum())
    factor = 1.0
    if target_triangles:
        faces_est = sum(int(np.count_nonzero(np.diff(np.pad(crop, 1).view(np.int8), axis=a))) for a in range(3))
        factor = max(1.0, float(np.sqrt(1.1 * faces_est / target_triangles)))
    verts = faces = None
    for _ in range(4):
        field, step = _field(crop, factor, device)
        level = 0.5 if step == 1.0 else 0.5 - 1.0 / 1024.0
        verts, faces, _n, _v = measure.marching_cubes(field, level=level, method="lewiner", allow_degenerate=False)
        if not target_triangles or faces.shape[0] <= target_triangles:
            break
        factor *= float(np.sqrt(faces.shape[0] / target_triangles)) * 1.05
    assert verts is not None and faces is not None
    # field index → padded-crop index → full index (k, j, i)
    if step != 1.0:
        verts = (verts - 1.0) * step
    verts = verts - 1.0 + lo[None, :]
    faces = faces.astype(np.int64)
    verts = taubin_smooth(verts.astype(np.float64), faces, iterations=smoothing_iterations)
    if signed_volume(verts, faces) < 0:  # orient outward in index space first
        faces = faces[:, [0, 2, 1]]
    if preserve_volume:  # in index units the mask's volume is its voxel count
        verts = _restore_volume(verts, faces, target_vox)
    # keep every vertex inside the scanned volume's voxel cells
    np.clip(verts, -0.5, np.asarray(geometry.shape, dtype=np.float64) - 0.5, out=verts)
    lps = geometry.index_to_lps(verts[:, ::-1])
    # (k, j, i) → LPS: the axis reversal is a mirror, and so is a direction matrix with determinant -1
    if -np.linalg.det(geometry.direction) < 0:
        faces = faces[:, [0, 2, 1]]
    log.debug("%s: %d vertices, %d triangles (grid step %.2f voxels)", name, lps.shape[0], faces.shape[0], step)
    return Mesh(name=name, vertices=lps, faces=faces)
