"""Lung nodules: placement fully inside the lungs (free, touching the pleura, or touching a vessel; never nearly
inside a vessel) and rendering.

A nodule is a centrally symmetric, gently lobulated sphere:
``r(u) = r · (1 + Σ w_j ((u · v_j)² - 1/3))`` for unit direction u, so its
voxel mask is centred on the stated centre. Solid nodules replace the
tissue; ground-glass ones raise it to at least their own HU (vessels stay
visible through them, as in real scans); part-solid ones are ground glass
with a solid core.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import binary_dilation, distance_transform_edt, gaussian_filter

from ..errors import PhantomError
from .scanner import CanonicalGrid
from .tubes import Tubes

log = logging.getLogger(__name__)

KIND_P = {"solid": 0.55, "part_solid": 0.2, "ground_glass": 0.25}
ATTACH_P = {None: 0.5, "pleura": 0.3, "vessel": 0.2}
#: Largest share of a nodule's volume that may already be lung vessel where it is placed. A nodule three-quarters
#: inside a vessel is no nodule a reader could see (a solid one merges with the vessel, a ground-glass one disappears
#: under it), so the ground truth would list a nodule that is not in the image: such places are refused.
MAX_VESSEL_SHARE = 0.75


@dataclass
class NoduleSpec:
    center: np.ndarray  # LPS mm
    radius: float  # mm
    kind: str
    attached_to: str | None
    lung: str
    lobes: np.ndarray  # (K, 3) unit vectors
    weights: np.ndarray  # (K,)
    value: float  # HU of the solid part or of the ground glass
    core_value: float
    core_frac: float


def _crop(grid: CanonicalGrid, center: np.ndarray, half_mm: float) -> tuple[slice, slice, slice]:
    out = []
    for coords, a in ((grid.zs, 2), (grid.ys, 1), (grid.xs, 0)):
        step = coords[1] - coords[0] if coords.size > 1 else 1.0
        i0 = int(np.floor((center[a] - half_mm - coords[0]) / step))
        i1 = int(np.ceil((center[a] + half_mm - coords[0]) / step)) + 1
        out.append(slice(max(i0, 0), min(max(i1, 0), coords.size)))
    return out[0], out[1], out[2]


def _shape_sd(grid: CanonicalGrid, spec: NoduleSpec, box: tuple[slice, slice, slice], scale: float = 1.0) -> np.ndarray:
    """Signed distance (mm, approximate) to the lobulated surface, scaled by ``scale``, in ``box``."""
    return nodule_signed_distance(grid.xs[box[2]], grid.ys[box[1]], grid.zs[box[0]], spec, scale=scale)


def nodule_signed_distance(xs: np.ndarray, ys: np.ndarray, zs: np.ndarray, spec: NoduleSpec, *, scale: float = 1.0) -> np.ndarray:
    """Signed distance (mm, approximate; negative inside) from the points of the grid ``xs`` (L), ``ys`` (P), ``zs``
    (S) (LPS mm, 1-D each) to the nodule's lobulated surface, its radius scaled by ``scale``; array ``[S, P, L]``."""
    dz = (np.asarray(zs) - spec.center[2])[:, None, None]
    dy = (np.asarray(ys) - spec.center[1])[None, :, None]
    dx = (np.asarray(xs) - spec.center[0])[None, None, :]
    dist = np.sqrt(dx * dx + dy * dy + dz * dz)
    inv = 1.0 / np.maximum(dist, 1e-6)
    f = np.ones_like(dist)
    for v, w in zip(spec.lobes, spec.weights):
        c = (dx * v[0] + dy * v[1] + dz * v[2]) * inv
        f += w * (c * c - 1.0 / 3.0)
    return (dist - spec.radius * scale * f).astype(np.float32)


