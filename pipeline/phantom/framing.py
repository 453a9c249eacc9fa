"""Where the scanner looks at a confounded phantom: the scanned z-range and the in-plane field of view.

The anatomy keeps its size: it is drawn for the field of view asked for,
``matrix * pixel_spacing`` mm (:func:`draw_layout`'s scale), as the plain
phantom's, and is not compressed along z. The image grid then crops it:
in-plane by the reconstruction field of view, ``fov_factor`` of that one
(the matrix stays, so pixels are ``fov_factor * pixel_spacing``: a zoomed
reconstruction), centred on the body or on one lung; along z by the
coverage, chosen relative to the lungs (apex at ``u = +1``, deepest
costophrenic recess at ``u = -1``; LPS mm).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .confounders import Confounders
from .layout import NOMINAL_FOV_MM, Layout, draw_layout
from .scanner import CanonicalGrid

MIN_SLICES = 8


def _z_range(layout: Layout, coverage: str, rng: np.random.Generator) -> tuple[float, float]:
    """(bottom, top) of the scanned range (LPS z, mm) for a coverage."""
    s = layout.scale
    U = rng.uniform
    apex, base = layout.z_of_u(1.0), layout.z_of_u(-1.0)
    if coverage == "full":
        return base - U(40.0, 70.0) * s, apex + U(10.0, 25.0) * s
    if coverage == "chest_only":
        return base - U(3.0, 10.0) * s, apex + U(5.0, 15.0) * s
    if coverage == "apices_cut":
        return base - U(10.0, 40.0) * s, layout.z_of_u(U(0.5, 0.8))
    if coverage == "bases_only":
        top = layout.z_of_u(U(-0.5, -0.2))
    else:  # abdomen_only
        top = base - U(10.0, 30.0) * s
    return top - U(180.0, 240.0) * s, top


def frame(
    r_layout: np.random.Generator,
    r_frame: np.random.Generator,
    conf: Confounders,
    *,
    matrix: int,
    pixel_spacing: float,
    slice_spacing: float,
    slices: int | None,
    max_slices: int,
) -> tuple[CanonicalGrid, Layout, dict[str, Any]]:
    """The canonical grid and the anatomy layout of a confounded case, and what they record.

    ``r_layout`` draws the anatomy in the same order as the plain phantom
    (z centre, in-plane offset, then :func:`draw_layout`). ``slices=None``
    covers the coverage's range (at most ``max_slices``, keeping its top); an
    explicit count keeps the anatomy's size and is centred on the range for
    ``full`` and ``chest_only``, anchored at its top otherwise.
    """
    anatomy_fov = matrix * float(pixel_spacing)
    ps, ss = float(pixel_spacing) * conf.fov_factor, float(slice_spacing)
    fov = matrix * ps
    s = anatomy_fov / NOMINAL_FOV_MM
    z_center = float(np.round(r_layout.uniform(-260.0, -120.0), 1))
    fx, fy = r_layout.uniform(-4.0, 4.0, 2) * s
    layout = draw_layout(r_layout, fov_mm=anatomy_fov, pixel=ps, scan_length_mm=math.inf, z_center=z_center)
    cx = fx + {"body": 0.0, "left_lung": 0.55 * layout.cav_a, "right_lung": -0.55 * layout.cav_a}[conf.fov_centre]
    xs = (np.arange(matrix) - (matrix - 1) / 2.0) * ps + cx
    ys = (np.arange(matrix) - (matrix - 1) / 2.0) * ps + fy
    bottom, top = _z_range(layout, conf.coverage, r_frame)
    anchored_top = conf.coverage not in ("full", "chest_only")
    if slices is None:
        nz = int(math.ceil((top - bottom) / ss)) + 1
        anchored_top = nz > max_slices
        nz = int(min(max(nz, MIN_SLICES), max_slices))
    else:
        nz = int(slices)
    if anchored_top:
        zs = top - (nz - 1 - np.arange(nz)) * ss
    else:
        zs = 0.5 * (top + bottom) + (np.arange(nz) - (nz - 1) / 2.0) * ss
    grid = CanonicalGrid(xs=xs, ys=ys, zs=zs, pixel_spacing=ps, slice_spacing=ss)
    record = {
        "fov_mm": round(fov, 2),
        "anatomy_fov_mm": round(anatomy_fov, 2),
        "patient_width_mm": round(2.0 * layout.body_a, 1),
        "scan_z_mm": [round(float(zs[0]), 2), round(float(zs[-1]), 2)],
        "lung_z_mm": [round(layout.z_of_u(-1.0), 2), round(layout.z_of_u(1.0), 2)],
    }
    return grid, layout, record


def lung_fraction_in_scan(layout: Layout, z_lo: float, z_hi: float, step_mm: float | None = None) -> float:
    """Share (0..1) of the pleural cavities' volume (:meth:`Layout.in_lung`) between heights ``z_lo`` and ``z_hi`` (mm).

    Evaluated on a coarse grid over the whole chest (about 3 mm at adult size).
    """
    step = step_mm or max(3.0 * layout.scale, 1.0)
    xs = np.arange(-layout.cav_a, layout.cav_a + step, step)
    ys = np.arange(-layout.cav_b_ant, layout.cav_b_post + step, step)
    zs = np.arange(layout.z_of_u(-1.0), layout.z_of_u(1.0) + step, step)
    inside = layout.in_lung(xs[None, None, :], ys[None, :, None], zs[:, None, None])
    per_z = inside.sum(axis=(1, 2)).astype(np.float64)
    total = per_z.sum()
    if total == 0:
        return 0.0
    keep = (zs >= z_lo) & (zs <= z_hi)
    return float(per_z[keep].sum() / total)
