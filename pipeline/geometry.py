"""The voxel grid of a volume in DICOM patient space: :class:`Geometry`.

Conventions (the same as SimpleITK / ITK / DICOM):

* Arrays on a grid are indexed ``[k, j, i]`` = ``[slice, row, column]``.
* Index triples in every public function are ``(i, j, k)`` = (column, row, slice).
* ``spacing`` is ``(si, sj, sk)`` in mm along i, j, k.
* ``origin`` is the centre of voxel ``(0, 0, 0)`` in DICOM patient coordinates
  (LPS: +x to the patient's Left, +y Posterior, +z Superior), in mm.
* ``direction`` is a 3×3 matrix whose *column* c is the LPS unit vector of
  index axis c (SimpleITK's ``GetDirection()`` read row-major).

So a voxel index maps to patient coordinates as
``lps = origin + direction @ (spacing * ijk)``.

A grid is valid once constructed and immutable: :meth:`Geometry.resampled`, :meth:`Geometry.cropped` and
:meth:`Geometry.binned` return new grids. The volumes on a grid are :mod:`pipeline.volume`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import GeometryError, described

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: Tolerance on direction cosines: of a grid's orthonormality, and of two grids' directions being equal.
DIRECTION_TOL = 1e-4


#: What a :class:`Geometry`'s 3-number fields hold, for the fix of an error in one.
_VEC3_FIX = {
    "spacing": "pass the voxel size as 3 numbers in mm along (i, j, k) (columns, rows, slices), e.g. (0.8, 0.8, 2.0)",
    "origin": "pass the LPS position in mm of the centre of voxel (0, 0, 0) as 3 numbers (x, y, z), e.g. (-200.0, -180.0, -300.0)",
}


def _as_vec3(value: Sequence[float] | np.ndarray, name: str) -> tuple[float, float, float]:
    """``value`` as 3 finite floats; :class:`GeometryError` naming ``name`` (``spacing`` or ``origin``) and the value."""
    try:
        arr = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        arr = np.empty(0)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise GeometryError(f"{name} must be 3 finite numbers, got {value!r}", fix=_VEC3_FIX[name])
    return (float(arr[0]), float(arr[1]), float(arr[2]))


def _shape3(shape: Any) -> tuple[int, int, int]:
    """A grid's shape as 3 ints ``(nk, nj, ni)``, each at least 1; :class:`GeometryError` naming the value otherwise
    (also for a size that is not a whole number, which ``int()`` would cut)."""
    try:
        values = list(shape)
        sizes = tuple(int(s) for s in values)
        whole = all(float(s) == n for s, n in zip(values, sizes))
    except (TypeError, ValueError):
        sizes, whole = (), False
    if len(sizes) != 3 or not whole or min(sizes) < 1:
        raise GeometryError(
            f"shape must be 3 positive sizes (k, j, i), got {shape!r}",
            fix="pass the array's shape, 3 whole numbers of at least 1 in [k, j, i] order (slices, rows, columns), "
            "e.g. Geometry(shape=array.shape, ...) for an array indexed [k, j, i]",
        )
    return (sizes[0], sizes[1], sizes[2])


def _spacing3(spacing: float | Sequence[float]) -> tuple[float, float, float]:
    """A voxel size in mm as (i, j, k): one number (isotropic) or three; :class:`GeometryError` naming the value."""
    fix = "pass one number for isotropic voxels, e.g. 2.0 for 2 mm, or 3 numbers in mm along (i, j, k), e.g. (0.8, 0.8, 2.0)"
    try:
        arr = np.asarray(spacing, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.empty(0)
    if isinstance(spacing, bool) or arr.ndim == 0 and not np.isfinite(arr):
        arr = np.empty(0)
    elif arr.ndim == 0:
        arr = np.full(3, float(arr))
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise GeometryError(f"spacing must be one number or 3 numbers (i, j, k) in mm, got {spacing!r}", fix=fix)
    return (float(arr[0]), float(arr[1]), float(arr[2]))


_DIRECTION_FIX = (
    "pass the direction cosines as a 3x3 matrix whose column c is the LPS direction of index axis c (i, j, k), "
    "e.g. numpy.eye(3) for an axial grid (or the 9 numbers of SimpleITK's GetDirection(), row by row)"
)


def _direction3x3(value: Any) -> np.ndarray:
    """A grid's direction cosines as a writable 3x3 float array (from a 3x3 matrix or 9 numbers row by row);
    :class:`GeometryError` naming the value and what to pass for anything else (text, a ragged or complex array, the
    wrong number of entries, NaN or infinite entries). Orthonormality is checked by :class:`Geometry`."""
    try:
        raw = np.asarray(value)
        if raw.dtype.kind in "USc":  # text, bytes, complex: no direction cosines, though numpy may convert them
            raise TypeError(raw.dtype)
        arr = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise GeometryError(f"direction must be a 3x3 matrix of numbers, got {described(value)}", fix=_DIRECTION_FIX) from None
    if arr.size != 9:
        raise GeometryError(f"direction must be a 3x3 matrix, got {described(value)}", fix=_DIRECTION_FIX)
    if not np.all(np.isfinite(arr)):
        raise GeometryError(
            f"direction must be a 3x3 matrix of finite numbers, got {arr.reshape(3, 3).tolist()}", fix=_DIRECTION_FIX
        )
    return arr.reshape(3, 3).copy()


def _points(values: np.ndarray | Sequence[float], what: str) -> np.ndarray:
    """``values`` as a float array whose last axis holds 3 coordinates; :class:`GeometryError` otherwise."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise GeometryError(
            f"{what} must be numbers, got {described(values)}",
            fix="pass one point as 3 numbers or n points as an (n, 3) array",
        ) from None
    if arr.ndim == 0 or arr.shape[-1] != 3:
        raise GeometryError(
            f"{what} must have 3 coordinates on their last axis, got shape {arr.shape}",
            fix="pass one point as 3 numbers or n points as an (n, 3) array",
        )
    return arr


