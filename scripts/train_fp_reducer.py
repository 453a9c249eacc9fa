#!/usr/bin/env python
"""Train the demo pipeline's false-positive reduction classifier on realistic synthetic phantoms.

The weights it writes are trained on synthetic phantoms, for demonstration and
testing only, not for clinical use.

1. Candidates: for each training phantom (``scripts/train_detector.py``'s ``training_phantom``:
   realistic confounders, vessel trees, some phantoms without any nodule; seeds ``--seed0 ..``,
   never the evaluation seeds 1..999 or the scenario seeds 5000..5099, nor the detector's training
   seeds, so the detector scores them as unseen scans), the demo RetinaNet's findings (centres
   refined) and the small-blob candidates, as the pipeline makes them
   (:func:`pipeline.detection.fp_reduction.candidate_findings`).
   A candidate within a nodule's radius is positive (LUNA16's hit rule); one within 1.5 radii
   (or 3 mm) but not within the radius is left out; the rest are negative (vessels, bifurcations,
   the confounders). Each nodule also gives ``--jitter`` positives around its true centre. Patches
   (``--patch`` voxels of 1 mm, axes L, P, S, and with ``--context-spacing`` a second, wider cube as a
   second channel) are cached per phantom in ``--work``, as are the validation phantoms' candidates.
   With ``--anatomy-negatives N``, each training phantom also gives up to N negatives taken from its own
   anatomy rather than from the detector (``scripts/fpr_anatomy.py`` :func:`anatomy_negatives`: vessel
   bifurcations, cross-sections of every calibre, vessels at the pleura, mediastinum and spine, pleura beside
   the spine and ribs), so the classifier sees every kind of vessel point, not only those the detector happens
   to propose; ``--anatomy-share`` of each batch's other negatives is drawn from them. The patches and their
   caches: ``scripts/fpr_cache.py``.
2. Training (from ``--init`` weights or from scratch): balanced batches, random flips and in-plane
   transposes, AdamW, cosine schedule, BCE; optionally (``--hard-negatives F``) a fraction F of each
   batch's negatives drawn, after mining at 1/2 and 3/4 of training, in proportion to the network's
   current score; losses logged. With ``--pasted-nodules F``, a fraction F of each batch's positives are the batch's
   own negatives with a synthetic nodule drawn into them (``scripts/fpr_paste.py``): the same vessel, bifurcation or
   pleura seen with and without a nodule. With ``--members K``, K classifiers are trained so on the same patches, each
   from its own torch seed (``--torch-seed``, +1, ...), and the model is their ensemble (their logits averaged,
   :class:`pipeline.detection.fp_classifier.PatchEnsemble`); each member's own validation CPM is recorded.
3. Validation seeds (``--val-seed0``, also unseen by both) choose, by CPM, whether candidates are scored
   on one view or averaged over ``--flip-views`` mirrored views (:func:`pipeline.detection.fp_classifier.patch_logits`),
   the detector weight of :func:`pipeline.detection.fp_reduction.combine_scores`, the radius factor of
   :func:`pipeline.detection.fp_reduction.suppress_duplicates` and whether candidates sharing one candidate's box
   are merged (``box_merge``: on a tie, since CPM does not count duplicate findings; they are logged) and whether
   small-blob candidates are combined with the network's support for them (``blob_support``,
   :func:`pipeline.detection.fp_reduction.network_support`); settings within one nodule's share of the best CPM
   count as tied, and among them the detector weight nearest 0.5 wins (``scripts/fpr_validation.py``
   :func:`choose_setting`); the model JSON's ``fp_reduction`` entry records them with the training settings.
   ``--validate-only`` redoes this choice for the weights a model JSON already names.
4. Operating point: the lowest score with at most ``--op-fps`` false positives per scan on the validation
   phantoms (LUNA16 counting, :func:`pipeline.detection.operating_point.calibrate`) becomes the model's
   default score threshold: the model JSON's ``operating_point`` entry, with the sensitivity there, the
   seeds, the number format and the command; ``network_only`` is the same for the RetinaNet's own
   scores (``--raw``). After training it is computed on the validation candidates cached in step 1
   (the pipeline's candidates of one RetinaNet pass, scored as
   :func:`pipeline.detection.fp_reduction.reduce_false_positives` scores them);
   ``scripts/calibrate_operating_point.py`` (also ``--calibrate-only`` here) recomputes it with the existing
   weights through the full two-stage pipeline, with the thick-slice score calibration.

    python scripts/train_fp_reducer.py --work /tmp/ctpipe_fpr
    python scripts/calibrate_operating_point.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import calibrate_operating_point
import numpy as np
import torch
from fpr_anatomy import ANATOMY_KINDS
from fpr_cache import anatomy_cache, build_cache
from fpr_paste import NoduleBank, paste
from fpr_validation import (
    VALIDATION_KEY,
    choose_setting,
    member_validation,
    one_nodule_share,
    operating_point_from_cache,
    parse_setting,
    probabilities,
    validate,
)
from train_detector import HELDOUT_SEEDS, SCENARIO_SEEDS

from pipeline.detection.bundle import load_model
from pipeline.detection.fp_reduction import (
    FLIP_VIEWS,
    FPReducer,
    FPReductionConfig,
    PatchClassifier,
    PatchEnsemble,
    build_classifier,
)
from pipeline.detection.infer import Detector
from pipeline.detection.model_config import DEMO_MODEL_JSON

log = logging.getLogger("train_fp_reducer")


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random flips of each axis and a random L/P transpose, per sample: (N, C, S, P, L)."""
    flips = torch.rand(x.shape[0], 4, generator=gen) < 0.5
    out = x.clone()
    for n in range(x.shape[0]):
        y = out[n]
        dims = [d + 1 for d in range(3) if flips[n, d]]
        if dims:
            y = torch.flip(y, dims)
        if flips[n, 3]:
            y = y.transpose(2, 3)
        out[n] = y.clone()
    return out


