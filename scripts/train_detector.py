#!/usr/bin/env python
"""Train ctpipe's demo nodule detector (a small MONAI RetinaNet) on realistic synthetic phantoms.

The weights it writes are trained on synthetic phantoms, for demonstration and
testing only, not for clinical use.

Steps: generate the training phantoms once (:func:`training_phantom`: realistic
confounders, vessel trees, a fifth without any nodule; seeds ``--seed0 ..``, never
the held-out seeds 1..999 or the scenario seeds 5000..5099) and cache their network
inputs, boxes and lung-vessel points; then train (from ``--init`` weights or from
scratch) on random patches (two thirds centred near a nodule, the rest negatives,
half of those centred on a lung vessel) with MONAI's detection
training utilities: ATSS matcher, hard-negative sampler, box coder (encoded
regression targets, smooth-L1), BCE classification. Mixed precision (float16 on
a GPU, bfloat16 on CPUs that run it natively; ``--fp32`` turns it off) and gradient
accumulation on a GPU. A checkpoint is written every
``--checkpoint-every`` steps and the run resumes from it. Losses are logged.

    python scripts/train_detector.py --work /tmp/ctpipe_train

``bash scripts/train_demo.sh`` trains both stages of the demo model (this script, then
``scripts/train_fp_reducer.py``) and evaluates them on held-out phantoms.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.detection.model_config import DEMO_MODEL_JSON, FORMAT
from pipeline.detection.network import build_anchor_generator, build_network, count_parameters
from pipeline.detection.precision import autocast_dtype, precision_name
from pipeline.detection.preprocess import Window, prepare_input

log = logging.getLogger("train_detector")

#: Seeds of the held-out evaluation phantoms: no training or validation script uses them.
HELDOUT_SEEDS = range(1, 1000)
#: Seeds of the named confounder scenarios (pipeline.phantom.SCENARIO_SEEDS), held out as well.
SCENARIO_SEEDS = range(5000, 5100)

ARCH = {
    "kind": "small_resnet_fpn",
    "block": "basic",
    "layers": [2, 2, 1, 1],
    "block_inplanes": [16, 32, 64, 128],
    "conv1_t_stride": [2, 2, 1],
    "conv1_t_size": [7, 7, 5],
    "returned_layers": [1, 2],
    "fpn_channels": 32,
    "num_classes": 1,
    "num_anchors": 3,
    "size_divisible": [16, 16, 8],
}
SPACING = [1.0, 1.0, 1.25]
WINDOW = Window(-1024.0, 300.0, 0.0, 1.0, True)
# anchor shapes in voxels of SPACING at the finest level; levels scale them by 1, 2, 4
ANCHORS = {"feature_map_scales": [1, 2, 4], "base_anchor_shapes": [[4, 4, 3], [6, 6, 5], [10, 10, 8]]}
SELECTOR = {"score_thresh": 0.02, "topk_candidates_per_level": 1000, "nms_thresh": 0.22, "detections_per_img": 300}
# the network sees the lungs' whole box at once where it fits (448 voxels per axis at SPACING; larger inputs are
# tiled): the operating point is calibrated, and the held-out figures measured, that way
SLIDING = {"roi_size": [448, 448, 448], "overlap": 0.25, "mode": "constant"}
PATCH = [64, 64, 48]
CACHE_MARGIN = 24  # voxels kept around the lungs in the cached training inputs
VESSEL_NEGATIVES = 0.5  # share of the negative patches centred on a lung vessel point


#: Share of the training, validation and evaluation phantoms drawn without any nodule (vessels, bifurcations and
#: the confounders are then the only things the detector sees there: negatives to learn).
NO_NODULE_FRACTION = 0.2
#: Patient positions of the training phantoms and their shares (the network input is reoriented to RAS).
POSITIONS = {"HFS": 0.85, "FFS": 0.1, "HFP": 0.05}


def phantom_confounders(seed: int):  # -> pipeline.phantom.Confounders
    """The confounders of every training, validation and held-out phantom: ``realistic_confounders(seed)`` with
    the lungs' sub-voxel peripheral vessels (``fine_vessels``: the faint dots real lungs are full of)."""
    from dataclasses import replace

    from pipeline.phantom import realistic_confounders

    return replace(realistic_confounders(seed), fine_vessels=True)


