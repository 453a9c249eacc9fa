#!/usr/bin/env python
"""Benchmark: ctpipe's DICOM results (SR + SEG) vs highdicom's own SEG encoding, same masks, same run.

Case: a synthetic 512×512×300 CT grid (``--quick``: 256×256×120), HFS, 0.7 × 0.7 × 1.0 mm, with 5
organ masks (body, lungs, airway, bone: ellipsoids and tubes) and 5 nodule masks with their findings.
The source series is written to a temporary folder as CT headers (no pixel data) and read back with
``read_source_series`` (timed on its own).

ctpipe: ``write_dicom_outputs`` (SR + SEG, every segment on every slice, the default), target < 2 s on
a CPU for the full case; also its SEG with ``omit_empty_frames=True``, the frames highdicom's default keeps.
Peer: ``highdicom.seg.Segmentation(...)`` with its default settings (empty frames omitted, Explicit VR
Little Endian, no workers) on the same 10 masks and source headers, then ``save_as``.

Reported: medians of ``--repeats`` runs (each of the three writers warmed up once first, then the three in turn,
so that the machine's other load hits them alike), the ratio peer / ctpipe (> 1: ctpipe faster),
file sizes. The peer's masks are stacked into its input array (segments last) once, outside its timings.

    python scripts/bench_dicom_out.py [--quick] [--repeats N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.atomic import atomic_write_bytes  # noqa: E402
from pipeline.detection.findings import Finding  # noqa: E402
from pipeline.dicom_out import read_source_series, write_dicom_outputs  # noqa: E402
from pipeline.dicom_out.model import reported_findings  # noqa: E402
from pipeline.dicom_out.seg import write_seg_object  # noqa: E402
from pipeline.volume import CTVolume, Geometry  # noqa: E402

PEER = "highdicom.seg.Segmentation (default settings) + save_as"
SPACING = (0.7, 0.7, 1.0)  # (i, j, k) mm
ORGANS = ("body", "lung_left", "lung_right", "airway", "bone")


def make_volume(matrix: int, slices: int) -> CTVolume:
    """A CT volume (all -1000 HU, a broadcast view: no memory) on an axial HFS grid centred on the scanner axis."""
    half = (matrix - 1) * SPACING[0] / 2
    geom = Geometry(shape=(slices, matrix, matrix), spacing=SPACING, origin=(-half, -half, -slices * SPACING[2]))
    meta = {
        "SeriesInstanceUID": "2.25.1234567890123456789",
        "StudyInstanceUID": "2.25.987654321",
        "FrameOfReferenceUID": "2.25.55555",
        "PatientID": "BENCH",
    }
    return CTVolume(np.broadcast_to(np.int16(-1000), geom.shape), geom, metadata=meta)


def write_headers(volume: CTVolume, folder: Path) -> None:
    """One CT Image Storage header file per slice (no pixel data), positions from the volume's geometry."""
    from pydicom import dcmwrite
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

    g = volume.geometry
    md = volume.metadata
    for k in range(g.shape[0]):
        ds = Dataset()
        ds.file_meta = FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = UID("1.2.840.10008.5.1.4.1.1.2")
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
        ds.StudyInstanceUID, ds.SeriesInstanceUID = md["StudyInstanceUID"], md["SeriesInstanceUID"]
        ds.FrameOfReferenceUID, ds.PatientID = md["FrameOfReferenceUID"], md["PatientID"]
        ds.PatientName, ds.PatientBirthDate, ds.PatientSex = "BENCH^CASE", "", "O"
        ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "20250101", "120000", "1", "", ""
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "CT", 1, k + 1
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [round(float(v), 4) for v in g.index_to_lps([0, 0, k])]
        ds.PixelSpacing = [SPACING[1], SPACING[0]]
        ds.SliceThickness = SPACING[2]
        ds.Rows, ds.Columns = g.shape[1], g.shape[2]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        dcmwrite(folder / f"ct{k:04d}.dcm", ds, enforce_file_format=True)


