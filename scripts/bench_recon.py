#!/usr/bin/env python
"""Benchmark: ctpipe's organ surfaces vs scikit-image marching cubes + trimesh smoothing and STL export.

Peer (same run, same masks): scikit-image ``marching_cubes`` on the whole organ mask (with the voxel
spacing), a ``trimesh.Trimesh``, ``trimesh.smoothing.filter_taubin`` with 20 iterations (the smoothing
ctpipe applies, and the one MONAI Deploy's STL conversion operator calls) and ``export`` to binary STL.
ctpipe: ``mesh_from_mask`` (crop, marching cubes, Taubin smoothing with 20 iterations, volume restoration,
LPS mm, outward faces) and the binary STL writer.

Reported per organ: median seconds of ``--repeats`` runs for each (both meshers warmed up once first, untimed,
on the first organ: imports and first-call set-up are not in any organ's figure), the ratio (peer / ctpipe) and both
volume errors (mesh-enclosed volume vs the mask's voxel volume). Also: seconds to segment the lungs
(``segment_organs``; CUDA events + synchronize on a GPU) plus their meshing, the target being < 10 s
on a CPU for a 512×512×300 phantom, and the Dice of each segmented organ against the phantom's truth.

    python scripts/bench_recon.py [--device cpu|cuda] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.atomic import atomic_write_bytes  # noqa: E402
from pipeline.phantom import generate_phantom  # noqa: E402
from pipeline.reconstruction.export import stl_bytes  # noqa: E402
from pipeline.reconstruction.mesh import mesh_from_mask  # noqa: E402
from pipeline.reconstruction.segment import segment_organs as _segment_organs  # noqa: E402


def segment_organs(volume, organs, device):
    return _segment_organs(volume, organs=organs, device=device)


# the peer smooths as many Taubin iterations as ctpipe does by default
PEER_SMOOTHING_ITERATIONS: int = inspect.signature(mesh_from_mask).parameters["smoothing_iterations"].default
PEER = f"scikit-image marching_cubes + trimesh filter_taubin ({PEER_SMOOTHING_ITERATIONS} iterations) + trimesh STL export"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, *args):
    """(result, seconds); GPU work is timed with CUDA events after a synchronize, host work with perf_counter."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sync(device)
        t0 = time.perf_counter()
        start.record()
        out = fn(*args)
        end.record()
        torch.cuda.synchronize()
        return out, max(start.elapsed_time(end) / 1000.0, time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def peer_mesh(mask: np.ndarray, spacing_kji: tuple[float, float, float]) -> tuple[bytes, float]:
    """The peer's pipeline on one mask: STL bytes and the enclosed volume (mm³)."""
    import trimesh
    from skimage import measure

    verts, faces, _n, _v = measure.marching_cubes(np.pad(mask, 1).astype(np.float32), level=0.5, spacing=spacing_kji)
    mesh = trimesh.Trimesh(vertices=verts, faces=faces)
    trimesh.smoothing.filter_taubin(mesh, iterations=PEER_SMOOTHING_ITERATIONS)
    buf = io.BytesIO()
    mesh.export(buf, file_type="stl")
    return buf.getvalue(), float(abs(mesh.volume))


def ours_mesh(mask: np.ndarray, geometry, name: str, device: str) -> tuple[bytes, float, int]:
    mesh = mesh_from_mask(mask, geometry, name=name, device=device)
    return stl_bytes(mesh), mesh.volume(), mesh.n_triangles


def mesh_lungs(seg, geometry, device: str) -> list:
    return [ours_mesh(seg.masks[k], geometry, k, device) for k in ("lung_left", "lung_right")]


def dice(a: np.ndarray, b: np.ndarray) -> float:
    s = int(a.sum()) + int(b.sum())
    return 1.0 if s == 0 else 2.0 * int((a & b).sum()) / s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="a 192×192×96 phantom, 3 repeats (< 2 min)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (default 3)")
    ap.add_argument("--matrix", type=int, default=None, help="rows = columns (default 512, quick 192)")
    ap.add_argument("--slices", type=int, default=None, help="slices (default 300, quick 96)")
    ap.add_argument("--organs", default="lung_left,lung_right,airway,bone,body")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    matrix = args.matrix or (192 if args.quick else 512)
    slices = args.slices or (96 if args.quick else 300)
    repeats = args.repeats
    if repeats < 1:
        ap.error("--repeats must be at least 1")
    organs = [o for o in args.organs.split(",") if o]
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))

    t0 = time.perf_counter()
    ph = generate_phantom(args.seed, matrix=matrix, slices=slices)
    vol = ph.volume
    print(f"phantom seed {args.seed}: {vol.shape} [k,j,i], spacing {vol.spacing} mm, made in {time.perf_counter() - t0:.1f} s")
    g = vol.geometry
    spacing_kji = (g.spacing[2], g.spacing[1], g.spacing[0])

    # 1. lungs: segmentation + meshing (ctpipe only; the peer has no segmentation)
    segment_organs(vol, ("lung_left", "lung_right"), args.device)  # warm-up
    seg_times, lung_total = [], []
    seg = None
    for _ in range(repeats):
        seg, s = timed(segment_organs, args.device, vol, ("lung_left", "lung_right"), args.device)
        _, m = timed(mesh_lungs, args.device, seg, g, args.device)
        seg_times.append(s)
        lung_total.append(s + m)
    assert seg is not None
    results: dict = {
        "peer": PEER,
        "device": args.device,
        "shape_kji": list(vol.shape),
        "spacing_ijk_mm": list(vol.spacing),
        "repeats": repeats,
        "lungs_segment_s": statistics.median(seg_times),
        "lungs_segment_and_mesh_s": statistics.median(lung_total),
        "dice_lungs": {k: round(dice(seg.masks[k], ph.masks[k]), 4) for k in ("lung_left", "lung_right")},
        "organs": {},
    }
    print(
        f"lungs segmented in {results['lungs_segment_s']:.2f} s, segmented + meshed in "
        f"{results['lungs_segment_and_mesh_s']:.2f} s (median of {repeats}; target < 10 s on CPU); "
        f"Dice {results['dice_lungs']}"
    )
    full = segment_organs(vol, organs, args.device)

    # 2. per organ: mesh + STL, ctpipe vs peer, on the same segmented mask
    print(f"peer: {PEER}; ratio = peer s / ctpipe s (> 1: ctpipe faster)")
    print(
        f"{'organ':10s} {'ctpipe s':>9s} {'peer s':>9s} {'ratio':>6s} {'ctpipe vol err':>15s} {'peer vol err':>13s} {'triangles':>10s}"
    )
    first = next((full.masks[o] for o in organs if o in full.masks), None)
    if first is not None:  # warm-up, untimed: the peer's imports (scikit-image, trimesh) and both first calls
        ours_mesh(first, g, "warm-up", args.device)
        peer_mesh(first, spacing_kji)
    for organ in organs:
        mask = full.masks.get(organ)
        if mask is None:
            print(f"{organ:10s} not segmented: {full.errors.get(organ)}")
            continue
        mask_mm3 = float(mask.sum()) * float(np.prod(g.spacing))
        ours_t, peer_t = [], []
        ours_out = peer_out = None
        for _ in range(repeats):
            ours_out, t = timed(ours_mesh, args.device, mask, g, organ, args.device)
            ours_t.append(t)
            peer_out, t = timed(peer_mesh, "cpu", mask, spacing_kji)
            peer_t.append(t)
        assert ours_out is not None and peer_out is not None
        row = {
            "ctpipe_s": statistics.median(ours_t),
            "peer_s": statistics.median(peer_t),
            "ctpipe_volume_error": abs(ours_out[1] / mask_mm3 - 1),
            "peer_volume_error": abs(peer_out[1] / mask_mm3 - 1),
            "ctpipe_triangles": ours_out[2],
            "dice": round(dice(mask, ph.masks[organ]), 4),
        }
        row["ratio"] = row["peer_s"] / row["ctpipe_s"]
        results["organs"][organ] = row
        print(
            f"{organ:10s} {row['ctpipe_s']:9.2f} {row['peer_s']:9.2f} {row['ratio']:5.1f}x "
            f"{row['ctpipe_volume_error']:14.3%} {row['peer_volume_error']:12.3%} {row['ctpipe_triangles']:10d}"
        )
    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1).encode())
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
