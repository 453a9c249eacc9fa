"""The demo detector's held-out evaluation (``scripts/train_detector.py --eval-only`` or ``--eval-seeds``).

Detects on held-out phantoms (:func:`detector_phantoms.heldout_phantom`, seeds 1..999, never used in training),
writes the findings and the ground truth and prints the FROC tables, the model's operating point and the nodules
found by size, kind and attachment (:func:`evaluate_heldout`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from detector_phantoms import heldout_phantom

log = logging.getLogger("train_detector")


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
