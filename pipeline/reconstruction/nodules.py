"""Nodule segmentation inside a detector finding's box (LPS mm) → mask, volume (mm³), equivalent diameter.

Per finding, on a crop around the box:

1. Levels. The lung parenchyma level is the median of the dark (< -600 HU)
   voxels outside the box-inscribed ellipsoid (inside the lung mask when one
   is given; on a tilt-corrected grid, never the unmeasured wedge, lung mask or
   not: :func:`~pipeline.ingest.measured.measured_mask` of the crop). The nodule level comes from its interior: when a fair share of
   it is ground glass (below ``SOLID_HU``) the ground-glass level is used, so
   a part-solid nodule is measured to its ground-glass edge, not its core.
   The ground-glass level is the mode of the ground-glass HU histogram.
2. Boundary. Intensity profiles along rays from the box centre in evenly
   spread directions (sub-voxel, trilinear) give where the intensity first
   falls below a threshold. The first threshold is half-way between the two
   levels (the edge of a blurred step). Blurring a convex object moves that
   half-way surface inwards by about ``sigma²/R`` (edge width ``sigma``,
   radius ``R``: a 6 mm nodule loses 10-25% of its volume at 1.25 mm
   slices), so the threshold is then lowered to about the value a blurred
   ball has at its surface, ``1/2 - K_CURV·sigma/R`` of the step, with
   ``sigma`` measured on the nodule's own edge (the 25-75% rise) and ``R``
   its median ray length, and the rays are read again.
   Around a ground-glass nodule, a ray is not used when it ends next to
   solid tissue (a vessel or the chest wall, within ``SOLID_NEAR_MM``) or
   runs into solid tissue again after the ground glass: the blur of the
   denser neighbour lifts the ground glass's edge outwards there.
3. Shape prior. A smooth star-shaped surface, radius ``r(u)`` = real
   spherical harmonics of degree ≤ 2 in the direction ``u``, is fitted to the
   ray lengths by one-sided trimmed least squares: rays that run on into an
   attached vessel or into the chest wall (same HU as a solid nodule) come out
   far too long and are dropped, so attachments are cut where the nodule's own
   surface continues. The surface's departures from a sphere are weakly
   penalised, so directions where every ray was dropped (a vessel through
   the nodule, a broad pleural contact) follow the sphere of the kept rays
   instead of an unconstrained extrapolation.
4. Mask. Voxels above the threshold, inside the fitted surface and
   connected to the centre. The equivalent diameter is that of the
   sphere with the nodule's volume.

A finding whose centre lies in a tilt-corrected grid's unmeasured wedge is refused as outside the scanned field
(the rays from it stop at once), saying where.

Where no edge lies in or near the finding's box (a box much smaller than its
nodule), steps 1-4 are done again in a box grown around the finding's centre
by each factor of ``BOX_GROWTH`` in turn.

All positions are DICOM patient coordinates (LPS, mm).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import ndimage

from ..errors import ReconstructionError
from ..ingest.measured import measured_mask
from ..volume import CTVolume, Geometry
from . import morph
from .findings_in import as_point, field_of, finding_box, finite_vec3
from .nodule_rays import (
    BOX_SLACK,
    MIN_INSIDE_SHARE,
    SOLID_HU,
    cast_rays,
    edge_sigma,
    fit_radius,
    glass_edge_ok,
    ray_crossings,
    ray_directions,
    star_radius,
)

log = logging.getLogger(__name__)

LUNG_MAX_HU = -600.0  # parenchyma used for the background level is darker than this
N_RAYS = 400
TRIM_FLOOR_VOX = 0.3  # smallest trimming tolerance of the fit, in voxels (sub-voxel crossings are this precise)
# A Gaussian-blurred ball of radius R reads 1/2 - sigma/(R·sqrt(2π)) ≈ 1/2 - 0.40·sigma/R of the step at its surface;
# the measured edge width also holds the nodule's own soft edge, which does not move with curvature, hence 0.35
# (0.3-0.4 all keep phantom nodules within 15% at 0.7-0.9 mm pixels, 1-1.25 mm slices).
K_CURV = 0.35
# Where even the slack holds no outline (a 26 mm mass in a box 70 % of its size got none), the box is grown around the
# finding's centre by these factors in turn; the trimmed fit still cuts attachments where the nodule's surface goes on.
BOX_GROWTH = (1.0, 1.5, 2.0)


@dataclass
class NoduleResult:
    """One segmented finding. ``center_lps`` (the finding's centre) and ``centroid_lps`` (the segmented blob's) are
    DICOM patient coordinates (LPS), mm; ``volume_mm3`` in mm³, ``diameter_mm`` that of the sphere of that volume.
    ``mask`` is bool ``[k, j, i]`` on ``geometry`` (a crop of the volume's grid, LPS); ``repr()`` leaves both out and
    gives the figures with their units (0.1 mm, 0.1 HU; the attributes hold them at full precision)."""

    index: int
    center_lps: tuple[float, float, float]
    volume_mm3: float | None = None
    diameter_mm: float | None = None
    centroid_lps: tuple[float, float, float] | None = None
    threshold_hu: float | None = None
    mask: np.ndarray | None = field(default=None, repr=False)
    geometry: Geometry | None = field(default=None, repr=False)
    error: str | None = None

    def __repr__(self) -> str:  # a notebook echoes recon.nodules: figures with their units, to 0.1 mm and 0.1 HU
        def point(p: tuple[float, float, float]) -> str:
            return "(" + ", ".join(f"{v:.1f}" for v in p) + ") mm"

        parts = [f"index={self.index}"]
        if self.error is not None:
            parts.append(f"not measured: {self.error}")
        if self.volume_mm3 is not None:
            parts.append(f"volume {self.volume_mm3:.1f} mm³")
        if self.diameter_mm is not None:
            parts.append(f"diameter {self.diameter_mm:.1f} mm")
        if self.centroid_lps is not None:
            parts.append(f"centroid_lps={point(self.centroid_lps)}")
        parts.append(f"center_lps={point(self.center_lps)}")
        if self.threshold_hu is not None:
            parts.append(f"threshold {self.threshold_hu:.1f} HU")
        return f"NoduleResult({', '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        """JSON form (the mask and geometry left out): ``center_lps_mm`` and ``centroid_lps_mm`` in LPS, mm."""
        return {
            "index": self.index,
            "center_lps_mm": [round(float(v), 3) for v in self.center_lps],
            "volume_mm3": None if self.volume_mm3 is None else round(self.volume_mm3, 2),
            "equivalent_diameter_mm": None if self.diameter_mm is None else round(self.diameter_mm, 3),
            "centroid_lps_mm": None if self.centroid_lps is None else [round(float(v), 3) for v in self.centroid_lps],
            "threshold_hu": self.threshold_hu,
            "error": self.error,
        }


def _where(volume: CTVolume, index: int, case_id: str | None) -> str:
    """``case C, finding N`` (or ``series UID, finding N`` without a case id): where a finding's error is."""
    if case_id:
        return f"case {case_id}, finding {index}"
    uid = volume.series_uid
    return f"series {uid}, finding {index}" if uid else f"finding {index}"


def _nodule_level(interior: np.ndarray, bg: float) -> float:
    """HU level of the nodule's outer tissue from its interior voxels (HU), ``bg`` being the lung level.

    A nodule with a fair share of ground glass is measured to the ground glass's edge: its level is the most
    frequent ground-glass HU (histogram mode, robust to a solid core, vessels and the partial-volume rim).
    A solid nodule's level is the median of its interior.
    """
    glass = interior[interior < SOLID_HU]
    if glass.size < 0.25 * interior.size or SOLID_HU - bg < 30.0:
        return float(np.median(interior))
    hist, edges = np.histogram(glass, bins=np.arange(bg, SOLID_HU + 10.0, 10.0))
    hist = ndimage.gaussian_filter1d(hist.astype(np.float64), 2.0)
    return float(edges[int(hist.argmax())] + 5.0)


def segment_nodule(
    volume: CTVolume,
    finding: Any,
    *,
    index: int = 0,
    lung_mask: np.ndarray | None = None,
    case_id: str | None = None,
) -> NoduleResult:
    """Segment the nodule of one finding (box in LPS mm; see the module notes). Errors raise ReconstructionError.

    ``lung_mask`` (bool ``[k, j, i]`` on ``volume``'s grid, optional) restricts the voxels that set the lung level
    (on a tilt-corrected grid, to those some image measured in any case). ``index`` (the finding's position in its list) and ``case_id`` (else the volume's series) name the finding in
    errors. Where no nodule edge lies in or near the box (a box much smaller than its nodule), the box is grown
    around the finding's centre by each factor of :data:`BOX_GROWTH` in turn.
    """
    where = _where(volume, index, case_id)
    centre, lo, hi = finding_box(finding, where=where)
    for scale in BOX_GROWTH:
        res = _segment_in_box(
            volume,
            centre,
            centre - scale * (centre - lo),
            centre + scale * (hi - centre),
            where=where,
            index=index,
            lung_mask=lung_mask,
        )
        if res is not None:
            if scale != 1.0:
                log.info("%s: no nodule edge in or near its box; measured in a box %g times as large", where, scale)
            return res
    raise ReconstructionError(
        f"no nodule boundary in or near the finding's box, nor in a box {BOX_GROWTH[-1]:g} times as large",
        where=where,
        fix="the finding may be a false positive",
    )


def _centre_in_field(centre: np.ndarray, geom: Geometry, measured: np.ndarray, *, where: str) -> None:
    """Raise :class:`ReconstructionError` when the finding's ``centre`` (LPS mm) lies in a tilt-corrected grid's wedge
    that no image measured (``measured``: bool ``[k, j, i]`` on ``geom``, a crop around the finding).

    The outline's rays start at the centre and stop where they leave the field, so from a centre outside it they read
    no nodule; the error says where the centre lies (LPS mm) and how far beyond the field's edge in its slice (mm).
    A centre outside the crop is left to the other checks.
    """
    ijk = np.round(geom.lps_to_index(centre[None, :])[0]).astype(int)
    i, j, k = (int(v) for v in ijk)
    if not (0 <= k < measured.shape[0] and 0 <= j < measured.shape[1] and 0 <= i < measured.shape[2]) or measured[k, j, i]:
        return
    plane = measured[k]
    spacing_ji = (float(geom.spacing[1]), float(geom.spacing[0]))
    if plane.any():
        beyond = float(ndimage.distance_transform_edt(~plane, sampling=spacing_ji)[j, i])
        how_far = f"{beyond:.1f} mm beyond the field's edge in its slice"
    else:
        how_far = "with no measured voxel near it in its slice"
    point = ", ".join(f"{v:.1f}" for v in centre)
    raise ReconstructionError(
        f"the finding's centre ({point}) mm LPS lies outside the scanned field: in the tilt-corrected grid's wedge that "
        f"no image of the tilted series measured, {how_far}; no nodule can be outlined from there",
        where=where,
        fix="check that the finding belongs to this series (LPS mm); a nodule the field's edge cuts is measured from a "
        "finding centred inside the field, or on another series whose field holds it",
    )


def _segment_in_box(
    volume: CTVolume,
    centre: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    where: str,
    index: int,
    lung_mask: np.ndarray | None,
) -> NoduleResult | None:
    """Steps 1-4 of the module notes for the box ``lo``..``hi`` around ``centre`` (LPS mm); None where no nodule edge
    lies in or near the box."""
    g = volume.geometry
    size = hi - lo
    corners = np.array([[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])])
    idx = g.lps_to_index(corners)
    pad_vox = np.maximum(3, np.ceil(0.5 * (idx.max(0) - idx.min(0))))  # holds BOX_SLACK's reach too
    i0 = np.floor(idx.min(0) - pad_vox).astype(int)
    i1 = np.ceil(idx.max(0) + pad_vox).astype(int) + 1
    i0 = np.maximum(i0, 0)
    i1 = np.minimum(i1, list(g.size_ijk))
    if np.any(i1 - i0 < 2):
        raise ReconstructionError(
            f"finding box {lo.round(1).tolist()}..{hi.round(1).tolist()} mm lies outside the volume",
            where=where,
            fix="check that the findings belong to this series (LPS mm)",
        )
    crop = volume.crop(i0.tolist(), i1.tolist())
    cg = crop.geometry
    hu = np.asarray(crop.array, dtype=np.float32)
    half = np.maximum(size / 2, 0.5 * np.asarray(g.spacing))
    kk, jj, ii = np.indices(hu.shape, dtype=np.float64)
    rel = cg.index_to_lps(np.stack([ii, jj, kk], axis=-1)) - centre
    rho2 = np.sum((rel / half) ** 2, axis=-1)

    # 1. lung level from the dark voxels around the box; never a tilt-corrected grid's unmeasured -1024 HU wedge (the
    # crop carries which of its voxels some image measured), lung mask or not
    measured = measured_mask(cg, crop.metadata)
    if measured is not None:
        _centre_in_field(centre, cg, measured, where=where)
    scanned = np.ones(hu.shape, bool) if measured is None else measured
    dark = (rho2 >= 1.0) & (hu < LUNG_MAX_HU) & scanned
    if lung_mask is not None:
        lung_local = lung_mask[i0[2] : i0[2] + hu.shape[0], i0[1] : i0[1] + hu.shape[1], i0[0] : i0[0] + hu.shape[2]]
        if (dark & lung_local).sum() >= 20:
            dark &= lung_local
    if dark.sum() < 20:
        dark = (hu < LUNG_MAX_HU) & scanned
    if dark.sum() < 20:
        raise ReconstructionError(
            f"no lung parenchyma (below {LUNG_MAX_HU:g} HU) around the finding's box "
            f"{lo.round(1).tolist()}..{hi.round(1).tolist()} mm",
            where=where,
            fix="check the finding's box (LPS mm)",
        )
    bg = float(np.median(hu[dark]))
    centre_vox = rho2 <= max(0.25**2, float(rho2.min()) + 1e-6)
    core = float(np.median(hu[centre_vox & scanned] if (centre_vox & scanned).any() else hu[centre_vox]))
    if core - bg < 100.0:
        raise ReconstructionError(
            f"no nodule in the box: centre {core:.0f} HU vs surrounding lung {bg:.0f} HU",
            where=where,
            fix="the finding may be a false positive",
        )

    dirs = ray_directions(N_RAYS)
    voxel_mm = float(max(g.spacing))
    reach = 1.0 / np.sqrt(np.sum((dirs / half) ** 2, axis=1))  # the box-inscribed ellipsoid along each ray
    rays = cast_rays(hu, cg, centre, dirs, max(1.5 * float(half.max()), BOX_SLACK * float(half.max()) + voxel_mm), measured)
    tol = TRIM_FLOOR_VOX * float(min(g.spacing))
    # 2a. rough outline just above the parenchyma, to find the nodule's interior
    rough_thr = bg + min(120.0, 0.5 * (core - bg))
    lengths, found = ray_crossings(rays, rough_thr)
    coef, _ = fit_radius(dirs, lengths, found, tol, reach)
    inside = (lengths <= reach)[found]
    if coef is None or inside.size == 0 or inside.mean() < MIN_INSIDE_SHARE:  # a box tighter than the nodule's edge
        reach = BOX_SLACK * reach + voxel_mm
        coef, _ = fit_radius(dirs, lengths, found, tol, reach)
    if coef is None:
        return None
    dist, r_fit = star_radius(cg, centre, coef)
    interior = hu[(dist < 0.8 * r_fit) & scanned]
    if interior.size < 8:
        interior = hu[(rho2 <= 0.25**2) & scanned]
    level = _nodule_level(interior, bg)
    solid_dist = None
    if level < SOLID_HU and np.any(hu > SOLID_HU):  # ground glass: solid tissue nearby lifts its edge
        solid_dist = ndimage.distance_transform_edt(hu <= SOLID_HU, sampling=np.asarray(cg.spacing, float)[::-1])

    def outline(threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        lengths, found = ray_crossings(rays, threshold)
        if solid_dist is not None:
            found &= glass_edge_ok(rays, lengths, found, solid_dist, cg)
        coef, keep = fit_radius(dirs, lengths, found, tol, reach)
        return lengths, found, coef, keep

    # 2b/3. boundary at the half-way threshold, with the shape prior
    thr = 0.5 * (level + bg)
    lengths, found, coef2, keep = outline(thr)
    if coef2 is not None:
        coef = coef2
        # 2c. the same, with the threshold corrected for the blurred edge's curvature
        sigma = edge_sigma(rays, lengths, keep, bg, level)
        radius = float(np.median(lengths[keep]))
        if sigma is not None and radius > 0:
            thr = bg + (0.5 - K_CURV * min(sigma, 0.5 * radius) / radius) * (level - bg)
            coef3 = outline(thr)[2]
            if coef3 is not None:
                coef = coef3
    _, r_fit = star_radius(cg, centre, coef)
    # 4. mask
    inside = (hu > thr) & (dist <= r_fit)
    labels, n = ndimage.label(inside, structure=morph.CONN6)
    if n == 0:
        raise ReconstructionError(
            f"no nodule voxels above {thr:.0f} HU near the finding's centre",
            where=where,
            fix="the finding may be a false positive",
        )
    near = labels[(dist <= 0.5 * np.maximum(r_fit, 0)) & (labels > 0)]
    if near.size == 0:
        raise ReconstructionError(
            f"no nodule voxels above {thr:.0f} HU near the finding's centre",
            where=where,
            fix="the finding may be a false positive",
        )
    nod = ndimage.binary_fill_holes(labels == np.bincount(near).argmax())
    voxel = float(np.prod(g.spacing))
    vol = float(nod.sum()) * voxel
    return NoduleResult(
        index=index,
        center_lps=as_point(centre),
        volume_mm3=vol,
        diameter_mm=float((6.0 * vol / np.pi) ** (1.0 / 3.0)),
        centroid_lps=as_point(cg.centroid_lps(nod)),
        threshold_hu=round(thr, 1),
        mask=nod,
        geometry=cg,
    )


def segment_findings(
    volume: CTVolume,
    findings: Sequence[Any],
    *,
    lung_mask: np.ndarray | None = None,
    case_id: str | None = None,
    report_failures: bool = True,
) -> list[NoduleResult]:
    """Segment the nodule of every finding of ``volume`` (HU, LPS geometry); one :class:`NoduleResult` per finding,
    in the order given (``index`` = position in ``findings``).

    Each finding is a detector :class:`~pipeline.detection.findings.Finding` or a mapping with the same keys
    (attributes or items); read are ``box_min_lps`` and ``box_max_lps`` (the box's opposite corners) with
    ``center_lps`` optional, or else ``center_lps`` with ``diameter_mm`` (a cube of that side): all DICOM patient
    coordinates (LPS), mm. ``lung_mask`` (optional): bool, indexed ``[k, j, i]`` on the volume's own grid (the shape
    of ``volume.array``); it restricts the voxels that set the lung level around each finding. ``case_id`` (else the
    volume's series) names the finding in errors and the log.

    Results: ``center_lps`` and ``centroid_lps`` in LPS mm, ``volume_mm3`` in mm³, ``diameter_mm`` (the diameter of
    the sphere of that volume) in mm, ``threshold_hu`` in HU, ``mask`` bool ``[k, j, i]`` on ``geometry`` (a crop of
    the volume's grid). A finding that fails gets its ``error`` set (the other fields ``None``; its centre NaN when
    the finding gives none) and the others go on; it is logged as a warning, or at info level with
    ``report_failures=False`` (the same findings segmented again, their failures already reported).
    """
    level = logging.WARNING if report_failures else logging.INFO
    out = []
    for n, f in enumerate(findings):
        try:
            out.append(segment_nodule(volume, f, index=n, lung_mask=lung_mask, case_id=case_id))
        except ReconstructionError as exc:
            try:
                c = finite_vec3(field_of(f, "center_lps"), "center_lps", "", "")
            except ReconstructionError:  # no centre, or not three numbers: reported as unknown beside the error
                c = np.full(3, np.nan)
            out.append(NoduleResult(index=n, center_lps=as_point(c), error=str(exc)))
            log.log(level, "nodule not segmented: %s", exc if exc.where else f"{_where(volume, n, case_id)}: {exc}")
    return out
