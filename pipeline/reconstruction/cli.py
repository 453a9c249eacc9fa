"""``ctpipe reconstruct``: organ masks, meshes, measurements and renderings of one CT series.

The loaders and the reconstruction stage (numpy, torch, pydicom) are imported inside the
command's functions, so ``ctpipe --help`` starts without them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import CtpipeError
from .organs import ORGANS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``reconstruct`` sub-command."""
    p = subparsers.add_parser(
        "reconstruct",
        help="segment, mesh and measure chest organs (STL/PLY/OBJ/GLB + PNG renderings)",
        description=(
            "Reconstruct the body, lungs (left/right), airways and bone of SRC: a DICOM folder, or a case-cache entry "
            "(<case>.json or <case>.npy written by `ctpipe ingest`). Writes <stem>_<organ>.<format> meshes in DICOM "
            "patient coordinates (LPS, mm), <stem>_measurements.json, <stem>_labels.npz and PNG renderings into --out."
        ),
    )
    p.add_argument("src", metavar="SRC", type=Path, help="DICOM folder or case-cache .json/.npy file")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--formats", default="stl", help="comma-separated mesh formats: stl,ply,obj,glb (default stl)")
    p.add_argument("--organs", default=",".join(ORGANS), help=f"comma-separated organs (default {','.join(ORGANS)})")
    p.add_argument("--seg-bundle", type=Path, default=None, help="MONAI segmentation bundle folder (optional)")
    p.add_argument("--findings", type=Path, default=None,
                   help="findings JSON (from `ctpipe detect`: a list, or an object with 'findings') to segment nodules")
    p.add_argument("--smoothing", type=int, default=20, help="Taubin smoothing iterations (default 20, 0 = none)")
    p.add_argument("--target-triangles", type=int, default=None, help="at most this many triangles per organ")
    p.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--no-render", action="store_true", help="skip the PNG renderings")
    p.add_argument("--series-uid", default=None, help="series to load when the DICOM folder holds several")
    p.set_defaults(func=run)


def _load(src: Path, series_uid: str | None) -> tuple[Any, str]:
    from ..cache import CaseCache

    if src.is_file() and src.suffix in (".json", ".npy"):
        return CaseCache(src.parent).read(src.stem), src.stem
    if src.is_dir():
        from ..ingest import load_series

        vol = load_series(src, series_uid=series_uid)
        return vol, (vol.series_uid or src.name)
    raise CtpipeError("is neither a DICOM folder nor a case-cache .json/.npy file", where=src,
                      fix="pass a folder of DICOM files or a file written by `ctpipe ingest`")


def _findings(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CtpipeError(f"cannot read findings ({exc})", where=path, fix="pass the JSON written by `ctpipe detect`") from exc
    items = data.get("findings", []) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise CtpipeError("findings must be a list of objects with box_min_lps/box_max_lps", where=path)
    return items


def run(args: argparse.Namespace) -> int:
    from .stage import reconstruct

    formats = [f for f in args.formats.split(",") if f]
    organs = [o for o in args.organs.split(",") if o]
    volume, stem = _load(args.src, args.series_uid)
    findings = _findings(args.findings) if args.findings else None
    if args.target_triangles is not None and args.target_triangles < 100:
        raise CtpipeError(f"--target-triangles {args.target_triangles} is too small", where="--target-triangles",
                          fix="use at least 100 triangles per organ")
    rec = reconstruct(volume, organs=organs, findings=findings, out_dir=args.out, mesh_formats=formats,
                      smoothing=args.smoothing, target_triangles=args.target_triangles, device=args.device,
                      seg_bundle=args.seg_bundle, render=not args.no_render, stem=stem)
    organ_meas = rec.measurements.get("organs", {})
    for organ, m in organ_meas.items():
        mesh = rec.meshes.get(organ)
        tri = f"{mesh.n_triangles} triangles" if mesh else "no mesh"
        print(f"{organ:12s} {m['volume_ml']:10.1f} mL  {tri}")
    lungs = rec.measurements.get("lungs")
    if lungs and lungs.get("lungs_total_volume_ml"):
        print(f"lungs total {lungs['lungs_total_volume_ml']:.1f} mL, emphysema index {lungs['emphysema_index_pct']:.2f} % "
              f"(< {lungs['emphysema_threshold_hu']:.0f} HU)")
    for what, msg in rec.errors.items():
        print(f"ctpipe reconstruct: {what}: {msg}", file=sys.stderr)
    n_files = sum(len(v) for v in rec.files.values())
    print(f"wrote {n_files} files to {args.out}")
    return 0 if rec.meshes else 1
