"""Mesh files: binary STL, binary PLY, OBJ and GLB (glTF 2.0 binary), written atomically.

STL, PLY and OBJ hold the vertices in DICOM patient coordinates (LPS, mm) and say so as 3D Slicer reads it
(``SPACE=LPS`` in the STL header, a PLY comment, the OBJ's first comment; Slicer before 4.11 assumed RAS). GLB
holds the same LPS-mm vertex data under a root node whose matrix maps it to
glTF's frame (metres, +Y up = superior, +Z = anterior, +X = patient's left), so
web viewers show the patient upright and facing the viewer. File names are
``<stem>_<organ>.<ext>``.
"""

from __future__ import annotations

import io
import json
import logging
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from ..errors import ReconstructionError
from .mesh import Mesh, vertex_normals
from .organs import ORGAN_COLORS

log = logging.getLogger(__name__)

FORMATS = ("stl", "ply", "obj", "glb")

# LPS mm → glTF metres: X = L, Y = S, Z = A (= -P); a proper rotation (det +1) times 0.001
GLTF_FROM_LPS = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]) @ np.diag(
    [0.001, 0.001, 0.001, 1.0]
)
GLB_DEFAULT_COLOR = (0.8, 0.5, 0.45)  # RGB 0..1 of an organ without a colour of its own in ORGAN_COLORS


def stl_bytes(mesh: Mesh) -> bytes:
    """Binary STL: 80-byte header, triangle count, (normal, 3 vertices, attribute) per face (float32 LE)."""
    rec = np.dtype([("n", "<f4", (3,)), ("v", "<f4", (3, 3)), ("attr", "<u2")])
    data = np.zeros(mesh.n_triangles, dtype=rec)
    data["n"] = mesh.face_normals()
    data["v"] = mesh.vertices[mesh.faces]
    header = f"ctpipe SPACE=LPS mm {mesh.name}".encode()[:80].ljust(80, b" ")
    return header + struct.pack("<I", mesh.n_triangles) + data.tobytes()


def ply_bytes(mesh: Mesh) -> bytes:
    """Binary little-endian PLY with float32 vertices and uint8-counted int32 face lists."""
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        "comment SPACE=LPS\n"
        f"comment ctpipe {mesh.name}, DICOM patient coordinates LPS, mm\n"
        f"element vertex {mesh.vertices.shape[0]}\nproperty float x\nproperty float y\nproperty float z\n"
        f"element face {mesh.n_triangles}\nproperty list uchar int vertex_indices\nend_header\n"
    ).encode()
    faces = np.zeros(mesh.n_triangles, dtype=np.dtype([("n", "u1"), ("i", "<i4", (3,))]))
    faces["n"] = 3
    faces["i"] = mesh.faces
    return header + mesh.vertices.astype("<f4").tobytes() + faces.tobytes()


def obj_bytes(mesh: Mesh) -> bytes:
    """Wavefront OBJ text (1-based face indices)."""
    buf = io.BytesIO()
    buf.write(f"# SPACE=LPS ctpipe {mesh.name}, DICOM patient coordinates LPS, mm\no {mesh.name}\n".encode())
    np.savetxt(buf, mesh.vertices, fmt="v %.4f %.4f %.4f")
    np.savetxt(buf, mesh.faces + 1, fmt="f %d %d %d")
    return buf.getvalue()


def _pad4(b: bytes, fill: bytes) -> bytes:
    return b + fill * ((4 - len(b) % 4) % 4)


