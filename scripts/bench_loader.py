"""Benchmark: volumes/second of the DALI loader and the torch loader against a MONAI DataLoader.

All three read the same cached cases (``<id>.npy`` + sidecar) and produce the MONAI
lung-nodule bundle's model input: Orientation RAS → Spacing 0.703125 × 0.703125 × 1.25 mm
(bilinear) → ScaleIntensityRange -1024..300 → 0..1 (clip) → DivisiblePad (16, 16, 8).
The peer is ``monai.data.DataLoader`` over ``LoadImaged`` (a reader for the cache:
the .npy array with the sidecar's affine) + ``EnsureChannelFirstd`` and those transforms,
with as many worker processes as the DALI loader has threads. With ``--device cuda``, where
ctpipe's loaders preprocess on the GPU, the first peer is MONAI's GPU recipe: ``EnsureTyped(device=cuda)``
right after reading, so the transforms run on the GPU, in a ``ThreadDataLoader`` without workers; the
CPU-worker ``DataLoader`` (its output moved to the GPU) is measured as a second peer. Each figure is the median
of several full passes (after one warm-up pass), the contenders in turn; ratios against every peer are
printed. Every output is compared with the CPU-worker peer's, case by case, so that all do the same work.

    python scripts/bench_loader.py [--quick] [--device cpu|cuda] [--json out.json] [--skip-dali]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.cache import CaseCache  # noqa: E402
from pipeline.load import BUNDLE_LUNG_NODULE, DaliLoader, TorchLoader, dali_available  # noqa: E402
from pipeline.volume import CTVolume, Geometry  # noqa: E402

CPU_PEER = "monai_dataloader"
GPU_PEER = "monai_thread_gpu"
PEERS = {
    GPU_PEER: "monai.data.ThreadDataLoader, no workers, EnsureTyped(device=cuda) after reading: the transforms on the GPU",
    CPU_PEER: "monai.data.DataLoader, worker processes running the transforms on the CPU",
}


def make_cases(cache: CaseCache, n: int, matrix: int, slices: int, fov: float) -> str:
    """Write ``n`` chest volumes (phantoms when available) with varying slice counts; returns their source."""
    try:
        from pipeline.phantom import generate_phantom
    except ImportError:
        generate_phantom = None
    for c in range(n):
        nslices = slices + 4 * c  # different sizes, as in a real batch
        if generate_phantom is not None:
            vol = generate_phantom(
                100 + c,
                matrix=matrix,
                pixel_spacing=min(2.0, max(0.3, fov / matrix)),
                slice_spacing=2.5,
                slices=nslices,
                n_nodules=3,
            ).volume
        else:
            vol = synthetic_chest(matrix, nslices, fov, seed=c)
        cache.write(f"case{c:02d}", vol)
    return "pipeline.phantom.generate_phantom" if generate_phantom is not None else "synthetic chest (pipeline.phantom missing)"


def synthetic_chest(matrix: int, slices: int, fov: float, *, seed: int) -> CTVolume:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:matrix, 0:matrix].astype(np.float32) / matrix - 0.5
    body = (x / 0.45) ** 2 + (y / 0.35) ** 2 < 1
    lungs = ((np.abs(x) - 0.2) / 0.15) ** 2 + (y / 0.25) ** 2 < 1
    sl = np.where(lungs, -850, np.where(body, 40, -1000)).astype(np.int16)
    arr = np.repeat(sl[None], slices, axis=0) + rng.normal(0, 20, (slices, matrix, matrix)).astype(np.int16)
    sp = min(2.0, max(0.3, fov / matrix))
    return CTVolume(arr, Geometry(shape=arr.shape, spacing=(sp, sp, 2.5), origin=(-fov / 2, -fov / 2, -300.0)))


def monai_loader(cache: CaseCache, ids: list[str], workers: int, device: str | None = None):
    """MONAI's loader with the bundle's transforms.

    ``device=None``: ``DataLoader`` with ``workers`` processes running the transforms on the CPU.
    ``device="cuda"``: MONAI's GPU recipe: the array moved to the device by ``EnsureTyped`` right after reading,
    so Orientation, Spacing, the intensity window and the padding run there, in a ``ThreadDataLoader`` (no worker
    processes: CUDA work stays in this process).
    """
    from monai.data import DataLoader, Dataset, ImageReader, ThreadDataLoader
    from monai.transforms import (
        Compose,
        DivisiblePadd,
        EnsureChannelFirstd,
        EnsureTyped,
        LoadImaged,
        Orientationd,
        ScaleIntensityRanged,
        Spacingd,
    )

    class CachedCaseReader(ImageReader):
        """Reads a cache entry: the ``.npy`` array and the RAS affine from its sidecar."""

        def verify_suffix(self, filename) -> bool:
            names = filename if isinstance(filename, (list, tuple)) else [filename]
            return all(str(f).endswith(".npy") for f in names)

        def read(self, data, **kwargs):
            names = data if isinstance(data, (list, tuple)) else [data]
            return Path(str(names[0]))

        def get_data(self, img):
            arr = np.load(img)
            geom = Geometry.from_json(json.loads(img.with_suffix(".json").read_text())["geometry"])
            data = arr.transpose(2, 1, 0)  # [k, j, i] → (i, j, k)
            meta = {
                "affine": geom.affine_ras,
                "original_affine": geom.affine_ras,
                "spatial_shape": np.array(data.shape),
                "original_channel_dim": "no_channel",
                "space": "RAS",
            }
            return data, meta

    s = BUNDLE_LUNG_NODULE
    to_device = [] if device is None else [EnsureTyped(keys="image", device=torch.device(device), track_meta=True)]
    transform = Compose(
        [
            LoadImaged(keys="image", reader=CachedCaseReader(), image_only=True),
            EnsureChannelFirstd(keys="image"),
            *to_device,
            Orientationd(keys="image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Spacingd(keys="image", pixdim=s.spacing, mode="bilinear"),
            ScaleIntensityRanged(
                keys="image",
                a_min=s.intensity_window[0],
                a_max=s.intensity_window[1],
                b_min=s.output_range[0],
                b_max=s.output_range[1],
                clip=s.clip,
            ),
            DivisiblePadd(keys="image", k=s.size_divisible),
        ]
    )
    data = [{"image": str(cache.array_path(i))} for i in ids]
    if device is not None:
        return ThreadDataLoader(
            Dataset(data=data, transform=transform), batch_size=1, num_workers=0, collate_fn=lambda batch: batch
        )
    return DataLoader(
        Dataset(data=data, transform=transform),
        batch_size=1,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=lambda batch: batch,
    )


def compare(outputs: list[torch.Tensor], ref: list[torch.Tensor]) -> tuple[bool, float]:
    """Whether every output has its reference's shape, and then the largest absolute difference (else NaN)."""
    same_shape = len(outputs) == len(ref) and all(a.shape == b.shape for a, b in zip(outputs, ref))
    if not same_shape:
        return False, float("nan")
    return True, max((float((a.cpu() - b.cpu()).abs().max()) for a, b in zip(outputs, ref)), default=0.0)


