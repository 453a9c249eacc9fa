"""Choose a ctpipe detector model's operating point on validation phantoms, with the existing weights.

Runs the full two-stage pipeline (the RetinaNet, then :meth:`pipeline.detection.infer.Detector.postprocess`, every
candidate kept) on validation phantoms that no training script uses (``scripts/train_detector.py``'s
``training_phantom`` protocol), then writes the model JSON's ``operating_point`` entry:

1. **Thick-slice score calibration** (``thick_slice_calibration``, :mod:`pipeline.detection.score_calibration`):
   the validation phantoms with slices thicker than 2.5 mm (those among ``--val-seed0``.. and ``--n-thick`` more,
   the first seeds from ``--thick-seed0`` whose confounders make thick slices) against those with thinner slices:
   at each FROC rate (1/8..8 false positives per scan), the thick-slice score with that rate is paired with the
   thin-slice score with that rate.
2. **Operating point**: with thick-slice scores so mapped, the lowest score with at most ``--op-fps`` false
   positives per scan on the validation phantoms ``--val-seed0``..``+--n-val`` (LUNA16 counting,
   :func:`pipeline.detection.operating_point.calibrate`), with the sensitivity reached there; ``network_only``: the
   same for the RetinaNet's own scores (``ctpipe detect --raw``; never calibrated).

Findings and ground truth are kept in ``--work`` (``pipeline/``, ``network/``, ``truth/``) for ``ctpipe evaluate``.

    python scripts/calibrate_operating_point.py
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from train_detector import HELDOUT_SEEDS, SCENARIO_SEEDS, training_phantom

from pipeline.detection.bundle import load_model
from pipeline.detection.infer import Detector
from pipeline.detection.lungs import quick_lung_mask
from pipeline.detection.model_config import DEMO_MODEL_JSON
from pipeline.detection.operating_point import calibrate
from pipeline.detection.score_calibration import ScoreCalibration, fit_knots
from pipeline.phantom import realistic_confounders
from pipeline.volume import THICK_SLICE_MM, slice_thickness_mm

log = logging.getLogger("calibrate_operating_point")

PROTOCOL = "scripts/train_detector.py training_phantom protocol"


def thick_seeds(seed0: int, n: int, *, reserved: set[int], limit: int = 5000) -> list[int]:
    """The first ``n`` seeds from ``seed0`` whose realistic confounders give thick slices and lungs, none in ``reserved``."""
    out: list[int] = []
    seed = seed0
    while len(out) < n and seed < limit:
        conf = realistic_confounders(seed)
        if seed not in reserved and conf.thick_slices_mm is not None and conf.thick_slices_mm > THICK_SLICE_MM and conf.has_lungs:
            out.append(seed)
        seed += 1
    if len(out) < n:
        raise SystemExit(f"only {len(out)} thick-slice seeds between {seed0} and {limit}: lower --n-thick")
    return out


def _rule(fps_per_scan: float) -> str:
    return f"lowest score with at most {fps_per_scan:g} false positive(s) per scan (LUNA16 counting)"


def operating_point_entry(
    found: Mapping[str, Any], truth: Mapping[str, Any], seeds: Sequence[int], *, stage: str, fps_per_scan: float
) -> dict:
    """The operating-point entry of ``found`` (scan id → findings, all candidates) on validation phantoms ``seeds``."""
    cal = calibrate(found, truth, fps_per_scan=fps_per_scan)
    log.info(
        "operating point (%s): score >= %.4f gives sensitivity %.3f at %.3f FPs/scan (%d scans, %d nodules)",
        stage,
        cal.score_threshold,
        cal.sensitivity,
        cal.measured_fps_per_scan,
        cal.n_scans,
        cal.n_nodules,
    )
    where = f"validation phantoms, seeds {seeds[0]}-{seeds[-1]} ({PROTOCOL})"
    return {"chosen_on": f"{where}, {stage}: {_rule(fps_per_scan)}", **cal.to_json(), "seeds": [seeds[0], seeds[-1]]}


def run_phantoms(model_json: Path, seeds: Sequence[int], out: Path) -> tuple[dict[int, dict[str, Any]], str]:
    """``({seed: {"network", "pipeline", "truth", "thickness_mm"}}, number format)``: the RetinaNet's and the full
    pipeline's findings (every candidate, scores not calibrated) and the ground truth of each validation phantom,
    written under ``out``."""
    model = load_model(model_json)
    det = Detector(model=model, device="cpu", postprocess=False, all_candidates=True)
    post = Detector(model=model, device="cpu", all_candidates=True)  # the default pipeline, applied to det's findings
    if not post.fp_reduction:
        raise SystemExit(f"{model_json} has no fp_reduction entry: train the classifier first")
    post.score_calibration = None  # fitted here, from uncalibrated scores
    results = {}
    for n, seed in enumerate(seeds):
        ph = training_phantom(seed, np.random.default_rng(seed))
        region = quick_lung_mask(ph.volume)
        ph.save_ground_truth(out / "truth" / f"phantom_{seed}")
        found = det.detect(ph.volume, lung_mask=region, case_id=f"phantom_{seed}")
        full = post.postprocess(ph.volume, found, region=region)
        found.write_json(out / "network" / f"phantom_{seed}.findings.json")
        full.write_json(out / "pipeline" / f"phantom_{seed}.findings.json")
        thickness = slice_thickness_mm(ph.volume.geometry, ph.volume.metadata)
        results[seed] = {
            "network": found,
            "pipeline": full,
            "truth": [(nod.center_lps, nod.diameter_mm) for nod in ph.nodules],
            "thickness_mm": thickness,
        }
        log.info(
            "validation phantom %d (%d/%d): %.3g mm slices, %d nodules, %d candidates",
            seed,
            n + 1,
            len(seeds),
            thickness,
            len(ph.nodules),
            len(full.candidates),
        )
    return results, post.precision


def calibrate_operating_point(
    model_json: Path, val_seeds: Sequence[int], extra_thick: Sequence[int], *, fps_per_scan: float, out: Path, command: str
) -> dict:
    """The ``operating_point`` entry for ``model_json`` (see the module docstring)."""
    t0 = time.time()
    res, precision = run_phantoms(model_json, [*val_seeds, *extra_thick], out)

    def split(seeds: Sequence[int], key: str) -> tuple[dict, dict]:
        return {str(s): res[s][key] for s in seeds}, {str(s): res[s]["truth"] for s in seeds}

    thin = [s for s in val_seeds if res[s]["thickness_mm"] <= THICK_SLICE_MM]
    thick = [s for s in [*val_seeds, *extra_thick] if res[s]["thickness_mm"] > THICK_SLICE_MM]
    if not thick:
        raise SystemExit("no validation phantom has thick slices: raise --n-thick")
    knots = fit_knots(split(thin, "pipeline"), split(thick, "pipeline"))
    in_val = [str(s) for s in thick if s in val_seeds]
    thick_where = ", ".join([*in_val, *([f"{extra_thick[0]}-{extra_thick[-1]}"] if extra_thick else [])])
    cal = ScoreCalibration(
        min_slice_thickness_mm=THICK_SLICE_MM,
        knots=knots,
        chosen_on=(
            f"validation phantoms ({PROTOCOL}): {len(thick)} with slices over {THICK_SLICE_MM:g} mm (seeds {thick_where}, "
            f"those with thick slices) against the {len(thin)} of seeds {val_seeds[0]}-{val_seeds[-1]} with thinner "
            "slices, matched at 1/8-8 false positives per scan (LUNA16 counting)"
        ),
        details={"n_thick_scans": len(thick), "n_thin_scans": len(thin), "thick_seeds": thick},
    )
    log.info("thick-slice calibration knots (thick -> thin score): %s", [(round(x, 4), round(y, 4)) for x, y in knots])
    pipeline = {str(s): cal.apply(res[s]["pipeline"], res[s]["thickness_mm"]) for s in val_seeds}
    network, truth = split(val_seeds, "network")
    entry = operating_point_entry(
        pipeline,
        truth,
        val_seeds,
        stage="RetinaNet + false-positive reduction, thick-slice scores calibrated",
        fps_per_scan=fps_per_scan,
    )
    return {
        **entry,
        "precision": precision,
        "device": "cpu",
        "compute_cpu_minutes": round((time.time() - t0) / 60, 1),
        "command": command,
        "thick_slice_calibration": cal.to_json(),
        "network_only": operating_point_entry(
            network, truth, val_seeds, stage="RetinaNet alone (--raw)", fps_per_scan=fps_per_scan
        ),
    }


def write_operating_point(model_json: Path, entry: dict) -> None:
    data = json.loads(model_json.read_text())
    data["operating_point"] = entry
    model_json.write_text(json.dumps(data, indent=1) + "\n")
    log.info("wrote the operating_point entry of %s: score threshold %.4f", model_json, entry["score_threshold"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ctpipe_calibration"))
    ap.add_argument(
        "--model", type=Path, default=DEMO_MODEL_JSON, help="detector model JSON; its operating_point entry is written"
    )
    ap.add_argument("--val-seed0", type=int, default=3000)
    ap.add_argument("--n-val", type=int, default=40)
    ap.add_argument("--thick-seed0", type=int, default=3040)
    ap.add_argument("--n-thick", type=int, default=40, help="further validation phantoms with thick slices")
    ap.add_argument("--op-fps", type=float, default=1.0, help="false positives per scan at the operating point")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(args.threads)
    data = json.loads(args.model.read_text())
    reserved = set(HELDOUT_SEEDS) | set(SCENARIO_SEEDS)
    for entry in (data.get("training", {}), data.get("fp_reduction", {}).get("training", {})):
        if "train_seeds" in entry:
            lo, hi = entry["train_seeds"]
            reserved |= set(range(lo, hi + 1))
    val_seeds = list(range(args.val_seed0, args.val_seed0 + args.n_val))
    if not val_seeds or reserved & set(val_seeds):
        raise SystemExit(f"validation seeds {args.val_seed0}.. are empty or overlap held-out or training seeds")
    extra = thick_seeds(args.thick_seed0, args.n_thick, reserved=reserved | set(val_seeds)) if args.n_thick else []
    command = "python scripts/calibrate_operating_point.py" + "".join(
        f" --{k.replace('_', '-')} {v:g}"
        for k, v, d in (
            ("val_seed0", args.val_seed0, 3000),
            ("n_val", args.n_val, 40),
            ("thick_seed0", args.thick_seed0, 3040),
            ("n_thick", args.n_thick, 40),
            ("op_fps", args.op_fps, 1.0),
        )
        if v != d
    )
    write_operating_point(
        args.model,
        calibrate_operating_point(args.model, val_seeds, extra, fps_per_scan=args.op_fps, out=args.work, command=command),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