def make_masks(volume: CTVolume, n_nodules: int, seed: int) -> tuple[dict[str, np.ndarray], list[Any], list[Finding]]:
    """Organ masks (bool [k, j, i]), nodule results (crops) and findings (LPS mm) on ``volume``'s grid."""
    g = volume.geometry
    nk, nj, ni = g.shape
    k = np.arange(nk)[:, None, None] / nk
    j = np.arange(nj)[None, :, None] / nj
    i = np.arange(ni)[None, None, :] / ni
    masks = {
        "body": ((i - 0.5) ** 2 / 0.2 + (j - 0.5) ** 2 / 0.12 < 1) & (k >= 0),
        "lung_left": (i - 0.68) ** 2 / 0.02 + (j - 0.5) ** 2 / 0.05 + (k - 0.55) ** 2 / 0.16 < 1,
        "lung_right": (i - 0.32) ** 2 / 0.02 + (j - 0.5) ** 2 / 0.05 + (k - 0.55) ** 2 / 0.16 < 1,
        "airway": ((i - 0.5) ** 2 + (j - 0.45) ** 2 < 0.0004) & (k > 0.5),
        "bone": ((i - 0.5) ** 2 / 0.2 + (j - 0.5) ** 2 / 0.12 > 0.9)
        & ((i - 0.5) ** 2 / 0.2 + (j - 0.5) ** 2 / 0.12 < 1)
        & (k >= 0),
    }
    masks = {name: np.ascontiguousarray(np.broadcast_to(m, g.shape)) for name, m in masks.items()}
    rng = np.random.default_rng(seed)
    nodules, findings = [], []
    for n in range(n_nodules):
        radius_mm = float(rng.uniform(3, 12))
        r = np.ceil(radius_mm / np.asarray(SPACING)).astype(int)  # (i, j, k)
        centre = np.array(
            [rng.integers(r[0] + 1, ni - r[0] - 1), rng.integers(r[1] + 1, nj - r[1] - 1), rng.integers(r[2] + 1, nk - r[2] - 1)]
        )
        lo, hi = centre - r, centre + r + 1
        kk, jj, ii = np.indices((hi[2] - lo[2], hi[1] - lo[1], hi[0] - lo[0]))
        rel = np.stack(
            [(ii + lo[0] - centre[0]) * SPACING[0], (jj + lo[1] - centre[1]) * SPACING[1], (kk + lo[2] - centre[2]) * SPACING[2]]
        )
        crop = (rel**2).sum(0) <= radius_mm**2
        crop_geom = g.cropped(lo.tolist(), hi.tolist())
        c = g.index_to_lps(centre)
        nodules.append(SimpleNamespace(index=n, mask=crop, geometry=crop_geom, volume_mm3=float(crop.sum() * np.prod(SPACING))))
        findings.append(
            Finding(
                center_lps=tuple(c),
                box_min_lps=tuple(c - radius_mm),
                box_max_lps=tuple(c + radius_mm),
                diameter_mm=2 * radius_mm,
                score=float(rng.uniform(0.55, 0.99)),
                voxel_ijk=(int(centre[0]), int(centre[1]), int(centre[2])),
                slice_number=int(centre[2]) + 1,
            )
        )
    return masks, nodules, findings


