"""``ctpipe detect`` and ``ctpipe evaluate``.

    ctpipe detect SRC --out DIR [--bundle PATH] [--no-lung-crop] [--device auto|cpu|cuda] [--fp32] [--raw] [--no-png]
                  [--score-threshold P | --all-candidates] [--dicom none|sr | --no-dicom]
                  [--case-id NAME] [--keep-identifiers]
    ctpipe evaluate --pred PATH [PATH ...] --truth PATH [PATH ...] --out DIR [--bootstrap 1000]
                    [--scans seriesuids.csv] [--irrelevant annotations_excluded.csv] [--reading interpolate|step]
                    [--max-marks 100] [--at-score P ...]

SRC is a DICOM folder (or an Enhanced CT file), a case-cache entry (``cache/<id>.npy`` or
``.json``), or an image file SimpleITK reads (``.nii.gz``, ``.mha``, ``.nrrd``).

``detect`` reports the findings scoring at or above the model's operating point (or
``--score-threshold``; every candidate with ``--all-candidates``): they fill the CSV and the
PNGs; the findings JSON holds them and every other candidate (``below_threshold``), with the
threshold used and where it came from. With a DICOM source (a DICOM folder or file, or a cache
entry ingested from one), ``detect`` also writes ``<case>_sr.dcm``, a TID 1500 structured report of
the reported findings (LPS mm, in the source's frame of reference), after the other files, so a
failure to write it loses none of them (exit status 1); each finding's lung side there comes from the
reconstruction's lung segmentation, as in ``ctpipe run``'s SR. Detection makes no masks: no SEG
(``ctpipe reconstruct --findings`` writes one). ``evaluate`` scores the full candidate lists.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from ..argtypes import add_keep_identifiers, any_case, device_name, in_path, number_in, out_path
from ..devices import allowed_devices
from ..dicom_out.kinds import add_dicom_options
from .evaluate import READINGS

log = logging.getLogger(__name__)


class _QualityFlagsPrinted(logging.Filter):
    """Drops the detector's log records of quality flags (``extra={"quality_flag": code}``), which ``ctpipe detect``
    prints itself under its summary line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "quality_flag")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "detect",
        help="find lung nodules in a CT series (findings JSON, CSV, PNGs, DICOM SR)",
        description="Find lung nodules in one CT series and write into --out <case>.findings.json (every candidate, "
        "with the threshold used), <case>.findings.csv and <case>_png/finding_NNN.png (the findings at or above the "
        "model's operating point, or --score-threshold), and <case>_sr.dcm (a TID 1500 DICOM SR, for a DICOM source, "
        "each finding with its lung side from the lung segmentation of ctpipe reconstruct and ctpipe run); "
        "positions in DICOM patient coordinates (LPS, mm), slices by InstanceNumber. Exit status 0 done, 1 an unreadable "
        "source or model, a GPU torch does not see, or a file that could not be written, 2 bad "
        "arguments (an unknown option, a value not allowed: out of its range, an unknown --device, a --case-id "
        "that is not a plain file name).",
    )
    p.add_argument(
        "src", metavar="SRC", type=in_path, help="DICOM folder/file, case-cache entry (.npy/.json) or NIfTI/MHA/NRRD image"
    )
    p.add_argument("--out", type=out_path, required=True, help="output folder")
    p.add_argument(
        "--bundle",
        type=Path,
        default=None,
        metavar="PATH",
        help="MONAI detection bundle folder (default: the embedded demo model)",
    )
    p.add_argument("--no-lung-crop", action="store_true", help="search the whole volume, not only the lungs")
    p.add_argument(
        "--device",
        type=device_name,
        default=None,
        metavar="DEV",
        help=f"{allowed_devices()} (default auto)",
    )
    p.add_argument(
        "--fp32",
        action="store_true",
        help="run the network in float32 (default: mixed precision where the hardware runs it natively)",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="the network's boxes as MONAI returns them: no centre refinement, no re-scoring "
        "(default: refined, and re-scored by the model's false-positive reduction stage if it has one)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--score-threshold",
        type=number_in(float, 0.0, 1.0),
        default=None,
        metavar="P",
        help="report findings scoring at or above P (0..1; default: the model's operating point)",
    )
    which.add_argument(
        "--all-candidates", action="store_true", help="report every candidate the detector keeps, whatever its score"
    )
    p.add_argument("--series-uid", default=None, help="series to load when the DICOM folder holds several")
    p.add_argument(
        "--allow-gantry-tilt",
        action="store_true",
        help="resample a tilted-gantry DICOM series onto an orthogonal grid instead of rejecting it (as ctpipe ingest)",
    )
    p.add_argument(
        "--case-id",
        default=None,
        help="name of the output files, and of the series in the findings for an image file (default: from the source: "
        "the series UID, the cache entry's name, or for an image file image-<12 hex digits>, a digest of the image: its "
        "file's name, which may be a patient's, only with --keep-identifiers)",
    )
    p.add_argument("--no-png", action="store_true", help="skip the per-finding PNGs")
    p.add_argument("--max-png", type=number_in(int, 0), default=20, help="PNGs for at most this many top findings (default 20)")
    add_dicom_options(p, default="sr")
    add_keep_identifiers(p)
    p.set_defaults(func=_detect)

    e = subparsers.add_parser(
        "evaluate",
        help="LUNA16 FROC/CPM of findings against ground truth",
        description="LUNA16 FROC/CPM of findings against ground truth. Positions are world coordinates in mm, LPS "
        "(x to the patient's left, y posterior, z superior), as ctpipe's findings and ground truth and as LUNA16's "
        "CSVs (coordX, coordY, coordZ: the world coordinates of the .mhd scans, which ITK gives in LPS); not voxel "
        "indices, not RAS (a warning says so when the candidates look like either). Scans are matched by "
        "SeriesInstanceUID. Exit status 0 written, 1 predictions or ground truth that cannot be read or share no "
        "scan, 2 bad arguments (an unknown option, a value out of its range).",
    )
    e.add_argument(
        "--pred",
        nargs="+",
        required=True,
        type=in_path,
        help="findings JSONs/folders or a LUNA16 candidates CSV (seriesuid,coordX,coordY,coordZ,probability; LPS mm)",
    )
    e.add_argument(
        "--truth",
        nargs="+",
        required=True,
        type=in_path,
        help="phantom ground_truth.json files/folders or a LUNA16 annotations CSV "
        "(seriesuid,coordX,coordY,coordZ,diameter_mm; LPS mm)",
    )
    e.add_argument("--out", type=out_path, required=True, help="folder for froc.json, froc.csv, froc.png and at_score.json")
    e.add_argument(
        "--bootstrap", type=number_in(int, 0), default=1000, help="bootstrap samples for the 95%% intervals (default 1000)"
    )
    e.add_argument(
        "--min-diameter",
        type=number_in(float, 0.0),
        default=3.0,
        help="smaller reference nodules are irrelevant findings (mm, default 3)",
    )
    e.add_argument(
        "--scans",
        type=Path,
        default=None,
        help="CSV of the test set's SeriesInstanceUIDs, as LUNA16's seriesuids.csv (default: every scan "
        "named by the predictions or the truth)",
    )
    e.add_argument(
        "--irrelevant",
        nargs="+",
        type=Path,
        default=None,
        help="irrelevant findings (hits ignored), e.g. LUNA16's annotations_excluded.csv",
    )
    e.add_argument(
        "--reading",
        type=any_case(READINGS),
        choices=READINGS,
        default="interpolate",
        help="sensitivity at each FP rate: linear interpolation of the FROC curve as LUNA16's script "
        "(default), or step: the best operating point at or below the rate",
    )
    e.add_argument(
        "--max-marks",
        type=number_in(int, 1),
        default=None,
        metavar="N",
        help="keep only each scan's N highest-scoring candidates, as LUNA16's script (N=100); default: all",
    )
    e.add_argument(
        "--at-score",
        nargs="+",
        type=number_in(float, 0.0, 1.0),
        default=[],
        metavar="P",
        help="also report the sensitivity, false positives per scan and nodules found by size of the findings scoring at "
        "or above each P (0..1), written to at_score.json (default: the score threshold the findings JSONs were reported at, the "
        "model's operating point, when they share one)",
    )
    e.add_argument(
        "--seed",
        type=number_in(int, 0, 2**32 - 1),
        default=0,
        help="seed of the bootstrap resampling, 0..4294967295 (default 0; the same seed gives the same intervals)",
    )
    e.set_defaults(func=_evaluate)


