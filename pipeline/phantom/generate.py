"""``generate_phantom``: a synthetic chest CT (HU, LPS geometry) with organ masks and nodule ground truth."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
from pydicom.uid import generate_uid

from ..errors import PhantomError
from ..volume import CTVolume
from . import confounded
from .anatomy import VESSEL, AnatomyPainter
from .confounders import Confounders
from .dicom_common import phantom_patient_name
from .fine_vessels import paint_fine_vessels
from .framing import frame
from .layout import draw_layout
from .model import Nodule, Phantom
from .nodules import paint_nodule, place_nodules
from .noise import SmoothField, blur_and_noise
from .one_lung import paint_one_lung
from .scanner import CanonicalGrid, direction_for, scanner_geometry, to_scanner_order
from .tubepaint import paint_tubes

log = logging.getLogger(__name__)

MAX_SLICES = 1024
DEFAULT_MAX_SLICES = 320
_SLAB = 16


def _check(name: str, value: float, lo: float, hi: float, fix: str) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and lo <= value <= hi):
        raise PhantomError(f"{name}={value!r} is outside {lo:g}..{hi:g}", where=f"generate_phantom({name}=...)", fix=fix)


def _validate(matrix, pixel_spacing, slice_spacing, slice_thickness, slices, n_nodules, nodule_diameter_mm, noise_hu) -> None:
    if not isinstance(matrix, (int, np.integer)) or isinstance(matrix, bool):
        raise PhantomError(
            f"matrix must be an integer, got {matrix!r}", where="generate_phantom(matrix=...)", fix="use e.g. 128, 256 or 512"
        )
    _check("matrix", int(matrix), 64, 1024, "use a matrix between 64 and 1024 (typically 128..512)")
    _check("pixel_spacing", pixel_spacing, 0.3, 2.0, "use a pixel spacing between 0.3 and 2.0 mm (typically 0.5..1.0)")
    _check("slice_spacing", slice_spacing, 0.3, 10.0, "use a slice spacing between 0.3 and 10 mm")
    if slice_thickness is not None:
        _check("slice_thickness", slice_thickness, 0.3, 10.0, "use a slice thickness between 0.3 and 10 mm")
    if slices is not None:
        if not isinstance(slices, (int, np.integer)) or isinstance(slices, bool):
            raise PhantomError(
                f"slices must be an integer, got {slices!r}",
                where="generate_phantom(slices=...)",
                fix="pass a whole number of slices",
            )
        _check("slices", int(slices), 8, MAX_SLICES, f"use 8..{MAX_SLICES} slices")
    if n_nodules is not None:
        if not isinstance(n_nodules, (int, np.integer)) or isinstance(n_nodules, bool):
            raise PhantomError(
                f"n_nodules must be an integer, got {n_nodules!r}",
                where="generate_phantom(n_nodules=...)",
                fix="pass 0..20 or None",
            )
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
    if hi < lo:  # out of order: said first, whatever the range (the maximum below the minimum is not "outside lo..60")
        raise PhantomError(
            f"the maximum must be at least the minimum, got ({lo:g}, {hi:g}) mm",
            where="generate_phantom(nodule_diameter_mm=...)",
            fix=f"give (min, max) in mm, the smaller first, e.g. ({hi:g}, {lo:g})",
        )
    _check("nodule_diameter_mm[1]", hi, 1.0, 60.0, "use diameters between 1 and 60 mm, the maximum at least the minimum")
    _check("noise_hu", noise_hu, 0.0, 500.0, "use a noise level between 0 and 500 HU")


def _metadata(seed: int, options: dict[str, Any]) -> dict[str, Any]:
    tag = f"ctpipe-phantom|seed={seed}"
    acq = tag + "|" + "|".join(f"{k}={options[k]}" for k in sorted(options))
    return {
        "PatientID": f"PHANTOM-{seed:06d}" if seed >= 0 else f"PHANTOM-M{-seed:06d}",
        "PatientName": phantom_patient_name(seed),  # no part of it a word of the descriptions below
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
    confounders: Confounders | None = None,
) -> Phantom:
    """Generate a synthetic chest CT with ground truth; deterministic from ``seed``.

    The anatomy scales to the field of view (``matrix * pixel_spacing`` mm);
    nodule diameters are absolute mm. ``slices=None`` covers the chest
    (about 1.15 × the lung height, at most 320 slices); a shorter scan
    compresses the chest along z so it stays complete. ``slice_thickness``
    defaults to ``slice_spacing``. ``n_nodules=None`` draws 0..6 (fewer when a
    tiny chest has no room for them); an explicit count is placed or an error raised.
    Nodules lie inside the lungs, never three-quarters or more inside a lung vessel (no reader could see them there).
    ``patient_position`` (HFS, HFP, FFS, FFP, HFDR, HFDL, FFDR, FFDL) sets the
    direction cosines and voxel order as a scanner would; the anatomy and all
    ground truth stay in patient coordinates (LPS, mm).

    ``confounders`` (:class:`~pipeline.phantom.confounders.Confounders`) adds
    what real scans have: table, arms, IV contrast, bowel gas, partial
    coverage, a small field of view, lung disease, a sharp kernel, thick
    slices, metal. The anatomy then keeps its size (that of the plain
    phantom for ``matrix * pixel_spacing``, not compressed along z); the image
    crops it: in-plane a field of view ``fov_factor`` times that one (same
    matrix, pixels ``fov_factor * pixel_spacing``), along z the coverage's
    range (``slices=None``: all of it). The masks of :data:`~pipeline.phantom.model.CONFOUNDER_MASK_NAMES` are
    added and ``phantom.truth`` records what the scan contains. With
    ``confounders=None`` the phantom is the plain one, unchanged.

    Raises :class:`~pipeline.errors.PhantomError` for out-of-range options or
    nodules that do not fit in the lungs.
    """
    t0 = time.perf_counter()
    _validate(matrix, pixel_spacing, slice_spacing, slice_thickness, slices, n_nodules, nodule_diameter_mm, noise_hu)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise PhantomError(
            f"seed must be an integer, got {seed!r}", where="generate_phantom(seed=...)", fix="pass a whole number"
        )
    if confounders is not None and not isinstance(confounders, Confounders):
        raise PhantomError(
            f"confounders must be a Confounders or None, got {type(confounders).__name__}",
            where="generate_phantom(confounders=...)",
            fix="pass pipeline.phantom.Confounders(...), realistic_confounders(seed) or a scenario's .confounders",
        )
    conf = confounders
    direction = direction_for(patient_position)
    seed = int(seed)
    matrix = int(matrix)
    ps = float(pixel_spacing)
    ss = float(slice_spacing)
    thickness = float(slice_thickness) if slice_thickness is not None else ss
    if conf is not None and conf.thick_slices_mm is not None:
        ss = thickness = conf.thick_slices_mm
    if conf is not None and not conf.has_lungs and n_nodules:
        raise PhantomError(
            f"n_nodules={n_nodules} but coverage='abdomen_only' puts no lung in the scan",
            where="generate_phantom(n_nodules=..., confounders=...)",
            fix="pass n_nodules=0 or None, or another coverage",
        )
    lo_d, hi_d = (float(v) for v in nodule_diameter_mm)
    root = np.random.SeedSequence([abs(seed), int(seed < 0), 20250101])
    r_layout, r_tex, r_vessel, r_air, r_rib, r_nod, r_noise = (np.random.default_rng(s) for s in root.spawn(7))

    scene = None
    if conf is None:
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
    else:
        rngs = {name: np.random.default_rng(s) for name, s in zip(confounded.STREAMS, root.spawn(len(confounded.STREAMS)))}
        grid, layout, framing = frame(
            r_layout,
            rngs["frame"],
            conf,
            matrix=matrix,
            pixel_spacing=ps,
            slice_spacing=ss,
            slices=slices,
            max_slices=DEFAULT_MAX_SLICES,
        )
        scene = confounded.new_scene(conf, layout, grid, str(patient_position).upper(), rngs, framing)
        scale = layout.scale
        nz, xs, ps = grid.shape[0], grid.xs, grid.pixel_spacing
    shape = grid.shape

    # 1. analytic anatomy, slab by slab
    texture = SmoothField(r_tex, shape, (6.0 * scale / ss + 1, 6.0 * scale / ps + 1, 6.0 * scale / ps + 1), 18.0)
    painter = AnatomyPainter(layout, grid, down=None if scene is None else scene.down)
    hu = np.empty(shape, dtype=np.float32)
    lung = np.empty(shape, dtype=bool)
    bone = np.empty(shape, dtype=bool)
    for k0 in range(0, nz, _SLAB):
        k1 = min(k0 + _SLAB, nz)
        painter.paint(k0, k1, texture.slab(k0, k1), hu[k0:k1], lung[k0:k1], bone[k0:k1])
    body = np.broadcast_to(painter.body2[None], shape).copy()
    if scene is not None:
        confounded.before_tubes(scene, painter, hu, lung, bone, body)
    t1 = time.perf_counter()

    # 2. tubes: mediastinal vessels, lung vessels, airways, ribs
    blood = None if scene is None else scene.blood
    r_bronchi = np.random.default_rng(root.spawn(1)[0]) if conf is not None and conf.bronchovascular else None
    vessels, airway, inner, blood_mask = paint_tubes(
        layout, grid, (r_vessel, r_air, r_rib), hu, lung, bone, body, painter.inner2, blood, bronchi=r_bronchi
    )
    one_lung = None
    if scene is not None:
        confounded.after_tubes(scene, hu, lung, bone, vessels, body, blood_mask)
        one_lung = paint_one_lung(scene, hu, lung, bone, vessels, airway, body)
    if conf is not None and conf.fine_vessels:
        r_fine = np.random.default_rng(root.spawn(1)[0])
        lung_blood = VESSEL if blood is None else blood["lung_vessels"]
        paint_fine_vessels(layout, grid, hu, lung, r_fine, blood_hu=lung_blood)
    t2 = time.perf_counter()

    # 3. nodules
    strict = n_nodules is not None
    if n_nodules is None:
        n_nodules = int(r_nod.integers(0, 7))
    if scene is not None and not lung.any():
        n_nodules = 0  # no lung in the scan (abdomen only)
    labels = np.zeros(shape, dtype=np.uint8)
    specs = place_nodules(
        r_nod, grid, lung, inner, labels, count=int(n_nodules), diameter_mm=(lo_d, hi_d), strict=strict, vessel_mask=vessels
    )
    left_side = (xs > 0)[None, None, :] if one_lung is None else one_lung.left
    nodules = []
    for n, spec in enumerate(specs, start=1):
        if one_lung is not None:  # the side the nodule's lung came from, not the side of x = 0 it lies on
            kji = np.rint((spec.center[::-1] - [grid.zs[0], grid.ys[0], grid.xs[0]]) / grid.spacing_zyx).astype(int)
            kji = np.clip(kji, 0, np.asarray(shape) - 1)
            spec.lung = "lung_left" if left_side[tuple(kji)] else "lung_right"
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
    if scene is None:
        blur_and_noise(hu, r_noise, sigma_vox_zyx=(sigma_z, sigma_xy, sigma_xy), noise_hu=float(noise_hu))
    else:
        confounded.acquire(scene, hu, r_noise, sigma_z=sigma_z, noise_hu=float(noise_hu))
    np.clip(hu, -1024.0, 3071.0, out=hu)
    t4 = time.perf_counter()

    options: dict[str, Any] = {
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
    if conf is not None:
        options["confounders"] = conf.to_json()
    geom = scanner_geometry(grid, direction)
    metadata = _metadata(seed, options)
    masks = {
        "body": body,
        "lung_left": lung & left_side,
        "lung_right": lung & ~left_side if one_lung is not None else lung & (xs < 0)[None, None, :],
        "airway": airway,
        "bone": bone,
        "vessels": vessels,
    }
    truth: dict[str, Any] = {}
    if scene is not None:
        masks.update(
            confounded.finish(scene, masks, labels, slice_thickness=thickness, slice_spacing=ss, noise_hu=float(noise_hu))
        )
        metadata.update(confounded.metadata(scene))
        truth = scene.truth
    volume = CTVolume(to_scanner_order(hu, direction), geom, metadata=metadata)
    masks = {k: to_scanner_order(v, direction) for k, v in masks.items()}
    phantom = Phantom(
        volume=volume,
        masks=masks,
        nodule_labels=to_scanner_order(labels, direction),
        nodules=tuple(nodules),
        seed=seed,
        options=options,
        truth=truth,
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
