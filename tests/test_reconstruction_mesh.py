"""Surfaces: closed, outward, volume-faithful, in LPS bounds; decimation; mesh file round trips."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh
from scipy import ndimage

from pipeline.errors import ReconstructionError
from pipeline.phantom import generate_phantom
from pipeline.reconstruction.export import GLTF_FROM_LPS, write_mesh
from pipeline.reconstruction.mesh import Mesh, mesh_from_mask, mesh_is_watertight
from pipeline.volume import Geometry
from tests._support.shapes import sphere_mask

DIRECTIONS = {
    "identity": np.eye(3),
    "x_flipped": np.diag([-1.0, 1.0, 1.0]),  # det -1: index order mirrors patient space
    "ffs": np.diag([-1.0, 1.0, -1.0]),
    "permuted": np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
}


def _geom(direction: np.ndarray, shape=(40, 40, 40)) -> Geometry:
    return Geometry(shape=shape, spacing=(0.8, 0.9, 1.5), origin=(10.0, -5.0, 3.0), direction=direction)


def _enclosed_centroid(mesh: Mesh) -> np.ndarray:
    """Centre of mass (LPS mm) of the solid a closed mesh encloses: its faces' tetrahedra to the origin, by volume."""
    a, b, c = (mesh.vertices[mesh.faces[:, n]] for n in range(3))
    v = np.einsum("ij,ij->i", a, np.cross(b, c)) / 6.0
    return ((a + b + c) / 4.0 * v[:, None]).sum(axis=0) / v.sum()


def _check_surface(mesh: Mesh, mask: np.ndarray, geom: Geometry, tol: float = 0.02) -> None:
    assert mesh.is_watertight()
    assert mesh.volume() > 0  # outward faces give a positive signed volume
    mask_mm3 = mask.sum() * np.prod(geom.spacing)
    assert abs(mesh.volume() / mask_mm3 - 1) < tol
    lo, hi = geom.bounds_lps()
    half = 0.5 * np.abs(geom.direction * np.asarray(geom.spacing)[None, :]).sum(axis=1)
    assert (mesh.vertices >= lo - half - 1e-6).all() and (mesh.vertices <= hi + half + 1e-6).all()
    # every vertex lies on the mask's edge in LPS: within 2 voxels of a voxel of the other kind (a mirrored or
    # permuted axis puts the surface of a lung or a bone 10 mm or more away from the mask's)
    d = _edge_distance_mm(mesh.vertices, mask, geom)
    assert d.max() <= 2 * max(geom.spacing) + 1e-6, (float(d.max()), geom.spacing)


def _edge_distance_mm(points_lps: np.ndarray, mask: np.ndarray, geom: Geometry) -> np.ndarray:
    """For each LPS point, the distance (mm) from the voxel it falls in to the nearest voxel on the other side of the
    mask's edge; outside the scanned grid counts as outside the mask."""
    padded = np.pad(mask, 1)
    kji = np.rint(geom.lps_to_index(points_lps)[:, ::-1]).astype(int) + 1
    kji = tuple(np.clip(kji, 0, np.array(padded.shape) - 1).T)
    sampling = geom.spacing[::-1]
    to_outside = ndimage.distance_transform_edt(padded, sampling=sampling)[kji]
    to_inside = ndimage.distance_transform_edt(~padded, sampling=sampling)[kji]
    return np.where(padded[kji], to_outside, to_inside)


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_sphere_surface_is_closed_outward_and_in_lps(name):
    geom = _geom(DIRECTIONS[name])
    mask = sphere_mask(center=(14, 22, 26), radius=10.0)  # off the grid's centre: a mirrored axis moves it
    mesh = mesh_from_mask(mask, geom, name="sphere")
    _check_surface(mesh, mask, geom, tol=0.001)  # volume restored to the voxel volume
    # the enclosed solid's centre of mass is the mask's, in LPS
    np.testing.assert_allclose(_enclosed_centroid(mesh), geom.centroid_lps(mask), atol=0.05)
    # every face normal points away from the centre
    centre = geom.index_to_lps([26, 22, 14])
    tri_c = mesh.vertices[mesh.faces].mean(axis=1)
    assert (np.einsum("ij,ij->i", mesh.face_normals(), tri_c - centre) > 0).mean() > 0.99


def test_raw_smoothing_alone_keeps_the_volume_within_two_percent():
    """Without the volume restoration step, Taubin smoothing itself does not shrink the surface."""
    geom = _geom(np.eye(3))
    mask = sphere_mask()
    mesh = mesh_from_mask(mask, geom, preserve_volume=False, smoothing_iterations=30)
    _check_surface(mesh, mask, geom, tol=0.02)


def test_mask_touching_the_border_still_closes():
    geom = _geom(np.eye(3), shape=(20, 20, 20))
    mask = np.zeros((20, 20, 20), bool)
    mask[:, 5:15, 5:15] = True  # a bar running out of the volume at both ends
    mesh = mesh_from_mask(mask, geom)
    _check_surface(mesh, mask, geom)


def test_target_triangles_caps_the_count_and_keeps_a_closed_surface():
    geom = _geom(np.eye(3))
    mask = sphere_mask()
    full = mesh_from_mask(mask, geom)
    small = mesh_from_mask(mask, geom, target_triangles=1500)
    assert small.n_triangles <= 1500 < full.n_triangles
    _check_surface(small, mask, geom)