def training_phantom(seed: int, rng: np.random.Generator):  # -> pipeline.phantom.Phantom
    """A realistic training phantom, deterministic from ``seed`` (``rng`` = ``default_rng(seed)``).

    Random protocol (matrix 160-256, field of view 200-360 mm, slices 1.25-2.5 mm), a patient position
    (:data:`POSITIONS`) and the realistic confounders of ``realistic_confounders(seed)`` (table, blanket, arms,
    contrast, bowel gas, partial coverage, small or large field of view, emphysema, effusion, atelectasis, sharp
    kernel, thick slices, metal) over the vessel trees (bifurcating, tapering from the hila) and the lungs' sub-voxel
    peripheral vessels (:func:`phantom_confounders`); a share
    :data:`NO_NODULE_FRACTION` has no nodule at all, the rest 3-8 (fewer where the lungs hold fewer).
    """
    from pipeline.errors import PhantomError
    from pipeline.phantom import generate_phantom

    matrix = int(rng.choice([160, 192, 256]))
    fov = float(rng.uniform(200.0, 360.0))
    slice_spacing = float(rng.choice([1.25, 2.0, 2.5]))
    n_nodules = 0 if rng.random() < NO_NODULE_FRACTION else int(rng.integers(3, 9))
    position = str(rng.choice(list(POSITIONS), p=np.asarray(list(POSITIONS.values()))))
    conf = phantom_confounders(seed)
    if not conf.has_lungs:
        n_nodules = 0
    options = {
        "matrix": matrix,
        "pixel_spacing": min(2.0, fov / matrix),
        "slice_spacing": slice_spacing,
        "patient_position": position,
        "confounders": conf,
    }
    try:
        return generate_phantom(seed, n_nodules=n_nodules, **options)
    except PhantomError:  # the cropped lungs hold fewer nodules: as many as fit
        return generate_phantom(seed, n_nodules=None if n_nodules else 0, **options)


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


def write_model(net: torch.nn.Module, out_json: Path, args: argparse.Namespace, history: dict) -> None:
    weights = out_json.with_suffix(".pt")
    state = {k: v.detach().cpu().float() if v.is_floating_point() else v.cpu() for k, v in net.state_dict().items()}
    torch.save(state, weights)
    data = {
        "format": FORMAT,
        "name": out_json.stem,
        "description": "Small MONAI RetinaNet trained on synthetic phantoms, for demonstration and testing only, not for clinical use.",
        "spacing_mm_ras": SPACING,
        "intensity_window": {
            "a_min": WINDOW.a_min,
            "a_max": WINDOW.a_max,
            "b_min": WINDOW.b_min,
            "b_max": WINDOW.b_max,
            "clip": WINDOW.clip,
        },
        "network": ARCH,
        "anchors": ANCHORS,
        "box_selector": SELECTOR,
        "sliding_window": SLIDING,
        "size_divisible": ARCH["size_divisible"],
        "lung_crop_margin_mm": 10.0,
        "lung_filter_margin_mm": 8.0,
        "weights": weights.name,
        "training": {
            "data": (
                "realistic synthetic phantoms: pipeline.phantom.generate_phantom with realistic_confounders(seed) and "
                "sub-voxel peripheral lung vessels (fine_vessels; scripts/train_detector.py phantom_confounders), "
                f"{NO_NODULE_FRACTION:.0%} without any nodule, positions {POSITIONS} (scripts/train_detector.py "
                f"training_phantom); {VESSEL_NEGATIVES:.0%} of the negative patches centred on a lung vessel"
            ),
            "initial_weights": args.init_label or (args.init.name if args.init is not None else None),
            "train_seeds": [args.seed0, args.seed0 + args.n_train - 1],
            "evaluation_seeds_must_avoid": f"{args.seed0}..{args.seed0 + args.n_train - 1}",
            "torch_seed": args.torch_seed,
            "patch_size": PATCH,
            "steps": history["step"],
            "batch_size": args.batch,
            "grad_accumulation": args.accum,
            "precision": history.get("precision"),
            "optimizer": f"AdamW (weight decay 1e-4), lr {args.lr}, cosine over {args.steps} steps with {args.warmup} warm-up steps",
            "matcher": "ATSS (num_candidates=4)",
            "sampler": "hard negative (batch 128, positive fraction 0.25)",
            "final_loss": history.get("loss"),
            "compute_cpu_minutes": history.get("compute_cpu_minutes"),
            "threads": args.threads,
            "parameters": count_parameters(net),
        },
        "intended_use": "trained on synthetic phantoms, for demonstration and testing only, not for clinical use",
    }
    out_json.write_text(json.dumps(data, indent=1) + "\n")
    log.info("wrote %s and %s (%.1f MB)", out_json, weights, weights.stat().st_size / 1e6)


