"""``ctpipe phantom``: write synthetic chest-CT phantom cases (DICOM series + ground truth)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..argtypes import any_case, number_in, out_path

if TYPE_CHECKING:
    from ..errors import CtpipeError, UsageError

_TRANSFER_SYNTAXES = ("explicit_le", "rle", "jpeg2000")
_MAX_SLICES = 1024  # pipeline.phantom.generate.MAX_SLICES (not imported: `ctpipe --help` stays fast)
_QUIRKS = ("shuffled_names", "reversed_order", "gantry_tilt", "missing_slice", "duplicate_slice", "localizer", "second_series")
#: the seeds a case can have: numpy's random generators take no negative seed, and 10 digits keep the DICOM
#: identifiers made from it (PatientID, AccessionNumber) within their lengths
_SEED_MAX = 2**32 - 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``phantom`` sub-command."""
    from .confounders import CONFOUNDER_SCENARIOS, SCENARIO_SEEDS
    from .scanner import PATIENT_POSITIONS

    p = subparsers.add_parser(
        "phantom",
        help="write synthetic chest CT phantom cases (DICOM + ground truth)",
        description=(
            "Write COUNT phantom cases with seeds SEED, SEED+1, ... into OUT_DIR/phantom_NNNNN/ (the seed padded with "
            "zeros to five digits: --seed 7 writes OUT_DIR/phantom_00007/): "
            "the DICOM series in dicom/, ground_truth.json (nodule centres in LPS mm, diameters, types) and masks.npz. "
            "--scenario or --realistic add the confounders of real scans (table, arms, contrast, bowel gas, partial "
            "coverage, small field of view, lung disease, kernel, thick slices, metal) with their ground truth. "
            "A case written there before (same seed) is replaced, its DICOM files removed first. Exit status 0 "
            "every case written, 1 a case that could not be written (the others are), 2 bad arguments (a value out of "
            "its range, options that do not go together, such as --seed-offset with --seed)."
        ),
    )
    p.add_argument("out_dir", metavar="OUT_DIR", type=out_path, help="folder that receives one sub-folder per case")
    p.add_argument(
        "--seed",
        type=number_in(int, 0, _SEED_MAX),
        default=None,
        help=f"seed of the first case, 0..{_SEED_MAX} (cases are deterministic); required unless --scenario is given",
    )
    p.add_argument("--count", type=number_in(int, 1), default=1, help="number of cases (default 1)")
    # the ranges generate_phantom accepts, refused here once (exit status 2) rather than once per case
    p.add_argument(
        "--matrix", type=number_in(int, 64, 1024), default=256, help="rows = columns per slice, 64..1024 (default 256)"
    )
    p.add_argument(
        "--pixel-spacing", type=number_in(float, 0.3, 2.0), default=0.7, help="in-plane spacing in mm, 0.3..2 (default 0.7)"
    )
    p.add_argument(
        "--slice-spacing",
        type=number_in(float, 0.3, 10.0),
        default=1.25,
        help="distance between slices in mm, 0.3..10 (default 1.25)",
    )
    p.add_argument(
        "--slice-thickness",
        type=number_in(float, 0.3, 10.0),
        default=None,
        help="reconstructed slice thickness in mm, 0.3..10 (default: the slice spacing)",
    )
    p.add_argument(
        "--slices",
        type=number_in(int, 8, _MAX_SLICES),
        default=None,
        help=f"number of slices, 8..{_MAX_SLICES} (default: whole chest)",
    )
    p.add_argument("--nodules", type=number_in(int, 0, 20), default=None, help="nodules per case, 0..20 (default: random 0-6)")
    p.add_argument(
        "--nodule-diameter",
        type=number_in(float, 1.0, 60.0),
        nargs=2,
        default=(3.0, 30.0),
        metavar=("MIN", "MAX"),
        help="range of nodule diameters in mm, each 1..60 (default 3 30)",
    )
    p.add_argument(
        "--noise-hu",
        type=number_in(float, 0.0, 500.0),
        default=20.0,
        help="image noise standard deviation in HU, 0..500 (default 20)",
    )
    p.add_argument(
        "--patient-position",
        default=None,
        type=any_case(PATIENT_POSITIONS),
        choices=PATIENT_POSITIONS,
        help="DICOM PatientPosition (default HFS, or the scenario's; given, it overrides the scenario's)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--scenario",
        type=any_case([*CONFOUNDER_SCENARIOS, "all"]),
        choices=[*CONFOUNDER_SCENARIOS, "all"],
        default=None,
        metavar="NAME",
        help=f"confounders (and patient position) of a named scenario: {', '.join(CONFOUNDER_SCENARIOS)}; "
        f"without --seed, the scenario's held-out seed ({SCENARIO_SEEDS[0]}-{SCENARIO_SEEDS[-1]}); "
        "'all' writes every scenario with its own seed",
    )
    group.add_argument(
        "--realistic", action="store_true", help="each case gets a realistic random mix of confounders drawn from its seed"
    )
    p.add_argument(
        "--fine-vessels",
        action="store_true",
        help="with --scenario or --realistic: add the lungs' sub-voxel peripheral vessels (faint dots of about "
        "-700..-150 HU, as on real CT; the detector's training phantoms have them)",
    )
    p.add_argument(
        "--bronchovascular",
        action="store_true",
        help="with --scenario or --realistic: add the bronchi beside the lung arteries (the hilum's bronchovascular "
        "bundles; the detector's training phantoms have them)",
    )
    p.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="with --scenario and no --seed: move the scenarios' seeds by this much "
        f"(2000: the same scenarios as new held-out cases, seeds 7000-7031; at least -{SCENARIO_SEEDS[0]}; default 0)",
    )
    p.add_argument(
        "--transfer-syntax",
        type=any_case(_TRANSFER_SYNTAXES),
        choices=_TRANSFER_SYNTAXES,
        default="explicit_le",
        help="how the DICOM files store their pixels: explicit_le (uncompressed explicit VR little endian), rle (RLE "
        "Lossless) or jpeg2000 (JPEG 2000 Lossless); default explicit_le",
    )
    p.add_argument("--unsigned", action="store_true", help="store uint16 with RescaleIntercept -1024")
    p.add_argument(
        "--quirk",
        dest="quirks",
        action="append",
        type=any_case(_QUIRKS),
        choices=_QUIRKS,
        default=[],
        metavar="QUIRK",
        help=f"add a quirk (repeatable): {', '.join(_QUIRKS)}",
    )
    p.add_argument(
        "--enhanced",
        action="store_true",
        help="one Enhanced CT multi-frame file instead of one file per slice (with the quirks shuffled_names, localizer and "
        "second_series only)",
    )
    p.set_defaults(func=run)


