#!/usr/bin/env python
"""Benchmark: the runner on Ray (runner.engine = ray) against the local executor, same cases, same run.

Three configurations run the real stages of ``ctpipe run`` (ingest, reconstruct, load, detect, nodules,
write) over the same phantom cases, ``--repeats`` times each, all with the same CPU cores:

* peer: "local" — the local executor: ``--workers`` CPU worker processes plus one model worker;
* "ray, 1 node" — a Ray cluster of one node with ``--workers`` CPUs on this machine: one CPU actor per CPU
  plus one model actor (no GPU here);
* "ray, 2 nodes" — the same CPUs split over two Ray nodes on this machine (separate raylets, object stores
  and worker pools): one CPU actor per CPU and one model actor per node.

The clusters are started before the runs (a cluster outlives runs) and the configurations alternate. Every run is a fresh ``ctpipe run``
process, as users run it: it starts its workers or joins the cluster and starts its actors, loads the model,
runs the cases and stops. Reported per configuration: the whole run's throughput (cases ÷ wall time, start-up
included) and the steady-state throughput (case completions per hour between the first and the last
completion: start-up, fill and drain excluded). Ratios are against the local peer of the same invocation; Ray's
per-case overhead is the difference of the steady-state seconds per case; "2-node efficiency" is 2 nodes ÷ 1
node on the same cores (1.0 = the split costs nothing). Also measured: the round trip of a no-op actor call (Ray's per-task overhead), and a
case-sized HU volume handed from one node to the other through Ray's object store and through a file in
the run folder (the choice documented in pipeline/runner/ray_executor.py). Medians over repeats.

The detector is the shipped demo model (the real per-case work); ``--small-model`` swaps in a small
randomly initialised network of the same architecture, which makes the model stage cheap and so shows the
executors' own overhead at its largest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_runner import make_cases  # noqa: E402  (scripts/, this script's folder, is on the path)

from pipeline.atomic import atomic_write_bytes  # noqa: E402


def steady_s_per_case(run_dir: Path) -> float:
    """Seconds between consecutive case completions, steady state: (last - first completion) / (cases - 1)."""
    db = sqlite3.connect(f"file:{run_dir / 'runs.sqlite'}?mode=ro", uri=True)
    try:
        ends = sorted(t for (t,) in db.execute("SELECT ended_at FROM cases WHERE status='done'"))
    finally:
        db.close()
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def one_run(src: Path, out: Path, settings: dict[str, Any], ray_address: str | None) -> dict[str, float]:
    """One ``ctpipe run`` in a fresh process (as users run it): wall time and steady-state rate."""
    cmd = [sys.executable, "-m", "pipeline", "run", str(src), "--out", str(out), "--quiet"]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    if ray_address:
        cmd += ["--ray", ray_address]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"run into {out} failed ({p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}")
    n = len(list((out / "cases").iterdir()))
    per_case = steady_s_per_case(out)
    return {"wall_s": wall, "cases_h": 3600 * n / wall, "steady_s_per_case": per_case, "steady_cases_h": 3600 / per_case}


def actor_round_trip(n: int = 200) -> float:
    """Median seconds of a no-op call to an actor on this cluster (the driver is connected)."""
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self, x: int) -> int:
            return x

    a = Echo.remote()
    ray.get(a.ping.remote(0))
    times = []
    for i in range(n):
        t = time.perf_counter()
        ray.get(a.ping.remote(i))
        times.append(time.perf_counter() - t)
    ray.kill(a)
    return statistics.median(times)


def handover(run_dir: Path, shape: tuple[int, int, int], repeats: int) -> dict[str, float]:
    """Median seconds to hand a case's int16 HU volume from a process on one node to one on another node:
    through Ray's object store, and through a file in the run folder (written with fsync, then read)."""
    import numpy as np
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    first, last = nodes[0], nodes[-1]

    @ray.remote(num_cpus=0)
    class Side:
        def make(self) -> Any:
            self.arr = np.random.default_rng(0).integers(-1024, 2000, size=shape, dtype=np.int16)
            return True

        def give(self) -> Any:
            return self.arr  # into this node's object store

        def write(self, path: str) -> float:
            t = time.perf_counter()
            with open(path, "wb") as fh:
                np.save(fh, self.arr)
                fh.flush()
                os.fsync(fh.fileno())
            return time.perf_counter() - t

        def take(self, arr: Any) -> int:
            return int(arr[0, 0, 0])  # fetched from the other node's object store before the call runs

        def read(self, path: str) -> int:
            return int(np.load(path)[0, 0, 0])

    a = Side.options(scheduling_strategy=NodeAffinitySchedulingStrategy(first, soft=False)).remote()
    b = Side.options(scheduling_strategy=NodeAffinitySchedulingStrategy(last, soft=False)).remote()
    ray.get(a.make.remote())
    store, files = [], []
    path = run_dir / "handover.npy"
    for _ in range(repeats):
        t = time.perf_counter()
        ray.get(b.take.remote(a.give.remote()))
        store.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get(a.write.remote(str(path)))
        ray.get(b.read.remote(str(path)))
        files.append(time.perf_counter() - t)
        path.unlink()
    ray.kill(a)
    ray.kill(b)
    return {"object_store_s": statistics.median(store), "run_folder_s": statistics.median(files)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=None, help="phantom cases (default 16; --quick 6)")
    ap.add_argument("--matrix", type=int, default=64, help="phantom matrix (pixels per side)")
    ap.add_argument("--slices", type=int, default=24)
    ap.add_argument("--workers", type=int, default=2, help="CPU cores given to every configuration")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--small-model", action="store_true", help="a small random network instead of the demo detector (overhead at its largest)"
    )
    ap.add_argument(
        "--handover-shape",
        default=None,
        help="slices,rows,columns of the handed-over volume (default 300,512,512; --quick 100,256,256)",
    )
    ap.add_argument("--quick", action="store_true", help="6 cases and a smaller hand-over volume, same repeats")
    ap.add_argument("--keep", type=Path, help="keep the cases and run folders here")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.workers < 2:
        ap.error("--workers must be at least 2 (the 2-node configuration splits them)")
    args.cases = args.cases or (6 if args.quick else 16)
    args.handover_shape = args.handover_shape or ("100,256,256" if args.quick else "300,512,512")
    if args.cases < 2 or args.repeats < 1:
        ap.error("--cases must be at least 2 (the steady state spans first to last completion) and --repeats at least 1")

    from tests._support.ray_cluster import LocalCluster

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    src = work / "cases"
    if not src.exists():
        make_cases(src, args.cases, args.matrix, args.slices, seed0=700, fov_mm=128.0, slice_spacing=5.0, n_nodules=1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the clusters on the way out
    opts: dict[str, Any] = {
        "reconstruct.renderings": False,
        "reconstruct.organs": "lung_left,lung_right",
        "detector.write_png": False,
        "outputs.dicom": "none",
        "report.enabled": False,
        "metrics.textfile": False,
        "runner.device": "cpu",
        "runner.torch_threads": 1,  # one thread per process in every configuration
        "runner.workers": args.workers,
    }
    if args.small_model:
        from tests._support.detection import small_model

        (work / "model").mkdir(exist_ok=True)
        small_model(work / "model")
        opts["detector.bundle"] = str(work / "model" / "small.json")

    half = args.workers // 2
    configs = [
        ("local", None),
        ("ray, 1 node", {"head_cpus": args.workers, "nodes": []}),
        ("ray, 2 nodes", {"head_cpus": half, "nodes": [{"num_cpus": args.workers - half}]}),
    ]
    shape = tuple(int(x) for x in args.handover_shape.split(","))
    model = "small random network" if args.small_model else "demo detector"
    peer = (
        f"local executor (runner.engine = local: {args.workers} CPU worker processes + 1 model worker), "
        "same cases, same cores, same invocation"
    )
    results: dict[str, Any] = {
        "cases": args.cases,
        "cores": args.workers,
        "model": model,
        "quick": args.quick,
        "peer": peer,
        "configs": {},
    }
    store_bytes = 3 * 2**20 * int(2 * shape[0] * shape[1] * shape[2] / 2**20 + 64)
    clusters: dict[str, Any] = {}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in configs}
    extra: dict[str, dict[str, Any]] = {name: {} for name, _ in configs}
    try:
        for name, spec in configs:
            if spec is not None:
                clusters[name] = LocalCluster(object_store_bytes=store_bytes, **spec).start()
        for r in range(args.repeats):  # the configurations alternate: the machine's other load hits them alike
            for name, _ in configs:
                out = work / "runs" / f"{name.replace(', ', '_').replace(' ', '')}_{r}"
                shutil.rmtree(out, ignore_errors=True)
                cluster = clusters.get(name)
                runs[name].append(one_run(src, out, opts, cluster.address if cluster is not None else None))
                print(
                    f"{name} run {r + 1}: {runs[name][-1]['wall_s']:.1f} s, steady {runs[name][-1]['steady_s_per_case']:.2f} s/case",
                    flush=True,
                )
        import ray

        for name, cluster in clusters.items():
            ray.init(address=cluster.address, log_to_driver=False)
            extra[name]["actor_round_trip_ms"] = 1000 * actor_round_trip()
            if len(cluster.node_specs) > 0:
                extra[name]["handover"] = handover(work, shape, args.repeats)
            ray.shutdown()
    finally:
        for cluster in clusters.values():
            cluster.stop()
    for name, _ in configs:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        results["configs"][name] = {"runs": runs[name], "median": med, **extra[name]}

    local = results["configs"]["local"]["median"]
    one = results["configs"]["ray, 1 node"]["median"]
    two = results["configs"]["ray, 2 nodes"]["median"]
    print(
        f"\n{args.cases} cases, {model}, {args.workers} cores per configuration, medians of {args.repeats} runs (fresh ctpipe run each)"
    )
    print(f"peer: {peer}; ratios = configuration's cases/h ÷ local's (> 1: faster than local)")
    print(f"{'configuration':<14} {'wall s':>7} {'cases/h':>8} {'ratio':>6} {'steady s/case':>14} {'cases/h':>8} {'ratio':>6}")
    for name in results["configs"]:
        m = results["configs"][name]["median"]
        print(
            f"{name:<14} {m['wall_s']:>7.1f} {m['cases_h']:>8.0f} {m['cases_h'] / local['cases_h']:>6.2f} "
            f"{m['steady_s_per_case']:>14.2f} {m['steady_cases_h']:>8.0f} {m['steady_cases_h'] / local['steady_cases_h']:>6.2f}"
        )
    results["ray_overhead_s_per_case"] = {
        "run": (one["wall_s"] - local["wall_s"]) / args.cases,
        "steady": one["steady_s_per_case"] - local["steady_s_per_case"],
    }
    results["ray_1_node_vs_local"] = {
        "run": one["cases_h"] / local["cases_h"],
        "steady": one["steady_cases_h"] / local["steady_cases_h"],
    }
    results["two_node_efficiency"] = {
        "run": two["cases_h"] / one["cases_h"],
        "steady": two["steady_cases_h"] / one["steady_cases_h"],
    }
    o, r1, e2 = results["ray_overhead_s_per_case"], results["ray_1_node_vs_local"], results["two_node_efficiency"]
    print(f"Ray overhead per case vs local: {o['steady']:+.3f} s steady, {o['run']:+.2f} s with start-up spread over the cases")
    print(f"Ray on 1 node / local: {r1['steady']:.2f} steady, {r1['run']:.2f} whole run; target >= 0.90")
    print(f"2-node efficiency (2 nodes / 1 node, same cores): {e2['steady']:.2f} steady, {e2['run']:.2f} whole run")
    for name in ("ray, 1 node", "ray, 2 nodes"):
        print(f"no-op actor call round trip ({name}): {results['configs'][name]['actor_round_trip_ms']:.2f} ms")
    h = results["configs"]["ray, 2 nodes"].get("handover")
    if h:
        mb = 2 * shape[0] * shape[1] * shape[2] / 2**20
        print(
            f"hand-over of a {shape[0]}x{shape[1]}x{shape[2]} int16 volume ({mb:.0f} MB) node to node: object store "
            f"{h['object_store_s']:.3f} s, run folder file {h['run_folder_s']:.3f} s (ratio {h['run_folder_s'] / h['object_store_s']:.2f})"
        )
    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1).encode())
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
