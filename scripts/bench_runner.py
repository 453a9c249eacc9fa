#!/usr/bin/env python
"""Benchmark: the pipelined runner against the same stages run one case after another.

Both modes run the real stages of ``ctpipe run`` (``pipeline.runner.stages.build_stages``: ingest, the lungs or
the reconstruction, load, detect, then the nodules or the reconstruction, write and the DICOM results) on the same
phantom cases, in this process's run, alternating, ``--repeats`` times each:

* peer: "sequential" — ``runner.workers = 0``: every stage of a case in one process, then the next case;
* ctpipe: "pipelined" — CPU worker processes plus a model worker per device, bounded queues.

Throughput (cases/hour) is the steady-state rate of each run, the same measure in both modes: (cases - 1) /
(last - first case completion). Start-up (model loading, pipeline fill) is outside it: a sequential run loads its
model before its first stage starts, while a pipelined run's model worker may still be loading its model when the
CPU workers start the first cases, so a window from the first stage start would count the loading against one
mode only. That whole window (first stage start to last completion) is printed too, as the rate a short batch
sees. Both modes follow the same torch threads rule (``--threads``; by default ctpipe's own: the machine's cores
divided among the run's processes, so the sequential run has them all, as ``ctpipe run --workers 0`` does).
Pipeline efficiency = pipelined steady-state throughput / (1 / mean wall time of the slowest stage in that same
pipelined run, the first case to complete left out as the rate leaves it out; with few cases both are noisy, and a
value a little over 1 means the stage and the completions were timed at different moments of a shared machine).
Since the CPU stages run on several workers, the efficiency against the worker-aware bound (CPU stage times summed
and divided by the CPU workers, against the model stage's time) is printed too. Until this version the rate was the
whole window's and the threads 1 per process in both modes (the GPU checks of 2026-12-04 were measured so).
Medians over repeats are reported, with the parallel speed-up the machine
offered at that moment (other users' load counts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.runner import open_run, run_batch  # noqa: E402

MODEL_STAGES = ("load", "detect")  # the stages of the model worker (one per device)


def make_cases(
    root: Path,
    n: int,
    matrix: int,
    slices: int,
    *,
    seed0: int = 500,
    fov_mm: float = 300.0,
    slice_spacing: float = 2.5,
    n_nodules: int = 2,
) -> None:
    """``n`` phantom cases (DICOM + ground truth) in ``root``/caseNNN: seeds ``seed0``.., ``matrix`` pixels
    over ``fov_mm`` (at most 2 mm each), ``slices`` slices ``slice_spacing`` mm apart, ``n_nodules`` each."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    for k in range(n):
        ph = generate_phantom(
            seed0 + k,
            matrix=matrix,
            slices=slices,
            pixel_spacing=min(2.0, fov_mm / matrix),
            slice_spacing=slice_spacing,
            n_nodules=n_nodules,
        )
        write_phantom_case(ph, root / f"case{k:03d}")


def _spin(n: int) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - t


def parallel_capacity(procs: int, n: int = 10_000_000, repeats: int = 5) -> float:
    """Speed-up this machine gives right now to ``procs`` CPU-bound processes over one (other users' load counts):
    ``procs`` x the median seconds of one spin alone ÷ the median seconds of ``procs`` spins at once, the two taking
    turns ``repeats`` times (one sample of each swings with the other users' load, past the number of cores)."""
    import multiprocessing as mp

    ones: list[float] = []
    manys: list[float] = []
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_spin, [1000] * procs)  # start-up
        for _ in range(repeats):
            t = time.perf_counter()
            pool.map(_spin, [n])
            ones.append(time.perf_counter() - t)
            t = time.perf_counter()
            pool.map(_spin, [n] * procs, chunksize=1)
            manys.append(time.perf_counter() - t)
    return procs * statistics.median(ones) / statistics.median(manys)


