"""The demo detector's training data (``scripts/train_detector.py``): the network inputs of the training phantoms,
cached once with their nodule boxes and lung-vessel points (:func:`build_cache`), and the random training patches
cut from them (:func:`random_patch`).

Positions in the cache and the patches are network-input voxels ((x, y, z) of the RAS input grid at
:data:`SPACING` mm, boxes xyzxyz).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from detector_phantoms import training_phantom

from pipeline.detection.preprocess import Window, prepare_input

log = logging.getLogger("train_detector")

# the network input (written into the model JSON): RAS voxels of SPACING mm (x, y, z), HU windowed to 0..1
SPACING = [1.0, 1.0, 1.25]
WINDOW = Window(-1024.0, 300.0, 0.0, 1.0, True)
PATCH = [64, 64, 48]
CACHE_MARGIN = 24  # voxels kept around the lungs in the cached training inputs
VESSEL_NEGATIVES = 0.5  # share of the negative patches centred on a lung vessel point


def _xyz_box(grid, geometry, kji: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Network-input (x, y, z) box of source voxels ``kji`` (n, 3)."""
    ijk_lo, ijk_hi = kji.min(0)[::-1], kji.max(0)[::-1]
    corners = np.array(
        [[a, b, c] for a in (ijk_lo[0], ijk_hi[0]) for b in (ijk_lo[1], ijk_hi[1]) for c in (ijk_lo[2], ijk_hi[2])], float
    )
    xyz = grid.lps_to_xyz(geometry.index_to_lps(corners))
    return xyz.min(0), xyz.max(0)


def phantom_sample(seed: int, rng: np.random.Generator) -> dict:
    """One training phantom's network input (float16), nodule boxes (input voxels, xyzxyz), the lungs' box
    and up to 400 points on its lung vessels (input voxels; centres of vessel negatives)."""
    ph = training_phantom(seed, rng)
    tensor, grid = prepare_input(ph.volume, spacing=SPACING, window=WINDOW)
    boxes = []
    for nod in ph.nodules:
        c = grid.lps_to_xyz(np.asarray(nod.center_lps))
        half = nod.diameter_mm / 2.0 / np.asarray(SPACING)
        boxes.append(np.concatenate([c - half, c + half]))
    lungs = ph.masks["lung_left"] | ph.masks["lung_right"]
    geom = ph.volume.geometry
    image = tensor[0].numpy()
    if lungs.any():
        xyz_lo, xyz_hi = _xyz_box(grid, geom, np.argwhere(lungs))
    else:  # no lung in the scan (abdomen only): the whole image is negative
        xyz_lo, xyz_hi = np.zeros(3), np.asarray(image.shape, float) - 1
    vessels = np.argwhere(ph.masks["vessels"])
    if len(vessels):
        pick = vessels[rng.choice(len(vessels), min(400, len(vessels)), replace=False)]
        vessel_xyz = grid.lps_to_xyz(geom.index_to_lps(pick[:, ::-1].astype(float)))
    else:
        vessel_xyz = np.zeros((0, 3))
    # keep the lungs and a margin: training patches are drawn there, and the cache stays small
    lo = np.clip(np.floor(xyz_lo).astype(int) - CACHE_MARGIN, 0, None)
    hi = np.minimum(np.ceil(xyz_hi).astype(int) + CACHE_MARGIN + 1, image.shape)
    image = image[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    shift = np.concatenate([lo, lo]).astype(np.float32)
    return {
        "image": image.astype(np.float16),
        "boxes": (np.asarray(boxes, np.float32).reshape(-1, 6) - shift),
        "lung_lo": (xyz_lo - lo).astype(np.float32),
        "lung_hi": (xyz_hi - lo).astype(np.float32),
        "vessels": (vessel_xyz - lo).astype(np.float32).reshape(-1, 3),
        "diam": np.asarray([n.diameter_mm for n in ph.nodules], np.float32),
    }


def build_cache(work: Path, seeds: list[int]) -> list[Path]:
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, seed in enumerate(seeds):
        path = cache / f"phantom_{seed}.npz"
        if not path.is_file():
            t0 = time.time()
            sample = phantom_sample(seed, np.random.default_rng(seed))
            tmp = cache / f".phantom_{seed}.tmp.npz"
            np.savez(tmp, **sample)
            tmp.replace(path)
            log.info(
                "cached phantom %d (%d/%d) %s, %d nodules, %.1fs",
                seed,
                n + 1,
                len(seeds),
                sample["image"].shape,
                len(sample["boxes"]),
                time.time() - t0,
            )
        paths.append(path)
    return paths


def random_patch(sample: dict, rng: np.random.Generator, positive: bool) -> tuple[np.ndarray, np.ndarray]:
    img = sample["image"]
    shape = np.asarray(img.shape)
    patch = np.minimum(np.asarray(PATCH), shape)
    boxes = sample["boxes"]
    if positive and len(boxes):
        size = np.maximum((boxes[:, 3] - boxes[:, 0]) * SPACING[0], 1.0)  # diameter mm
        weight = 1.0 / size  # small nodules are the hard ones: sample them more often
        b = boxes[rng.choice(len(boxes), p=weight / weight.sum())]
        centre = (b[:3] + b[3:]) / 2 + rng.uniform(-0.35, 0.35, 3) * patch
    elif len(sample["vessels"]) and rng.random() < VESSEL_NEGATIVES:
        # a vessel (branch, bifurcation, hilum) near the patch centre: the confusers to learn as negatives
        centre = sample["vessels"][int(rng.integers(len(sample["vessels"])))] + rng.uniform(-0.25, 0.25, 3) * patch
    else:
        lo, hi = sample["lung_lo"], sample["lung_hi"]
        centre = rng.uniform(np.minimum(lo, hi), np.maximum(lo, hi))
    start = np.clip(np.round(centre - patch / 2).astype(int), 0, shape - patch)
    sl = tuple(slice(s, s + p) for s, p in zip(start, patch))
    crop = img[sl].astype(np.float32)
    out_boxes = []
    for b in boxes:
        c = (b[:3] + b[3:]) / 2 - start
        if np.all(c >= 0) and np.all(c < patch):
            nb = np.concatenate([np.maximum(b[:3] - start, 0), np.minimum(b[3:] - start, patch)])
            out_boxes.append(nb)
    out = np.zeros(PATCH, np.float32)  # pad small images up to the patch size (air after windowing = 0)
    out[: crop.shape[0], : crop.shape[1], : crop.shape[2]] = crop
    bx = np.asarray(out_boxes, np.float32).reshape(-1, 6)
    for ax in range(3):  # random flips
        if rng.random() < 0.5:
            out = np.flip(out, ax)
            lo, hi = bx[:, ax].copy(), bx[:, ax + 3].copy()
            bx[:, ax], bx[:, ax + 3] = PATCH[ax] - hi, PATCH[ax] - lo
    out = out * rng.uniform(0.95, 1.05) + rng.uniform(-0.03, 0.03)
    return np.ascontiguousarray(out), bx