def _cases(args: argparse.Namespace) -> list[tuple[int, Any, str, str | None]]:
    """(seed, confounders or None, patient position, scenario name or None) of each case to write."""
    from ..errors import UsageError
    from .confounders import realistic_confounders, scenarios_at

    if args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}", fix="pass --count 1 or more")
    lo, hi = args.nodule_diameter
    if lo > hi:
        raise UsageError(
            f"--nodule-diameter {lo:g} {hi:g}: the minimum is larger than the maximum",
            fix=f"give MIN then MAX, e.g. --nodule-diameter {hi:g} {lo:g}",
        )
    position = args.patient_position
    scenarios = scenarios_at(args.seed_offset)
    if args.seed_offset and (args.scenario is None or args.seed is not None):
        raise UsageError(
            "--seed-offset moves the scenarios' own seeds",
            fix="use it with --scenario and without --seed",
        )
    if args.scenario == "all":
        if args.seed is not None or args.count != 1:
            raise UsageError(
                "--scenario all uses each scenario's own seed",
                where="--seed/--count",
                fix="drop --seed and --count, or name one scenario",
            )
        _check_seeds(args, [sc.seed for sc in scenarios.values()])
        return [(sc.seed, sc.confounders, position or sc.patient_position, name) for name, sc in scenarios.items()]
    if args.scenario is not None:
        sc = scenarios[args.scenario]
        if args.seed is None and args.count != 1:
            raise UsageError("--count needs --seed with a scenario", fix="pass --seed too")
        _check_seeds(args, [sc.seed])
        seeds = [sc.seed] if args.seed is None else list(range(args.seed, args.seed + args.count))
        return [(seed, sc.confounders, position or sc.patient_position, args.scenario) for seed in seeds]
    if args.seed is None:
        raise UsageError("--seed is required without --scenario", fix="pass --seed N")
    _check_seeds(args, [])
    seeds = list(range(args.seed, args.seed + args.count))
    return [(seed, realistic_confounders(seed) if args.realistic else None, position or "HFS", None) for seed in seeds]


