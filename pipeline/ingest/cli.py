"""``ctpipe ingest``: scan DICOM folders, cache every selected CT series, report the rest."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from ..argtypes import in_path, number_in, out_path
from ..atomic import atomic_write_bytes, check_out_outside_sources, ensure_dir, ensure_file_path
from ..cache import CaseCache
from ..errors import UsageError
from .api import explain_nothing, ingest_to_cache, safe_case_id
from .series import SelectionRules


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``ingest`` sub-command."""
    p = subparsers.add_parser(
        "ingest",
        help="scan DICOM folders and write the selected CT series to a case cache",
        description=(
            "Scan SRC folders recursively (any file names), choose the CT series by the selection rules, "
            "write each as <case>.npy + <case>.json (HU, LPS geometry) into the cache folder, and print which "
            "series were chosen, not chosen or rejected, with reasons. Exit status 0 done, 1 if any series was rejected or "
            "none was cached, 2 bad arguments (an unknown option, a value not allowed: out of its range, a --json "
            "that names --out)."
        ),
    )
    p.add_argument("sources", nargs="+", metavar="SRC", type=in_path, help="DICOM folder(s) or file(s)")
    p.add_argument("--out", required=True, type=out_path, metavar="CACHE_DIR", help="case cache folder")
    p.add_argument("--series-uid", default=None, help="ingest only this SeriesInstanceUID (or <uid>#<part> key)")
    p.add_argument(
        "--min-slices",
        type=number_in(int, 2),
        default=10,
        help="fewest slices of a volume, at least 2 (default 10); with one SRC whose only CT series is shorter, "
        "that series is cached anyway, with a warning",
    )
    p.add_argument("--allow-derived", action="store_true", help="also take DERIVED/SECONDARY image series")
    p.add_argument(
        "--axial-tolerance",
        type=number_in(float, 0.0, 90.0),
        default=30.0,
        metavar="DEG",
        help="largest angle between slice normal and patient z axis in degrees, 0..90 (default 30)",
    )
    p.add_argument(
        "--spacing-tolerance",
        type=number_in(float, 0.0, 1.0),
        default=0.02,
        help="allowed slice step deviation as a fraction of the median step, 0..1 (default 0.02)",
    )
    p.add_argument("--allow-gantry-tilt", action="store_true", help="resample tilted-gantry series instead of rejecting them")
    p.add_argument(
        "--keep-identifiers",
        action="store_true",
        help="keep patient identifiers (PatientID, PatientName, PatientBirthDate, AccessionNumber) in the "
        "cache sidecars, series descriptions as they are, and patient-named folders and the paths of skipped files "
        "as they are on the console and in --json; by default they are left out, each of them in a series "
        "description reads <patient>, such a folder <patient:xxxxxx>, a skipped file <file:xxxxxx>.pdf and a folder "
        "below SRC holding skipped files and no series <folder:xxxxxx>",
    )
    p.add_argument(
        "--threads",
        type=number_in(int, 1),
        default=None,
        metavar="N",
        help="I/O threads reading the files (default 2 x CPUs, at most 8); not the worker processes of ctpipe run --workers",
    )
    # the earlier name of --threads, kept so that existing scripts go on working
    p.add_argument("--workers", dest="threads", type=number_in(int, 1), help=argparse.SUPPRESS)
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="REPORT",
        help="also write the report as JSON to this file ('seconds': the whole ingest, 'scan_seconds': its header scan); "
        "'-' prints it on stdout (the table then goes to stderr)",
    )
    p.set_defaults(func=run)


#: Skipped files named one per line in the printed report (the JSON report has them all).
_SKIPPED_SHOWN = 20


