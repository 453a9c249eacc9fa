"""The confounder steps of :func:`~pipeline.phantom.generate.generate_phantom`, in order, and the truth they leave.

``generate_phantom`` calls, on the canonical grid (LPS mm): :func:`new_scene`
after framing; :func:`before_tubes` after the analytic anatomy (emphysema,
abdomen, heart chambers, arms, table); :func:`after_tubes` after vessels,
airways and ribs (contrast blood, effusion, atelectasis, metal);
:func:`acquire` instead of the plain blur and noise (streaks, kernel);
:func:`finish` for the extra masks and ``phantom.truth`` (and the ``bone`` mask without the spinal
canal, which the painter's vertebral arch crosses but paints as CSF); :func:`metadata`
for the DICOM attributes that change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .abdomen import paint_abdomen
from .acquisition import add_streaks, paint_metal, sharp_blur_and_noise
from .anatomy import AnatomyPainter
from .arms import paint_arms
from .confounders import Confounders
from .contrast import blood_values, paint_heart
from .disease import paint_emphysema, paint_pleura
from .framing import lung_fraction_in_scan
from .layout import Layout
from .model import CONFOUNDER_MASK_NAMES
from .noise import blur_and_noise
from .scanner import CanonicalGrid, floor_direction
from .scene import Scene, body_outline
from .table import paint_table

STREAMS = ("frame", "table", "arms", "contrast", "abdomen", "disease", "metal")
"""Independent random streams of a confounded case (one per group, so one option does not move the others)."""


def new_scene(
    conf: Confounders,
    layout: Layout,
    grid: CanonicalGrid,
    patient_position: str,
    rngs: dict[str, np.random.Generator],
    framing: dict[str, Any],
) -> Scene:
    """The shared state of one confounded case; gravity from ``patient_position``."""
    down3 = floor_direction(patient_position)
    scene = Scene(layout=layout, grid=grid, conf=conf, down=down3[:2].copy(), rngs=rngs)
    scene.blood = blood_values(conf.contrast, rngs["contrast"])
    scene.truth.update(
        patient_position=patient_position,
        gravity_lps=[float(v) for v in down3],
        coverage=conf.coverage,
        fov={
            **{k: framing[k] for k in ("fov_mm", "anatomy_fov_mm", "patient_width_mm")},
            "factor": conf.fov_factor,
            "centre": conf.fov_centre,
        },
        scan_z_mm=framing["scan_z_mm"],
        lung_z_mm=framing["lung_z_mm"],
        contrast_phase=conf.contrast,
        blood_hu={k: v for k, v in scene.blood.items() if k != "atelectasis_gain"},
    )
    return scene


def before_tubes(
    scene: Scene, painter: AnatomyPainter, hu: np.ndarray, lung: np.ndarray, bone: np.ndarray, body: np.ndarray
) -> None:
    """Emphysema, abdomen, heart chambers (with contrast), arms and table, painted over the analytic anatomy."""
    scene.spinal_canal = painter.canal2
    paint_emphysema(scene, hu, lung)
    paint_abdomen(scene, painter, hu)
    scene.add_mask("contrast_blood", np.zeros(scene.grid.shape, dtype=bool))
    if scene.conf.contrast != "none":
        paint_heart(scene, painter, hu)
    arm_points = paint_arms(scene, hu, body, bone, painter.body2)
    paint_table(scene, hu, body, np.concatenate([body_outline(scene.layout), arm_points]))


def after_tubes(
    scene: Scene,
    hu: np.ndarray,
    lung: np.ndarray,
    bone: np.ndarray,
    vessels: np.ndarray,
    body: np.ndarray,
    blood_mask: np.ndarray | None,
) -> None:
    """Contrast blood of the vessels, effusion and atelectasis, metal."""
    if scene.conf.contrast != "none" and blood_mask is not None:
        scene.add_mask("contrast_blood", blood_mask & body)
    paint_pleura(scene, hu, lung, vessels)
    paint_metal(scene, hu, bone)


def acquire(scene: Scene, hu: np.ndarray, rng: np.random.Generator, *, sigma_z: float, noise_hu: float) -> None:
    """Streaks, slice profile, reconstruction kernel and noise (in place); records kernel and noise."""
    ps = scene.grid.pixel_spacing
    scene.masks["emphysema"] &= hu < -950.0  # what is still low attenuation after vessels and nodules
    add_streaks(scene, hu)
    if scene.conf.kernel == "sharp":
        noise = sharp_blur_and_noise(hu, rng, sigma_z=sigma_z, pixel=ps, noise_hu=noise_hu)
    else:
        blur_and_noise(hu, rng, sigma_vox_zyx=(sigma_z, 0.45 / ps, 0.45 / ps), noise_hu=noise_hu)
        noise = noise_hu
    scene.truth["kernel"] = scene.conf.kernel
    scene.truth["noise_hu"] = round(float(noise), 2)


def _lung_status(mask: np.ndarray) -> str:
    """complete, apex_cut, base_cut, apex_and_base_cut or absent, from a canonical mask (slices along +S)."""
    if not mask.any():
        return "absent"
    apex, base = bool(mask[-1].any()), bool(mask[0].any())
    return {(False, False): "complete", (True, False): "apex_cut", (False, True): "base_cut"}.get(
        (apex, base), "apex_and_base_cut"
    )


def _edge(mask: np.ndarray) -> bool:
    """True when the mask reaches the in-plane border of the image."""
    return bool(mask[:, 0, :].any() or mask[:, -1, :].any() or mask[:, :, 0].any() or mask[:, :, -1].any())


def finish(
    scene: Scene,
    masks: dict[str, np.ndarray],
    labels: np.ndarray,
    *,
    slice_thickness: float,
    slice_spacing: float,
    noise_hu: float,
) -> dict[str, np.ndarray]:
    """The confounder masks (canonical, :data:`CONFOUNDER_MASK_NAMES`) and the rest of ``scene.truth``."""
    g = scene.grid
    if scene.spinal_canal is not None:
        # the vertebral arch's bars cross the canal in the painter's bone map, but the canal is painted CSF
        masks["bone"] &= ~scene.spinal_canal[None]
    lungs = masks["lung_left"] | masks["lung_right"]
    out = {name: scene.masks.get(name, np.zeros(g.shape, dtype=bool)) for name in CONFOUNDER_MASK_NAMES}
    nodule = labels > 0
    out["emphysema"] = out["emphysema"] & lungs & ~masks["vessels"] & ~nodule
    out["contrast_blood"] = out["contrast_blood"] & ~(
        masks["bone"] | out["metal"] | out["effusion"] | out["atelectasis"] | nodule
    )
    out["table"] = out["table"] & ~masks["body"]
    out["bowel_gas"] = out["bowel_gas"] & ~lungs
    voxel_ml = g.pixel_spacing**2 * g.slice_spacing / 1000.0
    status = {name: _lung_status(masks[name]) for name in ("lung_left", "lung_right")}
    parts = set(status.values()) - {"absent"}
    if not parts:
        overall = "absent"
    elif parts == {"complete"}:
        overall = "complete"
    else:
        apex = any(p in ("apex_cut", "apex_and_base_cut") for p in parts)
        base = any(p in ("base_cut", "apex_and_base_cut") for p in parts)
        overall = "apex_and_base_cut" if apex and base else ("apex_cut" if apex else "base_cut")
    n_lung = int(np.count_nonzero(lungs))
    half = 0.5 * slice_spacing
    t = scene.truth
    t["lungs_in_scan"] = overall
    t["lung_status"] = status
    t["lung_fraction_in_scan"] = round(lung_fraction_in_scan(scene.layout, float(g.zs[0]) - half, float(g.zs[-1]) + half), 4)
    t["slice_thickness_mm"] = float(slice_thickness)
    t["slice_spacing_mm"] = float(slice_spacing)
    t["fov"]["cuts_body"] = _edge(masks["body"])
    t["fov"]["cuts_lungs"] = _edge(lungs)
    t["emphysema_fraction"] = scene.conf.emphysema
    t["emphysema_index"] = round(float(np.count_nonzero(out["emphysema"])) / n_lung, 4) if n_lung else 0.0
    t["bowel_gas_ml"] = round(float(np.count_nonzero(out["bowel_gas"])) * voxel_ml, 1)
    t["contrast_blood_ml"] = round(float(np.count_nonzero(out["contrast_blood"])) * voxel_ml, 1)
    for name in ("effusion", "atelectasis"):
        t.setdefault(name, {"sides": "none", "volume_ml": {"left": 0.0, "right": 0.0}})
    t["metal"]["present"] = bool(out["metal"].any())
    return out


def metadata(scene: Scene) -> dict[str, Any]:
    """DICOM attributes of a confounded series: kernel, body part, description, contrast agent."""
    conf = scene.conf
    abdomen = conf.coverage in ("bases_only", "abdomen_only")
    words = [("Abdomen" if abdomen else "Chest") + " phantom"]
    if conf.contrast != "none":
        words.append(f"{conf.contrast} phase")
    meta: dict[str, Any] = {
        "ConvolutionKernel": "LUNG" if conf.kernel == "sharp" else "STANDARD",
        "BodyPartExamined": "ABDOMEN" if abdomen else "CHEST",
        "SeriesDescription": ", ".join(words),
    }
    if conf.contrast != "none":
        meta["ContrastBolusAgent"] = "IODINE"
    return meta
