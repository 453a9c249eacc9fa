"""``ctpipe detect`` and ``ctpipe evaluate``.

    ctpipe detect SRC --out DIR [--bundle PATH] [--no-lung-crop] [--device cpu|cuda] [--fp32] [--raw] [--no-png]
    ctpipe evaluate --pred PATH [PATH ...] --truth PATH [PATH ...] --out DIR [--bootstrap 1000]

SRC is a DICOM folder (or an Enhanced CT file), a case-cache entry (``cache/<id>.npy`` or
``.json``), or an image file SimpleITK reads (``.nii.gz``, ``.mha``, ``.nrrd``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("detect", help="find lung nodules in a CT series (findings JSON, CSV, PNGs)")
    p.add_argument("src", type=Path, help="DICOM folder/file, case-cache entry (.npy/.json) or NIfTI/MHA/NRRD image")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--bundle", type=Path, default=None, help="MONAI detection bundle folder (default: the embedded demo model)")
    p.add_argument("--no-lung-crop", action="store_true", help="search the whole volume, not only the lungs")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--fp32", action="store_true",
                   help="run the network in float32 (default: mixed precision where the hardware runs it natively)")
    p.add_argument("--raw", action="store_true",
                   help="the network's boxes as MONAI returns them: no centre refinement, no re-scoring "
                        "(default: refined, and re-scored by the model's false-positive reduction stage if it has one)")
    p.add_argument("--case-id", default=None, help="name of the output files (default: from the source)")
    p.add_argument("--no-png", action="store_true", help="skip the per-finding PNGs")
    p.add_argument("--max-png", type=int, default=20, help="PNGs for at most this many top findings")
    p.set_defaults(func=_detect)

    e = subparsers.add_parser("evaluate", help="LUNA16 FROC/CPM of findings against ground truth")
    e.add_argument("--pred", nargs="+", required=True, type=Path, help="findings JSONs/folders or a LUNA16 candidates CSV")
    e.add_argument("--truth", nargs="+", required=True, type=Path, help="phantom ground_truth.json files/folders or a LUNA16 annotations CSV")
    e.add_argument("--out", type=Path, required=True, help="folder for froc.json, froc.csv, froc.png")
    e.add_argument("--bootstrap", type=int, default=1000, help="bootstrap samples for the 95%% intervals")
    e.add_argument("--min-diameter", type=float, default=3.0, help="smaller reference nodules are irrelevant findings (mm)")
    e.add_argument("--seed", type=int, default=0)
    e.set_defaults(func=_evaluate)


def _read_source(src: Path):
    from ..errors import CtpipeError

    if src.suffix in (".npy", ".json") and src.is_file():
        from ..cache import CaseCache

        return CaseCache(src.parent).read(src.stem, mmap=True), src.stem
    name = src.name
    for ext in (".nii.gz", ".nii", ".mha", ".mhd", ".nrrd"):
        if name.endswith(ext) and src.is_file():
            import SimpleITK as sitk

            from ..volume import CTVolume

            try:
                img = sitk.ReadImage(str(src))
            except RuntimeError as exc:
                raise CtpipeError(f"image cannot be read ({str(exc).splitlines()[0]})", where=src) from exc
            return CTVolume.from_sitk(img, metadata={"SeriesInstanceUID": name[: -len(ext)]}), name[: -len(ext)]
    from ..ingest import load_series

    vol = load_series(src)
    return vol, (vol.series_uid or src.name)


def _detect(args: argparse.Namespace) -> int:
    from .figures import write_finding_pngs
    from .infer import Detector

    volume, case_id = _read_source(args.src)
    case_id = args.case_id or re.sub(r"[^A-Za-z0-9._-]", "_", str(case_id))
    det = Detector(bundle=args.bundle, device=args.device, amp=not args.fp32, restrict_to_lungs=not args.no_lung_crop,
                   postprocess=not args.raw)
    findings = det.detect(volume, case_id=case_id)
    out: Path = args.out
    j = findings.write_json(out / f"{case_id}.findings.json")
    c = findings.write_csv(out / f"{case_id}.findings.csv")
    pngs = [] if args.no_png else write_finding_pngs(volume, findings, out / f"{case_id}_png", max_findings=args.max_png)
    print(f"{case_id}: {len(findings)} findings ({det.config.name}, {findings.device}, "
          f"{findings.timings_ms.get('total', 0):.0f} ms){' — ' + findings.reason if findings.reason else ''}")
    for rank, f in enumerate(findings.findings[:10], 1):
        x, y, z = f.center_lps
        print(f"  #{rank:<3d} score {f.score:.3f}  {f.diameter_mm:5.1f} mm  LPS ({x:7.1f}, {y:7.1f}, {z:7.1f})  slice {f.slice_number}")
    print(f"wrote {j}, {c}" + (f" and {len(pngs)} PNGs in {out / (case_id + '_png')}" if pngs else ""))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_froc
    from .evaluate_io import load_predictions, load_truth

    truth = load_truth(args.truth)
    preds = load_predictions(args.pred)
    result = evaluate_froc(preds, truth, scans=sorted(truth), min_diameter_mm=args.min_diameter,
                           n_bootstrap=args.bootstrap, seed=args.seed)
    paths = result.write(args.out)
    print(result.table())
    print(f"wrote {paths['json']}, {paths['csv']}, {paths['png']}")
    return 0
