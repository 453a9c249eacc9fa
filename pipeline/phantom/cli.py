"""``ctpipe phantom``: write synthetic chest-CT phantom cases (DICOM series + ground truth)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_TRANSFER_SYNTAXES = ("explicit_le", "rle", "jpeg2000")
_QUIRKS = ("shuffled_names", "reversed_order", "gantry_tilt", "missing_slice", "duplicate_slice", "localizer", "second_series")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``phantom`` sub-command."""
    p = subparsers.add_parser(
        "phantom",
        help="write synthetic chest CT phantom cases (DICOM + ground truth)",
        description=(
            "Write COUNT phantom cases with seeds SEED, SEED+1, ... into OUT_DIR/phantom_<seed>/: "
            "the DICOM series in dicom/, ground_truth.json (nodule centres in LPS mm, diameters, types) and masks.npz."
        ),
    )
    p.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="folder that receives one sub-folder per case")
    p.add_argument("--seed", type=int, required=True, help="seed of the first case (cases are deterministic)")
    p.add_argument("--count", type=int, default=1, help="number of cases (default 1)")
    p.add_argument("--matrix", type=int, default=256, help="rows = columns per slice (default 256)")
    p.add_argument("--pixel-spacing", type=float, default=0.7, help="in-plane spacing in mm (default 0.7)")
    p.add_argument("--slice-spacing", type=float, default=1.25, help="distance between slices in mm (default 1.25)")
    p.add_argument("--slice-thickness", type=float, default=None, help="reconstructed slice thickness in mm")
    p.add_argument("--slices", type=int, default=None, help="number of slices (default: whole chest)")
    p.add_argument("--nodules", type=int, default=None, help="nodules per case (default: random 0-6)")
    p.add_argument("--nodule-diameter", type=float, nargs=2, default=(3.0, 30.0), metavar=("MIN", "MAX"),
                   help="range of nodule diameters in mm (default 3 30)")
    p.add_argument("--noise-hu", type=float, default=20.0, help="image noise standard deviation in HU (default 20)")
    p.add_argument("--patient-position", default="HFS", help="DICOM PatientPosition (default HFS)")
    p.add_argument("--transfer-syntax", choices=_TRANSFER_SYNTAXES, default="explicit_le", help="default explicit_le")
    p.add_argument("--unsigned", action="store_true", help="store uint16 with RescaleIntercept -1024")
    p.add_argument("--quirk", dest="quirks", action="append", choices=_QUIRKS, default=[], metavar="QUIRK",
                   help=f"add a quirk (repeatable): {', '.join(_QUIRKS)}")
    p.add_argument("--enhanced", action="store_true", help="one Enhanced CT multi-frame file instead of one file per slice")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate and write the cases; print where each went. A failing case is reported and the others go on."""
    from ..errors import CtpipeError, DicomWriteError
    from . import generate_phantom
    from .dicom_writer import write_phantom_case

    if args.count < 1:
        raise DicomWriteError(f"--count must be at least 1, got {args.count}", where="ctpipe phantom", fix="pass --count 1 or more")
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        case_dir = args.out_dir / f"phantom_{seed:05d}"
        try:
            phantom = generate_phantom(
                seed,
                matrix=args.matrix,
                pixel_spacing=args.pixel_spacing,
                slice_spacing=args.slice_spacing,
                slice_thickness=args.slice_thickness,
                slices=args.slices,
                n_nodules=args.nodules,
                nodule_diameter_mm=tuple(args.nodule_diameter),
                noise_hu=args.noise_hu,
                patient_position=args.patient_position,
            )
            case = write_phantom_case(
                phantom,
                case_dir,
                transfer_syntax=args.transfer_syntax,
                unsigned=args.unsigned,
                quirks=args.quirks,
                enhanced=args.enhanced,
            )
        except CtpipeError as exc:
            failed += 1
            print(f"ctpipe phantom: case seed {seed} failed: {exc}", file=sys.stderr)
            continue
        n_files = sum(1 for p in (case / "dicom").rglob("*") if p.is_file())
        print(
            f"{case}: {n_files} DICOM files in {case / 'dicom'}, shape {phantom.volume.shape} [k,j,i], "
            f"{len(phantom.nodules)} nodules, ground truth {case / 'ground_truth.json'}"
        )
    return 1 if failed else 0
