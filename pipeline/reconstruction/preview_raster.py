"""Triangle meshes rasterised without a display, for the 3-D preview (:mod:`.preview`): each view's image of the
organ surfaces and the depth of the nearest surface at each pixel.

A view looks along an LPS axis (``"anterior"``: from the front, the patient's right on the image left; ``"left"``:
from the patient's left, anterior on the image left; superior up in both); every view is drawn at one scale, fitted to
the meshes' frame. Vertices are DICOM patient coordinates (LPS, mm); depths in mm, growing towards the viewer.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .mesh import Mesh
from .organs import organ_colours
from .render_layout import hex_rgb

_CHUNK = 20000


def _scan_convert(u: np.ndarray, v: np.ndarray, dz: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixels (flat index), depths and triangle indices of the pixel centres covered by triangles (T, 3) in u, v."""
    x0 = np.clip(np.floor(u.min(axis=1)).astype(np.int64), 0, size - 1)
    x1 = np.clip(np.ceil(u.max(axis=1)).astype(np.int64), 0, size - 1)
    y0 = np.clip(np.floor(v.min(axis=1)).astype(np.int64), 0, size - 1)
    y1 = np.clip(np.ceil(v.max(axis=1)).astype(np.int64), 0, size - 1)
    w, h = x1 - x0 + 1, y1 - y0 + 1
    n = w * h
    rep = np.repeat(np.arange(u.shape[0]), n)
    local = np.arange(rep.size) - np.repeat(np.cumsum(n) - n, n)
    px = x0[rep] + local % w[rep]
    py = y0[rep] + local // w[rep]
    cx, cy = px + 0.5, py + 0.5
    ua, ub, uc = u[rep, 0], u[rep, 1], u[rep, 2]
    va, vb, vc = v[rep, 0], v[rep, 1], v[rep, 2]
    det = (vb - vc) * (ua - uc) + (uc - ub) * (va - vc)
    ok = np.abs(det) > 1e-12
    det = np.where(ok, det, 1.0)
    l0 = ((vb - vc) * (cx - uc) + (uc - ub) * (cy - vc)) / det
    l1 = ((vc - va) * (cx - uc) + (ua - uc) * (cy - vc)) / det
    l2 = 1.0 - l0 - l1
    inside = ok & (l0 >= -1e-9) & (l1 >= -1e-9) & (l2 >= -1e-9)
    r = rep[inside]
    d = (l0[inside] * dz[r, 0] + l1[inside] * dz[r, 1] + l2[inside] * dz[r, 2]).astype(np.float32)
    return py[inside] * size + px[inside], d, r


def view_axes(view: str) -> tuple[tuple[int, int], int, float]:
    """A view's image axes (LPS axis of the columns, of the rows), depth axis and the sign that makes depth grow
    towards the viewer."""
    if view == "anterior":
        return (0, 2), 1, -1.0  # viewer at -y (anterior)
    if view == "left":
        return (1, 2), 0, 1.0  # viewer at +x (patient's left)
    raise ValueError(f"view must be 'anterior' or 'left', got {view!r}")


def fit_frame(frame: tuple[np.ndarray, np.ndarray], size: int) -> tuple[float, np.ndarray]:
    """Pixels per mm and the LPS centre of an image of ``size`` pixels fitted to ``frame`` (lowest, highest corner).
    The scale is the same for every view: fitted to the frame's longest side in any direction, so that the anterior
    and lateral views draw a millimetre alike and a point at one head-foot height on the same row of both."""
    lo, hi = (np.asarray(c, dtype=np.float64) for c in frame)
    return 0.92 * size / max(float((hi - lo).max()), 1e-6), (lo + hi) / 2