def _no_lungs(args: argparse.Namespace, scenario: str | None) -> UsageError:
    """The error of --nodules for a case whose scan holds no lung (coverage ``abdomen_only``): of ``scenario``, or of
    the realistic confounders drawn for it (None)."""
    from ..errors import UsageError

    what = f"scenario {scenario} puts" if scenario else "the realistic confounders drawn for this case put"
    return UsageError(
        f"--nodules {args.nodules}: {what} no lung in the scan",
        fix="leave --nodules out, or choose a --scenario with lungs"
        if scenario
        else "leave --nodules out (a case without lungs then gets none)",
    )


def _check_lungs_for_nodules(args: argparse.Namespace, cases: list[tuple[int, Any, str, str | None]]) -> None:
    """Refuse --nodules with one named scenario whose scan holds no lung (``abdomen_only``), before its case is made
    (with --scenario all or --realistic such a case fails alone, the others are written)."""
    if args.nodules and args.scenario not in (None, "all") and not cases[0][1].has_lungs:
        raise _no_lungs(args, args.scenario)


#: generate_phantom's arguments as ctpipe phantom's flags, for the error of a case that failed
_FLAG_OF = {
    "n_nodules": "--nodules",
    "nodule_diameter_mm": "--nodule-diameter",
    "matrix": "--matrix",
    "pixel_spacing": "--pixel-spacing",
    "slice_spacing": "--slice-spacing",
    "slice_thickness": "--slice-thickness",
    "slices": "--slices",
    "noise_hu": "--noise-hu",
    "patient_position": "--patient-position",
    "confounders": "--scenario/--realistic",
}


def _in_flags(exc: CtpipeError, args: argparse.Namespace) -> str:
    """The error ``exc`` of :func:`~pipeline.phantom.generate_phantom` in the command's words: its ``where``
    (``generate_phantom(nodule_diameter_mm=...)``) as the flags with their values (``--nodule-diameter 20 30``), and
    the arguments its text names (``pixel_spacing``) as their flags."""
    from ..errors import CtpipeError

    call = re.fullmatch(r"generate_phantom\((.*)\)", exc.where or "")
    if call is None:  # a case folder or file that could not be written: named as it is
        return str(exc)
    values = {"--nodules": args.nodules, "--matrix": args.matrix, "--slices": args.slices, "--noise-hu": args.noise_hu}
    values["--nodule-diameter"] = " ".join(f"{d:g}" for d in args.nodule_diameter)
    values.update({"--pixel-spacing": args.pixel_spacing, "--slice-spacing": args.slice_spacing})
    flags = [_FLAG_OF.get(name.split("=")[0].strip(), name) for name in call.group(1).split(",")]
    where = ", ".join(f"{f} {values[f]}" if values.get(f) is not None else f for f in flags)

    def words(text: str | None) -> str | None:  # 'larger matrix or pixel_spacing' -> 'larger --matrix or --pixel-spacing'
        if text is None:
            return None
        return re.sub(r"\b(matrix|[a-z]+_[a-z_]+)\b", lambda m: _FLAG_OF.get(m.group(1), m.group(1)), text)

    return str(CtpipeError(words(exc.problem) or "", where=where, fix=words(exc.fix)))


def _check_enhanced_quirks(args: argparse.Namespace) -> None:
    """Refuse, before any case is generated, --quirk values that one --enhanced multi-frame file cannot hold (the
    writer would refuse each case in turn, after generating it)."""
    from ..errors import UsageError
    from .dicom_quirks import ENHANCED_QUIRKS

    bad = [q for q in args.quirks or () if q not in ENHANCED_QUIRKS]
    if args.enhanced and bad:
        raise UsageError(
            f"--quirk {', '.join(bad)} cannot be written into the one multi-frame file of --enhanced",
            fix=f"with --enhanced use only --quirk {', '.join(ENHANCED_QUIRKS)}, or drop --enhanced",
        )


