"""Scanner geometry of a phantom: patient position → direction cosines, origin and voxel order.

The anatomy is built on a *canonical grid*: an axial grid whose array axes
``[z, y, x]`` run along +S, +P and +L (LPS, mm). A real scanner stores the
same voxels in its own order: rows along the scanner's horizontal axis,
columns pointing to the floor and slices along the gantry axis. Those three
axes, written in patient coordinates, depend on how the patient lies
(``PatientPosition``):

* gantry axis (slice normal, index k): +S for head-first (HF*), -S (inferior) for feet-first (FF*);
* floor direction (column direction, index j): +P supine (S), -P prone (P),
  -L (the patient's right side down) for decubitus right (DR), +L for decubitus left (DL);
* row direction (index i) = column direction × slice normal (a right-handed scanner frame).

So HFS gives the identity direction, FFS gives ImageOrientationPatient
``[-1, 0, 0, 0, 1, 0]`` with slices running inferior, HFP ``[-1, 0, 0, 0, -1, 0]``.
Slices are ordered by increasing position along the slice normal (as
SimpleITK and ctpipe's ingest sort them); the origin is the centre of the
top-left voxel of the first slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PhantomError
from ..volume import Geometry

_DOWN = {"S": (0, 1, 0), "P": (0, -1, 0), "DR": (-1, 0, 0), "DL": (1, 0, 0)}
_GANTRY = {"HF": (0, 0, 1), "FF": (0, 0, -1)}
PATIENT_POSITIONS = tuple(f"{a}{b}" for a in _GANTRY for b in _DOWN)


def direction_for(patient_position: str) -> np.ndarray:
    """3×3 direction matrix (column c = LPS unit vector of index axis c) for a DICOM PatientPosition."""
    pos = str(patient_position).upper()
    if pos not in PATIENT_POSITIONS:
        raise PhantomError(
            f"unknown patient_position {patient_position!r}",
            where="generate_phantom(patient_position=...)",
            fix=f"use one of {', '.join(PATIENT_POSITIONS)}",
        )
    normal = np.array(_GANTRY[pos[:2]], dtype=np.float64)
    col = np.array(_DOWN[pos[2:]], dtype=np.float64)
    row = np.cross(col, normal)
    return np.stack([row, col, normal], axis=1)


def floor_direction(patient_position: str) -> np.ndarray:
    """LPS unit vector (3,) pointing to the floor for a DICOM PatientPosition (+P supine, -P prone, -L / +L decubitus)."""
    direction = direction_for(patient_position)
    return direction[:, 1].copy()


@dataclass(frozen=True)
class CanonicalGrid:
    """Voxel centres of the canonical grid: ``xs`` (+L), ``ys`` (+P), ``zs`` (+S), LPS mm, ascending."""

    xs: np.ndarray
    ys: np.ndarray
    zs: np.ndarray
    pixel_spacing: float
    slice_spacing: float

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.zs.size, self.ys.size, self.xs.size)

    @property
    def spacing_zyx(self) -> tuple[float, float, float]:
        return (self.slice_spacing, self.pixel_spacing, self.pixel_spacing)

    def index_of(self, point_lps: np.ndarray) -> np.ndarray:
        """Continuous canonical array index ``(z, y, x)`` of LPS points (mm): shape ``(..., 3)`` in, ``(..., 3)`` out."""
        p = np.asarray(point_lps, dtype=np.float64)
        return np.stack(
            [
                (p[..., 2] - self.zs[0]) / self.slice_spacing,
                (p[..., 1] - self.ys[0]) / self.pixel_spacing,
                (p[..., 0] - self.xs[0]) / self.pixel_spacing,
            ],
            axis=-1,
        )

    def lps_of(self, index_zyx: np.ndarray) -> np.ndarray:
        """LPS points (mm) of continuous canonical indices ``(z, y, x)``: the inverse of :meth:`index_of`, ``(..., 3)``."""
        q = np.asarray(index_zyx, dtype=np.float64)
        return np.stack(
            [
                self.xs[0] + q[..., 2] * self.pixel_spacing,
                self.ys[0] + q[..., 1] * self.pixel_spacing,
                self.zs[0] + q[..., 0] * self.slice_spacing,
            ],
            axis=-1,
        )


def _axis_map(direction: np.ndarray) -> list[tuple[int, int]]:
    """For index axis c = 0 (i), 1 (j), 2 (k): (LPS axis it follows, sign)."""
    out = []
    for c in range(3):
        col = direction[:, c]
        a = int(np.argmax(np.abs(col)))
        out.append((a, 1 if col[a] > 0 else -1))
    return out


def scanner_geometry(grid: CanonicalGrid, direction: np.ndarray) -> Geometry:
    """The scanner's :class:`Geometry` of the canonical grid seen with ``direction`` (LPS)."""
    coords = (grid.xs, grid.ys, grid.zs)
    origin = [0.0, 0.0, 0.0]
    size_ijk = []
    spacing = []
    for a, sign in _axis_map(direction):
        values = coords[a]
        origin[a] = float(values[0] if sign > 0 else values[-1])
        size_ijk.append(values.size)
        spacing.append(grid.slice_spacing if a == 2 else grid.pixel_spacing)
    return Geometry(
        shape=(size_ijk[2], size_ijk[1], size_ijk[0]),
        spacing=(spacing[0], spacing[1], spacing[2]),
        origin=(origin[0], origin[1], origin[2]),
        direction=direction,
    )


def to_scanner_order(array: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """Reorder a canonical ``[z, y, x]`` array into the scanner's ``[k, j, i]`` order (a copy unless HFS)."""
    amap = _axis_map(direction)
    # canonical array dim of LPS axis a is 2 - a; scanner array dim of index axis c is 2 - c
    perm = [2 - amap[c][0] for c in (2, 1, 0)]
    out = array.transpose(perm)
    for c, (_, sign) in enumerate(amap):
        if sign < 0:
            out = np.flip(out, axis=2 - c)
    if perm == [0, 1, 2] and all(sign > 0 for _, sign in amap):
        return array
    return np.ascontiguousarray(out)