def _fits(
    grid: CanonicalGrid,
    spec: NoduleSpec,
    lung: np.ndarray,
    labels: np.ndarray,
    margin_mm: float,
    touch: bool = False,
    vessels: np.ndarray | None = None,
) -> bool:
    """True when the nodule (grown by ``margin_mm``) lies inside ``lung`` and clear of other nodules, and (with the
    lung ``vessels`` mask) at most :data:`MAX_VESSEL_SHARE` of its own volume is vessel.

    With ``touch``, the nodule must also come within one voxel of the lung's edge (the pleura).
    """
    reach = spec.radius * 1.5 + margin_mm + 2 * max(grid.pixel_spacing, grid.slice_spacing)
    box = _crop(grid, spec.center, reach)
    if any(s.stop - s.start < 1 for s in box):
        return False
    # the crop must not be cut by the volume edge
    for coords, a in zip((grid.zs, grid.ys, grid.xs), (2, 1, 0)):
        if spec.center[a] - reach < coords[0] or spec.center[a] + reach > coords[-1]:
            return False
    sd = _shape_sd(grid, spec, box)
    inside = sd < margin_mm
    if not inside.any():
        return False
    sub = lung[box]
    if not sub[inside].all() or labels[box][sd < margin_mm + 2 * grid.pixel_spacing].any():
        return False
    if vessels is not None and _vessel_share(vessels[box], sd) > MAX_VESSEL_SHARE:
        return False
    if touch:
        grown = binary_dilation(inside, structure=np.ones((3, 3, 3), dtype=bool))
        return bool((grown & ~sub).any())
    return True


def _vessel_share(vessels: np.ndarray, sd: np.ndarray) -> float:
    """Share of the nodule's voxels (``sd < 0``) that are vessel in ``vessels`` (the same crop)."""
    body = sd < 0
    return float(vessels[body].mean()) if body.any() else 0.0


def _random_kind(rng: np.random.Generator) -> str:
    kinds = list(KIND_P)
    return kinds[int(rng.choice(len(kinds), p=list(KIND_P.values())))]


def _random_attach(rng: np.random.Generator) -> str | None:
    keys = list(ATTACH_P)
    return keys[int(rng.choice(len(keys), p=list(ATTACH_P.values())))]


def random_nodule_spec(
    rng: np.random.Generator, center: np.ndarray, radius: float, kind: str, attached: str | None
) -> NoduleSpec:
    """A nodule of ``kind`` (:data:`KIND_P`) at ``center`` (LPS mm) of ``radius`` mm: random lobulation and HU."""
    k = 3
    lobes = rng.standard_normal((k, 3))
    lobes /= np.linalg.norm(lobes, axis=1, keepdims=True)
    weights = rng.uniform(-0.12, 0.12, k)
    if kind == "solid":
        value = rng.uniform(5.0, 70.0)
    else:
        value = rng.uniform(-620.0, -380.0)
    return NoduleSpec(
        center=np.asarray(center, dtype=np.float64),
        radius=float(radius),
        kind=kind,
        attached_to=attached,
        lung="lung_left" if center[0] > 0 else "lung_right",
        lobes=lobes,
        weights=weights,
        value=float(value),
        core_value=float(rng.uniform(-20.0, 60.0)),
        core_frac=float(rng.uniform(0.35, 0.6)),
    )