def _detect(args: argparse.Namespace) -> int:
    """``ctpipe detect``, a patient-named source folder shown and written as its token (as ``ctpipe run``), or as it
    is with ``--keep-identifiers``."""
    from ..runner.redact_sources import redacting_sources

    with redacting_sources([args.src], keep_identifiers=args.keep_identifiers):
        return _detect_source(args)


def _detect_source(args: argparse.Namespace) -> int:
    from ..atomic import check_out_outside_sources, ensure_dir
    from ..ingest.source import image_named, read_source
    from ..load.base import resolve_device

    if args.case_id is not None:
        check_case_id(args.case_id)
    # auto, gpu: the torch device they stand for ("cuda" or "cpu"), as ctpipe run's --device reads them
    device = resolve_device(args.device, where="--device") if args.device is not None else None
    check_out_outside_sources([args.src], args.out, beside="findings")  # else the next scan reads the SR back
    ensure_dir(args.out)
    volume, case_id = read_source(
        args.src,
        series_uid=args.series_uid,
        mmap=True,
        allow_gantry_tilt=args.allow_gantry_tilt,
        keep_identifiers=args.keep_identifiers,
    )
    # an image file's name, which may be a patient's, names the outputs only with --keep-identifiers
    volume, case_id = image_named(volume, case_id, args.src, case_id=args.case_id, keep_identifiers=args.keep_identifiers)
    case_id = args.case_id or re.sub(r"[^A-Za-z0-9._-]", "_", str(case_id))
    # the model's imports take seconds: made once the source is read, so that a refused one (a label map) is said at once
    from .figures import write_finding_pngs
    from .infer import Detector

    det = Detector(
        bundle=args.bundle,
        device=device,
        amp=not args.fp32,
        restrict_to_lungs=not args.no_lung_crop,
        postprocess=not args.raw,
        score_threshold=args.score_threshold,
        all_candidates=args.all_candidates,
    )
    infer_log = logging.getLogger("pipeline.detection.infer")
    printed_below = _QualityFlagsPrinted()  # the quality flags are printed with the findings: not logged twice
    infer_log.addFilter(printed_below)
    try:
        findings = det.detect(volume, case_id=case_id)
    finally:
        infer_log.removeFilter(printed_below)
    out: Path = args.out
    j = findings.write_json(out / f"{case_id}.findings.json")
    c = findings.write_csv(out / f"{case_id}.findings.csv")
    pngs = [] if args.no_png else write_finding_pngs(volume, findings, out / f"{case_id}_png", max_findings=args.max_png)
    thr = "any score" if findings.score_threshold is None else f"score >= {findings.score_threshold:.4g}"
    print(
        f"{case_id}: {len(findings)} findings reported of {len(findings.candidates)} candidates ({thr}; "
        f"{findings.threshold_source}) ({det.config.name}, {findings.device} {findings.precision}, "
        f"{findings.timings_ms.get('total', 0):.0f} ms){' — ' + findings.reason if findings.reason else ''}"
    )
    for message in findings.flags.values():
        print(f"  warning: {message}")
    for rank, f in enumerate(findings.findings[:10], 1):
        x, y, z = f.center_lps
        print(
            f"  #{rank:<3d} score {f.score:.3f}  box {f.diameter_mm:5.1f} mm  LPS ({x:7.1f}, {y:7.1f}, {z:7.1f})  "
            f"{findings.slice_number_source} {f.slice_number}"
        )
    print(f"wrote {j}, {c}" + (f" and {len(pngs)} PNGs in {out / (case_id + '_png')}" if pngs else ""))
    return _write_dicom(args, volume, findings, case_id, device=str(det.device))