def _fragments(mesh: Mesh, *, view: str, size: int, frame: tuple[np.ndarray, np.ndarray]):
    """The mesh's triangles (T, 3, 3) in chunks with the pixels (flat index) they cover, the depth there (mm, growing
    towards the viewer) and the triangle of each."""
    axes, depth_axis, depth_sign = view_axes(view)
    scale, centre = fit_frame(frame, size)
    for f0 in range(0, mesh.n_triangles, _CHUNK):  # bounded memory for large meshes
        tri = mesh.vertices[mesh.faces[f0 : f0 + _CHUNK]]
        u = (tri[:, :, axes[0]] - centre[axes[0]]) * scale + size / 2
        v = size / 2 - (tri[:, :, axes[1]] - centre[axes[1]]) * scale  # image rows run downwards
        yield (tri, *_scan_convert(u, v, depth_sign * tri[:, :, depth_axis], size))


def _mesh_frame(meshes: Mapping[str, Mesh]) -> tuple[np.ndarray, np.ndarray]:
    allv = np.concatenate([m.vertices for m in meshes.values() if m.n_triangles])
    return allv.min(axis=0), allv.max(axis=0)


def rasterise(
    meshes: Mapping[str, Mesh],
    *,
    view: str = "anterior",
    size: int = 512,
    frame: tuple[np.ndarray, np.ndarray] | None = None,
    colours: Mapping[str, str] | None = None,
) -> np.ndarray:
    """Orthographic shaded image (H, W, 3) float of the meshes seen from ``anterior`` or ``left``, each in its colour
    (``colours``, else :func:`~.organs.organ_colours`: :data:`~.organs.ORGAN_COLORS`).

    frame: the LPS box (lowest, highest corner, mm) the image is fitted to (default: the meshes' own), so that other
    meshes drawn in the same frame (the nodules over the organs) land on the same pixels.

    Anterior view: patient's right on image left, superior up. Left view: anterior on image left.
    A vectorised scan-converter: every pixel centre of each triangle's bounding box is tested with
    barycentric coordinates; a depth sort keeps the nearest surface per pixel (Lambert shading).
    """
    img = np.zeros((size, size, 3))
    parts = [(k, m) for k, m in meshes.items() if m.n_triangles]
    _axes, depth_axis, depth_sign = view_axes(view)
    if not parts:
        return img
    rgbs = {k: hex_rgb(c) for k, c in (colours or organ_colours(meshes)).items()}
    frame = frame if frame is not None else _mesh_frame(dict(parts))
    light = np.zeros(3)
    light[depth_axis] = depth_sign
    pix, depth, colour = [], [], []
    for organ, m in parts:
        rgb = np.asarray(rgbs[organ])
        for tri, p_, d_, r_ in _fragments(m, view=view, size=size, frame=frame):
            n_hat = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
            n_hat /= np.maximum(np.linalg.norm(n_hat, axis=1, keepdims=True), 1e-12)
            shade = 0.25 + 0.75 * np.clip(n_hat @ light, 0.0, 1.0)
            pix.append(p_)
            depth.append(d_)
            colour.append(rgb[None, :] * shade[r_, None])
    p, d, c = np.concatenate(pix), np.concatenate(depth), np.concatenate(colour)
    order = np.argsort(d)  # farthest first, so the nearest sample of each pixel is written last
    flat = img.reshape(-1, 3)
    flat[p[order]] = c[order]  # sequential assignment of a 1-D fancy index: the last write wins
    return img


def surface_depth(
    mesh: Mesh, *, view: str, size: int, frame: tuple[np.ndarray, np.ndarray], farthest: bool = False
) -> np.ndarray:
    """The depth (mm along the view's axis, growing towards the viewer) of the mesh's nearest surface, or with
    ``farthest`` its farthest, at each pixel of a :func:`rasterise` image (size, size) fitted to ``frame`` (LPS
    mm); NaN where the mesh covers no pixel centre."""
    out = np.full(size * size, np.nan, dtype=np.float32)
    parts = [(p, d) for _tri, p, d, _r in _fragments(mesh, view=view, size=size, frame=frame)]
    if parts:
        p, d = (np.concatenate(x) for x in zip(*parts))
        order = np.argsort(-d if farthest else d)  # the last write of a pixel wins
        out[p[order]] = d[order]
    return out.reshape(size, size)