def peer_seg(source: Any, stacked: np.ndarray, out: Path) -> int:
    """highdicom's own SEG (default settings) of ``stacked`` masks (``[k, j, i, segment]``, bool); returns the number
    of frames."""
    import highdicom as hd
    from pydicom.sr.codedict import codes
    from pydicom.uid import generate_uid

    algo = hd.AlgorithmIdentificationSequence(name="ctpipe", family=codes.DCM.MorphologicalOperations, version="0")
    descriptions = [
        hd.seg.SegmentDescription(
            segment_number=n + 1,
            segment_label=f"segment {n + 1}",
            segmented_property_category=codes.SCT.AnatomicalStructure,
            segmented_property_type=codes.SCT.Lung,
            algorithm_type="AUTOMATIC",
            algorithm_identification=algo,
        )
        for n in range(stacked.shape[-1])
    ]
    seg = hd.seg.Segmentation(
        source_images=list(source.datasets),
        pixel_array=stacked,
        segmentation_type="BINARY",
        segment_descriptions=descriptions,
        series_instance_uid=generate_uid(),
        series_number=902,
        sop_instance_uid=generate_uid(),
        instance_number=1,
        manufacturer="ctpipe",
        manufacturer_model_name="ctpipe",
        software_versions="0",
        device_serial_number="0",
    )
    seg.save_as(out)
    return int(seg.NumberOfFrames)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 256×256×120 case and 3 repeats (< 1 min)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (default 5, quick 3)")
    ap.add_argument("--matrix", type=int, default=None, help="rows = columns (default 512, quick 256)")
    ap.add_argument("--slices", type=int, default=None, help="slices (default 300, quick 120)")
    ap.add_argument("--nodules", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    matrix = args.matrix or (256 if args.quick else 512)
    slices = args.slices or (120 if args.quick else 300)
    repeats = args.repeats or (3 if args.quick else 5)

    volume = make_volume(matrix, slices)
    masks, nodules, findings = make_masks(volume, args.nodules, args.seed)
    recon = SimpleNamespace(
        masks=masks,
        measurements={
            "lungs": {
                "lung_left_volume_ml": 1500.0,
                "lung_right_volume_ml": 1700.0,
                "lungs_total_volume_ml": 3200.0,
                "emphysema_index_pct": 2.0,
            }
        },
    )
    quality = {"lung_coverage": "complete", "contrast_phase": "non_contrast", "flags": [], "unreliable": []}
    print(f"case: {volume.shape} [k,j,i], {len(masks)} organs, {len(findings)} findings; {repeats} repeats")
    results: dict[str, Any] = {
        "benchmark": "dicom_out",
        "quick": args.quick,
        "peer": PEER,
        "shape_kji": list(volume.shape),
        "repeats": repeats,
        "target_s": 2.0,
    }
    with tempfile.TemporaryDirectory(prefix="bench_dicom_out_") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "src").mkdir()
        write_headers(volume, tmpdir / "src")
        read_times = []
        source = None
        for _ in range(repeats):
            source, t = timed(read_source_series, tmpdir / "src", volume)
            read_times.append(t)
        assert source is not None
        options = dict(
            source=source,
            volume=volume,
            findings=findings,
            reconstruction=recon,
            nodules=nodules,
            quality=quality,
            model_name="bench",
            model_version="1",
            score_threshold=0.5,
        )
        reported = reported_findings(
            findings,
            volume.geometry,
            series_uid=source.series_instance_uid,
            score_threshold=0.5,
            nodules=nodules,
            organ_masks=masks,
        )
        g = volume.geometry
        nodule_full = []
        for f in reported:
            assert f.mask is not None
            full = np.zeros(g.shape, dtype=bool)
            k0, j0, i0 = f.mask.offset_kji
            nk, nj, ni = f.mask.mask.shape
            full[k0 : k0 + nk, j0 : j0 + nj, i0 : i0 + ni] = f.mask.mask
            nodule_full.append(full)
        stacked = np.stack([masks[o] for o in ORGANS] + nodule_full, axis=-1)  # highdicom's input form
        del nodule_full

        def ours_run(out: Path) -> dict[str, Path]:
            return write_dicom_outputs(out, **options)

        def omit_run(out: Path) -> Path:
            return write_seg_object(
                out / "seg.dcm", source=source, volume=volume, organ_masks=masks, findings=reported, omit_empty_frames=True
            )

        def peer_run(out: Path) -> int:
            return peer_seg(source, stacked, out / "seg.dcm")

        writers: dict[str, Any] = {"ours": ours_run, "omit": omit_run, "peer": peer_run}
        for name, fn in writers.items():  # each writer warmed up once
            (tmpdir / f"{name}_warm").mkdir()
            fn(tmpdir / f"{name}_warm")
        times: dict[str, list[float]] = {name: [] for name in writers}
        last: dict[str, Any] = {}
        for r in range(repeats):  # the writers take turns, so that the machine's other load hits them alike
            for name, fn in writers.items():
                out = tmpdir / f"{name}{r}"
                out.mkdir()
                last[name], t = timed(fn, out)
                times[name].append(t)
        ours, omit, peer = times["ours"], times["omit"], times["peer"]
        paths: dict[str, Path] = last["ours"]
        peer_frames = int(last["peer"])
        sizes = {
            "sr": paths["sr"].stat().st_size,
            "seg": paths["seg"].stat().st_size,
            "seg_omit": (tmpdir / "omit0" / "seg.dcm").stat().st_size,
            "peer": (tmpdir / "peer0" / "seg.dcm").stat().st_size,
        }
    results.update(
        {
            "read_sources_s": statistics.median(read_times),
            "ctpipe_sr_seg_s": statistics.median(ours),
            "ctpipe_seg_omit_empty_s": statistics.median(omit),
            "peer_seg_s": statistics.median(peer),
            "peer_frames": peer_frames,
            "file_bytes": sizes,
        }
    )
    results["ratio_peer_vs_ctpipe_sr_seg"] = results["peer_seg_s"] / results["ctpipe_sr_seg_s"]
    results["ratio_peer_vs_ctpipe_seg_omit"] = results["peer_seg_s"] / results["ctpipe_seg_omit_empty_s"]
    results["meets_target"] = results["ctpipe_sr_seg_s"] < results["target_s"]
    print(f"read_source_series:               {results['read_sources_s']:6.2f} s")
    print(
        f"ctpipe SR + SEG (all frames):     {results['ctpipe_sr_seg_s']:6.2f} s  (target < 2 s: "
        f"{'met' if results['meets_target'] else 'NOT met'}; SR {sizes['sr'] / 1e3:.0f} kB, SEG {sizes['seg'] / 1e6:.1f} MB)"
    )
    print(f"ctpipe SEG (empty frames omitted): {results['ctpipe_seg_omit_empty_s']:6.2f} s  ({sizes['seg_omit'] / 1e6:.1f} MB)")
    print(f"peer: {PEER}")
    print(f"peer SEG ({peer_frames} frames):       {results['peer_seg_s']:6.2f} s  ({sizes['peer'] / 1e6:.1f} MB)")
    print(
        f"ratio peer s / ctpipe s (> 1: ctpipe faster): {results['ratio_peer_vs_ctpipe_sr_seg']:.1f}x (vs SR + SEG), "
        f"{results['ratio_peer_vs_ctpipe_seg_omit']:.1f}x (vs the SEG with the same frames)"
    )
    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1).encode())
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