def _write_dicom(args: argparse.Namespace, volume: Any, findings: Any, case_id: str, *, device: str | None = None) -> int:
    """The SR of the findings (after every other output): 0 when written or not asked for, 1 when it failed.

    Each finding's side comes from the reconstruction's lung segmentation of ``volume`` on ``device`` (the
    detector's; None: CUDA when available) (:func:`~pipeline.dicom_out.case.lung_side_masks`), as in the SR of
    ``ctpipe run``."""
    from ..dicom_out.case import dicom_source_of, lung_side_masks, write_case_dicom
    from ..errors import DicomOutputError
    from ..ingest.source import source_shown

    outputs = tuple(args.dicom)
    if "seg" in outputs:
        log.warning("no SEG: detection makes no masks (ctpipe reconstruct --findings writes the SEG)")
    else:
        log.info("no SEG: detection makes no masks (ctpipe reconstruct --findings writes the SEG)")
    outputs = tuple(o for o in outputs if o != "seg")
    if not outputs:
        return 0
    source = dicom_source_of(args.src)
    if source is None:
        log.warning(
            "%s is not DICOM (nor a cache entry ingested from DICOM): no DICOM SR written",
            source_shown(args.src, case_id=args.case_id, name=case_id),
        )
        return 0
    lungs = lung_side_masks(volume, device=device) if len(findings) else None  # each finding's side
    try:
        paths = write_case_dicom(
            args.out,
            source=source,
            volume=volume,
            findings=findings,
            outputs=outputs,
            side_masks=lungs,  # the sides alone: detection has no organ masks for a SEG
            stem=case_id,
            stable_uids=True,
        )
    except (DicomOutputError, OSError) as exc:
        print(
            f"ctpipe detect: error: the DICOM SR was not written ({exc}); the findings JSON, CSV and PNGs are "
            f"written in {args.out}",
            file=sys.stderr,
        )
        return 1
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def check_case_id(case_id: str) -> None:
    """Refuse a ``--case-id`` (of ``ctpipe detect`` or ``reconstruct``) that would name a file outside ``--out`` (a
    path, or a name starting with a dot)."""
    from ..cache import is_plain_file_name
    from ..errors import UsageError

    if not is_plain_file_name(case_id):
        raise UsageError(
            f"{case_id!r} is not a plain file name",
            where="--case-id",
            fix="use letters, digits, '.', '_' and '-' (not first '.'); the outputs go to --out",
        )


