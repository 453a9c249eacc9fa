"""The false-positive classifier's training and validation data: each phantom's candidates as the pipeline makes
them, labelled against the phantom's nodules, cut into patches and cached (``scripts/train_fp_reducer.py``).

Centres are DICOM patient coordinates (LPS, mm); patches are cubes along L, P, S (uint8, 0..255 for the
classifier's 0..1 input).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from fpr_anatomy import ANATOMY_KINDS, anatomy_negatives
from train_detector import training_phantom

from pipeline.detection.findings import box_extents
from pipeline.detection.fp_reduction import FPReductionConfig, candidate_findings, classifier_input
from pipeline.detection.infer import Detector
from pipeline.detection.lungs import quick_lung_mask

log = logging.getLogger("train_fp_reducer")


def phantom_candidates(det: Detector, seed: int, cfg: FPReductionConfig, jitter: int) -> dict[str, np.ndarray]:
    """One phantom's candidates as the pipeline makes them, plus ``jitter`` positives per nodule: patches
    (uint8, N x channels x P^3), labels (1, 0, or -1 = left out), detector scores (-1 blob, -2 jittered),
    centres (LPS mm), diameters, box extents (mm along L, P, S), the diameter of the nodule each positive hits, and the nodules themselves."""
    rng = np.random.default_rng(seed)
    ph = training_phantom(seed, rng)
    region = quick_lung_mask(ph.volume)
    findings = det.detect(ph.volume, lung_mask=region)
    items, det_scores = candidate_findings(ph.volume, findings, region, blobs=cfg.blob_candidates)
    centers = np.array([f.center_lps for f in items]).reshape(-1, 3)
    sizes = np.array([f.diameter_mm for f in items], np.float32)
    extents = box_extents(items).astype(np.float32)
    labels = np.zeros(len(items), np.int8)
    diam = np.zeros(len(items), np.float32)
    extra = []
    for nod in ph.nodules:
        c, r = np.asarray(nod.center_lps), nod.diameter_mm / 2.0
        d = np.linalg.norm(centers - c, axis=1)
        labels[(d >= r) & (d < max(1.5 * r, 3.0)) & (labels == 0)] = -1
        labels[d < r] = 1
        diam[d < r] = nod.diameter_mm
        for _ in range(jitter):
            v = rng.normal(size=3)
            extra.append((c + v / np.linalg.norm(v) * rng.uniform(0, 0.5 * r), nod.diameter_mm))
    if extra:
        centers = np.concatenate([centers, np.array([e[0] for e in extra])])
        labels = np.concatenate([labels, np.ones(len(extra), np.int8)])
        det_scores = np.concatenate([det_scores, np.full(len(extra), -2.0)])
        diam = np.concatenate([diam, np.array([e[1] for e in extra], np.float32)])
        sizes = np.concatenate([sizes, np.array([e[1] for e in extra], np.float32)])
        extents = np.concatenate([extents, np.repeat(np.array([[e[1]] for e in extra], np.float32), 3, axis=1)])
    patches = classifier_input(ph.volume, centers, cfg)
    return {
        "patches": np.round(patches * 255).astype(np.uint8),
        "labels": labels,
        "det": det_scores.astype(np.float32),
        "diam": diam,
        "centers": centers,
        "sizes": sizes,
        "extents": extents,
        "nodule_centers": np.array([n.center_lps for n in ph.nodules]).reshape(-1, 3),
        "nodule_diameters": np.array([n.diameter_mm for n in ph.nodules]),
    }


def _patch_key(cfg: FPReductionConfig) -> str:
    """The part of a cache file's name set by the patches' size and spacings."""
    return f"p{cfg.patch}_s{'-'.join(f'{s:g}' for s in cfg.spacings_mm)}"


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` (.npz) whole or not at all: a killed run leaves no half-written cache file."""
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def anatomy_cache(work: Path, seeds: list[int], cfg: FPReductionConfig, count: int) -> list[dict]:
    """For each training seed, :func:`anatomy_negatives` as cached patches (uint8), labels (0), detector score -3,
    centres (LPS mm), sizes (the patch side) and kinds; cached in ``work``."""
    out = []
    key = f"{_patch_key(cfg)}_n{count}"
    for n, seed in enumerate(seeds):
        path = work / "cache" / f"anatomy_{seed}_{key}.npz"
        if not path.is_file():
            t0 = time.time()
            ph = training_phantom(seed, np.random.default_rng(seed))
            centres, kinds = anatomy_negatives(ph, np.random.default_rng([seed, 1]), count)
            patches = classifier_input(ph.volume, centres, cfg)
            _save_npz(
                path,
                patches=np.round(patches * 255).astype(np.uint8),
                labels=np.zeros(len(centres), np.int8),
                det=np.full(len(centres), -3.0, np.float32),
                diam=np.zeros(len(centres), np.float32),
                centers=centres,
                sizes=np.full(len(centres), float(cfg.patch), np.float32),
                kinds=kinds,
            )
            log.info(
                "phantom %d (%d/%d): %d anatomy negatives (%s), %.1fs",
                seed,
                n + 1,
                len(seeds),
                len(centres),
                ", ".join(f"{ANATOMY_KINDS[k]} {int((kinds == k).sum())}" for k in range(len(ANATOMY_KINDS))),
                time.time() - t0,
            )
        out.append(dict(np.load(path)))
    return out


def build_cache(work: Path, det: Detector, seeds: list[int], cfg: FPReductionConfig, jitter: int) -> list[dict]:
    """:func:`phantom_candidates` of each seed, cached in ``work`` (keyed by the settings that change them)."""
    out = []
    (work / "cache").mkdir(parents=True, exist_ok=True)
    key = f"{_patch_key(cfg)}_b{cfg.blob_candidates}_j{jitter}_x"
    for n, seed in enumerate(seeds):
        path = work / "cache" / f"fpr_{seed}_{key}.npz"
        if not path.is_file():
            t0 = time.time()
            data = phantom_candidates(det, seed, cfg, jitter)
            _save_npz(path, **data)
            lab = data["labels"]
            log.info(
                "phantom %d (%d/%d): %d candidates, %d positive (%d jittered), %.1fs",
                seed,
                n + 1,
                len(seeds),
                int((data["det"] > -2).sum()),
                int(((lab == 1) & (data["det"] > -2)).sum()),
                int((data["det"] == -2).sum()),
                time.time() - t0,
            )
        out.append(dict(np.load(path)))
    return out
