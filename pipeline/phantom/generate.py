"""``generate_phantom``: a synthetic chest CT (HU, LPS geometry) with organ masks and nodule ground truth."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
from pydicom.uid import generate_uid
from scipy.ndimage import binary_dilation

from ..errors import PhantomError
from ..volume import CTVolume
from . import anatomy as T
from .anatomy import AnatomyPainter
from .layout import Layout, draw_layout
from .model import Nodule, Phantom
from .nodules import paint_nodule, place_nodules
from .noise import SmoothField, blur_and_noise
from .scanner import CanonicalGrid, direction_for, scanner_geometry, to_scanner_order
from .tubes import Tubes, coverage, signed_distance
from .vessels import airway_tubes, aorta_tubes, rib_tubes, vessel_trees

log = logging.getLogger(__name__)

MAX_SLICES = 1024
DEFAULT_MAX_SLICES = 320
_SLAB = 16


def _check(name: str, value: float, lo: float, hi: float, fix: str) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and lo <= value <= hi):
        raise PhantomError(f"{name}={value!r} is outside {lo:g}..{hi:g}", where=f"generate_phantom({name}=...)", fix=fix)


def _validate(matrix, pixel_spacing, slice_spacing, slice_thickness, slices, n_nodules, nodule_diameter_mm, noise_hu) -> None:
    if not isinstance(matrix, (int, np.integer)) or isinstance(matrix, bool):
        raise PhantomError(f"matrix must be an integer, got {matrix!r}", where="generate_phantom(matrix=...)", fix="use e.g. 128, 256 or 512")
    _check("matrix", int(matrix), 64, 1024, "use a matrix between 64 and 1024 (typically 128..512)")
    _check("pixel_spacing", pixel_spacing, 0.3, 2.0, "use a pixel spacing between 0.3 and 2.0 mm (typically 0.5..1.0)")
    _check("slice_spacing", slice_spacing, 0.3, 10.0, "use a slice spacing between 0.3 and 10 mm")
    if slice_thickness is not None:
        _check("slice_thickness", slice_thickness, 0.3, 10.0, "use a slice thickness between 0.3 and 10 mm")
    if slices is not None:
        if not isinstance(slices, (int, np.integer)) or isinstance(slices, bool):
            raise PhantomError(f"slices must be an integer, got {slices!r}", where="generate_phantom(slices=...)", fix="pass a whole number of slices")
        _check("slices", int(slices), 8, MAX_SLICES, f"use 8..{MAX_SLICES} slices")
    if n_nodules is not None:
        if not isinstance(n_nodules, (int, np.integer)) or isinstance(n_nodules, bool):
            raise PhantomError(f"n_nodules must be an integer, got {n_nodules!r}", where="generate_phantom(n_nodules=...)", fix="pass 0..20 or None")
        _check("n_nodules", int(n_nodules), 0, 20, "ask for 0..20 nodules, or None for a random 0..6")
    try:
        lo, hi = (float(v) for v in nodule_diameter_mm)
    except (TypeError, ValueError) as exc:
        raise PhantomError(
            f"nodule_diameter_mm must be two numbers (min, max), got {nodule_diameter_mm!r}",
            where="generate_phantom(nodule_diameter_mm=...)",
            fix="pass e.g. (3.0, 30.0)",
        ) from exc
    _check("nodule_diameter_mm[0]", lo, 1.0, 60.0, "use diameters between 1 and 60 mm")
    _check("nodule_diameter_mm[1]", hi, lo, 60.0, "the maximum diameter must be >= the minimum and <= 60 mm")
    _check("noise_hu", noise_hu, 0.0, 500.0, "use a noise level between 0 and 500 HU")


def _metadata(seed: int, options: dict[str, Any]) -> dict[str, Any]:
    tag = f"ctpipe-phantom|seed={seed}"
    acq = tag + "|" + "|".join(f"{k}={options[k]}" for k in sorted(options))
    return {
        "PatientID": f"PHANTOM-{seed:06d}" if seed >= 0 else f"PHANTOM-M{-seed:06d}",
        "PatientName": f"PHANTOM^{seed}",
        "StudyInstanceUID": str(generate_uid(entropy_srcs=[tag, "study"])),
        "SeriesInstanceUID": str(generate_uid(entropy_srcs=[acq, "series"])),
        "FrameOfReferenceUID": str(generate_uid(entropy_srcs=[acq, "frame"])),
        "Modality": "CT",
        "Manufacturer": "ctpipe-phantom",
        "ManufacturerModelName": "chest-phantom-1",
        "SliceThickness": float(options["slice_thickness"]),
        "SpacingBetweenSlices": float(options["slice_spacing"]),
        "ConvolutionKernel": "STANDARD",
        "KVP": 120.0,
        "PatientPosition": options["patient_position"],
        "BodyPartExamined": "CHEST",
        "SeriesDescription": "Chest phantom",
    }


def _near(sd: np.ndarray, box: tuple[slice, slice, slice], limit: float) -> np.ndarray:
    """Flat indices of the voxels in ``box`` whose signed distance is below ``limit`` mm."""
    k, j, i = np.nonzero(sd[box] < limit)
    return np.ravel_multi_index((k + box[0].start, j + box[1].start, i + box[2].start), sd.shape)


def _blend(flat_hu: np.ndarray, idx: np.ndarray, alpha: np.ndarray, value: float | np.ndarray) -> None:
    """Mix ``value`` (HU) into the voxels ``idx`` with weights ``alpha`` (0..1)."""
    old = flat_hu[idx]
    flat_hu[idx] = old + alpha * (np.asarray(value, dtype=np.float32) - old)


def _paint_tubes(
    layout: Layout,
    grid: CanonicalGrid,
    rngs: tuple[np.random.Generator, np.random.Generator, np.random.Generator],
    hu: np.ndarray,
    lung: np.ndarray,
    bone: np.ndarray,
    body: np.ndarray,
    inner2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, Tubes]:
    """Paint aorta, pulmonary vessels, airways and ribs into ``hu`` (canonical grid, in place).

    Updates ``lung`` (clear of mediastinal vessels, airway lumen, cartilage and
    bone) and ``bone`` (ribs and clavicles added, within the 2-D ``inner2`` region); returns the vessel and airway-lumen masks and the
    intrapulmonary vessel tubes. Only voxels near a tube surface are touched.
    """
    r_vessel, r_air, r_rib = rngs
    ps = grid.pixel_spacing
    shape = grid.shape
    sd = np.empty(shape, dtype=np.float32)
    flat_hu, flat_sd, flat_bone, flat_lung = hu.reshape(-1), sd.reshape(-1), bone.reshape(-1), lung.reshape(-1)
    vessels = np.zeros(shape, dtype=bool)
    airway = np.zeros(shape, dtype=bool)
    pad = 1.5 * ps
    edge = 0.5 * ps
    max_piece = max(4.0 * ps, 6.0 * layout.scale)
    medi = aorta_tubes(layout, grid.zs[0] - 20.0)
    inner, trunks = vessel_trees(layout, r_vessel)
    medi.extend(trunks)
    box = signed_distance(grid, medi.split(max_piece), sd, pad=pad + layout.gap)
    if box is not None:
        idx = _near(sd, box, edge)
        _blend(flat_hu, idx, coverage(flat_sd[idx], ps) * ~flat_bone[idx], T.BLOOD)
        flat_lung[_near(sd, box, layout.gap)] = False
    box = signed_distance(grid, inner.split(max_piece), sd, pad=pad)
    if box is not None:
        idx = _near(sd, box, edge)
        d = flat_sd[idx]
        _blend(flat_hu, idx, coverage(d, ps) * ~flat_bone[idx], T.VESSEL)
        vessels.reshape(-1)[idx[d < 0]] = True
    air = airway_tubes(layout, r_air, grid.zs[-1] + 20.0)
    wall = layout.trachea_wall
    box = signed_distance(grid, air.split(max_piece), sd, pad=pad + wall)
    if box is not None:
        idx = _near(sd, box, edge + wall)
        d = flat_sd[idx]
        keep = ~flat_bone[idx]
        _blend(flat_hu, idx, coverage(d - np.float32(wall), ps) * keep, T.AIRWAY_WALL)
        # thick slices: the wall also covers every voxel touching the lumen, so lumen never meets lung
        lumen_box = sd[box] < 0
        rim = binary_dilation(lumen_box, structure=np.ones((3, 3, 3), dtype=bool)) & ~lumen_box & ~bone[box]
        hu[box][rim] = T.AIRWAY_WALL
        _blend(flat_hu, idx, coverage(d, ps) * keep, T.AIR)
        inside = idx[d < 0]
        airway.reshape(-1)[inside[body.reshape(-1)[inside]]] = True
    ribs, cartilage = rib_tubes(layout, r_rib)
    wall_zone = inner2.reshape(-1)  # bones and cartilage stay under the subcutaneous fat
    plane = shape[1] * shape[2]
    box = signed_distance(grid, cartilage.split(max_piece), sd, pad=pad)
    if box is not None:
        idx = _near(sd, box, edge)
        d = flat_sd[idx]
        _blend(flat_hu, idx, coverage(d, ps) * ~flat_bone[idx] * wall_zone[idx % plane], T.CARTILAGE)
        flat_lung[idx[d < 0]] = False
    box = signed_distance(grid, ribs.split(max_piece), sd, pad=pad)
    if box is not None:
        cort = max(1.2 * layout.scale, 0.7 * ps)
        idx = _near(sd, box, edge)
        idx = idx[wall_zone[idx % plane]]
        d = flat_sd[idx]
        value = np.where(d > -cort, np.float32(T.CORTICAL), np.float32(T.CANCELLOUS))
        _blend(flat_hu, idx, coverage(d, ps), value)
        flat_bone[idx[d < 0]] = True
    lung &= ~(airway | bone)
    vessels &= lung
    return vessels, airway, inner


def generate_phantom(
    seed: int,
    *,
    matrix: int = 256,
    pixel_spacing: float = 0.7,
    slice_spacing: float = 1.25,
    slice_thickness: float | None = None,
    slices: int | None = None,
    n_nodules: int | None = None,
    nodule_diameter_mm: tuple[float, float] = (3.0, 30.0),
    noise_hu: float = 20.0,
    patient_position: str = "HFS",
) -> Phantom:
    """Generate a synthetic chest CT with ground truth; deterministic from ``seed``.

    The anatomy scales to the field of view (``matrix * pixel_spacing`` mm);
    nodule diameters are absolute mm. ``slices=None`` covers the chest
    (about 1.15 × the lung height, at most 320 slices); a shorter scan
    compresses the chest along z so it stays complete. ``slice_thickness``
    defaults to ``slice_spacing``. ``n_nodules=None`` draws 0..6 (fewer when a
    tiny chest has no room for them); an explicit count is placed or an error raised.
    ``patient_position`` (HFS, HFP, FFS, FFP, HFDR, HFDL, FFDR, FFDL) sets the
    direction cosines and voxel order as a scanner would; the anatomy and all
    ground truth stay in patient coordinates (LPS, mm).

    Raises :class:`~pipeline.errors.PhantomError` for out-of-range options or
    nodules that do not fit in the lungs.
    """
    t0 = time.perf_counter()
    _validate(matrix, pixel_spacing, slice_spacing, slice_thickness, slices, n_nodules, nodule_diameter_mm, noise_hu)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise PhantomError(f"seed must be an integer, got {seed!r}", where="generate_phantom(seed=...)", fix="pass a whole number")
    direction = direction_for(patient_position)
    seed = int(seed)
    matrix = int(matrix)
    ps = float(pixel_spacing)
    ss = float(slice_spacing)
    thickness = float(slice_thickness) if slice_thickness is not None else ss
    lo_d, hi_d = (float(v) for v in nodule_diameter_mm)
    root = np.random.SeedSequence([abs(seed), int(seed < 0), 20250101])
    r_layout, r_tex, r_vessel, r_air, r_rib, r_nod, r_noise = (np.random.default_rng(s) for s in root.spawn(7))

    fov = matrix * ps
    scale = fov / 360.0
    if slices is None:
        slices = int(min(DEFAULT_MAX_SLICES, max(16, math.ceil(1.15 * 2 * 130.0 * scale * 1.05 / ss))))
    nz = int(slices)
    scan_len = nz * ss
    z_center = float(np.round(r_layout.uniform(-260.0, -120.0), 1))
    fx, fy = r_layout.uniform(-4.0, 4.0, 2) * scale
    xs = (np.arange(matrix) - (matrix - 1) / 2.0) * ps + fx
    ys = (np.arange(matrix) - (matrix - 1) / 2.0) * ps + fy
    zs = z_center + (np.arange(nz) - (nz - 1) / 2.0) * ss
    grid = CanonicalGrid(xs=xs, ys=ys, zs=zs, pixel_spacing=ps, slice_spacing=ss)
    layout = draw_layout(r_layout, fov_mm=fov, pixel=ps, scan_length_mm=scan_len, z_center=z_center)
    shape = grid.shape

    # 1. analytic anatomy, slab by slab
    texture = SmoothField(r_tex, shape, (6.0 * scale / ss + 1, 6.0 * scale / ps + 1, 6.0 * scale / ps + 1), 18.0)
    painter = AnatomyPainter(layout, grid)
    hu = np.empty(shape, dtype=np.float32)
    lung = np.empty(shape, dtype=bool)
    bone = np.empty(shape, dtype=bool)
    for k0 in range(0, nz, _SLAB):
        k1 = min(k0 + _SLAB, nz)
        painter.paint(k0, k1, texture.slab(k0, k1), hu[k0:k1], lung[k0:k1], bone[k0:k1])
    body = np.broadcast_to(painter.body2[None], shape).copy()
    t1 = time.perf_counter()

    # 2. tubes: mediastinal vessels, lung vessels, airways, ribs
    vessels, airway, inner = _paint_tubes(layout, grid, (r_vessel, r_air, r_rib), hu, lung, bone, body, painter.inner2)
    t2 = time.perf_counter()

    # 3. nodules
    strict = n_nodules is not None
    if n_nodules is None:
        n_nodules = int(r_nod.integers(0, 7))
    labels = np.zeros(shape, dtype=np.uint8)
    specs = place_nodules(r_nod, grid, lung, inner, labels, count=int(n_nodules), diameter_mm=(lo_d, hi_d), strict=strict)
    nodules = []
    for n, spec in enumerate(specs, start=1):
        mean_hu, count = paint_nodule(grid, spec, hu, labels, n)
        nodules.append(
            Nodule(
                center_lps=(float(spec.center[0]), float(spec.center[1]), float(spec.center[2])),
                diameter_mm=2.0 * spec.radius,
                kind=spec.kind,
                attached_to=spec.attached_to,
                lung=spec.lung,
                mean_hu=mean_hu,
                volume_mm3=count * ps * ps * ss,
            )
        )
    vessels &= labels == 0
    t3 = time.perf_counter()

    # 4. partial volume (slice profile + in-plane kernel) and noise
    sigma_z = math.sqrt(thickness**2 / 12.0 + 0.3**2) / ss
    sigma_xy = 0.45 / ps
    blur_and_noise(hu, r_noise, sigma_vox_zyx=(sigma_z, sigma_xy, sigma_xy), noise_hu=float(noise_hu))
    np.clip(hu, -1024.0, 3071.0, out=hu)
    t4 = time.perf_counter()

    options = {
        "matrix": matrix,
        "pixel_spacing": ps,
        "slice_spacing": ss,
        "slice_thickness": thickness,
        "slices": nz,
        "n_nodules": len(nodules),
        "nodule_diameter_mm": [lo_d, hi_d],
        "noise_hu": float(noise_hu),
        "patient_position": str(patient_position).upper(),
    }
    geom = scanner_geometry(grid, direction)
    volume = CTVolume(to_scanner_order(hu, direction), geom, metadata=_metadata(seed, options))
    masks = {
        "body": body,
        "lung_left": lung & (xs > 0)[None, None, :],
        "lung_right": lung & (xs < 0)[None, None, :],
        "airway": airway,
        "bone": bone,
        "vessels": vessels,
    }
    masks = {k: to_scanner_order(v, direction) for k, v in masks.items()}
    phantom = Phantom(
        volume=volume,
        masks=masks,
        nodule_labels=to_scanner_order(labels, direction),
        nodules=tuple(nodules),
        seed=seed,
        options=options,
    )
    log.info(
        "phantom seed %d: %s voxels, %d nodules; anatomy %.2fs, tubes %.2fs, nodules %.2fs, blur+noise %.2fs, total %.2fs",
        seed,
        shape,
        len(nodules),
        t1 - t0,
        t2 - t1,
        t3 - t2,
        t4 - t3,
        time.perf_counter() - t0,
    )
    return phantom