def _evaluate(args: argparse.Namespace) -> int:
    from ..atomic import atomic_write_bytes, ensure_dir
    from ..errors import ConfigError
    from .evaluate import at_score_threshold, coordinate_warnings, froc_of_matched, match_predictions, size_band_text
    from .evaluate_io import load_scans, load_truth, read_predictions

    ensure_dir(args.out)

    truth = load_truth(args.truth)
    predictions = read_predictions(args.pred)
    preds = predictions.candidates
    irrelevant = load_truth(args.irrelevant, what="--irrelevant") if args.irrelevant else None
    scans = load_scans(args.scans, known=set(preds) | set(truth)) if args.scans is not None else None
    if preds and scans is None and not set(preds) & set(truth):  # a model that found nothing is scored all the same
        raise ConfigError(
            f"the predictions ({len(preds)} scan(s), e.g. {sorted(preds)[:2]}) and the truth ({len(truth)} scan(s), "
            f"e.g. {sorted(truth)[:2]}) share no scan",
            where="--pred/--truth",
            fix="pass the truth of the scans the predictions are of (both name scans by SeriesInstanceUID)",
        )
    for message in coordinate_warnings(preds, truth):
        print(f"ctpipe evaluate: warning: {message}", file=sys.stderr)
    unknown = sorted(set(preds) - set(truth))
    if unknown and scans is None:
        print(
            f"ctpipe evaluate: warning: {len(unknown)} scan(s) of the predictions have no ground truth (e.g. "
            f"{unknown[:2]}) and count as scans without nodules; pass --scans with the test set's SeriesInstanceUIDs "
            "(LUNA16's seriesuids.csv) to fix which scans count",
            file=sys.stderr,
        )
    _check_relevant_nodules(args, truth, sorted(scans) if scans is not None else sorted(set(preds) | set(truth)))
    # matched once: the FROC and the figures at a score threshold count the same hits and false positives
    matched = match_predictions(
        preds, truth, scans=scans, min_diameter_mm=args.min_diameter, irrelevant=irrelevant, max_marks_per_scan=args.max_marks
    )
    result = froc_of_matched(
        matched, n_bootstrap=args.bootstrap, seed=args.seed, reading=args.reading, max_marks_per_scan=args.max_marks
    )
    paths = result.write(args.out)
    print(result.table())
    written = [str(paths["json"]), str(paths["csv"]), str(paths["png"])]
    # by default, the threshold the findings JSONs were reported at (a model's operating point), when they share one
    reported = predictions.reported_threshold()
    at_scores = list(args.at_score) or ([reported] if reported is not None else [])
    if at_scores:
        figures = [at_score_threshold(matched, p) for p in at_scores]
        for op in figures:
            print(
                f"at score >= {op['score_threshold']:.4g}: sensitivity {op['sensitivity']:.3f} "
                f"({op['nodules_found']}/{op['n_nodules']}) at {op['fps_per_scan']:.2f} FPs/scan"
                + ("" if args.at_score else " (the threshold the findings were reported at)")
            )
            print(f"  nodules found by size: {size_band_text(op['by_size'])}")
        at_path = Path(args.out) / "at_score.json"
        atomic_write_bytes(at_path, (json.dumps(figures, indent=1) + "\n").encode())
        written.append(str(at_path))
    print("wrote " + ", ".join(written))
    return 0


