#!/usr/bin/env python
"""Benchmark: cached case → nodule findings, ctpipe vs MONAI's bundle-style pipeline.

Peer: MONAI's lung_nodule_ct_detection bundle pipeline (MetaTensor from the cached
case → Orientation RAS → Spacing → ScaleIntensityRange → RetinaNetDetector with
the model's parameters → ClipBoxToImage → AffineBoxToWorldCoordinate), see
``pipeline/detection/reference.py``. Both sides use the same weights, the same phantom
and run in the same process; each model is loaded once before timing (as the batch
runner does). Timed: reading the cached case through to findings in LPS. ctpipe's time
includes its post-processing, which MONAI's pipeline does not do: centre refinement and,
for the demo model, the false-positive reduction stage (blob candidates and the patch
classifier); its share is printed.

Two models: the embedded demo model, and the bundle architecture (ResNet-50 FPN,
random weights: speed does not depend on the weight values) at the bundle's own
spacing 0.703 × 0.703 × 1.25 mm. ctpipe runs with its defaults (lung crop on; mixed
precision where the hardware runs it natively: bfloat16 on CPUs with AVX512-BF16/AMX,
float16 on CUDA, see ``pipeline/detection/precision.py``) and, where that is not
float32, once more with ``amp=False`` (float32, as MONAI runs on a CPU).

MONAI's pipeline runs the whole volume; ctpipe by default crops it to the lungs first (its lung search is
in its time). So each model gets three ratios, MONAI's median ÷ ctpipe's: "ctpipe, lung crop vs MONAI whole
volume" (what ctpipe does by default), "same input: whole volume" (ctpipe with ``restrict_to_lungs=False``, its
post-processing still on) and "same job" (ctpipe on the whole volume with ``postprocess=False`` and MONAI's
precision: the detector's boxes in LPS and nothing more, the work MONAI's pipeline does), all timed in the same
rounds. The float32 run is the lung crop.
Each side is run once per round, interleaved; one warm-up round, then ``--repeats`` timed rounds (medians).
On CUDA both the model time and the end-to-end time are measured with CUDA events
(:class:`~pipeline.devicetime.DeviceTimer`, the device synchronised before each call and at its end).
``--quick``: a small phantom and, on a CPU, the demo model only.

    python scripts/bench_detect.py [--quick] [--device cpu|cuda] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.cache import CaseCache
from pipeline.detection.bundle import LoadedModel, load_model
from pipeline.detection.infer import Detector
from pipeline.detection.model_config import ModelConfig
from pipeline.detection.network import BUNDLE_ARCHITECTURE, build_network
from pipeline.detection.preprocess import Window
from pipeline.detection.reference import monai_detect, monai_detector
from pipeline.devicetime import DeviceTimer

PEER = (
    "MONAI bundle-style pipeline (Orientation → Spacing → ScaleIntensityRange → RetinaNetDetector → AffineBoxToWorldCoordinate)"
)


def bundle_model() -> LoadedModel:
    """The lung_nodule_ct_detection architecture and inference settings, random weights."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="lung_nodule_ct_detection architecture (random weights)",
        spacing=(0.703125, 0.703125, 1.25),
        window=Window(-1024.0, 300.0, 0.0, 1.0, True),
        arch=BUNDLE_ARCHITECTURE,
        anchors={"feature_map_scales": [1, 2, 4], "base_anchor_shapes": [[6, 8, 4], [8, 6, 5], [10, 10, 6]]},
        selector={"score_thresh": 0.02, "topk_candidates_per_level": 1000, "nms_thresh": 0.22, "detections_per_img": 300},
        sliding_window={"roi_size": [512, 512, 192], "overlap": 0.25, "mode": "constant"},
        size_divisible=(16, 16, 8),
        weights=None,
        source="monai_bundle",
    )
    return LoadedModel(cfg, build_network(BUNDLE_ARCHITECTURE).eval())


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds for ``fn()`` end to end, and its result: on CUDA the device is synchronised first, then
    :class:`~pipeline.devicetime.DeviceTimer` times the call with CUDA events up to the end of the work it queued;
    on a CPU the wall clock."""
    _sync(device)
    with DeviceTimer(device) as clock:
        out = fn()
    return clock.seconds, out


def time_case(cache: CaseCache, case_id: str, model: LoadedModel, device: str, repeats: int) -> dict:
    """Median seconds per case, interleaved: ctpipe (defaults: lung crop), ctpipe on the whole volume, ctpipe with
    float32 forced (lung crop) and the MONAI pipeline (whole volume)."""
    det = Detector(model=model, device=device)
    det32 = Detector(model=model, device=device, amp=False) if det.precision != "float32" else None
    on_cuda = device.startswith("cuda")  # MONAI then runs with AMP (float16)
    # the same job as MONAI's pipeline: whole volume, no post-processing, its precision (float16 AMP on CUDA, else float32)
    det_raw = Detector(model=model, device=device, postprocess=False, amp=on_cuda)
    monai_det = monai_detector(model, device=device)  # loaded once, as ctpipe's Detector is
    ours, whole, ours32, raw, peer, model_ms, whole_model_ms, post_ms = [], [], [], [], [], [], [], []
    steps_ms: dict[str, list[float]] = {}  # the false-positive reduction's steps (fpr_blobs, fpr_refine, ...)
    n_ours = n_reported = n_whole = n_raw = n_peer = 0
    for r in range(repeats + 1):  # the first round warms up every side and is not counted
        t_ours, f = _timed(device, lambda: det.detect(cache.read(case_id, mmap=True), case_id=case_id))
        if "model" not in f.timings_ms:
            raise SystemExit(f"{case_id}: ctpipe ran no model ({f.reason}); the phantom is no chest to time detection on")
        t_whole, fw = _timed(device, lambda: det.detect(cache.read(case_id, mmap=True), case_id=case_id, restrict_to_lungs=False))
        t_ours32 = (
            _timed(device, lambda: det32.detect(cache.read(case_id, mmap=True), case_id=case_id))[0] if det32 else float("nan")
        )
        t_raw, fr = _timed(
            device, lambda: det_raw.detect(cache.read(case_id, mmap=True), case_id=case_id, restrict_to_lungs=False)
        )
        t_peer, ref = _timed(
            device, lambda: monai_detect(model, volume=cache.read(case_id), device=device, amp=on_cuda, detector=monai_det)
        )
        if r > 0:
            ours.append(t_ours)
            whole.append(t_whole)
            ours32.append(t_ours32)
            raw.append(t_raw)
            peer.append(t_peer)
            model_ms.append(f.timings_ms["model"])
            whole_model_ms.append(fw.timings_ms["model"])
            post_ms.append(f.timings_ms.get("fp_reduction", f.timings_ms.get("refine", 0.0)))
            for key, ms in f.timings_ms.items():
                if key.startswith("fpr_"):
                    steps_ms.setdefault(key, []).append(ms)
        # candidates against candidates: MONAI keeps every box above the selector's score_thresh, ctpipe reports
        # those above the operating point (len(f)) and keeps the rest (f.candidates: all of them)
        n_ours, n_reported, n_whole, n_peer = len(f.candidates), len(f), len(fw.candidates), len(ref["score"])
        n_raw = len(fr.candidates)
        fp32 = f", ctpipe float32 {t_ours32:.2f}s" if det32 else ""  # the default already runs in float32
        logging.info(
            "round %d: ctpipe %.2fs (%s), ctpipe whole volume %.2fs%s, ctpipe same job %.2fs, MONAI %.2fs",
            r,
            t_ours,
            det.precision,
            t_whole,
            fp32,
            t_raw,
            t_peer,
        )
    m_ours, m_whole, m_peer = statistics.median(ours), statistics.median(whole), statistics.median(peer)
    m_raw = statistics.median(raw)
    res = {
        "ctpipe_s": m_ours,
        "monai_s": m_peer,
        "ratio": m_peer / m_ours,
        "ratio_label": "ctpipe, lung crop vs MONAI whole volume",
        "ctpipe_whole_volume_s": m_whole,
        "ratio_whole_volume": m_peer / m_whole,
        "ratio_whole_volume_label": "same input: whole volume",
        "ctpipe_same_job_s": m_raw,
        "ctpipe_same_job_runs_s": raw,
        "ratio_same_job": m_peer / m_raw,
        "ratio_same_job_label": "same job: whole volume, detector boxes in LPS only (no post-processing), MONAI's precision",
        "ctpipe_same_job_precision": det_raw.precision,
        "ctpipe_same_job_findings": n_raw,
        "ctpipe_runs_s": ours,
        "ctpipe_whole_volume_runs_s": whole,
        "monai_runs_s": peer,
        "ctpipe_precision": det.precision,
        "monai_precision": "float16 (AMP)" if on_cuda else "float32",
        "ctpipe_model_ms_median": statistics.median(model_ms),
        "ctpipe_whole_volume_model_ms_median": statistics.median(whole_model_ms),
        "ctpipe_postprocess_ms_median": statistics.median(post_ms),
        "ctpipe_postprocess_steps_ms_median": {k: statistics.median(v) for k, v in steps_ms.items()},
        "ctpipe_fp_reduction": det.fp_reduction,
        "ctpipe_input_xyz": list(f.input_shape_xyz or []),
        "ctpipe_whole_volume_input_xyz": list(fw.input_shape_xyz or []),
        "ctpipe_findings": n_ours,
        "ctpipe_reported_at_operating_point": n_reported,
        "ctpipe_whole_volume_findings": n_whole,
        "monai_findings": n_peer,
        "repeats": repeats,
        "model_timer": "CUDA events" if on_cuda else "perf_counter",
    }
    if det32 is not None:
        m32 = statistics.median(ours32)
        res.update({"ctpipe_float32_s": m32, "ctpipe_float32_runs_s": ours32, "ratio_float32": m_peer / m32})
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a small phantom; on a CPU the demo model only (the bundle architecture at 0.7 mm takes minutes there); "
        "about 2 min on 2 cores",
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round (medians; default 3)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--skip-bundle", action="store_true", help="only the demo model")
    ap.add_argument("--model", type=Path, default=None, help="ctpipe model JSON for the first model (default: the demo model)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    from pipeline.phantom import generate_phantom

    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    repeats = args.repeats
    # (model, phantom options): the bundle model works at 0.7 mm, so its phantom is smaller on CPU
    if args.device == "cuda":
        cases = {
            "demo": dict(matrix=512, pixel_spacing=0.7, slice_spacing=1.25),
            "bundle": dict(matrix=512, pixel_spacing=0.7, slice_spacing=1.25),
        }
    elif args.quick:  # the demo model on a small chest whose lungs ctpipe's lung search still finds
        cases = {"demo": dict(matrix=128, pixel_spacing=1.2, slice_spacing=2.0, slices=48)}
    else:  # bundle: ~256 x 256 x 112 voxels at 0.7 mm, where MONAI needs about a minute on 2 cores
        cases = {
            "demo": dict(matrix=384, pixel_spacing=0.9, slice_spacing=1.25),
            "bundle": dict(matrix=128, pixel_spacing=1.4, slice_spacing=2.5, slices=56),
        }
    results = {"peer": PEER, "device": args.device, "threads": torch.get_num_threads(), "quick": args.quick, "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench_detect_") as tmp:
        cache = CaseCache(tmp)
        for name, opts in cases.items():
            if name == "bundle" and args.skip_bundle:
                continue
            ph = generate_phantom(7, **opts)
            case_id = f"bench_{name}"
            cache.write(case_id, ph.volume)
            model = load_model(args.model) if name == "demo" else bundle_model()
            res = time_case(cache, case_id, model, args.device, repeats)
            res["phantom"] = {**opts, "seed": 7, "shape_kji": list(ph.volume.shape)}
            res["model"] = model.config.name
            results["models"][name] = res
            print(f"[{name}] {model.config.name}; phantom {ph.volume.shape} [k,j,i] {opts}")
            print(f"  peer: {PEER}")
            post = "false-positive reduction" if res["ctpipe_fp_reduction"] else "refinement"
            print(
                f"  ctpipe median {res['ctpipe_s']:.2f} s (lung crop; model {res['ctpipe_model_ms_median']:.0f} ms, "
                f"{post} {res['ctpipe_postprocess_ms_median']:.0f} ms, input {res['ctpipe_input_xyz']}), "
                f"MONAI median {res['monai_s']:.2f} s (whole volume)  (runs: ctpipe {_fmt(res['ctpipe_runs_s'])}, "
                f"MONAI {_fmt(res['monai_runs_s'])}); ctpipe {res['ctpipe_precision']}, MONAI {res['monai_precision']}"
            )
            if res["ctpipe_postprocess_steps_ms_median"]:
                steps = res["ctpipe_postprocess_steps_ms_median"]
                print("  of which " + ", ".join(f"{k.removeprefix('fpr_')} {v:.0f} ms" for k, v in steps.items()))
            print(f"  ratio ({res['ratio_label']}; MONAI s / ctpipe s, > 1: ctpipe faster): {res['ratio']:.2f}x")
            print(
                f"  ctpipe whole volume median {res['ctpipe_whole_volume_s']:.2f} s (model "
                f"{res['ctpipe_whole_volume_model_ms_median']:.0f} ms, input {res['ctpipe_whole_volume_input_xyz']}; "
                f"runs {_fmt(res['ctpipe_whole_volume_runs_s'])})"
            )
            print(f"  ratio ({res['ratio_whole_volume_label']}; MONAI s / ctpipe s): {res['ratio_whole_volume']:.2f}x")
            print(
                f"  ctpipe same job median {res['ctpipe_same_job_s']:.2f} s ({res['ctpipe_same_job_precision']}; "
                f"runs {_fmt(res['ctpipe_same_job_runs_s'])}); ratio ({res['ratio_same_job_label']}; MONAI s / ctpipe s): "
                f"{res['ratio_same_job']:.2f}x"
            )
            print(
                f"  candidates: ctpipe {res['ctpipe_findings']} ({res['ctpipe_reported_at_operating_point']} at the "
                f"operating point; whole volume {res['ctpipe_whole_volume_findings']}; same job "
                f"{res['ctpipe_same_job_findings']}), MONAI {res['monai_findings']}"
            )
            if "ctpipe_float32_s" in res:
                print(
                    f"  ctpipe float32 (--fp32, lung crop) median {res['ctpipe_float32_s']:.2f} s, "
                    f"ratio vs MONAI whole volume {res['ratio_float32']:.2f}x "
                    f"(runs {_fmt(res['ctpipe_float32_runs_s'])})"
                )
    if "bundle" not in cases and not args.skip_bundle:
        print("[bundle] skipped: --quick on a CPU (its smallest chest with lungs takes about 40 s a MONAI call on 2 cores)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
