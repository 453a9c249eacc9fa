"""Nodule segmentation inside a detector finding's box (LPS mm) → mask, volume (mm³), equivalent diameter.

Per finding: crop the volume around the box, take the half-way threshold
between the nodule core (median HU near the box centre) and the surrounding
lung (median HU away from it), keep the component at the centre inside an
ellipsoid a little larger than the box, cut thin attachments (vessels) by an
opening with a ball whose size follows the box, and keep chest-wall tissue out with the
lung mask closed over the nodule (pleural nodules). The equivalent diameter is
that of the sphere with the nodule's volume.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from ..errors import ReconstructionError
from ..volume import CTVolume, Geometry
from . import morph

log = logging.getLogger(__name__)


@dataclass
class NoduleResult:
    """One segmented finding. ``mask`` is bool ``[k, j, i]`` on ``geometry`` (a crop of the volume's grid, LPS)."""

    index: int
    center_lps: tuple[float, float, float]
    volume_mm3: float | None = None
    diameter_mm: float | None = None
    centroid_lps: tuple[float, float, float] | None = None
    threshold_hu: float | None = None
    mask: np.ndarray | None = None
    geometry: Geometry | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "center_lps_mm": [round(float(v), 3) for v in self.center_lps],
            "volume_mm3": None if self.volume_mm3 is None else round(self.volume_mm3, 2),
            "equivalent_diameter_mm": None if self.diameter_mm is None else round(self.diameter_mm, 3),
            "centroid_lps_mm": None if self.centroid_lps is None else [round(float(v), 3) for v in self.centroid_lps],
            "threshold_hu": self.threshold_hu,
            "error": self.error,
        }


def _get(finding: Any, name: str) -> Any:
    if isinstance(finding, Mapping):
        return finding.get(name)
    return getattr(finding, name, None)