def _check_relevant_nodules(args: argparse.Namespace, truth: dict[str, list[Any]], scans: list[str]) -> None:
    """Refuse an evaluation without a nodule of at least --min-diameter among the ``scans`` evaluated (no
    sensitivity to measure), saying in the options' terms why: the nodules are all smaller, or in other scans."""
    from ..errors import ConfigError

    in_scans = [float(d) for sid in scans for _, d in truth.get(sid, [])]
    if any(d >= args.min_diameter for d in in_scans):
        return
    evaluated = (
        f"the {len(scans)} scan(s) of --scans {args.scans}"
        if args.scans is not None
        else f"the {len(scans)} scan(s) named by --pred and --truth"
    )
    if in_scans:
        problem = (
            f"no nodule of at least {args.min_diameter:g} mm (--min-diameter) in {evaluated}: its {len(in_scans)} "
            f"nodule(s) there measure {min(in_scans):g} to {max(in_scans):g} mm"
        )
        fix = f"pass --min-diameter {max(in_scans):g} or less, or the ground truth of the test set"
    else:
        n_all = sum(len(nods) for nods in truth.values())
        problem = f"no nodule in {evaluated}" + (
            f" (its {n_all} nodule(s) are in {sum(1 for n in truth.values() if n)} other scan(s))" if n_all else ""
        )
        fix = (
            "pass --scans listing the scans of --truth (by SeriesInstanceUID), or the truth of those scans"
            if args.scans is not None
            else "pass the ground truth of the scans the predictions are of, with their nodules"
        )
    raise ConfigError(f"the ground truth holds {problem}", where="--truth " + " ".join(map(str, args.truth)), fix=fix)
