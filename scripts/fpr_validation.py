"""Validation of the false-positive classifier on cached validation candidates (``scripts/train_fp_reducer.py``):
the CPM of each scoring setting, the choice among them, and the interim operating point.

Candidate centres are DICOM patient coordinates (LPS, mm); scores are probabilities (0..1).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from typing import Any

import calibrate_operating_point
import numpy as np
import torch

from pipeline.detection.evaluate import evaluate_froc
from pipeline.detection.fp_reduction import (
    FPReductionConfig,
    PatchClassifier,
    combine_scores,
    final_scores,
    network_support,
    patch_logits,
    suppress_duplicates,
)

log = logging.getLogger("train_fp_reducer")

#: The training record's entry holding :func:`validate`'s results.
VALIDATION_KEY = "validation_cpm_by_flip_views_detector_weight_duplicate_factor_box_merge_and_blob_support"


@torch.no_grad()
def probabilities(net: torch.nn.Module, patches: np.ndarray, *, views: int = 1, min_probability: float = 0.02) -> np.ndarray:
    """Nodule probability of each cached patch (uint8), scored as the pipeline scores it (:func:`patch_logits`)."""
    out = []
    for a in range(0, len(patches), 256):
        x = torch.from_numpy(patches[a : a + 256].astype(np.float32) / 255.0)
        out.append(torch.sigmoid(patch_logits(net, x, views=views, min_probability=min_probability)).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def duplicate_findings(preds: list[tuple[np.ndarray, float]], case: dict, *, min_score: float = 0.5) -> int:
    """Findings scoring ``min_score`` or more that hit a nodule (LPS mm, within its radius) a higher-scoring finding
    already hit: the same nodule reported twice (LUNA16 counting ignores them; a reader sees two findings)."""
    hit: set[int] = set()
    extra = 0
    for centre, score in sorted(preds, key=lambda p: -p[1]):
        if score < min_score:
            break
        d = np.linalg.norm(case["nodule_centers"] - centre, axis=1) < case["nodule_diameters"] / 2.0
        for m in np.flatnonzero(d):
            extra += int(m in hit)
            hit.add(int(m))
    return extra


def choose_setting(val: dict[str, float], *, tolerance: float) -> str:
    """The key of :func:`validate`'s results to use: among the settings whose validation CPM lies within
    ``tolerance`` of the best (ties: by default one nodule's share of the validation sensitivity, a difference
    the validation phantoms cannot resolve), the one weighting both stages most evenly (detector weight nearest
    0.5: both stages are trained on phantoms only, and on scans unlike them either can be wrong alone, so the
    even geometric mean asks both to agree), then small-blob candidates with the network's support (the same
    reason), then the best CPM, then merging shared boxes (fewer duplicate findings, which CPM does not count)."""
    if not val:
        raise ValueError("no validation results to choose from: give validation seeds (--n-val above 0)")
    top = max(val.values())

    def rank(key: str) -> tuple[float, bool, float, bool]:
        setting = parse_setting(key)
        return (-abs(setting["detector_weight"] - 0.5), setting["blob_support"], val[key], setting["box_merge"])

    return max((k for k in val if val[k] >= top - tolerance), key=rank)


def one_nodule_share(cases: list[dict]) -> float:
    """One nodule's share of the sensitivity on validation ``cases``: :func:`choose_setting`'s tie tolerance."""
    return 1.0 / max(sum(len(c["nodule_diameters"]) for c in cases), 1)


def parse_setting(key: str) -> dict[str, Any]:
    """The :class:`FPReductionConfig` fields a key of :func:`validate`'s results stands for."""
    views, weight, factor, *flags = key.split("/")
    unknown = set(flags) - {"box", "support"}
    if unknown:
        raise ValueError(f"validation setting {key!r} has unknown parts {sorted(unknown)}: expected box and/or support")
    return {
        "flip_views": int(views),
        "detector_weight": float(weight),
        "duplicate_radius_factor": float(factor),
        "box_merge": "box" in flags,
        "blob_support": "support" in flags,
    }