def evaluate_heldout(
    model_json: Path,
    seeds: list[int],
    out: Path,
    *,
    weights: Path | None = None,
    refine: bool = False,
    amp: bool = True,
    protocol: dict | None = None,
) -> int:
    """Detect on held-out phantoms (never training seeds), write findings + ground truth, print the FROC tables.

    Two runs from one network pass: the network's findings as they are, and the default pipeline's
    (:meth:`Detector.postprocess`: refined centres, then the model's false-positive reduction stage
    or compact-blob rescoring), written as ``network/*.findings.json`` / ``froc.*`` and
    ``pipeline/*.findings.json`` / ``froc_pipeline.*``, ground truth in ``phantom_NNN/``
    (``ctpipe evaluate --pred OUT/pipeline --truth OUT``). ``refine``: also centres refined without
    re-scoring (``froc_refined.*``). ``protocol``: the phantoms' ``matrix``, ``pixel_spacing`` and
    ``slice_spacing`` (mm; default :data:`EVAL_PHANTOM`).
    """
    from pipeline.detection.bundle import LoadedModel, load_model, load_weights
    from pipeline.detection.evaluate import at_score_threshold, froc_of_matched, match_predictions, size_band_text
    from pipeline.detection.infer import Detector
    from pipeline.detection.lungs import quick_lung_mask
    from pipeline.detection.operating_point import resolve_threshold
    from pipeline.detection.refine import refine_findings

    model = load_model(model_json)
    if weights is not None:  # e.g. the training checkpoint
        load_weights(model.network, weights)
        model = LoadedModel(model.config, model.network.eval())
    # every candidate kept: evaluation scores the full lists, whatever the operating point
    det = Detector(model=model, device="cpu", amp=amp, postprocess=False, all_candidates=True)
    post = Detector(model=model, device="cpu", amp=amp, all_candidates=True)  # the default post-processing of det's findings
    # the model's operating points: the pipeline's and the network's own (``--raw``)
    op_threshold = {
        "froc": resolve_threshold(model.config, postprocess=False)[0],
        "froc_pipeline": resolve_threshold(model.config, postprocess=True)[0],
    }
    log.info("evaluating in %s%s", det.precision, " with false-positive reduction" if post.fp_reduction else "")
    preds, pipeline, refined, truth = {}, {}, {}, {}
    kinds: dict[str, list[tuple[np.ndarray, str, str]]] = {}  # each nodule's centre (LPS mm), kind, attachment
    for seed in seeds:
        ph = heldout_phantom(seed, protocol=protocol)
        case = out / f"phantom_{seed:03d}"
        ph.save_ground_truth(case)
        region = quick_lung_mask(ph.volume)
        found = det.detect(ph.volume, lung_mask=region, case_id=f"phantom_{seed:03d}")
        found.write_json(out / "network" / f"phantom_{seed:03d}.findings.json")
        sid = ph.volume.series_uid
        preds[sid] = found
        pipeline[sid] = post.postprocess(ph.volume, found, region=region)
        pipeline[sid].write_json(out / "pipeline" / f"phantom_{seed:03d}.findings.json")
        if refine:
            refined[sid] = refine_findings(ph.volume, found)
        truth[sid] = [(n.center_lps, n.diameter_mm) for n in ph.nodules]
        kinds[sid] = [(np.asarray(n.center_lps), n.kind, n.attached_to or "isolated") for n in ph.nodules]
        log.info(
            "held-out phantom %d: %d nodules %s, %d findings (top scores %s), %.1fs",
            seed,
            len(ph.nodules),
            [round(n.diameter_mm, 1) for n in ph.nodules],
            len(pipeline[sid]),
            [round(f.score, 2) for f in pipeline[sid].findings[:5]],
            found.timings_ms.get("total", 0) / 1000,
        )
    runs = [("network findings", preds, "froc"), ("default pipeline", pipeline, "froc_pipeline")]
    if refine:
        runs.append(("centres refined on the HU volume", refined, "froc_refined"))
    for title, found_all, stem in runs:
        matched = match_predictions(found_all, truth, scans=sorted(truth))
        result = froc_of_matched(matched)
        result.write(out, stem=stem)
        step = froc_of_matched(matched, reading="step", n_bootstrap=0)
        print(f"== {title} ({len(seeds)} held-out phantoms)")
        print(result.table())
        print(
            "step reading (best operating point at or below each rate): "
            + " ".join(f"{v:.3f}" for v in step.sensitivity)
            + f"  CPM {step.cpm:.3f}"
        )
        if op_threshold.get(stem) is not None:
            op = at_score_threshold(matched, op_threshold[stem])
            (out / f"{stem}_operating_point.json").write_text(json.dumps(op, indent=1) + "\n")
            print(
                f"at the model's operating point (score >= {op['score_threshold']:.4f}): sensitivity "
                f"{op['sensitivity']:.3f} ({op['nodules_found']}/{op['n_nodules']}) at {op['fps_per_scan']:.2f} FPs/scan; "
                f"by size: {size_band_text(op['by_size'])}"
            )
        _print_by_size(result, kinds)
    return 0