def glb_bytes(mesh: Mesh, *, color: tuple[float, float, float] = GLB_DEFAULT_COLOR) -> bytes:
    """A glTF 2.0 binary: one mesh (positions float32, normals, uint32 indices) under an LPS→glTF node, its material
    ``color`` (RGB, 0..1; :func:`write_mesh` gives each organ its :func:`organ_rgb`)."""
    pos = mesh.vertices.astype("<f4")
    nrm = vertex_normals(mesh.vertices, mesh.faces).astype("<f4")
    idx = mesh.faces.astype("<u4").ravel()
    blobs = [pos.tobytes(), nrm.tobytes(), idx.tobytes()]
    offsets = []
    bin_chunk = b""
    for b in blobs:
        offsets.append(len(bin_chunk))
        bin_chunk = _pad4(bin_chunk + b, b"\x00")
    doc = {
        "asset": {"version": "2.0", "generator": "ctpipe"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"name": f"{mesh.name} (LPS mm)", "mesh": 0, "matrix": GLTF_FROM_LPS.T.ravel().tolist()}],
        "meshes": [
            {
                "name": mesh.name,
                "primitives": [{"attributes": {"POSITION": 0, "NORMAL": 1}, "indices": 2, "material": 0, "mode": 4}],
            }
        ],
        "materials": [
            {
                "name": mesh.name,
                "pbrMetallicRoughness": {"baseColorFactor": [*color, 1.0], "metallicFactor": 0.0, "roughnessFactor": 0.8},
            }
        ],
        "buffers": [{"byteLength": len(bin_chunk)}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": offsets[0], "byteLength": len(blobs[0]), "target": 34962},
            {"buffer": 0, "byteOffset": offsets[1], "byteLength": len(blobs[1]), "target": 34962},
            {"buffer": 0, "byteOffset": offsets[2], "byteLength": len(blobs[2]), "target": 34963},
        ],
        "accessors": [
            {
                "bufferView": 0,
                "componentType": 5126,
                "count": int(pos.shape[0]),
                "type": "VEC3",
                "min": pos.min(axis=0).tolist(),
                "max": pos.max(axis=0).tolist(),
            },
            {"bufferView": 1, "componentType": 5126, "count": int(nrm.shape[0]), "type": "VEC3"},
            {"bufferView": 2, "componentType": 5125, "count": int(idx.size), "type": "SCALAR"},
        ],
    }
    json_chunk = _pad4(json.dumps(doc, separators=(",", ":")).encode(), b" ")
    total = 12 + 8 + len(json_chunk) + 8 + len(bin_chunk)
    return (
        struct.pack("<4sII", b"glTF", 2, total)
        + struct.pack("<I4s", len(json_chunk), b"JSON")
        + json_chunk
        + struct.pack("<I4s", len(bin_chunk), b"BIN\x00")
        + bin_chunk
    )


def organ_rgb(organ: str) -> tuple[float, float, float]:
    """The colour (RGB, 0..1) of ``organ`` in :data:`~.organs.ORGAN_COLORS`, as the 3-D preview draws it; an organ
    not listed there gets :data:`GLB_DEFAULT_COLOR`."""
    hex_rgb = ORGAN_COLORS.get(organ)
    if hex_rgb is None:
        return GLB_DEFAULT_COLOR
    r, g, b = (int(hex_rgb[i : i + 2], 16) / 255.0 for i in (1, 3, 5))
    return (r, g, b)


def _glb_of_organ(mesh: Mesh) -> bytes:
    return glb_bytes(mesh, color=organ_rgb(mesh.name))


_WRITERS = {"stl": stl_bytes, "ply": ply_bytes, "obj": obj_bytes, "glb": _glb_of_organ}


def check_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """Normalise and validate mesh format names (raises :class:`ReconstructionError`). A string is one format
    (``"ply"``) or several separated by commas (``"stl,glb"``, as on the command line), never a sequence of letters."""
    items = formats.split(",") if isinstance(formats, str) else formats
    out = tuple(str(f).strip().lower().lstrip(".") for f in items)
    bad = [f for f in out if f not in _WRITERS]
    if bad:
        raise ReconstructionError(f"unknown mesh format(s) {bad}", where="mesh_formats", fix=f"choose from {list(FORMATS)}")
    return out


def write_mesh(mesh: Mesh, out_dir: Path, *, fmt: str, stem: str = "") -> Path:
    """Write ``mesh`` as ``<out_dir>/<stem>_<organ>.<fmt>`` (atomically) and return the path. Vertices are in DICOM
    patient coordinates (LPS), mm; a GLB maps them to glTF's frame in its root node (see the module's docstring) and
    has the organ's colour (:func:`organ_rgb`, the 3-D preview's)."""
    (fmt,) = check_formats([fmt])
    name = f"{stem}_{mesh.name}" if stem else mesh.name
    path = Path(out_dir) / f"{name}.{fmt}"
    atomic_write_bytes(path, _WRITERS[fmt](mesh))
    log.debug("wrote %s (%d triangles)", path, mesh.n_triangles)
    return path