def finding_box(finding: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre, box min, box max) in LPS mm from a detector ``Finding`` or a mapping with the same keys.

    Accepts ``box_min_lps``/``box_max_lps`` (and optional ``center_lps``), or ``center_lps`` with ``diameter_mm``.
    """
    c, lo, hi = _get(finding, "center_lps"), _get(finding, "box_min_lps"), _get(finding, "box_max_lps")
    if lo is not None and hi is not None:
        lo_a = np.minimum(np.asarray(lo, float), np.asarray(hi, float))
        hi_a = np.maximum(np.asarray(lo, float), np.asarray(hi, float))
        centre = np.asarray(c, float) if c is not None else (lo_a + hi_a) / 2
        return centre, lo_a, hi_a
    d = _get(finding, "diameter_mm")
    if c is not None and d is not None and float(d) > 0:
        centre = np.asarray(c, float)
        return centre, centre - float(d) / 2, centre + float(d) / 2
    raise ReconstructionError(
        f"finding {finding!r} has no box",
        fix="give box_min_lps/box_max_lps (LPS mm), or center_lps with diameter_mm",
    )


def segment_nodule(volume: CTVolume, finding: Any, *, index: int = 0, lung_mask: np.ndarray | None = None) -> NoduleResult:
    """Segment the nodule of one finding (see the module notes). Errors are raised as ReconstructionError."""
    centre, lo, hi = finding_box(finding)
    g = volume.geometry
    size = hi - lo
    corners = np.array([[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])])
    idx = g.lps_to_index(corners)
    pad_vox = np.maximum(3, np.ceil(0.5 * (idx.max(0) - idx.min(0))))
    i0 = np.floor(idx.min(0) - pad_vox).astype(int)
    i1 = np.ceil(idx.max(0) + pad_vox).astype(int) + 1
    ni, nj, nk = g.size_ijk
    i0 = np.maximum(i0, 0)
    i1 = np.minimum(i1, [ni, nj, nk])
    if np.any(i1 - i0 < 2):
        raise ReconstructionError(f"finding box {lo.round(1).tolist()}..{hi.round(1).tolist()} mm lies outside the volume",
                                  fix="check that the findings belong to this series (LPS mm)")
    crop = volume.crop(i0.tolist(), i1.tolist())
    cg = crop.geometry
    hu = np.asarray(crop.array, dtype=np.float32)
    # normalised ellipsoid distance of every voxel from the box centre (1 on the box-inscribed ellipsoid)
    from .segment import lps_coordinate_grid

    half = np.maximum(size / 2, 0.5 * np.asarray(g.spacing))
    rho2 = sum(((lps_coordinate_grid(cg, a) - centre[a]) / half[a]) ** 2 for a in range(3))
    rho2 = np.broadcast_to(rho2, hu.shape)
    core_zone = rho2 <= 0.3**2
    if not core_zone.any():
        core_zone = rho2 <= rho2.min() + 1e-6
    core = float(np.median(hu[core_zone]))
    shell = (rho2 > 0.3**2) & (rho2 <= 0.6**2)
    if shell.any():  # a part-solid nodule: its ground-glass rim sets the level, not the solid core
        core = min(core, float(np.median(hu[shell])))
    lung_local = None
    if lung_mask is not None:
        k0, j0, i0_ = i0[2], i0[1], i0[0]
        lung_local = lung_mask[k0:k0 + cg.shape[0], j0:j0 + cg.shape[1], i0_:i0_ + cg.shape[2]]
    ring = rho2 >= 1.6**2
    bg_vals = hu[ring & (hu < core)]
    if lung_local is not None and (ring & lung_local).sum() > 10:
        bg_vals = hu[ring & lung_local]
    if bg_vals.size < 10:
        bg_vals = hu[hu < core]
    if bg_vals.size == 0:
        raise ReconstructionError("no darker lung tissue around the finding", fix="check the finding's box")
    bg = float(np.median(bg_vals))
    if core - bg < 50.0:
        raise ReconstructionError(f"no nodule in the box: centre {core:.0f} HU vs surroundings {bg:.0f} HU",
                                  fix="the finding may be a false positive")
    thr = 0.5 * (core + bg)
    cand = (hu > thr) & (rho2 <= 1.35**2)
    if lung_local is not None and lung_local.any():
        # lung closed over the nodule keeps the chest wall out while letting a pleural nodule in
        r_close = morph.radius_vox(0.6 * float(size.max()), cg.spacing)
        allowed = morph.erode(morph.closing(torch.from_numpy(np.ascontiguousarray(lung_local)), r_close), (1, 1, 1)).numpy()
        if (cand & allowed).any():
            cand &= allowed
    ball = _ball(0.28 * float(np.min(size)), cg.spacing)
    opened = _open_with_ball(cand, ball)
    comp = _component_at_centre(opened if opened.any() else cand, rho2)
    if comp is None:
        raise ReconstructionError("no nodule voxels near the finding's centre", fix="the finding may be a false positive")
    # a ball opening leaves a rounded nodule whole; give back its one-voxel rim, not the cut vessels
    grow = morph.dilate(torch.from_numpy(comp), (1, 1, 1)).numpy()
    nod = grow & cand
    nod = ndimage.binary_fill_holes(nod)
    voxel = float(np.prod(g.spacing))
    vol = float(nod.sum()) * voxel
    from .segment import centroid_lps

    return NoduleResult(
        index=index, center_lps=tuple(float(v) for v in centre), volume_mm3=vol,
        diameter_mm=float((6.0 * vol / np.pi) ** (1.0 / 3.0)), centroid_lps=tuple(float(v) for v in centroid_lps(nod, cg)),
        threshold_hu=round(thr, 1), mask=nod, geometry=cg,
    )


def _ball(radius_mm: float, spacing_ijk: tuple[float, float, float]) -> torch.Tensor:
    """Ellipsoidal kernel ``[k, j, i]`` of a ball of ``radius_mm`` on an anisotropic grid (float, 0/1)."""
    si, sj, sk = spacing_ijk
    rk, rj, ri = (max(0, int(np.floor(radius_mm / s))) for s in (sk, sj, si))
    k, j, i = np.ogrid[-rk:rk + 1, -rj:rj + 1, -ri:ri + 1]
    ball = (k * sk) ** 2 + (j * sj) ** 2 + (i * si) ** 2 <= radius_mm**2
    return torch.from_numpy(ball.astype(np.float32))


def _open_with_ball(mask: np.ndarray, ball: torch.Tensor) -> np.ndarray:
    """Morphological opening with a ball (two 3-D convolutions): removes what the ball cannot fit in."""
    if ball.numel() <= 1:
        return mask
    pad = tuple(s // 2 for s in ball.shape)
    w = ball[None, None]
    x = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))[None, None]
    eroded = (F.conv3d(x, w, padding=pad) >= float(ball.sum()) - 0.5).to(torch.float32)
    return (F.conv3d(eroded, w, padding=pad) > 0.5)[0, 0].numpy()


def _component_at_centre(mask: np.ndarray, rho2: np.ndarray) -> np.ndarray | None:
    labels, n = ndimage.label(mask, structure=morph.CONN6)
    if n == 0:
        return None
    near = labels[(rho2 <= 0.5**2) & (labels > 0)]
    if near.size == 0:
        return None
    best = np.bincount(near).argmax()
    return labels == best


def segment_findings(volume: CTVolume, findings: Sequence[Any], *, lung_mask: np.ndarray | None = None) -> list[NoduleResult]:
    """Segment every finding; a finding that fails gets its ``error`` set and the others go on."""
    out = []
    for n, f in enumerate(findings):
        try:
            out.append(segment_nodule(volume, f, index=n, lung_mask=lung_mask))
        except ReconstructionError as exc:
            centre = _get(f, "center_lps")
            c = tuple(float(v) for v in centre) if centre is not None else (float("nan"),) * 3
            out.append(NoduleResult(index=n, center_lps=c, error=str(exc)))  # type: ignore[arg-type]
            log.warning("nodule %d: %s", n, exc)
    return out