def timed(fn: Callable[[], list[torch.Tensor]], device: str) -> tuple[float, list[torch.Tensor]]:
    """Seconds for one full pass (CUDA events + synchronize on a GPU)."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000.0, out
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run (< 2 min)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--skip-dali", action="store_true", help="do not measure the DALI loader")
    ap.add_argument("--cases", type=int, help="number of cases (default 3 quick, 4 full)")
    ap.add_argument("--matrix", type=int, help="in-plane matrix (default 128 quick, 512 full)")
    ap.add_argument("--fov", type=float, help="field of view in mm (default 200 quick, 350 full)")
    ap.add_argument("--slices", type=int, help="slices of the first case at 2.5 mm (default 32 quick, 100 full)")
    ap.add_argument("--repeats", type=int, help="timed passes (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="DALI threads = torch loader threads = MONAI workers (default 2)")
    ap.add_argument("--batch-size", type=int, default=2, help="DALI batch size (default 2)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    n = args.cases or (3 if args.quick else 4)
    matrix = args.matrix or (128 if args.quick else 512)
    fov = args.fov or (200.0 if args.quick else 350.0)
    slices = args.slices or (32 if args.quick else 100)
    repeats = args.repeats or 3
    torch.set_num_threads(args.threads)
    have_dali, dali_why = dali_available()
    run_dali = have_dali and not args.skip_dali

    with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
        cache = CaseCache(tmp)
        t0 = time.perf_counter()
        source = make_cases(cache, n, matrix, slices, fov)
        ids = cache.case_ids()
        print(
            f"{n} cases, matrix {matrix}, FOV {fov:g} mm, {slices}..{slices + 4 * (n - 1)} slices at 2.5 mm ({source}); "
            f"written in {time.perf_counter() - t0:.1f} s; device {args.device}; {args.threads} threads/workers; "
            f"median of {repeats} passes after 1 warm-up"
        )
        dev = args.device
        contenders: dict[str, Callable[[], list[torch.Tensor]]] = {}
        if run_dali:
            dali = DaliLoader(cache, BUNDLE_LUNG_NODULE, device=dev, batch_size=args.batch_size, num_threads=args.threads)
            contenders["dali"] = lambda: [c.unwrap() for c in dali.load(ids)]
        tl = TorchLoader(cache, BUNDLE_LUNG_NODULE, device=dev, num_threads=args.threads)
        contenders["torch"] = lambda: [c.unwrap() for c in tl.load(ids)]
        ml = monai_loader(cache, ids, args.threads)
        contenders[CPU_PEER] = lambda: [b[0]["image"].as_tensor().to(dev) for b in ml]
        moved = "; output moved to the GPU with .to(device)" if dev == "cuda" else ""
        peers = {CPU_PEER: f"{PEERS[CPU_PEER]} ({args.threads} workers){moved}"}
        if dev == "cuda":
            mg = monai_loader(cache, ids, 0, device=dev)
            contenders[GPU_PEER] = lambda: [b[0]["image"].as_tensor() for b in mg]
            peers = {GPU_PEER: PEERS[GPU_PEER], **peers}
        for name, what in peers.items():
            print(f"peer {name}: {what}")

        results: dict[str, dict] = {}
        outputs: dict[str, list[torch.Tensor]] = {}
        for name, fn in contenders.items():
            _, outputs[name] = timed(fn, dev)  # warm-up (worker start, pipeline build)
        secs: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(repeats):  # round robin, so that load from other processes hits all alike
            for name, fn in contenders.items():
                secs[name].append(timed(fn, dev)[0])
        for name in contenders:
            med = statistics.median(secs[name])
            results[name] = {"seconds_per_pass": secs[name], "median_s": med, "volumes_per_s": n / med}
            runs = ", ".join(f"{x:.2f}" for x in secs[name])
            print(f"{name:>17}: {n / med:7.3f} volumes/s  (median {med:.2f} s per pass of {n}; runs {runs})")

        ref = outputs[CPU_PEER]
        for name in outputs:
            if name == CPU_PEER:
                continue
            same_shape, mx = compare(outputs[name], ref)
            results[name]["max_abs_diff_vs_monai"] = mx
            print(f"{name:>17}: same shapes as {CPU_PEER}: {same_shape}; max abs difference {mx:.2e}")
        ratios = {
            f"{k}_vs_{p}": v["volumes_per_s"] / results[p]["volumes_per_s"]
            for p in peers
            for k, v in results.items()
            if k not in peers
        }
        if "dali" in results:
            ratios["dali_vs_torch"] = results["dali"]["volumes_per_s"] / results["torch"]["volumes_per_s"]
        for k, v in ratios.items():
            a, b = k.split("_vs_")
            print(f"ratio {k}: {v:.2f}x ({a} volumes/s / {b} volumes/s, > 1: {a} faster)")
        if not run_dali:
            print(f"DALI skipped: {'--skip-dali' if args.skip_dali else dali_why}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "loader",
                    "device": dev,
                    "quick": args.quick,
                    "cases": n,
                    "matrix": matrix,
                    "fov_mm": fov,
                    "slices_first": slices,
                    "source": source,
                    "threads": args.threads,
                    "repeats": repeats,
                    "peer": next(iter(peers.values())),
                    "peers": peers,
                    "dali_skipped": not run_dali,
                    "results": results,
                    "ratios": ratios,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