def float3(values: Iterable[Any]) -> tuple[float, float, float]:
    """Exactly three floats from any iterable (ValueError when there are not three)."""
    a, b, c = (float(v) for v in values)
    return (a, b, c)


def int3(values: Iterable[Any]) -> tuple[int, int, int]:
    """Exactly three ints from any iterable (ValueError when there are not three)."""
    a, b, c = (int(v) for v in values)
    return (a, b, c)


def bool3(values: Iterable[Any]) -> tuple[bool, bool, bool]:
    """Exactly three bools from any iterable (ValueError when there are not three)."""
    a, b, c = (bool(v) for v in values)
    return (a, b, c)


@dataclass(frozen=True)
class Geometry:
    """Voxel grid in DICOM patient space (LPS, mm).

    Attributes
    ----------
    shape: array shape ``(nk, nj, ni)`` = (slices, rows, columns).
    spacing: voxel size ``(si, sj, sk)`` in mm, all > 0.
    origin: LPS position (mm) of the centre of voxel ``(i, j, k) = (0, 0, 0)``.
    direction: 3×3 orthonormal matrix, column c = LPS direction of index axis c.
    """

    shape: tuple[int, int, int]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    direction: np.ndarray = field(default_factory=lambda: np.eye(3))

    def __post_init__(self) -> None:
        shape = _shape3(self.shape)
        spacing = _as_vec3(self.spacing, "spacing")
        if min(spacing) <= 0:
            raise GeometryError(
                f"spacing must be > 0 mm on every axis, got {spacing}",
                fix="check PixelSpacing and the slice positions of the series",
            )
        direction = _direction3x3(self.direction)
        if not np.allclose(direction.T @ direction, np.eye(3), atol=DIRECTION_TOL):
            raise GeometryError(
                f"direction cosines are not orthonormal: {direction.tolist()}",
                fix="a sheared grid (e.g. gantry tilt) must be resampled before building a volume",
            )
        direction.setflags(write=False)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "spacing", spacing)
        object.__setattr__(self, "origin", _as_vec3(self.origin, "origin"))
        object.__setattr__(self, "direction", direction)

    def __eq__(self, other: object) -> bool:
        """The same grid exactly (see :meth:`same_grid` for a tolerance)."""
        if not isinstance(other, Geometry):
            return NotImplemented
        return (self.shape, self.spacing, self.origin) == (other.shape, other.spacing, other.origin) and bool(
            np.array_equal(self.direction, other.direction)
        )

    def __hash__(self) -> int:
        return hash((self.shape, self.spacing, self.origin, tuple(self.direction.ravel().tolist())))

    def __repr__(self) -> str:
        """One line, as a notebook echoes it: the shape ``[k, j, i]``, the spacing in mm along (i, j, k), the origin in
        LPS mm and, for an axis-aligned grid, the patient direction each index axis runs towards (``i→L j→P k→S`` for
        an LPS-ordered series, ``i→R j→A k→S`` for a NIfTI stored RAS); else the direction cosines row by row."""
        spacing = ", ".join(f"{v:g}" for v in self.spacing)
        origin = ", ".join(f"{v:g}" for v in self.origin)
        if np.allclose(np.abs(self.direction), np.round(np.abs(self.direction)), atol=DIRECTION_TOL):
            letters = ("RL", "AP", "IS")  # LPS axis x, y, z: (towards -, towards +)
            runs = " ".join(f"{n}→{letters[a][sign > 0]}" for n, (a, sign) in zip("ijk", self.axis_map()))
            direction = f"direction: {runs}"
        else:
            rows = ", ".join("(" + ", ".join(f"{v:g}" for v in row) + ")" for row in self.direction)
            direction = f"direction=({rows})"
        return f"Geometry(shape={self.shape} [k,j,i], spacing=({spacing}) mm [i,j,k], origin=({origin}) LPS mm, {direction})"

    # -- mappings ----------------------------------------------------------------
    @property
    def size_ijk(self) -> tuple[int, int, int]:
        """Number of voxels along (i, j, k)."""
        return (self.shape[2], self.shape[1], self.shape[0])

    @property
    def affine_lps(self) -> np.ndarray:
        """4×4 matrix mapping homogeneous ``(i, j, k, 1)`` to LPS mm."""
        aff = np.eye(4)
        aff[:3, :3] = self.direction * np.asarray(self.spacing)[None, :]
        aff[:3, 3] = self.origin
        return aff

    @property
    def affine_ras(self) -> np.ndarray:
        """4×4 matrix mapping ``(i, j, k, 1)`` to RAS mm (MONAI/NIfTI convention)."""
        return LPS_TO_RAS @ self.affine_lps

    def index_to_lps(self, ijk: np.ndarray | Sequence[float]) -> np.ndarray:
        """Map voxel indices ``(..., 3)`` in (i, j, k) order to LPS mm ``(..., 3)``."""
        ijk = _points(ijk, "voxel indices (i, j, k)")
        m = self.direction * np.asarray(self.spacing)[None, :]
        return ijk @ m.T + np.asarray(self.origin)

    def lps_to_index(self, lps: np.ndarray | Sequence[float]) -> np.ndarray:
        """Map LPS points ``(..., 3)`` in mm to continuous (i, j, k) indices."""
        lps = _points(lps, "LPS points (x, y, z) in mm")
        rel = lps - np.asarray(self.origin)
        return (rel @ self.direction) / np.asarray(self.spacing)

    # -- axes ----------------------------------------------------------------------
    def axis_map(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """For index axis c = 0 (i), 1 (j), 2 (k): the LPS axis (0=x, 1=y, 2=z) it runs along and its sign.

        Each index axis is read as the LPS axis of its largest direction cosine (the nearest
        axis-aligned reading of an oblique grid). Raises :class:`GeometryError` when two index
        axes would read as the same LPS axis (a grid rotated by about 45°).
        """
        out = []
        for c in range(3):
            col = self.direction[:, c]
            a = int(np.argmax(np.abs(col)))
            out.append((a, 1 if col[a] > 0 else -1))
        if sorted(a for a, _ in out) != [0, 1, 2]:
            raise GeometryError(
                f"direction {self.direction.tolist()} has no axis-aligned reading",
                fix="resample the volume onto an axis-aligned grid first",
            )
        return (out[0], out[1], out[2])

    def descending_axes(self) -> tuple[bool, bool, bool]:
        """For index axis i, j, k: whether it runs towards decreasing LPS (of its nearest axis-aligned reading,
        :meth:`axis_map`). A grid with no axis-aligned reading has none."""
        try:
            amap = self.axis_map()
        except GeometryError:
            return (False, False, False)
        return (amap[0][1] < 0, amap[1][1] < 0, amap[2][1] < 0)

    def flipped(self, flips_ijk: Sequence[bool]) -> Geometry:
        """The grid of the array reversed (``np.flip``) along the index axes flagged in ``flips_ijk`` (i, j, k): the
        same voxel positions (LPS mm), counted from the other end of those axes."""
        flips = bool3(flips_ijk)
        corner = [n - 1 if f else 0 for n, f in zip(self.size_ijk, flips)]
        direction = self.direction * np.where(flips, -1.0, 1.0)[None, :]
        return self.with_(origin=tuple(self.index_to_lps(corner).reshape(3)), direction=direction)

    def array_axis(self, lps_axis: int) -> int:
        """The array axis (0..2 of ``[k, j, i]``) that runs most nearly along LPS axis ``lps_axis`` (0=x, 1=y, 2=z).

        ``array_axis(2)`` is the slice axis of an axial series (0 for an axial ``[k, j, i]`` array).
        """
        if lps_axis not in (0, 1, 2):
            raise GeometryError(f"lps_axis must be 0 (x), 1 (y) or 2 (z), got {lps_axis!r}")
        c = int(np.argmax(np.abs(self.direction[lps_axis, :])))  # index axis c of (i, j, k)
        return 2 - c

    def lps_coordinate(self, lps_axis: int) -> np.ndarray:
        """LPS coordinate ``lps_axis`` (0=x, 1=y, 2=z) in mm of every voxel, as an array that broadcasts to ``shape``.

        Exact for oblique grids; the result has shape ``shape`` only where the axis is oblique,
        otherwise one or two of its dimensions are 1.
        """
        if lps_axis not in (0, 1, 2):
            raise GeometryError(f"lps_axis must be 0 (x), 1 (y) or 2 (z), got {lps_axis!r}")
        m = self.direction * np.asarray(self.spacing)[None, :]
        nk, nj, ni = self.shape
        total = np.asarray(self.origin[lps_axis], dtype=np.float64).reshape(1, 1, 1)
        for c, n, shape in ((0, ni, (1, 1, ni)), (1, nj, (1, nj, 1)), (2, nk, (nk, 1, 1))):
            if m[lps_axis, c] != 0.0:
                total = total + m[lps_axis, c] * np.arange(n, dtype=np.float64).reshape(shape)
        return total

    def contains_lps(self, lps: np.ndarray | Sequence[float]) -> np.ndarray:
        """For LPS points ``(..., 3)`` (mm), whether each lies within the grid's voxels (``(...)`` bool): within
        half a voxel beyond the first and last voxel centres along i, j and k."""
        ijk = self.lps_to_index(lps)
        return np.all((ijk >= -0.5) & (ijk <= np.asarray(self.size_ijk) - 0.5), axis=-1)

    def centroid_lps(self, mask: Any) -> np.ndarray:
        """Centre of mass (LPS mm, shape ``(3,)``) of the true (non-zero) voxels of ``mask``: an array ``[k, j, i]`` of
        this grid's shape, or a label map on this grid (a :class:`~pipeline.volume.LabelMap`, e.g.
        ``reconstruct(vol).masks["lung_left"]``: its labelled voxels)."""
        grid = getattr(mask, "geometry", None)
        if isinstance(grid, Geometry) and hasattr(mask, "array"):
            if not grid.same_grid(self):
                raise GeometryError(
                    f"the label map lies on another grid (shape {grid.shape}, origin {grid.origin} mm) than this one "
                    f"(shape {self.shape}, origin {self.origin} mm)",
                    fix="take the centroid on the label map's own grid: labels.geometry.centroid_lps(labels)",
                )
            mask = mask.array
        mask = np.asarray(mask)
        if mask.shape != self.shape:
            raise GeometryError(f"mask shape {mask.shape} is not the grid's shape {self.shape}")
        idx = np.argwhere(mask)
        if idx.size == 0:
            raise GeometryError("the mask is empty: an empty region has no centroid")
        return self.index_to_lps(idx[:, ::-1].mean(axis=0))

    def to_lps_view(self, array: np.ndarray) -> np.ndarray:
        """View of ``array [k, j, i]`` as ``[z, y, x]`` with LPS coordinates ascending along each axis.

        No copy: transposes and flips only (the nearest axis-aligned reading for oblique grids,
        see :meth:`axis_map`). The view's voxel ``[0, 0, 0]`` lies at the LPS minimum corner of
        :meth:`bounds_lps` (exactly for axis-aligned grids).
        """
        amap = self.axis_map()
        # view dim (2 - a) takes array dim (2 - c) for index axis c running along LPS axis a
        perm = [0, 0, 0]
        for c, (a, _) in enumerate(amap):
            perm[2 - a] = 2 - c
        view = array.transpose(perm)
        for a, sign in amap:
            if sign < 0:
                view = np.flip(view, axis=2 - a)
        return view

    def lps_view_index(self, ijk: np.ndarray | Sequence[float]) -> np.ndarray:
        """Indices ``(n, 3)`` (i, j, k) of this grid as indices ``(n, 3)`` (x, y, z) of :meth:`to_lps_view`'s array
        (fractional indices stay fractional)."""
        src = np.asarray(ijk, dtype=np.float64).reshape(-1, 3)
        out = np.zeros_like(src)
        for c, (a, sign) in enumerate(self.axis_map()):
            out[:, a] = src[:, c] if sign > 0 else (self.size_ijk[c] - 1) - src[:, c]
        return out

    def view_plane_slices(self) -> np.ndarray | None:
        """For each axial plane z of :meth:`to_lps_view` (inferior to superior), the slice index k it is; ``None``
        when the slices do not run along the patient's long axis (LPS z), so that no axial plane is one slice."""
        amap = self.axis_map()
        if amap[2][0] != 2:
            return None
        k = np.arange(self.size_ijk[2])
        return k if amap[2][1] > 0 else k[::-1]

    def from_lps_view(self, view: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_lps_view`: an ``[z, y, x]`` LPS-ascending array back in this grid's ``[k, j, i]`` order."""
        amap = self.axis_map()
        for a, sign in amap:
            if sign < 0:
                view = np.flip(view, axis=2 - a)
        perm = [0, 0, 0]
        for c, (a, _) in enumerate(amap):
            perm[2 - c] = 2 - a
        return view.transpose(perm)

    def spacing_lps(self) -> tuple[float, float, float]:
        """Voxel size (mm) along LPS x, y, z in the axis-aligned reading of :meth:`axis_map`."""
        out = [0.0, 0.0, 0.0]
        for c, (a, _) in enumerate(self.axis_map()):
            out[a] = self.spacing[c]
        return (out[0], out[1], out[2])

    def bounds_lps(self) -> tuple[np.ndarray, np.ndarray]:
        """Axis-aligned LPS box (min, max) in mm enclosing all voxel centres."""
        ni, nj, nk = self.size_ijk
        corners = np.array([[i, j, k] for i in (0, ni - 1) for j in (0, nj - 1) for k in (0, nk - 1)])
        pts = self.index_to_lps(corners)
        return pts.min(axis=0), pts.max(axis=0)

    def with_(self, **changes: Any) -> Geometry:
        """A copy with some fields replaced (validated again)."""
        unknown = sorted(set(changes) - {"shape", "spacing", "origin", "direction"})
        if unknown:
            raise GeometryError(
                f"Geometry has no field {', '.join(map(repr, unknown))}",
                fix="replace one of shape, spacing, origin or direction, e.g. geometry.with_(spacing=(1.0, 1.0, 2.0))",
            )
        values: dict[str, Any] = {
            "shape": self.shape,
            "spacing": self.spacing,
            "origin": self.origin,
            "direction": self.direction,
        }
        values.update(changes)
        return Geometry(**values)

    def resampled(self, spacing: float | Sequence[float]) -> Geometry:
        """The grid covering the same extent with a new ``spacing`` in mm: 3 numbers along (i, j, k), or one number
        for isotropic voxels (``2`` is ``(2, 2, 2)``, as MONAI's ``Spacing(pixdim=2)`` and TorchIO's
        ``Resample(2)`` take it).

        Voxel 0 keeps its position; the size along each axis is
        ``max(1, round(n * old / new))``.
        """
        new = _spacing3(spacing)
        if min(new) <= 0:
            raise GeometryError(
                f"the new spacing must be > 0 mm on every axis (i, j, k), got {spacing!r}",
                fix="pass the voxel size wanted in mm, e.g. 1.0 (isotropic) or (1.0, 1.0, 1.0) along (i, j, k)",
            )
        size = [max(1, int(round(n * s / t))) for n, s, t in zip(self.size_ijk, self.spacing, new)]
        return self.with_(shape=(size[2], size[1], size[0]), spacing=new)

    def binned(self, step_kji: Sequence[int]) -> Geometry:
        """The grid of blocks of ``step`` voxels along k, j, i (the last block of an axis may be partial): the spacing
        (mm) grows by the step and voxel 0 lies at the centre of the first block."""
        try:
            steps = tuple(step_kji)
            real = all(isinstance(s, numbers.Real) and not isinstance(s, bool) for s in steps)  # not text, not True
            whole = len(steps) == 3 and real and all(float(s) == int(s) >= 1 for s in steps)
        except (TypeError, ValueError, OverflowError):
            whole = False
        if not whole:
            raise GeometryError(
                f"steps must be 3 whole numbers of voxels, 1 or more, along k, j, i; got {described(step_kji)}",
                fix="pass one step per array axis [k, j, i], e.g. (1, 2, 2)",
            )
        sk, sj, si = (int(s) for s in steps)
        nk, nj, ni = self.shape
        spacing = (self.spacing[0] * si, self.spacing[1] * sj, self.spacing[2] * sk)
        origin = self.index_to_lps([(si - 1) / 2.0, (sj - 1) / 2.0, (sk - 1) / 2.0]).reshape(3)
        return self.with_(shape=(-(-nk // sk), -(-nj // sj), -(-ni // si)), spacing=spacing, origin=origin)

    def cropped(self, lo_ijk: Sequence[int], hi_ijk: Sequence[int]) -> Geometry:
        """The sub-grid ``lo <= (i, j, k) < hi`` (indices clipped to the grid)."""
        lo, hi = clip_box(self.size_ijk, lo_ijk, hi_ijk)
        origin = self.index_to_lps(lo)
        return self.with_(shape=(hi[2] - lo[2], hi[1] - lo[1], hi[0] - lo[0]), origin=origin)

    def same_grid(self, other: Geometry, *, atol: float = 1e-4) -> bool:
        """True when both grids have equal shape and equal geometry within ``atol`` mm."""
        return (
            self.shape == other.shape
            and np.allclose(self.spacing, other.spacing, atol=atol)
            and np.allclose(self.origin, other.origin, atol=atol)
            and np.allclose(self.direction, other.direction, atol=atol)
        )

    def to_json(self) -> dict[str, Any]:
        """The grid as JSON: ``shape`` [nk, nj, ni], ``spacing`` [si, sj, sk] mm, ``origin`` LPS mm, ``direction`` the
        9 direction cosines row by row (SimpleITK's ``GetDirection()`` order: column c is index axis c in LPS)."""
        return {
            "shape": list(self.shape),
            "spacing": list(self.spacing),
            "origin": list(self.origin),
            "direction": self.direction.reshape(-1).tolist(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Geometry:
        """The grid :meth:`to_json` wrote (validated as any new grid)."""
        return cls(
            shape=tuple(data["shape"]),
            spacing=tuple(data["spacing"]),
            origin=tuple(data["origin"]),
            direction=np.asarray(data["direction"], dtype=np.float64).reshape(3, 3),
        )


def clip_box(size_ijk: Sequence[int], lo: Sequence[int], hi: Sequence[int]) -> tuple[list[int], list[int]]:
    """The box ``lo <= (i, j, k) < hi`` clipped to a grid of ``size_ijk`` voxels, as ``(lo, hi)`` lists of (i, j, k);
    :class:`GeometryError` when a corner is not 3 indices or nothing of the box is left."""
    try:
        if any(float(v) != round(float(v)) for v in (*lo, *hi)):  # 1.5 would silently become voxel 1
            raise ValueError("not whole voxel indices")
        lo, hi = int3(lo), int3(hi)
    except (TypeError, ValueError) as exc:
        raise GeometryError(
            f"a box's corners must be 3 whole voxel indices (i, j, k) each, got lo={lo!r} hi={hi!r}",
            fix="pass lo=(i0, j0, k0) and hi=(i1, j1, k1): column, row, slice, the reverse of the array's [k, j, i] order",
        ) from exc
    lo_c = [int(max(0, min(int(a), n))) for a, n in zip(lo, size_ijk)]
    hi_c = [int(max(0, min(int(b), n))) for b, n in zip(hi, size_ijk)]
    if any(b <= a for a, b in zip(lo_c, hi_c)):
        raise GeometryError(f"empty crop box lo={list(lo)} hi={list(hi)} for a grid of size (i, j, k)={list(size_ijk)}")
    return lo_c, hi_c
