"""``ctpipe run`` and ``ctpipe report``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..argtypes import in_folder, number_in, out_folder
from ..devices import allowed_devices
from ..dicom_out.kinds import add_dicom_options
from .cli_options import cli_overrides, load_cli_config, set_item

if TYPE_CHECKING:
    from .run_summary import RunSummary


def case_outputs(cfg: Any) -> list[str]:
    """What a published case folder of a run with config ``cfg`` holds, as ``ctpipe run`` lists it: the findings
    always, their PNGs, the reconstruction and the DICOM results only when the config writes them."""
    out = ["findings.json", "findings.csv"]
    if cfg.detector.write_png:
        out.append("findings_png/")
    if cfg.reconstruct.enabled:
        out.append("recon/")
    if cfg.outputs.dicom:
        out.append("dicom/")
    return out


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the pipeline over DICOM folders or worklist CSVs (resumable)",
        description="Discover CT series under SRC folders (or rows of a worklist .csv) and run "
        "ingest -> segment the lungs (reconstruct) -> load -> detect -> measure nodules -> write -> DICOM SR and "
        "SEG (outputs.dicom) for each, into "
        "RUN_DIR (a scan without lungs is not searched). Running the same command "
        "again resumes: completed cases are skipped, interrupted ones retried. Exit status: 0 all "
        "cases done, 3 some cases quarantined (listed with their reasons), by this run or by an earlier run and "
        "not retried (the summary tells newly quarantined cases from those still quarantined from earlier runs), "
        "4 the run folder could not be written (disk full, read-only, no permission, quota, file-size limit, a file "
        "where the run folder keeps a folder) or a source folder went away during the run (a network mount that "
        "dropped): the run stopped early or could not start, nothing is lost, and the "
        "same command finishes the rest once it can write and read, 1 the run "
        "could not proceed (bad source, a bad --config file or CTPIPE_* variable, RUN_DIR inside a source folder, a model that cannot load, "
        "another run using RUN_DIR, Ray actors that cannot be placed within runner.ray_timeout_s, a Ray head that "
        "stopped answering for runner.ray_reconnect_s (600 s) or came back as a new cluster: the same command resumes, "
        "a node running another ctpipe version or unable to import the run's code, "
        "an option that shapes results (detector threshold or model, organs, DICOM "
        "results, ...) other than the one RUN_DIR's completed cases were made with: a new RUN_DIR for new options), "
        "2 bad command-line arguments (an unknown option, a missing value, a value not allowed: --device foo, a "
        "--set item whose option or value is not allowed), 130 interrupted (Ctrl-C, SIGTERM, SIGHUP: the same command resumes), 141 the "
        "reader of its output closed it early (| head). "
        "A run that finds no CT series in its sources says so and exits 0; so does one that leaves a series for the "
        "next run because more of it arrived in the source while it ran (nothing of it is published; the summary "
        "names it, the next run takes the whole series).",
    )
    p.add_argument(
        "sources", nargs="+", metavar="SRC", type=in_folder, help="DICOM folder(s) or worklist CSV file(s) (column 'path')"
    )
    p.add_argument("--out", required=True, type=out_folder, metavar="RUN_DIR", help="run folder (created; reused to resume)")
    p.add_argument("--config", metavar="FILE", help="YAML config (see configs/default.yaml)")
    p.add_argument(
        "--workers",
        type=number_in(int, 0, 256),
        metavar="N",
        help="CPU worker processes, 0..256 (0 = all stages in one process; default: runner.workers of the configuration, 2)",
    )
    p.add_argument(
        "--device",
        metavar="DEV",
        help=f"model device: {allowed_devices(several=True)} (default: runner.device of the configuration, auto)",
    )
    p.add_argument(
        "--bundle",
        metavar="PATH",
        help="MONAI bundle folder for the detector (default: detector.bundle of the configuration; null: the embedded "
        "demo weights)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run the stages as Ray actors across a cluster: auto (the cluster this machine joined with ray start; "
        "the default), HEAD:PORT, or local (a private Ray instance); needs ctpipe[cluster], see README 'Scale out'",
    )
    p.add_argument(
        "--metrics-port",
        type=number_in(int, 1, 65535),
        metavar="N",
        help="serve Prometheus metrics on port N (1..65535) of metrics.bind (default 127.0.0.1: this machine only) during the "
        "run, at /metrics (metrics.port; default: off)",
    )
    p.add_argument("--retry-failed", action="store_true", default=None, help="re-attempt cases quarantined earlier")
    p.add_argument(
        "--keep-identifiers",
        action="store_true",
        default=None,
        help="keep patient identifiers: PatientID, PatientName, PatientBirthDate and AccessionNumber, and the series "
        "description as it is, in the case cache and volume.json (the others, such as InstitutionName and the "
        "physicians' names, are never read), and folder and file names that hold one, and the paths of skipped files "
        "below the sources, written as they are in run.log, the console, the run store and the report; by default "
        "these read <patient:xxxxxx> (<file:xxxxxx>.pdf for a skipped file, <folder:xxxxxx> for a folder of it that "
        "holds no series, <patient> in a description) and identifiers appear nowhere in the run folder but in its DICOM results (SR, SEG), which copy "
        "them from the source to be filed with the patient's study",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=set_item,
        metavar="SECTION.KEY=VALUE",
        help="set any option, e.g. --set reconstruct.mesh_formats=stl,glb (repeatable)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="for cron: no progress bar; on success only the summary line (and what discovery skipped), otherwise "
        "also the problems (quarantined cases, why the run stopped) and the log's path; errors on stderr",
    )
    add_dicom_options(p, default=None)
    p.set_defaults(func=_run)

    r = sub.add_parser(
        "report",
        help="throughput/latency report over one or more run folders",
        description="Write report.html (plots embedded), report.json and CSV tables for RUN_DIRs into --out, writing "
        "nothing in the run folders (they may be read-only; --out cannot be one of them). What a glob catches beside the run folders (a file, a "
        "folder without runs.sqlite) is left out, counted with one line per reason (never named). Exit status 0 written, 1 a path that does not "
        "exist, a run store that cannot be read, no run folder among the paths or a report that could not be written "
        "(the earlier report in --out stays whole), 2 bad arguments (an unknown option, a value not allowed, an --out "
        "that is one of the RUN_DIRs).",
    )
    r.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        type=in_folder,
        help="run folders written by ctpipe run --out (e.g. runs/2026-11-*)",
    )
    r.add_argument("--out", required=True, type=out_folder, metavar="DIR", help="folder for the report")
    r.add_argument(
        "--bin-minutes",
        type=number_in(int, 0, 1440),
        default=0,
        help="bin width of the throughput plot in minutes, 0..1440 (default 0: chosen from the runs' span, seconds or "
        "minutes for a short run, up to an hour for a nightly run, days over several days)",
    )
    r.add_argument(
        "--hours-per-day",
        type=number_in(float, 0.1, 24.0),
        default=24.0,
        help="operating hours per day for the projection, 0.1..24 (default 24)",
    )
    r.add_argument("--gpus", type=number_in(int, 1), metavar="N", help="capacity model: GPUs in all (default: the runs' own)")
    r.add_argument(
        "--nodes",
        type=number_in(int, 1),
        default=1,
        metavar="M",
        help="capacity model: nodes the GPUs are spread over (default 1)",
    )
    r.add_argument(
        "--cpu-workers",
        type=number_in(int, 1),
        metavar="W",
        help="capacity model: CPU workers per node, at least 1 (default: the runs' own; 1 for runs of one process)",
    )
    r.add_argument(
        "--timezone",
        metavar="ZONE",
        type=_zone_name,
        help="IANA time zone of the completed cases per day (e.g. Europe/Berlin; default: this machine's local time, "
        "$TZ); the UTC days are given too",
    )
    r.set_defaults(func=_report)


def run_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """``ctpipe run``'s command-line overrides and their source labels (:func:`cli_overrides`): its ``--set`` items
    and flags."""
    flags: dict[str, tuple[str, Any]] = {
        "workers": ("--workers", args.workers),
        "device": ("--device", args.device),
        "bundle": ("--bundle", args.bundle),
        "metrics_port": ("--metrics-port", args.metrics_port),
        "retry_failed": ("--retry-failed", args.retry_failed),
        "keep_identifiers": ("--keep-identifiers", args.keep_identifiers),
        "outputs.dicom": (getattr(args, "dicom_flag", "--dicom"), None if args.dicom is None else list(args.dicom)),
    }
    if args.ray is not None:
        flags.update({"engine": ("--ray", "ray"), "ray_address": ("--ray", args.ray)})
    return cli_overrides(args.set, flags)


#: Log events the run's summary repeats (a quarantined case with its reason, the run folder failing, a case whose
#: series was still being written): with ``--quiet`` the console leaves them to the summary, so that a cron mail
#: names each once (run.log keeps them).
SUMMARISED_EVENTS = frozenset({"case_failed", "run_stopping", "case_still_written"})


def _leave_to_the_summary(events: frozenset[str]) -> None:
    """Drop the records of ``events`` from the console handlers (those writing to stderr)."""

    def keep(record: logging.LogRecord) -> bool:
        return getattr(record, "event", None) not in events

    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stderr:
            handler.addFilter(keep)


def stop_once(out: str, *, note: str | None = None, done: Callable[[], bool] | None = None) -> dict[int, Any]:
    """Make Ctrl-C (SIGINT), SIGTERM and SIGHUP stop ``ctpipe run`` as Ctrl-C does: the first raises
    KeyboardInterrupt, so that the run is recorded as interrupted (``run_end`` in run.log, report, metrics) and
    resumes next time. The second (Ctrl-C pressed again while the run records its stop, a few seconds) only says that
    the run is stopping, instead of cutting that record short and leaving the folder marked "in progress"; a third
    stops it at once, as before (the next run then finds it interrupted).
    SIGINT is left alone where it is ignored (a background job), SIGHUP where it is not the default (under nohup).
    ``out``: the run folder, named in the note; ``note``: another command's line for the second signal (``ctpipe
    listen``); ``done``: once it returns True (``ctpipe run``: the run's end recorded and its summary printed), a signal
    changes nothing: the command ends as it was ending, with the run's exit status. Returns the handlers it replaced,
    by signal number, to put back."""
    signals = 0
    default_note = (
        f"ctpipe run: already stopping: recording the run in {out} as interrupted and writing its report (a few "
        "seconds); Ctrl-C once more stops it at once, and the next run then finds it interrupted\n"
    )

    def on_stop(signum: int, frame: Any) -> None:
        nonlocal signals
        if done is not None and done():  # nothing left to stop
            return
        signals += 1
        if signals != 2:
            raise KeyboardInterrupt  # the run is recorded as interrupted and resumes next time
        try:  # os.write: safe inside a signal handler, even while the main program writes to stderr
            os.write(2, (note or default_note).encode())
        except OSError:  # SIGHUP: the terminal is gone
            pass

    replaced: dict[int, Any] = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        replaced[signal.SIGINT] = signal.signal(signal.SIGINT, on_stop)
    replaced[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_stop)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # not under nohup
        replaced[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_stop)  # the terminal closed: stop as for SIGTERM
    return replaced


def _run(args: argparse.Namespace) -> int:
    from ..errors import RunEnvironmentError
    from .batch import EXIT_ENVIRONMENT, EXIT_INTERRUPTED, run_batch
    from .discover import check_sources
    from .progress import TqdmBar

    if args.quiet:
        _leave_to_the_summary(SUMMARISED_EVENTS)
    overrides, labels = run_overrides(args)
    if Path(args.out).is_file():
        from ..errors import CtpipeError

        raise CtpipeError("--out is a file, not a run folder", where=args.out, fix="give --out a folder (created if missing)")
    cfg = load_cli_config(args.config, overrides, labels)  # errors name the --set item or flag
    check_sources(args.sources)  # here, for the errors in the command's terms; run_batch's name the Python calls
    bar: TqdmBar | None = None

    def on_progress(p: Any) -> None:
        nonlocal bar
        if args.quiet or not sys.stderr.isatty():  # no bar in a cron mail or a log file
            return
        if bar is None:
            bar = TqdmBar(p.total)
        bar(p)

    code: int | None = None  # the exit status, once the summary is printed

    def on_end(summary: RunSummary, linger_s: float) -> None:
        nonlocal bar, code
        if bar is not None:
            bar.close()
            bar = None
        code = _print_summary(summary, cfg, quiet=args.quiet)
        if linger_s > 0 and not args.quiet:
            stop = (
                f"kill {os.getpid()} ends it early"
                if signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a background job: Ctrl-C does not reach it
                else "Ctrl-C ends it early"
            )
            url = f"http://{cfg.metrics.bind}:{cfg.metrics.port}/metrics"
            print(f"the metrics endpoint {url} stays up for {linger_s:g} s for a last scrape ({stop})")
        sys.stdout.flush()  # before the wait: a pipe (cron, systemd, tee) shows it now, not at the exit

    replaced = stop_once(args.out, done=lambda: code is not None)
    try:
        summary = run_batch(
            args.sources,
            out=args.out,
            config=cfg,
            progress=on_progress,
            command="ctpipe " + " ".join(sys.argv[1:]),
            origins=getattr(args, "pacs_origins", None),  # set by pipeline.pacs.cli for PACS sources
            ended=on_end,
        )
    except RunEnvironmentError as exc:  # the run folder cannot be written at all: one line, its own exit status
        print(f"ctpipe run: error: cannot write the run folder: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
            bar = None
        try:
            print(
                f"ctpipe run: interrupted; run the same command again to resume (completed cases in {args.out} are "
                "kept and skipped, the interrupted ones run again)",
                file=sys.stderr,
            )
        except OSError:  # SIGHUP: the terminal is gone; the run is recorded as interrupted all the same
            pass
        return EXIT_INTERRUPTED
    finally:
        if bar is not None:
            bar.close()
        # the caller's own handling again (ctpipe main called in-process); as the command, once the run has ended, its
        # own until the process exits: a Ctrl-C as it exits leaves the exit status the run's
        if code is None or not getattr(args, "exits", False):
            for signum, handler in replaced.items():
                signal.signal(signum, handler)
    return _print_summary(summary, cfg, quiet=args.quiet) if code is None else code


def _print_summary(summary: RunSummary, cfg: Any, *, quiet: bool) -> int:
    """Print the run's summary (``--quiet``: the lines cron should mail) and where its results are; its exit status."""
    lines = summary.lines()
    code = summary.exit_code
    if quiet:
        keep = (
            "quarantined",
            "still quarantined",
            "run stopped",
            "the run folder",
            "not written",
            "skipped by discovery",
            "no CT series",
            "NIfTI/MHA/NRRD",
            "left for the next run",
        )
        lines = lines[:1] + [ln for ln in lines[1:] if ln.lstrip().startswith(keep)]
    for line in lines:
        print(line)
    if quiet and code == 0:  # cron: the summary line is all a run that went well has to say
        return code
    if (summary.done or summary.redone or summary.skipped) and not quiet:  # where the findings, meshes and DICOM results are
        print(f"results: {summary.run_dir / 'cases'}/<case id>/ ({', '.join(case_outputs(cfg))})")
    if summary.metrics_file and not quiet:
        print(f"metrics: {summary.metrics_file}")
    if summary.node_metrics_file and not quiet:
        print(f"metrics for node_exporter: {summary.node_metrics_file}")
    print(f"log: {summary.run_dir / 'run.log'}")
    if summary.report_html:
        print(f"report: {summary.report_html}")
    return code


def _zone_name(text: str) -> str:
    """An argparse ``type``: ``text`` if it names a time zone (IANA), else the error naming it and the fix."""
    from ..errors import ConfigError
    from .report_days import report_zone

    try:
        return report_zone(text)[1]
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _report(args: argparse.Namespace) -> int:
    from ..atomic import ensure_dir
    from ..errors import UsageError
    from .report import build_report

    out = Path(args.out).resolve()
    for run_dir in args.run_dirs:  # the report's files beside a run's store, config and cases: never
        if Path(run_dir).resolve() == out:
            raise UsageError(
                "--out is a run folder this report reads: its files (report.html, cases.csv, ...) would be written "
                "among the run's own",
                where=args.out,
                fix=f"give --out a folder of its own, e.g. {Path(run_dir) / 'report'} (the one ctpipe run rebuilds) "
                "or a folder beside the runs",
            )
    ensure_dir(args.out)

    rep = build_report(
        args.run_dirs,
        args.out,
        bin_minutes=args.bin_minutes,
        hours_per_day=args.hours_per_day,
        gpus=args.gpus,
        nodes=args.nodes,
        cpu_workers=args.cpu_workers,
        timezone=args.timezone,
    )
    status = rep.summary["status"]
    if status["state"] in ("in_progress", "interrupted"):  # the figures are not those of a finished run: said first
        print(f"run status: {status['text']}")
    for entry in rep.summary["left_out"]:  # what a glob such as runs/* caught beside the run folders
        print(f"left out {entry['count']} path(s): {entry['reason']}")
    print(rep.summary["projection"])
    print(rep.summary["capacity"]["text"])
    print(f"report: {rep.html}")
    return 0