def measure(run_dir: Path) -> dict:
    run = open_run(run_dir)
    done = run.cases[run.cases.status == "done"]
    ok = run.stages[run.stages.status == "ok"]
    t0 = float(ok.started_at.min())
    ends = sorted(float(t) for t in done.ended_at)
    # stage times of the steady state too: the first case to complete (its stages' one-off warm-up) left out
    first = done.sort_values("ended_at").case_id.iloc[0]
    means = ok[ok.case_id != first].groupby("stage", sort=False).wall_s.mean().to_dict()
    return {
        "cases": int(len(done)),
        "window_s": ends[-1] - t0,
        "window_cases_per_hour": 3600.0 * len(done) / (ends[-1] - t0),
        "steady_s": ends[-1] - ends[0],
        "cases_per_hour": 3600.0 * (len(ends) - 1) / (ends[-1] - ends[0]),  # steady state
        "stage_mean_s": means,
        "failed": int((run.cases.status == "failed").sum()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=8, help="phantom cases (at least 3: the rate is taken between completions)")
    ap.add_argument("--matrix", type=int, default=128, help="phantom matrix (pixels per side)")
    ap.add_argument("--slices", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="CPU worker processes of the pipelined runner")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per process, the same in both modes (0: ctpipe's rule, the cores divided among the processes)",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--renderings", action="store_true", help="include the PNG renderings in the reconstruct stage")
    ap.add_argument("--quick", action="store_true", help="small run: 6 cases of 64x64x32, 3 repeats")
    ap.add_argument("--keep", type=Path, help="keep the cases and run folders here")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.cases, args.matrix, args.slices, args.repeats = 6, 64, 32, 3
    if args.cases < 3:
        ap.error(f"--cases {args.cases}: the steady-state rate needs at least 3 cases")
    work = args.keep or Path(tempfile.mkdtemp(prefix="ctpipe-bench-runner-"))
    data = work / "dicom"
    if not data.exists():
        make_cases(data, args.cases, args.matrix, args.slices)
    opts = {
        "device": args.device,
        "report.enabled": False,
        "metrics.textfile": False,
        "reconstruct.renderings": bool(args.renderings),
        "runner.torch_threads": args.threads,
    }
    results: dict[str, list[dict]] = {"sequential": [], "pipelined": []}
    for rep in range(args.repeats):
        for mode, workers in (("sequential", 0), ("pipelined", args.workers)):
            out = work / f"{mode}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            s = run_batch([data], out=out, workers=workers, **opts)
            m = measure(out)
            m["run_total_s"] = time.perf_counter() - t
            if s.exit_code != 0 or m["cases"] != args.cases:
                print(f"{mode} run failed: {s.lines()}", file=sys.stderr)
                return 1
            results[mode].append(m)
            print(
                f"repeat {rep + 1} {mode:10s}: {m['cases_per_hour']:8.1f} cases/h steady ({m['window_cases_per_hour']:.1f} over "
                f"the whole {m['window_s']:.1f} s window); "
                f"stage means " + ", ".join(f"{k} {v:.2f} s" for k, v in m["stage_mean_s"].items())
            )
    procs = args.workers + 1
    capacity = parallel_capacity(procs)
    seq = statistics.median(r["cases_per_hour"] for r in results["sequential"])
    pip = statistics.median(r["cases_per_hour"] for r in results["pipelined"])
    seq_w = statistics.median(r["window_cases_per_hour"] for r in results["sequential"])
    pip_w = statistics.median(r["window_cases_per_hour"] for r in results["pipelined"])
    effs = []
    for r in results["pipelined"]:
        slowest = max(r["stage_mean_s"].values())
        effs.append(r["cases_per_hour"] / (3600.0 / slowest))
    eff = statistics.median(effs)
    # the bound that counts parallel workers: CPU stages share the CPU workers, the model stages (load, detect)
    # share the one model worker
    bounds = []
    for r in results["pipelined"]:
        m = r["stage_mean_s"]
        cpu = sum(v for k, v in m.items() if k not in MODEL_STAGES) / max(1, args.workers)
        model = sum(v for k, v in m.items() if k in MODEL_STAGES)
        bounds.append(r["cases_per_hour"] / (3600.0 / max(cpu, model)))
    eff_bound = statistics.median(bounds)
    # the slowest stage of each pipelined run (the one its efficiency is measured against): the name of the most
    # frequent one, and the median of those runs' slowest-stage means
    slowest_names = [max(r["stage_mean_s"].items(), key=lambda kv: kv[1])[0] for r in results["pipelined"]]
    slow_name = max(set(slowest_names), key=slowest_names.count)
    slow_stage = (slow_name, statistics.median(max(r["stage_mean_s"].values()) for r in results["pipelined"]))
    print()
    print(
        f"cases: {args.cases} phantoms {args.matrix}x{args.matrix}x{args.slices}, device {args.device}, "
        f"{args.workers} CPU workers, {args.threads or 'auto'} torch thread(s)/process, repeats {args.repeats} (medians)"
    )
    print(
        f"parallel capacity now: {procs} CPU-bound processes run {capacity:.2f}x as fast as one (medians of 5) "
        f"(the most any pipelining can gain on this machine at this moment)"
    )
    print(f"peer  sequential (same stages, one case after another, workers=0): {seq:8.1f} cases/h steady state")
    print(f"ctpipe pipelined runner:                                           {pip:8.1f} cases/h steady state")
    print(f"ratio pipelined / sequential: {pip / seq:.2f}x (steady state)")
    print(f"over the whole window, start-up and fill included: {pip_w:.1f} against {seq_w:.1f} cases/h, {pip_w / seq_w:.2f}x")
    print(
        f"pipeline efficiency (throughput x slowest stage mean, slowest = {slow_stage[0]}, median {slow_stage[1]:.2f} s): "
        f"{eff:.2f}"
        f"  (target >= 0.85)"
    )
    print(
        f"efficiency against the worker-aware bound (CPU stages share {args.workers} workers, load + detect share 1): "
        f"{eff_bound:.2f}"
    )
    out = {
        "benchmark": "runner",
        "device": args.device,
        "cases": args.cases,
        "matrix": args.matrix,
        "slices": args.slices,
        "workers": args.workers,
        "threads": args.threads,
        "repeats": args.repeats,
        "peer": "sequential (workers=0)",
        "sequential_cases_per_hour": seq,
        "pipelined_cases_per_hour": pip,
        "ratio": pip / seq,
        "rate": "steady state: (cases - 1) / (last - first completion)",
        "sequential_window_cases_per_hour": seq_w,
        "pipelined_window_cases_per_hour": pip_w,
        "window_ratio": pip_w / seq_w,
        "efficiency": eff,
        "efficiencies": effs,
        "efficiency_worker_bound": eff_bound,
        "parallel_capacity": capacity,
        "slowest_stage": slow_stage[0],
        "runs": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