def _print_by_size(result, kinds: dict[str, list[tuple[np.ndarray, str, str]]]) -> None:
    """Nodules found at <= 8 FPs/scan by size; those under 10 mm also by kind and by what they touch (``kinds``: per
    scan, each nodule's centre LPS mm, kind and attachment); the nodules no candidate hit."""
    from pipeline.detection.evaluate import found_by_size, size_band_text

    thr = result.thresholds[result.fp_rates.index(8.0)][0]  # lowest score with at most 8 FPs/scan

    def found(p: dict) -> bool:
        return p["best_score"] is not None and p["best_score"] >= thr

    print(f"nodules found at <= 8 FPs/scan by size: {size_band_text(found_by_size(result.per_nodule, thr))}")
    small = []
    for p in result.per_nodule:
        if p["diameter_mm"] < 10:
            near = min(kinds[p["scan"]], key=lambda k: float(np.linalg.norm(k[0] - np.asarray(p["center_lps"]))))
            small.append((found(p), near[1], near[2]))
    for what, col in (("kind", 1), ("attached to", 2)):
        groups = sorted({s[col] for s in small})
        counts = ", ".join(
            f"{g} {sum(s[0] for s in small if s[col] == g)}/{sum(1 for s in small if s[col] == g)}" for g in groups
        )
        print(f"nodules under 10 mm by {what}: {counts}")
    missed = [p for p in result.per_nodule if p["best_score"] is None]
    print(f"missed nodules: {[(p['scan'][-6:], round(p['diameter_mm'], 1)) for p in missed]}")


EVAL_PHANTOM = {"matrix": 256, "pixel_spacing": 1.2, "slice_spacing": 2.0}