class NodulePlacer:
    """Chooses nodule positions inside the lung masks of a canonical grid."""

    def __init__(
        self,
        rng: np.random.Generator,
        grid: CanonicalGrid,
        lung: np.ndarray,
        vessels: Tubes,
        vessel_mask: np.ndarray | None = None,
    ):
        self.rng = rng
        self.grid = grid
        self.lung = lung
        self.vessel_arrays = vessels.arrays()
        self.vessel_mask = vessel_mask
        # a coarse grid of about 4e5 voxels, as isotropic as the slice spacing allows
        ps, ss = grid.pixel_spacing, grid.slice_spacing
        extent = np.asarray(lung.shape) * np.array([ss, ps, ps])
        cell = max(ps, float(np.prod(extent) / 4e5) ** (1.0 / 3.0))
        self.steps = (max(1, int(round(cell / ss))), max(1, int(round(cell / ps))), max(1, int(round(cell / ps))))
        sz, sy, sx = self.steps
        coarse = lung[::sz, ::sy, ::sx]
        sp = (ss * sz, ps * sy, ps * sx)
        self.edt = distance_transform_edt(coarse, sampling=sp).astype(np.float32)
        self.coarse_err = float(np.linalg.norm(sp)) / 2
        self.inscribed_mm = 2.0 * float(self.edt.max())
        self.max_radius = max(float(self.edt.max()) - self.coarse_err, 0.0)

    def _coarse_to_lps(self, idx: np.ndarray) -> np.ndarray:
        sz, sy, sx = self.steps
        g = self.grid
        k, j, i = int(idx[0]) * sz, int(idx[1]) * sy, int(idx[2]) * sx
        jit = self.rng.uniform(-0.5, 0.5, 3)  # (x, y, z)
        return g.lps_of(np.array([k + jit[2] * sz, j + jit[1] * sy, i + jit[0] * sx]))

    def _free_center(self, radius: float) -> np.ndarray | None:
        cand = np.flatnonzero(self.edt >= radius + self.coarse_err + 2 * self.grid.pixel_spacing)
        if cand.size == 0:
            return None
        idx = np.unravel_index(cand[self.rng.integers(cand.size)], self.edt.shape)
        return self._coarse_to_lps(np.array(idx))

    def _pleural_centers(self, radius: float) -> list[np.ndarray]:
        lo, hi = radius - self.coarse_err, radius + 2 * self.coarse_err
        cand = np.flatnonzero((self.edt >= max(lo, 0.1)) & (self.edt <= hi))
        if cand.size == 0:
            return []
        idx = np.unravel_index(cand[self.rng.integers(cand.size)], self.edt.shape)
        rough = self._coarse_to_lps(np.array(idx))
        g = self.grid
        half = radius + 4 * self.coarse_err + 3 * g.pixel_spacing
        box = _crop(g, rough, half)
        sub = self.lung[box]
        if sub.size == 0 or not sub.any():
            return []
        pad = [(1, 1)] * 3
        d = distance_transform_edt(np.pad(sub, pad, constant_values=True), sampling=g.spacing_zyx)[1:-1, 1:-1, 1:-1]
        vox = max(g.pixel_spacing, g.slice_spacing)
        ok = (d >= radius + 0.4 * g.pixel_spacing) & (d <= radius + 0.5 * g.pixel_spacing + 0.5 * vox)
        # keep centres whose whole sphere lies within the crop (the EDT sees only the crop)
        zz, yy, xx = np.meshgrid(g.zs[box[0]], g.ys[box[1]], g.xs[box[2]], indexing="ij")
        ok &= np.abs(zz - rough[2]) < half - radius - vox
        ok &= np.abs(yy - rough[1]) < half - radius - vox
        ok &= np.abs(xx - rough[0]) < half - radius - vox
        pts = np.flatnonzero(ok)
        picks = self.rng.permutation(pts)[:12]
        return [np.array([xx.flat[p], yy.flat[p], zz.flat[p]]) for p in picks]

    def _vessel_center(self, radius: float) -> np.ndarray | None:
        a, b, ra, rb = self.vessel_arrays
        if len(a) == 0:
            return None
        rv = 0.5 * (ra + rb)
        ok = np.flatnonzero((rv >= 0.6 * self.grid.pixel_spacing) & (rv <= max(radius, 1.0)))
        if ok.size == 0:
            return None
        n = ok[self.rng.integers(ok.size)]
        t = self.rng.uniform(0.2, 0.8)
        p = a[n] + t * (b[n] - a[n])
        d = b[n] - a[n]
        d = d / max(float(np.linalg.norm(d)), 1e-9)
        v = self.rng.standard_normal(3)
        v -= (v @ d) * d
        v /= max(float(np.linalg.norm(v)), 1e-9)
        return p + v * (rv[n] + 0.8 * radius)

    def place(
        self, specs: list[NoduleSpec], labels: np.ndarray, radius: float, kind: str, attached: str | None
    ) -> NoduleSpec | None:
        """One nodule of ``radius`` mm, or None when 60 tries found no room."""
        g = self.grid
        for _ in range(60):
            cands: list[np.ndarray | None]
            if attached == "pleura":
                cands = list(self._pleural_centers(radius))
            elif attached == "vessel":
                cands = [self._vessel_center(radius)]
            else:
                cands = [self._free_center(radius)]
            for c in cands:
                if c is None:
                    return None
                if any(np.linalg.norm(c - o.center) < 1.3 * (radius + o.radius) + 2 * g.pixel_spacing for o in specs):
                    continue
                spec = random_nodule_spec(self.rng, c, radius, kind, attached)
                margin = 0.0 if attached else 1.5 * g.pixel_spacing
                if _fits(g, spec, self.lung, labels, margin, touch=attached == "pleura", vessels=self.vessel_mask):
                    return spec
        return None