def _row(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()


def run(args: argparse.Namespace) -> int:
    """Scan, cache, print the table; 1 when a series was rejected or nothing was cached, else 0. Unless
    ``--keep-identifiers``, a patient-named source folder or file reads as its token (as in ``ctpipe run``) on the
    console and in the JSON report; the cache entries name their source folders as they are (``ctpipe detect
    <entry>`` reads the source images from them)."""
    from ..runner.redact_sources import redacting_sources

    with redacting_sources(args.sources, keep_identifiers=args.keep_identifiers):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..runner.redact_active import redacted_data

    rules = SelectionRules(min_slices=args.min_slices, allow_derived=args.allow_derived, axial_tolerance_deg=args.axial_tolerance)
    json_to_stdout = args.json is not None and str(args.json) == "-"
    # with --json -, stdout holds the JSON report alone (for jq and scripts): the table goes to stderr
    say = functools.partial(print, file=sys.stderr) if json_to_stdout else print
    check_out_outside_sources(args.sources, args.out, beside="cache")  # else the next scan reads the cache back
    if args.json is not None and not json_to_stdout:  # refused before the scan and the cache writes, not at the end
        if args.json.resolve() == args.out.resolve():
            raise UsageError(
                "--json names the --out cache folder", where=args.json, fix="give --json a file path, e.g. ingest.json"
            )
        ensure_file_path(args.json, what="--json")
    ensure_dir(args.out)
    cache = CaseCache(args.out, keep_identifiers=args.keep_identifiers)
    report = ingest_to_cache(
        args.sources,
        cache,
        series_uid=args.series_uid,
        rules=rules,
        spacing_tolerance=args.spacing_tolerance,
        allow_gantry_tilt=args.allow_gantry_tilt,
        keep_identifiers=args.keep_identifiers,
        workers=args.threads,
    )
    scan = report.scan
    rejected = {r.series.key: r for r in scan.rejected}
    header = ["status", "series", "slices", "description", "case id / reason"]
    rows = []
    for s in scan.series:
        described = s.description_shown(keep_identifiers=args.keep_identifiers)
        if s.key in report.written:
            rows.append(["cached", s.key, str(s.n_slices), described, safe_case_id(s.key)])
        elif s.key in rejected:
            r = rejected[s.key]
            rows.append(["REJECTED", s.key, str(s.n_slices), described, f"{type(r.error).__name__}: {r.error.problem}"])
        else:
            rows.append(["skipped", s.key, str(s.n_slices), described, s.why_not or "not requested"])
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(4)] + [0]
    say(_row(header, widths))
    for row in rows:
        say(_row(row, widths))
    say(
        f"{scan.n_files} files, {len(scan.series)} series: {len(report.written)} cached in {args.out}, "
        f"{len(scan.rejected)} rejected; files skipped: {scan.skipped_summary()} ({scan.seconds:.2f} s scan, {report.seconds:.2f} s in all)"
    )
    for r in scan.rejected:
        say(f"  rejected {r.series.key}: {r.error}")
        if safe_case_id(r.series.key) in cache:  # cached by an earlier ingest, before the series went wrong
            say(
                f"  note: {args.out} still holds case {safe_case_id(r.series.key)} from an earlier ingest of this "
                f"series; it was not replaced (remove {safe_case_id(r.series.key)}.npy and .json to drop it)"
            )
    for s in scan.series:
        for w in s.warnings if s.key in report.written else ():
            say(f"  warning {s.key}: {w}")
    for f in scan.skipped_files[:_SKIPPED_SHOWN]:
        say(f"  skipped file {f.path}: {f.kind.replace('_', ' ')}: {f.reason}")
    if len(scan.skipped_files) > _SKIPPED_SHOWN:
        listed = "the JSON report on stdout" if json_to_stdout else args.json
        more = f" (all are listed in {listed})" if args.json else " (--json REPORT lists them all)"
        say(f"  ... and {len(scan.skipped_files) - _SKIPPED_SHOWN} more skipped files{more}")
    if args.json:
        data = scan.to_json(keep_identifiers=args.keep_identifiers)
        data["cached"] = {k: e.case_id for k, e in report.written.items()}
        data["cache"] = str(args.out)
        # the scan's "seconds" is the header scan alone: the report's is the whole ingest, reads and cache writes too
        data["scan_seconds"] = data.pop("seconds")
        data["seconds"] = round(report.seconds, 4)
        data = redacted_data(data)  # the roots and skipped files, patient-named ones as tokens
        if json_to_stdout:
            print(json.dumps(data, indent=1))
        else:
            atomic_write_bytes(args.json, json.dumps(data, indent=1).encode())
    if not report.written:
        if scan.rejected:
            why = f"{len(scan.rejected)} rejected (see the reasons above)"
        elif scan.series:
            why = "no series matched the selection rules (see the reasons above)"
        else:  # no files, or none of them DICOM: the same explanation as the library's error
            why = str(explain_nothing(scan, rules))
        say(f"no series was cached: {why}")
    return 1 if scan.rejected or not report.written else 0