def validate(net: torch.nn.Module, cases: list[dict], args: argparse.Namespace) -> dict[str, float]:
    """CPM on validation phantoms (:func:`phantom_candidates` without jitter) for one view and ``--flip-views``
    views, each detector weight, each duplicate radius factor, duplicates merged by distance alone or also by
    shared boxes, and small-blob candidates scored by the classifier alone or with the network's support (keys
    ``views/weight/factor``, then ``/box`` and ``/support`` where on: :func:`parse_setting`), candidates scored as
    the pipeline scores them; the duplicate findings (:func:`duplicate_findings`) of each are logged."""
    results = {}
    supported = [network_support(c["centers"], c["det"], c["extents"]) for c in cases]
    for views in sorted({1, args.flip_views}):
        probs = [probabilities(net, c["patches"], views=views, min_probability=args.flip_min_probability) for c in cases]
        for w, factor, box, support in itertools.product(
            args.detector_weights, args.duplicate_factors, (False, True), (False, True)
        ):
            preds, truth = {}, {}
            duplicates = 0
            for n, (case, p) in enumerate(zip(cases, probs)):
                scores = combine_scores(p, supported[n] if support else case["det"], w)
                keep = suppress_duplicates(
                    case["centers"],
                    case["sizes"],
                    scores,
                    radius_factor=factor,
                    extents_mm=case["extents"] if box else None,
                )
                preds[str(n)] = [(case["centers"][k], float(scores[k])) for k in keep]
                truth[str(n)] = list(zip(case["nodule_centers"], case["nodule_diameters"]))
                duplicates += duplicate_findings(preds[str(n)], case)
            res = evaluate_froc(preds, truth, n_bootstrap=0)
            key = f"{views}/{w}/{factor}" + ("/box" if box else "") + ("/support" if support else "")
            results[key] = round(float(res.cpm), 4)
            log.info(
                "validation (%d phantoms), %d view(s), detector weight %.2f, duplicate radius factor %.1f%s%s: "
                "CPM %.3f, %d duplicate findings scoring 0.5 or more",
                len(cases),
                views,
                w,
                factor,
                ", shared boxes merged" if box else "",
                ", blobs with the network's support" if support else "",
                res.cpm,
                duplicates,
            )
    return results


def member_validation(
    trained: list[tuple[PatchClassifier, list[dict]]], cases: list[dict], key: str, args: argparse.Namespace
) -> list[float]:
    """Each ensemble member's own validation CPM at the ensemble's chosen setting ``key`` (:func:`parse_setting`):
    what averaging them gains."""
    setting = parse_setting(key)
    one = argparse.Namespace(
        **{
            **vars(args),
            "flip_views": setting["flip_views"],
            "detector_weights": [setting["detector_weight"]],
            "duplicate_factors": [setting["duplicate_radius_factor"]],
        }
    )
    out = []
    for n, (net, _) in enumerate(trained):
        cpm = validate(net, cases, one)[key]
        log.info("ensemble member %d alone: validation CPM %.4f at setting %s", n, cpm, key)
        out.append(cpm)
    return out


def operating_point_from_cache(
    net: torch.nn.Module,
    cases: list[dict],
    cfg: FPReductionConfig,
    seeds: list[int],
    *,
    fps_per_scan: float,
    command: str,
    precision: str,
) -> dict:
    """The ``operating_point`` entry from the validation phantoms' cached candidates (:func:`phantom_candidates`
    without jitter: the pipeline's candidates of one RetinaNet pass each), scored as
    :func:`pipeline.detection.fp_reduction.reduce_false_positives` scores them with ``cfg``'s views, detector weight
    and duplicate merging; ``network_only`` from the RetinaNet's own scores at its (refined) finding centres. The
    same rule as ``scripts/calibrate_operating_point.py``, without a second detector pass per phantom (and without its
    thick-slice score calibration, which that script adds). ``precision``: the number format of the RetinaNet pass
    that made the candidates (the detector's ``precision``)."""
    t0 = time.time()
    pipeline, network, truth = {}, {}, {}
    for n, case in enumerate(cases):
        probs = probabilities(net, case["patches"], views=cfg.flip_views, min_probability=cfg.flip_min_probability)
        scores = final_scores(cfg, probs, case["det"], case["centers"], case["extents"])
        keep = suppress_duplicates(
            case["centers"],
            case["sizes"],
            scores,
            radius_factor=cfg.duplicate_radius_factor,
            extents_mm=case["extents"] if cfg.box_merge else None,
        )
        pipeline[str(n)] = [(case["centers"][k], float(scores[k])) for k in keep]
        net_idx = np.flatnonzero(case["det"] >= 0)
        network[str(n)] = [(case["centers"][k], float(case["det"][k])) for k in net_idx]
        truth[str(n)] = list(zip(case["nodule_centers"], case["nodule_diameters"]))
    entries = {
        name: calibrate_operating_point.operating_point_entry(found, truth, seeds, stage=stage, fps_per_scan=fps_per_scan)
        for name, found, stage in (
            ("pipeline", pipeline, "RetinaNet + false-positive reduction, candidates cached at training"),
            ("network", network, "RetinaNet alone at its refined finding centres"),
        )
    }
    return {
        **entries["pipeline"],
        "precision": precision,
        "device": "cpu",
        "compute_cpu_minutes": round((time.time() - t0) / 60, 1),
        "command": command,
        "network_only": entries["network"],
    }