def place_nodules(
    rng: np.random.Generator,
    grid: CanonicalGrid,
    lung: np.ndarray,
    vessels: Tubes,
    labels: np.ndarray,
    *,
    count: int,
    diameter_mm: tuple[float, float],
    strict: bool = True,
    vessel_mask: np.ndarray | None = None,
) -> list[NoduleSpec]:
    """Place ``count`` nodules in ``lung`` (canonical grid); with ``vessel_mask`` (the lung vessels, same grid), none
    where more than :data:`MAX_VESSEL_SHARE` of its volume would be vessel.

    When they cannot all fit, raise PhantomError if ``strict``, else return those that fit (a warning is logged).
    """
    if count == 0:
        return []
    placer = NodulePlacer(rng, grid, lung, vessels, vessel_mask)
    lo, hi = diameter_mm
    fit = 2.0 * placer.max_radius / 1.2 - 2 * grid.pixel_spacing
    if count and placer.inscribed_mm < lo:
        if not strict:
            log.warning(
                "no nodule of %.1f mm fits in these lungs (largest inscribed sphere about %.1f mm)", lo, placer.inscribed_mm
            )
            return []
        raise PhantomError(
            f"a nodule of the minimum diameter {lo:g} mm does not fit in lungs whose largest inscribed sphere is "
            f"about {placer.inscribed_mm:.1f} mm across",
            where="generate_phantom(nodule_diameter_mm=...)",
            fix="use a larger matrix or pixel_spacing (the anatomy scales with the field of view), or smaller nodules",
        )
    # keep nodules in proportion in small chests: at most half the largest inscribed sphere's diameter
    hi_eff = max(lo, min(hi, fit, placer.max_radius))
    specs: list[NoduleSpec] = []
    for _ in range(count):
        d = float(np.exp(rng.uniform(np.log(lo), np.log(hi_eff)))) if hi_eff > lo else lo
        kind = _random_kind(rng)
        attached = _random_attach(rng)
        spec = None
        while spec is None:
            spec = placer.place(specs, labels, d / 2.0, kind, attached)
            if spec is not None:
                break
            if attached is not None:
                attached = None
                continue
            if d <= lo * 1.0001:
                if not strict:
                    log.warning("room for only %d of %d nodules in these lungs", len(specs), count)
                    return specs
                raise PhantomError(
                    f"found no room for nodule {len(specs) + 1} of {count} (diameter {d:.1f} mm) in the lungs",
                    where="generate_phantom(n_nodules=...)",
                    fix="ask for fewer or smaller nodules, a larger field of view, or thinner slices",
                )
            d = max(lo, d * 0.8)
        paint_nodule(grid, spec, None, labels, len(specs) + 1)
        specs.append(spec)
    return specs


def paint_nodule(
    grid: CanonicalGrid, spec: NoduleSpec, hu: np.ndarray | None, labels: np.ndarray, label: int
) -> tuple[float, int]:
    """Write the nodule into ``labels`` (and ``hu`` when given); return (mean HU inside, voxel count)."""
    reach = spec.radius * 1.3 + 3 * max(grid.pixel_spacing, grid.slice_spacing)
    box = _crop(grid, spec.center, reach)
    sd = _shape_sd(grid, spec, box)
    mask = sd < 0
    labels[box][mask] = label
    if hu is None:
        return 0.0, int(mask.sum())
    sub = hu[box]
    px = grid.pixel_spacing
    if spec.kind == "solid":
        alpha = np.clip(0.5 - sd / px, 0.0, 1.0)
        target = np.full_like(sub, spec.value)
    else:
        alpha = np.clip(0.5 - sd / (2.0 * px), 0.0, 1.0)
        rng = np.random.default_rng(int(abs(spec.value) * 1000) + label)
        tex = gaussian_filter(rng.standard_normal(sub.shape).astype(np.float32), 1.0) * 120.0
        target = np.maximum(sub, spec.value + tex)
    sub += alpha * (target - sub)
    if spec.kind == "part_solid":
        sdc = _shape_sd(grid, spec, box, scale=spec.core_frac)
        ac = np.clip(0.5 - sdc / px, 0.0, 1.0)
        sub += ac * (spec.core_value - sub)
    hu[box] = sub
    return float(sub[mask].mean()) if mask.any() else spec.value, int(mask.sum())