def train(data: list[dict], cfg: FPReductionConfig, args: argparse.Namespace, *, seed: int) -> tuple[PatchClassifier, list[dict]]:
    """One classifier trained on ``data`` (random initialisation, batch order and augmentation from ``seed``)."""
    patches = np.concatenate([d["patches"] for d in data])
    labels = np.concatenate([d["labels"] for d in data])
    det = np.concatenate([d["det"] for d in data])
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    if not len(pos) or not len(neg):
        raise SystemExit(
            f"the training phantoms gave {len(pos)} positive and {len(neg)} negative patches: the classifier needs both; "
            "give more training phantoms (--n-train; a fifth of them hold no nodule)"
        )
    anat = np.flatnonzero((labels == 0) & (det == -3.0))  # anatomy negatives (:func:`anatomy_negatives`)
    diam = np.concatenate([d["diam"] for d in data])[pos]
    pos_p = np.maximum(diam, 1.0) ** -args.small_nodule_weight  # exponent 0: every positive equally often
    pos_p /= pos_p.sum()
    log.info(
        "training on %d positives, %d negatives (%d of them anatomy negatives; %d left out)",
        len(pos),
        len(neg),
        len(anat),
        int((labels < 0).sum()),
    )
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = build_classifier(replace(cfg, members=1))
    assert isinstance(net, PatchClassifier)
    if args.init is not None:
        net.load_state_dict(torch.load(args.init, map_location="cpu", weights_only=True))
        log.info("starting from the weights %s", args.init)
    net = net.to(memory_format=torch.channels_last_3d)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    history = []
    t0 = time.time()
    ema = None
    net.train()
    hard_p = None  # sampling weights of the negatives once mined: the ones the network currently scores highest
    n_neg = args.batch - args.batch // 2
    n_hard = int(round(args.hard_negatives * n_neg))
    n_anat = int(round(args.anatomy_share * (n_neg - n_hard))) if len(anat) else 0
    n_paste = int(round(args.pasted_nodules * (args.batch // 2)))
    bank = None
    if n_paste:
        spacings = (cfg.spacing_mm,) + ((cfg.context_spacing_mm,) if cfg.context_spacing_mm else ())
        t_bank = time.time()
        bank = NoduleBank(size=args.paste_bank, patch=cfg.patch, spacings_mm=spacings, seed=seed)
        log.info("drew %d nodules to paste into negatives (%.1f s)", len(bank), time.time() - t_bank)
    for step in range(args.steps):
        if n_hard and step in (args.steps // 2, 3 * args.steps // 4):
            net.eval()
            scores = probabilities(net, patches[neg])
            net.train()
            hard_p = (scores + 0.01) / (scores + 0.01).sum()
            log.info(
                "step %d: mined hard negatives (%d of %d negatives score >= 0.5)", step, int((scores >= 0.5).sum()), len(neg)
            )
        lr = args.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        hard = rng.choice(neg, n_hard, p=hard_p) if hard_p is not None else rng.choice(neg, n_hard)
        anatomy = rng.choice(anat, n_anat) if n_anat else hard[:0]
        negs = np.concatenate([hard, anatomy, rng.choice(neg, n_neg - n_hard - n_anat)])
        idx = np.concatenate([rng.choice(pos, args.batch // 2 - n_paste, p=pos_p), negs])
        x = torch.from_numpy(patches[idx].astype(np.float32) / 255.0)
        y = torch.from_numpy((labels[idx] == 1).astype(np.float32))
        if n_paste:  # the same surroundings with and without a nodule in one batch
            bases = (len(idx) - len(negs)) + rng.choice(len(negs), n_paste, replace=False)  # rows of the batch's negatives
            pasted, visible = paste(x[bases], bank, rng.integers(0, len(bank), n_paste), gen)
            x = torch.cat([x, pasted])
            y = torch.cat([y, visible.float()])
        x = augment(x, gen).contiguous(memory_format=torch.channels_last_3d)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            history.append({"step": step + 1, "loss_ema": round(ema, 4), "seconds": round(time.time() - t0, 1)})
            log.info("step %d/%d loss %.4f (%.2f s/step)", step + 1, args.steps, ema, (time.time() - t0) / (step + 1))
    return net.eval(), history


def revalidate(args: argparse.Namespace, det: Detector, work: Path, val_seeds: list[int], command: str) -> int:
    """``--validate-only``: the validation choice (:func:`validate`, :func:`choose_setting`) for the classifier the
    model JSON already names, written to its ``fp_reduction`` entry (the training record kept, its validation
    results replaced), then the interim operating point on the cached validation candidates."""
    model_json = json.loads(args.model.read_text())
    cfg = FPReductionConfig.from_json(model_json["fp_reduction"], weights_dir=args.model.parent, source=args.model)
    net = FPReducer(cfg).network  # loaded as the pipeline loads it, errors included
    t0 = time.time()
    val_cases = build_cache(work, det, val_seeds, cfg, 0)
    val = validate(net, val_cases, args)
    best = choose_setting(val, tolerance=one_nodule_share(val_cases))
    cfg = replace(cfg, **parse_setting(best), flip_min_probability=args.flip_min_probability)
    entry = model_json["fp_reduction"]
    training = {k: v for k, v in entry.get("training", {}).items() if not k.startswith("validation_cpm_by")}
    training[VALIDATION_KEY] = val
    training["validation_command"] = " ".join(["python scripts/train_fp_reducer.py", *sys.argv[1:]])
    entry.update(cfg.to_json(), training=training)
    args.model.write_text(json.dumps(model_json, indent=1) + "\n")
    log.info("validated %s in %.1f min: setting %s", cfg.weights, (time.time() - t0) / 60, best)
    calibrate_operating_point.write_operating_point(
        args.model,
        operating_point_from_cache(
            net, val_cases, cfg, val_seeds, fps_per_scan=args.op_fps, command=command, precision=det.precision
        ),
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ctpipe_fpr"))
    ap.add_argument("--model", type=Path, default=DEMO_MODEL_JSON, help="detector model JSON; its fp_reduction entry is written")
    ap.add_argument("--seed0", type=int, default=2000)
    ap.add_argument("--n-train", type=int, default=80)
    ap.add_argument("--val-seed0", type=int, default=3000)
    ap.add_argument("--n-val", type=int, default=40)
    ap.add_argument("--patch", type=int, default=24)
    ap.add_argument(
        "--context-spacing",
        type=float,
        default=None,
        help="grid spacing (mm) of a second, wider cube given to the classifier as a second channel",
    )
    ap.add_argument("--channels", type=int, nargs=3, default=[8, 16, 32])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--blobs", type=int, default=200, help="small-blob candidates per scan")
    ap.add_argument("--jitter", type=int, default=6, help="positives around each true nodule centre")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument(
        "--hard-negatives",
        type=float,
        default=0.0,
        help="fraction of each batch's negatives drawn by score after hard-negative mining at 1/2 and 3/4 of training",
    )
    ap.add_argument(
        "--anatomy-negatives",
        type=int,
        default=0,
        help="negatives per training phantom taken from its own anatomy (vessel bifurcations, cross-sections of every "
        "calibre, vessels at the pleura, pleura by the spine and ribs), besides the detector's candidates",
    )
    ap.add_argument(
        "--anatomy-share",
        type=float,
        default=0.25,
        help="fraction of each batch's other (not hard-mined) negatives drawn from the anatomy negatives",
    )
    ap.add_argument(
        "--small-nodule-weight",
        type=float,
        default=0.0,
        help="draw positives in proportion to diameter^-W (0: uniformly; 1: a 3 mm nodule 10x as often as a 30 mm one)",
    )
    ap.add_argument(
        "--pasted-nodules",
        type=float,
        default=0.0,
        help="fraction of each batch's positives made by drawing a synthetic nodule into one of the batch's negatives "
        "(scripts/fpr_paste.py): the same vessel or pleura seen with and without a nodule",
    )
    ap.add_argument("--paste-bank", type=int, default=2000, help="synthetic nodules drawn once for --pasted-nodules")
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from these classifier weights (a state dict of the same architecture) instead of random ones",
    )
    ap.add_argument("--torch-seed", type=int, default=11)
    ap.add_argument(
        "--members",
        type=int,
        default=1,
        help="classifiers trained on the same patches with torch seeds --torch-seed, +1, ...; their logits averaged",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--detector-weights", type=float, nargs="+", default=[0.0, 0.25, 0.5])
    ap.add_argument("--duplicate-factors", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument(
        "--flip-views",
        type=int,
        choices=sorted(FLIP_VIEWS),
        default=4,
        help="mirrored views averaged at inference, validated against a single view",
    )
    ap.add_argument(
        "--flip-min-probability",
        type=float,
        default=0.02,
        help="candidates scored below this on one view keep that score (no flipped views)",
    )
    ap.add_argument(
        "--op-fps",
        type=float,
        default=1.0,
        help="false positives per scan on the validation phantoms at the model's operating point",
    )
    ap.add_argument(
        "--validate-only",
        action="store_true",
        help="only redo the validation choice of views, detector weight, duplicate merging and blob support for the "
        "model's existing classifier weights, then the interim operating point",
    )
    ap.add_argument(
        "--calibrate-only",
        action="store_true",
        help="only recompute the model's operating point (validation phantoms, existing weights)",
    )
    args = ap.parse_args(argv)
    if args.members < 1:
        ap.error(f"--members {args.members}: give 1 or more classifiers")
    if not 0.0 <= args.pasted_nodules <= 1.0:
        ap.error(f"--pasted-nodules {args.pasted_nodules}: give a fraction of each batch's positives, 0..1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    train_seeds = list(range(args.seed0, args.seed0 + args.n_train))
    val_seeds = list(range(args.val_seed0, args.val_seed0 + args.n_val))
    det_lo, det_hi = json.loads(args.model.read_text()).get("training", {}).get("train_seeds", [1000, 1149])
    # held-out seeds (evaluation, confounder scenarios) and the detector's training seeds
    reserved = set(HELDOUT_SEEDS) | set(SCENARIO_SEEDS) | set(range(det_lo, det_hi + 1))
    if reserved & (set(train_seeds) | set(val_seeds)) or set(train_seeds) & set(val_seeds):
        raise SystemExit(
            f"training/validation seeds overlap the held-out ({HELDOUT_SEEDS[0]}..{HELDOUT_SEEDS[-1]}) or "
            f"detector ({det_lo}..{det_hi}) seeds or each other"
        )
    command = (
        "python scripts/calibrate_operating_point.py"
        + (f" --val-seed0 {args.val_seed0} --n-val {args.n_val}" if (args.val_seed0, args.n_val) != (3000, 40) else "")
        + (f" --op-fps {args.op_fps:g}" if args.op_fps != 1.0 else "")
    )
    if args.calibrate_only:  # the full-pipeline calibration, with the thick-slice score calibration
        return calibrate_operating_point.main(
            [
                "--model",
                str(args.model),
                "--val-seed0",
                str(args.val_seed0),
                "--n-val",
                str(args.n_val),
                "--op-fps",
                f"{args.op_fps:g}",
                "--threads",
                str(args.threads),
                "--work",
                str(args.work / "calibration"),
            ]
        )
    base = load_model(args.model)
    det = Detector(model=base, device="cpu", postprocess=False, all_candidates=True)
    weights = args.model.with_name(args.model.stem.replace("retinanet", "fpr") + ".pt")
    cfg = FPReductionConfig(
        weights=weights,
        patch=args.patch,
        spacing_mm=1.0,
        channels=tuple(args.channels),  # type: ignore[arg-type]
        hidden=args.hidden,
        blob_candidates=args.blobs,
        context_spacing_mm=args.context_spacing,
        members=args.members,
    )
    # candidates depend on the detector's weights: one cache folder per weights file
    work = args.work / f"detector_{hashlib.sha256(base.config.weights.read_bytes()).hexdigest()[:12]}"
    if args.validate_only:
        return revalidate(args, det, work, val_seeds, command)
    t0 = time.time()
    data = build_cache(work, det, train_seeds, cfg, args.jitter)
    if args.anatomy_negatives > 0:
        anatomy = anatomy_cache(work, train_seeds, cfg, args.anatomy_negatives)
        data = [{k: np.concatenate([d[k], a[k]]) for k in ("patches", "labels", "det", "diam")} for d, a in zip(data, anatomy)]
    t_data = time.time() - t0
    t0 = time.time()
    seeds = [args.torch_seed + m for m in range(args.members)]
    trained = [train(data, cfg, args, seed=seed) for seed in seeds]
    net = trained[0][0] if args.members == 1 else PatchEnsemble([m for m, _ in trained]).eval()
    t_train = time.time() - t0
    t0 = time.time()
    val_cases = build_cache(work, det, val_seeds, cfg, 0) if val_seeds else []
    val = validate(net, val_cases, args) if val_seeds else {}
    best = choose_setting(val, tolerance=one_nodule_share(val_cases)) if val else "1/0.5/1.0"
    members_cpm = member_validation(trained, val_cases, best, args) if val and args.members > 1 else []
    t_val = time.time() - t0
    torch.save(net.state_dict(), weights)
    cfg = replace(cfg, **parse_setting(best), flip_min_probability=args.flip_min_probability)
    model_json = json.loads(args.model.read_text())
    model_json["fp_reduction"] = {
        **cfg.to_json(),
        "intended_use": "trained on synthetic phantoms, for demonstration and testing only, not for clinical use",
        "training": {
            "data": (
                "realistic synthetic phantoms: pipeline.phantom.generate_phantom with realistic_confounders(seed) and "
                "sub-voxel peripheral lung vessels (fine_vessels; scripts/train_detector.py phantom_confounders), "
                "some without any nodule (scripts/train_detector.py training_phantom)"
                + (
                    f"; besides the detector's candidates, {args.anatomy_negatives} negatives per phantom from its own "
                    "vessel mask and pleura (scripts/fpr_anatomy.py anatomy_negatives)"
                    if args.anatomy_negatives > 0
                    else ""
                )
            ),
            "initial_weights": str(args.init) if args.init is not None else None,
            "train_seeds": [train_seeds[0], train_seeds[-1]],
            "validation_seeds": [val_seeds[0], val_seeds[-1]],
            "jitter_positives_per_nodule": args.jitter,
            "hard_negative_fraction": args.hard_negatives,
            "pasted_nodule_fraction": args.pasted_nodules,
            "pasted_nodule_bank": args.paste_bank if args.pasted_nodules > 0 else 0,
            "anatomy_negatives_per_phantom": args.anatomy_negatives,
            "anatomy_negative_kinds": list(ANATOMY_KINDS) if args.anatomy_negatives > 0 else [],
            "anatomy_negative_share": args.anatomy_share if args.anatomy_negatives > 0 else 0.0,
            "steps": args.steps,
            "batch_size": args.batch,
            "lr": args.lr,
            "optimizer": "AdamW (weight decay 1e-4), cosine schedule",
            "torch_seed": args.torch_seed,
            "ensemble_members": [
                {"torch_seed": seed, **({"validation_cpm": members_cpm[m]} if members_cpm else {}), "loss": history[-1:]}
                for m, (seed, (_, history)) in enumerate(zip(seeds, trained))
            ],
            "compute_cpu_minutes": {
                "candidates_and_patches": round(t_data / 60, 1),
                "training": round(t_train / 60, 1),
                "validation": round(t_val / 60, 1),
            },
            "threads": args.threads,
            VALIDATION_KEY: val,
        },
    }
    args.model.write_text(json.dumps(model_json, indent=1) + "\n")
    log.info("wrote %s and the fp_reduction entry of %s (setting %s)", weights, args.model, best)
    if val_seeds:  # the new classifier moves the operating point: calibrated on the cached validation candidates
        calibrate_operating_point.write_operating_point(
            args.model,
            operating_point_from_cache(
                net, val_cases, cfg, val_seeds, fps_per_scan=args.op_fps, command=command, precision=det.precision
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