def _check_seeds(args: argparse.Namespace, scenario_seeds: list[int]) -> None:
    """Refuse cases whose seeds would leave 0.._SEED_MAX (numpy takes no negative seed): with --seed, the last one,
    --seed + --count - 1 (argparse keeps --seed itself in range); without, the scenarios' ``scenario_seeds``, moved by
    --seed-offset."""
    from ..errors import UsageError

    if args.seed is not None:
        last = args.seed + args.count - 1
        if last > _SEED_MAX:
            raise UsageError(
                f"--seed {args.seed} --count {args.count} runs up to seed {last}, above the largest seed {_SEED_MAX}",
                fix=f"pass --count {_SEED_MAX - args.seed + 1} or less, or a smaller --seed",
            )
        return
    lo, hi = min(scenario_seeds), max(scenario_seeds)
    if lo < 0 or hi > _SEED_MAX:
        raise UsageError(
            f"--seed-offset {args.seed_offset} moves the scenario seeds to {lo}..{hi}, outside 0..{_SEED_MAX}",
            fix=f"use a --seed-offset of {args.seed_offset - lo} or more"
            if lo < 0
            else f"use a --seed-offset of {args.seed_offset - (hi - _SEED_MAX)} or less",
        )


def _clear_earlier_case(case_dir: Path) -> bool:
    """Remove the DICOM files of the phantom case written into ``case_dir`` before (True), so that no file of its
    series stays beside the new one's; False when there is none. A folder that holds other files is refused."""
    from ..errors import PhantomError

    if not case_dir.is_dir() or not any(case_dir.iterdir()):
        return False
    try:
        earlier = json.loads((case_dir / "ground_truth.json").read_text())
    except (OSError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and "series_uid" in earlier):
        raise PhantomError(
            "the case folder already holds files, and no phantom ground_truth.json",
            where=case_dir,
            fix="choose another OUT_DIR, or move those files away",
        )
    if (case_dir / "dicom").is_dir():
        shutil.rmtree(case_dir / "dicom")
    return True


def run(args: argparse.Namespace) -> int:
    """Generate and write the cases; print where each went. A failing case is reported and the others go on."""
    from ..atomic import ensure_dir
    from ..errors import CtpipeError, UsageError
    from . import generate_phantom
    from .dicom_writer import write_phantom_case

    failed = 0
    _check_enhanced_quirks(args)
    cases = _cases(args)
    _check_lungs_for_nodules(args, cases)
    extra = {name: True for name in ("fine_vessels", "bronchovascular") if getattr(args, name)}
    if extra:
        if any(conf is None for _, conf, _, _ in cases):
            flags = " ".join("--" + name.replace("_", "-") for name in extra)
            raise UsageError(
                f"{flags} adds to the confounders of real scans, and a plain phantom has none",
                fix="add --realistic or --scenario NAME",
            )
        cases = [(seed, replace(conf, **extra), position, sc) for seed, conf, position, sc in cases]
    ensure_dir(args.out_dir, what="OUT_DIR")  # a file there, or in its way, is said before any case is generated
    for seed, confounders, position, scenario in cases:
        case_dir = args.out_dir / f"phantom_{seed:05d}"
        if args.nodules and confounders is not None and not confounders.has_lungs:
            failed += 1
            print(f"ctpipe phantom: case seed {seed} failed: {_no_lungs(args, scenario)}", file=sys.stderr)
            continue
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
                patient_position=position,
                confounders=confounders,
            )
            if scenario is not None:
                phantom.truth["scenario"] = scenario
            replaced = _clear_earlier_case(case_dir)
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
            print(f"ctpipe phantom: case seed {seed} failed: {_in_flags(exc, args)}", file=sys.stderr)
            continue
        n_files = sum(1 for p in (case / "dicom").rglob("*") if p.is_file())
        what = f"scenario {scenario}, " if scenario else ("realistic confounders, " if confounders is not None else "")
        print(
            f"{case}: {'replaced the earlier case: ' if replaced else ''}{n_files} DICOM files in {case / 'dicom'}, shape {phantom.volume.shape} [k,j,i], "
            f"{what}{len(phantom.nodules)} nodules, ground truth {case / 'ground_truth.json'}"
        )
    return 1 if failed else 0