def heldout_phantom(seed: int, *, protocol: dict | None = None):  # -> pipeline.phantom.Phantom
    """A held-out evaluation phantom (seeds 1..999 only): :data:`EVAL_PHANTOM`'s protocol (or ``protocol``: matrix,
    pixel_spacing and slice_spacing in mm) with the realistic confounders of :func:`phantom_confounders` and 0-6
    nodules (``n_nodules=None``), head first supine. The nodules are placed on the protocol's grid, so another
    protocol of the same seed holds other nodules."""
    from pipeline.phantom import generate_phantom

    return generate_phantom(seed, confounders=phantom_confounders(seed), **(protocol or EVAL_PHANTOM))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ctpipe_train"))
    ap.add_argument("--out", type=Path, default=DEMO_MODEL_JSON, help="model JSON to write (weights next to it, .pt)")
    ap.add_argument("--seed0", type=int, default=1000, help="first training phantom seed (held-out evaluation uses 1..999)")
    ap.add_argument("--n-train", type=int, default=150)
    ap.add_argument("--steps", type=int, default=7000)
    ap.add_argument("--minutes", type=float, default=90.0, help="stop training after this wall time")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=1, help="gradient accumulation steps (GPU)")
    ap.add_argument("--fp32", action="store_true", help="train in float32 (default: mixed precision where native)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from these RetinaNet weights (a state dict of the same architecture) instead of random ones",
    )
    ap.add_argument(
        "--init-label",
        default=None,
        help="where the --init weights come from, as the model's training record says it (default: the file's name)",
    )
    ap.add_argument("--warmup", type=int, default=100, help="linear learning-rate warm-up steps")
    ap.add_argument("--torch-seed", type=int, default=7)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--eval-seeds",
        type=int,
        default=0,
        help="after training, evaluate on N held-out phantoms: seeds --eval-seed0 .. --eval-seed0 + N - 1",
    )
    ap.add_argument("--eval-seed0", type=int, default=1, help="first held-out seed (held-out seeds lie in 1..999)")
    ap.add_argument("--eval-only", action="store_true", help="skip training; evaluate --out (or --eval-checkpoint)")
    ap.add_argument("--eval-checkpoint", action="store_true", help="evaluate the training checkpoint's weights")
    ap.add_argument(
        "--eval-fp32", action="store_true", help="evaluate with the network in float32 (default: the detector's default)"
    )
    ap.add_argument(
        "--eval-protocol",
        nargs=3,
        type=float,
        metavar=("MATRIX", "PIXEL_MM", "SLICE_MM"),
        default=None,
        help="held-out phantoms' matrix, pixel spacing and slice spacing (default: "
        f"{EVAL_PHANTOM['matrix']} {EVAL_PHANTOM['pixel_spacing']} {EVAL_PHANTOM['slice_spacing']})",
    )
    ap.add_argument(
        "--eval-refine",
        action="store_true",
        help="also evaluate with finding centres refined on the original HU volume (pipeline.detection.refine)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.torch_seed)
    args.work.mkdir(parents=True, exist_ok=True)
    eval_seeds = list(range(args.eval_seed0, args.eval_seed0 + args.eval_seeds))
    if not set(eval_seeds) <= set(HELDOUT_SEEDS):
        raise SystemExit(
            f"held-out seeds {eval_seeds[0]}..{eval_seeds[-1]} leave {HELDOUT_SEEDS[0]}..{HELDOUT_SEEDS[-1]}, "
            "the range no training script uses"
        )
    if set(eval_seeds) & set(range(args.seed0, args.seed0 + args.n_train)):
        raise SystemExit("evaluation seeds overlap the training seeds")
    if set(range(args.seed0, args.seed0 + args.n_train)) & (set(HELDOUT_SEEDS) | set(SCENARIO_SEEDS)):
        raise SystemExit(
            f"training seeds {args.seed0}..{args.seed0 + args.n_train - 1} overlap the held-out seeds "
            f"({HELDOUT_SEEDS[0]}..{HELDOUT_SEEDS[-1]}, {SCENARIO_SEEDS[0]}..{SCENARIO_SEEDS[-1]})"
        )
    protocol = None
    if args.eval_protocol is not None:
        matrix, pixel_mm, slice_mm = args.eval_protocol
        if matrix != int(matrix) or not 64 <= matrix <= 1024 or not 0.3 <= pixel_mm <= 2.0 or not 0.5 <= slice_mm <= 10:
            ap.error(
                f"--eval-protocol {matrix:g} {pixel_mm:g} {slice_mm:g}: give a whole matrix 64..1024, "
                "pixels of 0.3..2 mm and slices of 0.5..10 mm"
            )
        protocol = {"matrix": int(matrix), "pixel_spacing": pixel_mm, "slice_spacing": slice_mm}
    if args.eval_only:
        ckpt_w = None
        if args.eval_checkpoint:
            ckpt_w = args.work / "ckpt_weights.pt"
            torch.save(torch.load(args.work / "last.pt", map_location="cpu", weights_only=False)["model"], ckpt_w)
        return evaluate_heldout(
            args.out,
            eval_seeds,
            args.work / "eval",
            weights=ckpt_w,
            refine=args.eval_refine,
            amp=not args.eval_fp32,
            protocol=protocol,
        )
    seeds = list(range(args.seed0, args.seed0 + args.n_train))
    t_cache = time.time()
    paths = build_cache(args.work, seeds)
    t_cache = time.time() - t_cache
    samples = [dict(np.load(p)) for p in paths]
    log.info("%d training phantoms, %d nodules", len(samples), sum(len(s["boxes"]) for s in samples))

    from monai.apps.detection.networks.retinanet_detector import RetinaNetDetector

    device = torch.device(args.device)
    net = build_network(ARCH).to(device)
    det = RetinaNetDetector(network=net, anchor_generator=build_anchor_generator(ANCHORS), debug=False).to(device)
    det.set_atss_matcher(num_candidates=4, center_in_gt=False)
    det.set_hard_negative_sampler(batch_size_per_image=128, positive_fraction=0.25, pool_size=20, min_neg=16)
    det.set_target_keys(box_key="boxes", label_key="labels")
    det.set_box_regression_loss(torch.nn.SmoothL1Loss(beta=1.0 / 9, reduction="mean"), encode_gt=True, decode_pred=False)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    # mixed precision where the hardware runs it natively: float16 (with loss scaling) on a GPU, bfloat16 on
    # CPUs with AVX512-BF16/AMX (about 1.7x faster per step there); float32 elsewhere or with --fp32
    amp_dtype = autocast_dtype(device, not args.fp32)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    log.info("training in %s", precision_name(amp_dtype))
    ckpt = args.work / "last.pt"
    step = 0
    if args.init is not None and not ckpt.is_file():
        net.load_state_dict(torch.load(args.init, map_location=device, weights_only=True))
        log.info("starting from the weights %s", args.init)
    rng = np.random.default_rng(args.torch_seed)
    if ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        rng = np.random.default_rng(args.torch_seed + step)
        log.info("resumed from %s at step %d", ckpt, step)
    t_start = time.time()
    det.train()
    ema = None
    while step < args.steps and (time.time() - t_start) < args.minutes * 60:
        lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        if step < args.warmup:
            lr *= (step + 1) / args.warmup
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(args.accum):
            imgs, targets = [], []
            for b in range(args.batch):
                sample = samples[int(rng.integers(len(samples)))]
                img, boxes = random_patch(sample, rng, positive=b % 3 != 2)
                imgs.append(torch.from_numpy(img)[None].to(device))
                targets.append(
                    {
                        "boxes": torch.from_numpy(boxes).to(device),
                        "labels": torch.zeros(len(boxes), dtype=torch.long, device=device),
                    }
                )
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                losses = det(torch.stack(imgs), targets)
                loss = (losses["classification"] + losses["box_regression"]) / args.accum
            scaler.scale(loss).backward()
            total += float(loss.detach())
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        scaler.step(opt)
        scaler.update()
        step += 1
        ema = total if ema is None else 0.95 * ema + 0.05 * total
        if step % 20 == 0:
            log.info(
                "step %d lr %.2e loss %.4f (cls %.4f box %.4f) ema %.4f",
                step,
                lr,
                total,
                float(losses["classification"]),
                float(losses["box_regression"]),
                ema,
            )
        if step % args.checkpoint_every == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            tmp.replace(ckpt)
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    if step < args.steps:  # the time limit came first: no half-trained weights in the model file
        raise SystemExit(
            f"training stopped at step {step} of {args.steps} after --minutes {args.minutes:g}; {args.out} was not "
            f"written. The checkpoint {ckpt} holds the progress: run the same command again to resume, or raise --minutes"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    minutes = {"cache": round(t_cache / 60, 1), "training": round((time.time() - t_start) / 60, 1)}  # this run's
    write_model(
        net, args.out, args, {"step": step, "loss": ema, "compute_cpu_minutes": minutes, "precision": precision_name(amp_dtype)}
    )
    if eval_seeds:
        return evaluate_heldout(
            args.out, eval_seeds, args.work / "eval", refine=args.eval_refine, amp=not args.eval_fp32, protocol=protocol
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
