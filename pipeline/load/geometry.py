"""Where each voxel of a model input lies in the patient: index (x, y, z) → LPS mm and back.

The model input is built from a cached volume (array ``[k, j, i]``, geometry in LPS)
by the same steps as MONAI's ``Orientationd(axcodes="RAS")`` → ``Spacingd(pixdim)``
→ ``DivisiblePadd`` (plus an optional crop). This module plans those steps for one
case and records them in an :class:`InputGeometry`, which maps any voxel index of the
model input tensor back to DICOM patient coordinates (LPS, mm) and forward again.

Resampling is defined exactly as MONAI's ``Spacing`` (``scale_extent=False``,
``align_corners=False``, border padding): along each model axis ``a`` the output
grid has ``round((n - 1) * s / t + 1)`` voxels, voxel ``q`` lies at the oriented
source index ``q * t / s``, and positions past the last voxel take the edge value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import LoaderError
from ..volume import LPS_TO_RAS, Geometry, bool3, float3, int3
from .spec import PreprocessSpec, Roi

__all__ = ["InputGeometry", "AxisPlan", "plan_input", "ras_orientation"]

#: MONAI's AFFINE_TOL: a source spacing this close (mm) to the target is kept as it is.
SPACING_TOL = 1e-3


def ras_orientation(geometry: Geometry) -> tuple[tuple[int, int, int], tuple[bool, bool, bool]]:
    """Which source index axis (0=i, 1=j, 2=k) becomes RAS axis x, y, z, and whether it is reversed.

    The closest RAS axis is chosen for every index axis, largest direction cosine
    first (as nibabel's ``io_orientation``, which MONAI's ``Orientation`` uses).
    """
    ras = LPS_TO_RAS[:3, :3] @ geometry.direction  # column c: RAS direction of index axis c
    order = np.argsort(-np.abs(ras), axis=None, kind="stable")
    src_axis = [-1, -1, -1]
    flip = [False, False, False]
    used_c: set[int] = set()
    for flat in order:
        w, c = divmod(int(flat), 3)
        if src_axis[w] >= 0 or c in used_c:
            continue
        src_axis[w] = c
        flip[w] = bool(ras[w, c] < 0)
        used_c.add(c)
    return (src_axis[0], src_axis[1], src_axis[2]), (flip[0], flip[1], flip[2])


class AxisPlan(NamedTuple):
    """How model axis ``a`` is sampled from source index axis ``src_axis``.

    Tensor voxels ``valid_lo <= p < valid_hi`` hold image data sampled at source index
    ``src(p) = n_src - 1 - (p + anchor) * ratio`` if ``flip`` else ``(p + anchor) * ratio``
    (clamped to ``[0, n_src - 1]``); the others hold the pad value.
    """

    src_axis: int
    n_src: int
    flip: bool
    ratio: float
    anchor: int
    size: int
    valid_lo: int
    valid_hi: int

    def positions(self) -> np.ndarray:
        """Continuous source indices (float64) of the valid tensor voxels, unclamped."""
        q = np.arange(self.valid_lo, self.valid_hi, dtype=np.float64) + self.anchor
        o = q * self.ratio
        return (self.n_src - 1) - o if self.flip else o


@dataclass(frozen=True, eq=False)
class InputGeometry:
    """Geometry of one model input tensor ``(C, X, Y, Z)`` (RAS axis order).

    Attributes
    ----------
    source: the cached volume's grid (LPS, mm; array ``[k, j, i]``).
    src_axis: source index axis (0=i, 1=j, 2=k) feeding model axis x, y, z.
    flip: whether model axis x, y, z runs against its source index axis.
    spacing: voxel size of the model input along x, y, z in mm.
    resampled_shape: size of the full resampled grid (before pad/crop) along x, y, z.
    anchor: resampled-grid index of tensor voxel 0 along x, y, z (negative = padding before).
    shape: spatial size ``(X, Y, Z)`` of the tensor.
    """

    source: Geometry
    src_axis: tuple[int, int, int]
    flip: tuple[bool, bool, bool]
    spacing: tuple[float, float, float]
    resampled_shape: tuple[int, int, int]
    anchor: tuple[int, int, int]
    shape: tuple[int, int, int]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputGeometry):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    # -- per-axis sampling plan -------------------------------------------------------------
    @property
    def ratio(self) -> tuple[float, float, float]:
        """Source voxels per model voxel along x, y, z (``spacing / source spacing``)."""
        sp = self.source.spacing
        return float3(self.spacing[a] / sp[self.src_axis[a]] for a in range(3))

    def axis(self, a: int) -> AxisPlan:
        """The sampling plan of model axis ``a`` (0=x, 1=y, 2=z)."""
        c = self.src_axis[a]
        anchor, size, n_res = self.anchor[a], self.shape[a], self.resampled_shape[a]
        lo, hi = max(0, -anchor), min(size, n_res - anchor)
        return AxisPlan(c, self.source.size_ijk[c], self.flip[a], self.ratio[a], anchor, size, lo, max(lo, hi))

    @property
    def valid_box(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Tensor index box ``lo <= (x, y, z) < hi`` that holds image data (the rest is padding)."""
        plans = [self.axis(a) for a in range(3)]
        return int3(p.valid_lo for p in plans), int3(p.valid_hi for p in plans)

    # -- mappings -----------------------------------------------------------------------------
    @property
    def index_matrix(self) -> np.ndarray:
        """4×4 matrix mapping homogeneous tensor index ``(x, y, z, 1)`` to source index ``(i, j, k, 1)``."""
        m = np.zeros((4, 4))
        m[3, 3] = 1.0
        for a in range(3):
            p = self.axis(a)
            if p.flip:
                m[p.src_axis, a] = -p.ratio
                m[p.src_axis, 3] = (p.n_src - 1) - p.anchor * p.ratio
            else:
                m[p.src_axis, a] = p.ratio
                m[p.src_axis, 3] = p.anchor * p.ratio
        return m

    @property
    def affine_lps(self) -> np.ndarray:
        """4×4 matrix: tensor index ``(x, y, z, 1)`` → LPS mm."""
        return self.source.affine_lps @ self.index_matrix

    @property
    def affine_ras(self) -> np.ndarray:
        """4×4 matrix: tensor index ``(x, y, z, 1)`` → RAS mm (MONAI's ``MetaTensor.affine``)."""
        return LPS_TO_RAS @ self.affine_lps

    def input_index_to_lps(self, idx: np.ndarray | Sequence[float]) -> np.ndarray:
        """Tensor voxel indices ``(N, 3)`` (or ``(3,)``) in (x, y, z) order → LPS mm, same shape."""
        idx = np.asarray(idx, dtype=np.float64)
        aff = self.affine_lps
        return idx @ aff[:3, :3].T + aff[:3, 3]

    def lps_to_input_index(self, lps: np.ndarray | Sequence[float]) -> np.ndarray:
        """LPS points ``(N, 3)`` (or ``(3,)``) in mm → continuous tensor indices (x, y, z)."""
        lps = np.asarray(lps, dtype=np.float64)
        aff = self.affine_lps
        return (lps - aff[:3, 3]) @ np.linalg.inv(aff[:3, :3]).T

    #: Short names (network-input voxel ``(x, y, z)`` ↔ LPS mm), as the detector's scripts use them.
    xyz_to_lps = input_index_to_lps
    lps_to_xyz = lps_to_input_index

    def input_boxes_to_lps(self, boxes: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Boxes ``(N, 6)`` ``[x0, y0, z0, x1, y1, z1]`` in tensor index coordinates → LPS boxes ``(N, 6)``.

        Box corners are continuous voxel indices (voxel centres at integers, as MONAI's
        ``AffineBoxToWorldCoordinate`` treats them). The result is the axis-aligned LPS box
        ``[l0, p0, s0, l1, p1, s1]`` (mm, min corner then max corner) enclosing the 8 corners.
        """
        return _map_boxes(np.asarray(boxes, dtype=np.float64), self.input_index_to_lps)

    def lps_boxes_to_input(self, boxes: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """LPS boxes ``(N, 6)`` (mm, min then max corner) → tensor index boxes ``[x0, y0, z0, x1, y1, z1]``."""
        return _map_boxes(np.asarray(boxes, dtype=np.float64), self.lps_to_input_index)

    def input_index_to_source_index(self, idx: np.ndarray | Sequence[float]) -> np.ndarray:
        """Tensor voxel indices (x, y, z) → continuous source indices (i, j, k) of the cached array."""
        idx = np.asarray(idx, dtype=np.float64)
        m = self.index_matrix
        return idx @ m[:3, :3].T + m[:3, 3]

    @property
    def geometry(self) -> Geometry:
        """The model input grid as a :class:`Geometry` (LPS): its index (i, j, k) is tensor (x, y, z).

        An array ``tensor[0].permute(2, 1, 0)`` (i.e. ``[z, y, x]``) on this grid is a
        regular ``[k, j, i]`` volume, e.g. to wrap a model output as a ``LabelMap``.
        """
        aff = self.affine_lps
        sp = np.asarray(self.spacing)
        return Geometry(
            shape=(self.shape[2], self.shape[1], self.shape[0]),
            spacing=self.spacing,
            origin=tuple(aff[:3, 3]),
            direction=aff[:3, :3] / sp[None, :],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.to_json(),
            "src_axis": list(self.src_axis),
            "flip": list(self.flip),
            "spacing": list(self.spacing),
            "resampled_shape": list(self.resampled_shape),
            "anchor": list(self.anchor),
            "shape": list(self.shape),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputGeometry:
        return cls(
            source=Geometry.from_json(data["source"]),
            src_axis=int3(data["src_axis"]),
            flip=bool3(data["flip"]),
            spacing=float3(data["spacing"]),
            resampled_shape=int3(data["resampled_shape"]),
            anchor=int3(data["anchor"]),
            shape=int3(data["shape"]),
        )


def _map_boxes(boxes: np.ndarray, fn: Any) -> np.ndarray:
    boxes = boxes.reshape(-1, 6)
    sel = np.array([[a, b, c] for a in (0, 3) for b in (1, 4) for c in (2, 5)])  # 8 corners
    corners = boxes[:, sel]  # (N, 8, 3)
    mapped = fn(corners.reshape(-1, 3)).reshape(-1, 8, 3)
    return np.concatenate([mapped.min(axis=1), mapped.max(axis=1)], axis=1)


def _target_spacing(src: float, target: float | None) -> float:
    if target is None or abs(src - target) <= SPACING_TOL:
        return src
    return float(target)


def _roi_range(
    source: Geometry,
    roi: Roi,
    src_axis: Sequence[int],
    flip: Sequence[bool],
    spacing: Sequence[float],
    n_res: Sequence[int],
    case: str,
) -> tuple[list[int], list[int]]:
    lo_c, hi_c = np.minimum(roi.lo, roi.hi), np.maximum(roi.lo, roi.hi)
    corners = np.array([[x, y, z] for x in (lo_c[0], hi_c[0]) for y in (lo_c[1], hi_c[1]) for z in (lo_c[2], hi_c[2])])
    ijk = source.lps_to_index(corners) if roi.space == "lps" else corners
    lo, hi = [], []
    for a in range(3):
        c = src_axis[a]
        n = source.size_ijk[c]
        o = (n - 1) - ijk[:, c] if flip[a] else ijk[:, c]
        q = o * source.spacing[c] / spacing[a]
        grow = roi.margin_mm / spacing[a]
        q0 = max(0, math.floor(q.min() - grow + 1e-6))
        q1 = min(n_res[a], math.ceil(q.max() + grow - 1e-6) + 1)
        if q1 <= q0:
            raise LoaderError(
                f"the ROI {roi.to_json()} lies outside the image along model axis {'xyz'[a]}",
                where=f"case {case}",
                fix="pass an ROI in LPS mm (space='lps') or source voxel indices (space='index') inside the volume",
            )
        lo.append(q0)
        hi.append(q1)
    return lo, hi


def plan_input(source: Geometry, spec: PreprocessSpec, *, roi: Roi | None = None, case: str = "?") -> InputGeometry:
    """Plan the model input of a volume on ``source`` (LPS) under ``spec``; ``roi`` overrides ``spec.roi``."""
    src_axis, flip = ras_orientation(source)
    spacing, n_res = [], []
    for a in range(3):
        c = src_axis[a]
        s, n = source.spacing[c], source.size_ijk[c]
        t = _target_spacing(s, spec.spacing[a])
        spacing.append(t)
        n_res.append(max(1, int(np.round((n - 1) * s / t + 1.0))))
    roi = roi if roi is not None else spec.roi
    if roi is not None:
        lo, hi = _roi_range(source, roi, src_axis, flip, spacing, n_res, case)
    else:
        lo, hi = [0, 0, 0], list(n_res)
    anchor, shape = [], []
    for a in range(3):
        length = hi[a] - lo[a]
        d = spec.size_divisible[a]
        padded = int(math.ceil(length / d) * d)
        before = (padded - length) // 2 if spec.pad_method == "symmetric" else 0
        anchor.append(lo[a] - before)
        shape.append(padded)
    return InputGeometry(
        source=source,
        src_axis=src_axis,
        flip=flip,
        spacing=(spacing[0], spacing[1], spacing[2]),
        resampled_shape=(n_res[0], n_res[1], n_res[2]),
        anchor=(anchor[0], anchor[1], anchor[2]),
        shape=(shape[0], shape[1], shape[2]),
    )