def test_watertight_check_can_fail():
    mesh = mesh_from_mask(sphere_mask((20, 20, 20), (10, 10, 10), 6), _geom(np.eye(3), (20, 20, 20)))
    assert mesh_is_watertight(mesh.faces)
    assert not mesh_is_watertight(mesh.faces[1:])  # a hole
    flipped = mesh.faces.copy()
    flipped[0] = flipped[0, [0, 2, 1]]
    assert not mesh_is_watertight(flipped)  # inconsistent orientation


def test_empty_mask_names_the_organ():
    with pytest.raises(ReconstructionError, match="airway: mask is empty"):
        mesh_from_mask(np.zeros((10, 10, 10), bool), _geom(np.eye(3), (10, 10, 10)), name="airway")


@pytest.fixture(scope="module")
def phantom128():
    return generate_phantom(1, matrix=128, patient_position="FFS")


@pytest.mark.parametrize("organ", ["lung_left", "lung_right", "body", "airway", "bone"])
def test_phantom_organ_surfaces(phantom128, organ):
    mask = phantom128.masks[organ]
    mesh = mesh_from_mask(mask, phantom128.volume.geometry, name=organ)
    _check_surface(mesh, mask, phantom128.volume.geometry)
    if organ == "lung_left":
        assert mesh.vertices[:, 0].min() > 0  # patient's left is +x in LPS


@pytest.mark.parametrize("fmt", ["stl", "ply", "obj", "glb"])
def test_export_round_trip_through_trimesh(tmp_path, fmt, phantom128):
    mesh = mesh_from_mask(phantom128.masks["lung_right"], phantom128.volume.geometry, name="lung_right", target_triangles=4000)
    path = write_mesh(mesh, tmp_path, fmt=fmt, stem="case1")
    assert path.name == f"case1_lung_right.{fmt}"
    loaded = trimesh.load(path, force="mesh", process=False)
    assert len(loaded.faces) == mesh.n_triangles
    verts = np.asarray(loaded.vertices, dtype=np.float64)
    expected = mesh.vertices
    if fmt == "glb":  # the root node maps LPS mm to glTF metres (+Y superior, +Z anterior)
        expected = (np.c_[mesh.vertices, np.ones(len(mesh.vertices))] @ GLTF_FROM_LPS.T)[:, :3]
    tri = verts[np.asarray(loaded.faces)]  # STL stores a triangle soup: compare triangle corners
    assert np.allclose(tri, expected[mesh.faces], atol=2e-3 if fmt != "glb" else 2e-6)
    if fmt != "stl":
        assert np.array_equal(np.asarray(loaded.faces), mesh.faces)
    loaded = trimesh.load(path, force="mesh")  # merged vertices: a closed, outward surface
    assert loaded.is_watertight and loaded.volume > 0
    scale = 1e9 if fmt == "glb" else 1.0
    assert loaded.volume * scale == pytest.approx(mesh.volume(), rel=1e-3)


@pytest.mark.parametrize("fmt", ["stl", "ply", "obj"])
def test_mesh_files_declare_lps_the_way_3d_slicer_reads_it(tmp_path, fmt):
    """3D Slicer takes a mesh file's coordinate system from ``SPACE=LPS`` / ``SPACE=RAS`` in the STL header, a PLY
    comment or the OBJ's leading comment, else from its own default (RAS before Slicer 4.11): say LPS, even after a
    long organ name."""
    mesh = mesh_from_mask(sphere_mask((20, 20, 20), (10, 10, 10), 6), _geom(np.eye(3), (20, 20, 20)), name="x" * 90)
    raw = write_mesh(mesh, tmp_path, fmt=fmt, stem="case1").read_bytes()
    if fmt == "stl":
        assert b"SPACE=LPS" in raw[:80] and not raw.startswith(b"solid")  # binary STL: the header is 80 bytes
    elif fmt == "ply":
        assert b"\ncomment SPACE=LPS\n" in raw[: raw.index(b"end_header")]
    else:
        assert raw.startswith(b"#") and b"SPACE=LPS" in raw.split(b"\n", 1)[0]


def test_glb_files_carry_each_organs_colour(tmp_path):
    """Every GLB was the same salmon whatever the organ: loaded together in a web viewer the lungs, the airway and the
    bone could not be told apart. Each now has its organ's colour, as the 3-D preview draws it."""
    import json
    import struct

    from pipeline.reconstruction.organs import ORGAN_COLORS

    geom = _geom(np.eye(3), (20, 20, 20))
    for organ in ("lung_left", "lung_right", "airway", "bone"):
        mesh = mesh_from_mask(sphere_mask((20, 20, 20), (10, 10, 10), 6), geom, name=organ)
        raw = write_mesh(mesh, tmp_path, fmt="glb", stem="case1").read_bytes()
        (length,) = struct.unpack("<I", raw[12:16])
        doc = json.loads(raw[20 : 20 + length])
        rgb = doc["materials"][0]["pbrMetallicRoughness"]["baseColorFactor"][:3]
        hex_rgb = ORGAN_COLORS[organ]
        assert rgb == pytest.approx([int(hex_rgb[i : i + 2], 16) / 255 for i in (1, 3, 5)]), organ
