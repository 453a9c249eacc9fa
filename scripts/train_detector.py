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
from detector_data import PATCH, SPACING, VESSEL_NEGATIVES, WINDOW, build_cache, random_patch
from detector_phantoms import EVAL_PHANTOM, NO_NODULE_FRACTION, POSITIONS

# named here by the model's training record, the weights' README and the other training scripts
from detector_phantoms import heldout_phantom as heldout_phantom
from detector_phantoms import phantom_confounders as phantom_confounders
from detector_phantoms import training_phantom as training_phantom
from heldout_eval import evaluate_heldout

from pipeline.detection.model_config import DEMO_MODEL_JSON, FORMAT
from pipeline.detection.network import build_anchor_generator, build_network, count_parameters
from pipeline.detection.precision import autocast_dtype, precision_name

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
# anchor shapes in voxels of SPACING at the finest level; levels scale them by 1, 2, 4
ANCHORS = {"feature_map_scales": [1, 2, 4], "base_anchor_shapes": [[4, 4, 3], [6, 6, 5], [10, 10, 8]]}
SELECTOR = {"score_thresh": 0.02, "topk_candidates_per_level": 1000, "nms_thresh": 0.22, "detections_per_img": 300}
# the network sees the lungs' whole box at once where it fits (448 voxels per axis at SPACING; larger inputs are
# tiled): the operating point is calibrated, and the held-out figures measured, that way
SLIDING = {"roi_size": [448, 448, 448], "overlap": 0.25, "mode": "constant"}


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
