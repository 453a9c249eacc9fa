#!/usr/bin/env python
"""Benchmark DICOM ingest against SimpleITK (and dcm2niix when installed) on the same files, in the same run.

1. Series ingest: a 512x512x300 phantom series (``--quick``: 256x256x120) read into a HU array with LPS
   geometry by ``pipeline.ingest.load_series`` and by SimpleITK's ImageSeriesReader (series listing +
   read + array), each from the folder, median of several runs on a warm page cache (every reader run once
   first; then the readers take turns, so that the machine's other load hits them alike). The outputs are
   compared voxel for voxel and the geometry within 1e-4 mm; the script exits 1 if they differ.
   dcm2niix (DICOM -> NIfTI, uncompressed) is timed in the same turns on the same folder when it is on PATH,
   and its voxels are compared up to the axis flips of its output orientation. ctpipe reads with its default
   thread pool (2 x CPU count, at most 8); SimpleITK's series reader and dcm2niix read the files one after
   another (neither has an option to do otherwise).
2. Header scan: a folder tree of >= 5000 small files from 80 series written into shared folders
   (``--quick``: 1000 files). ctpipe's ``scan_directory`` (discovery, header reads, grouping, selection,
   geometry checks) against SimpleITK's ``GetGDCMSeriesIDs`` + ``GetGDCMSeriesFileNames`` per folder, in
   files per second, the tools taking turns; the series → files mapping of both is compared.

Ingest runs on the CPU; ``--device`` is accepted for a uniform benchmark interface and recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median_times(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, tuple[float, list[float], Any]]:
    """Each of ``fns`` run ``runs`` times, in turn (round robin, so that the machine's other load hits them alike):
    name -> (median seconds, every run's seconds, the last result)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Any] = {}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(ts), ts, results[name]) for name, ts in times.items()}


def make_series(folder: Path, matrix: int, slices: int) -> Path:
    """Write one phantom series (explicit VR little endian, one file per slice) unless already there."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    marker = folder / f".done_{matrix}_{slices}"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    ph = generate_phantom(1, matrix=matrix, slices=slices, n_nodules=3)
    write_dicom_series(ph.volume, folder, seed=1)
    marker.touch()
    return folder


def make_scan_tree(root: Path, n_series: int, slices: int) -> Path:
    """``n_series`` small series spread over 10 shared folders (8 series per folder for 80 series)."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.volume import CTVolume

    marker = root / f".done_{n_series}_{slices}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    base = generate_phantom(2, matrix=64, slices=slices, n_nodules=1).volume
    for s in range(n_series):
        md = dict(base.metadata)
        md["SeriesInstanceUID"] = f"1.2.826.0.1.3680043.8.498.77.{s + 1}"
        md["StudyInstanceUID"] = f"1.2.826.0.1.3680043.8.498.78.{s // 4 + 1}"
        vol = CTVolume(base.array, base.geometry, metadata=md)
        write_dicom_series(
            vol, root / f"batch{s % 10:02d}", seed=s, series_number=s + 1, transfer_syntax="rle" if s % 10 == 9 else "explicit_le"
        )
    marker.touch()
    return root


def bench_series(folder: Path, runs: int) -> dict:
    import SimpleITK as sitk

    from pipeline.ingest import load_series, scan_directory

    def ours():
        return load_series(folder)

    # one GDCM pass over the folder: without a series UID GetGDCMSeriesFileNames lists its first series, the only one
    def simpleitk():
        reader = sitk.ImageSeriesReader()
        reader.SetFileNames(sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(folder)))
        img = reader.Execute()
        return img, sitk.GetArrayFromImage(img)

    def ours_scan():
        return scan_directory(folder)

    def simpleitk_listing():
        return sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(folder))

    contenders: dict[str, Callable[[], Any]] = {"ours": ours, "simpleitk": simpleitk}
    nii_dir = Path(tempfile.mkdtemp(prefix="bench_dcm2niix_", dir=memory_tmp_root())) if shutil.which("dcm2niix") else None
    if nii_dir is not None:
        contenders["dcm2niix"] = lambda: _run_dcm2niix(folder, nii_dir)
    try:
        for fn in contenders.values():  # warm the page cache for every reader
            fn()
        timed = _median_times(contenders, runs)
        dcm2niix = _check_dcm2niix(nii_dir, timed["ours"][2].array, timed["dcm2niix"]) if nii_dir is not None else {}
    finally:
        if nii_dir is not None:
            shutil.rmtree(nii_dir, ignore_errors=True)
    t_ours, runs_ours, vol = timed["ours"]
    t_sitk, runs_sitk, (img, arr) = timed["simpleitk"]
    timed = _median_times({"ours": ours_scan, "simpleitk": simpleitk_listing}, runs)
    t_scan, _, scan = timed["ours"]
    t_list, _, listing = timed["simpleitk"]
    (plan,) = scan.plans.values()
    same_listing = [str(h.path) for h in plan.headers] == list(listing)
    identical = bool(
        np.array_equal(vol.array, arr)
        and np.allclose(vol.origin, img.GetOrigin(), atol=1e-4)
        and np.allclose(vol.spacing, img.GetSpacing(), atol=1e-4)
        and np.allclose(vol.direction, np.asarray(img.GetDirection()).reshape(3, 3), atol=1e-4)
    )
    n_files = sum(1 for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    out = {
        "shape_kji": list(vol.shape),
        "files": n_files,
        "megabytes": round(vol.array.nbytes / 1e6, 1),
        "ctpipe_s": t_ours,
        "ctpipe_runs_s": runs_ours,
        "simpleitk_s": t_sitk,
        "simpleitk_runs_s": runs_sitk,
        "ratio_vs_simpleitk": t_sitk / t_ours,
        "identical_to_simpleitk": identical,
        "listing_ctpipe_s": t_scan,
        "listing_simpleitk_s": t_list,
        "listing_ratio": t_list / t_scan,
        "listing_same_order": same_listing,
    }
    if dcm2niix:
        out.update(dcm2niix)
        out["ratio_vs_dcm2niix"] = out["dcm2niix_s"] / t_ours
    return out


def memory_tmp_root() -> Path | None:
    """``/dev/shm`` (a RAM-backed tmpfs) when writable, else ``None`` (the default temporary folder)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _run_dcm2niix(folder: Path, out_dir: Path) -> None:
    """dcm2niix: ``folder`` to one uncompressed NIfTI, ``out_dir/vol.nii`` (emptied first)."""
    for p in out_dir.iterdir():
        p.unlink()
    subprocess.run(
        ["dcm2niix", "-z", "n", "-b", "n", "-o", str(out_dir), "-f", "vol", str(folder)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _check_dcm2niix(out_dir: Path, ours: np.ndarray, timed: tuple[float, list[float], Any]) -> dict:
    """dcm2niix's figures, and whether its last NIfTI in ``out_dir`` holds ctpipe's voxels (up to axis flips).
    Its output goes to a RAM-backed folder (``/dev/shm`` where there is one), as ctpipe reads into memory."""
    import nibabel as nib

    nii = np.asanyarray(nib.load(str(out_dir / "vol.nii")).dataobj)
    ref = ours.transpose(2, 1, 0)  # (i, j, k)
    same = any(
        nii.shape == ref.shape and np.array_equal(nii, ref[::fi, ::fj, ::fk])
        for fi in (1, -1)
        for fj in (1, -1)
        for fk in (1, -1)
    )
    return {
        "dcm2niix_s": timed[0],
        "dcm2niix_runs_s": timed[1],
        "identical_to_dcm2niix": bool(same),
        "dcm2niix_output_dir": str(out_dir.parent),
        "dcm2niix_output_in_memory": out_dir.parent == Path("/dev/shm"),
    }


def bench_scan(root: Path, runs: int) -> dict:
    import SimpleITK as sitk

    from pipeline.ingest import scan_directory

    folders = sorted({p.parent for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")})

    def ours():
        return scan_directory(root)

    def simpleitk():
        found: dict[str, list[str]] = {}
        for f in folders:
            for uid in sitk.ImageSeriesReader.GetGDCMSeriesIDs(str(f)):
                found.setdefault(uid, []).extend(sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(f), uid))
        return found

    def simpleitk_ids_only():  # one pass per folder, series UIDs only (no file lists): a lower bound for GDCM
        return [uid for f in folders for uid in sitk.ImageSeriesReader.GetGDCMSeriesIDs(str(f))]

    ours(), simpleitk()
    timed = _median_times({"ours": ours, "simpleitk": simpleitk, "ids": simpleitk_ids_only}, runs)
    t_ours, runs_ours, scan = timed["ours"]
    t_sitk, runs_sitk, listing = timed["simpleitk"]
    t_ids = timed["ids"][0]
    mine: dict[str, set[str]] = {}
    for s in scan.series:
        mine.setdefault(s.uid, set()).update(str(p) for p in s.files)
    same_sets = mine == {k: set(v) for k, v in listing.items()}
    same_order = all([str(h.path) for h in plan.headers] == listing[plan.series.uid] for plan in scan.plans.values())
    n = scan.n_files
    return {
        "files": n,
        "series": len(scan.series),
        "selected": len(scan.selected),
        "folders": len(folders),
        "ctpipe_s": t_ours,
        "ctpipe_runs_s": runs_ours,
        "ctpipe_files_per_s": n / t_ours,
        "simpleitk_s": t_sitk,
        "simpleitk_runs_s": runs_sitk,
        "simpleitk_files_per_s": n / t_sitk,
        "ratio_vs_simpleitk": t_sitk / t_ours,
        "same_series_files": same_sets,
        "same_slice_order": same_order,
        "simpleitk_ids_only_s": t_ids,
        "simpleitk_ids_only_files_per_s": n / t_ids,
        "ratio_vs_simpleitk_ids_only": t_ids / t_ours,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller data, fewer runs (< 2 min)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="recorded only: ingest runs on the CPU")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per tool (default 5, quick 3)")
    ap.add_argument(
        "--data", type=Path, default=None, help="keep/reuse the generated DICOM here (default: a temp folder, removed)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    import SimpleITK as sitk

    sitk.ProcessObject.SetGlobalWarningDisplay(False)
    runs = args.runs or (3 if args.quick else 5)
    matrix, slices = (256, 120) if args.quick else (512, 300)
    n_series, scan_slices = (20, 50) if args.quick else (80, 64)
    data = args.data or Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    data.mkdir(parents=True, exist_ok=True)
    results: dict = {"benchmark": "ingest", "quick": args.quick, "device": args.device, "runs": runs, "cpus": os.cpu_count()}
    try:
        t0 = time.perf_counter()
        series_dir = make_series(data / "series", matrix, slices)
        scan_dir = make_scan_tree(data / "scan", n_series, scan_slices)
        results["data_seconds"] = time.perf_counter() - t0
        s = bench_series(series_dir, runs)
        results["series_ingest"] = s
        print(
            f"series ingest {matrix}x{matrix}x{slices} ({s['files']} files, {s['megabytes']} MB HU), median of {runs} "
            "(the tools in turn); ratio = peer s / ctpipe s (> 1: ctpipe faster):"
        )
        print(f"  ctpipe load_series                  {s['ctpipe_s']:.3f} s")
        print(
            f"  SimpleITK ImageSeriesReader (peer)  {s['simpleitk_s']:.3f} s   ratio {s['ratio_vs_simpleitk']:.2f}x   "
            f"identical output: {'yes' if s['identical_to_simpleitk'] else 'NO'}"
        )
        print(
            f"  series listing of the same folder: ctpipe scan_directory {s['listing_ctpipe_s']:.3f} s "
            f"({s['files'] / s['listing_ctpipe_s']:.0f} files/s), SimpleITK GetGDCMSeriesFileNames (peer) "
            f"{s['listing_simpleitk_s']:.3f} s ({s['files'] / s['listing_simpleitk_s']:.0f} files/s), "
            f"ratio {s['listing_ratio']:.2f}x, same slice order: {'yes' if s['listing_same_order'] else 'NO'}"
        )
        if "dcm2niix_s" in s:
            where = "RAM-backed /dev/shm" if s["dcm2niix_output_in_memory"] else f"{s['dcm2niix_output_dir']} (no /dev/shm)"
            print(
                f"  dcm2niix (peer, to NIfTI in {where}) {s['dcm2niix_s']:.3f} s   ratio {s['ratio_vs_dcm2niix']:.2f}x   "
                f"identical voxels: {'yes' if s['identical_to_dcm2niix'] else 'NO'}"
            )
        else:
            print("  dcm2niix: not installed, skipped")
        h = bench_scan(scan_dir, runs)
        results["header_scan"] = h
        print(
            f"header scan of {h['files']} files, {h['series']} series in {h['folders']} folders, median of {runs} "
            "(the tools in turn); ratio = peer s / ctpipe s (> 1: ctpipe faster):"
        )
        print(f"  ctpipe scan_directory               {h['ctpipe_s']:.3f} s  {h['ctpipe_files_per_s']:.0f} files/s")
        print(
            f"  SimpleITK GDCM series listing (peer) {h['simpleitk_s']:.3f} s  {h['simpleitk_files_per_s']:.0f} files/s   "
            f"ratio {h['ratio_vs_simpleitk']:.2f}x   same series/files: {'yes' if h['same_series_files'] else 'NO'}, "
            f"same slice order: {'yes' if h['same_slice_order'] else 'NO'}"
        )
        print(
            f"  SimpleITK GetGDCMSeriesIDs only      {h['simpleitk_ids_only_s']:.3f} s  "
            f"{h['simpleitk_ids_only_files_per_s']:.0f} files/s   ratio {h['ratio_vs_simpleitk_ids_only']:.2f}x "
            "(series UIDs only, no file lists: a lower bound for the peer)"
        )
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    ok = results["series_ingest"]["identical_to_simpleitk"] and results["header_scan"]["same_series_files"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
