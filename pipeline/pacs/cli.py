"""``ctpipe listen``, ``ctpipe send``, and PACS sources for ``ctpipe run``.

``register`` adds the two sub-commands and, when ``ctpipe run`` is registered (before this module),
lets its SRC arguments be PACS addresses (:mod:`pipeline.pacs.address`): those are searched and
retrieved into ``RUN_DIR/pacs/spool/`` first, and the run then processes the retrieved series like
folders. With ``pacs.send_to`` set, ``ctpipe run`` also sends the DICOM results of completed cases
there in the background.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..argtypes import in_folder, number_in, out_folder
from ..devices import allowed_devices
from ..runner.cli import set_item, stop_once

if TYPE_CHECKING:
    from .handover import SeriesOutcome

EXIT_SOME_FAILED = 3

RUN_EPILOG = (
    "SRC may also be a PACS: 'dicomweb+http(s)://HOST:PORT/PATH?QUERY' (QIDO-RS + WADO-RS) or "
    "'dimse://AET@HOST:PORT?QUERY' (C-FIND + C-MOVE/C-GET), QUERY of studydate=YYYYMMDD[-YYYYMMDD]|today|yesterday, "
    "accession=A,B, study=UID,UID, series=UID,UID, worklist=FILE.csv (StudyInstanceUID/SeriesInstanceUID "
    "columns), modality=CT, retrieve=move|get. Retrieved series go to RUN_DIR/pacs/spool/ (removed once "
    "their case is published or quarantined, see pacs.keep_received); the run store records each case's origin "
    "(archive, Study/Series Instance UID), and a rerun retrieves and processes none twice. Credentials: CTPIPE_DICOMWEB_USER/CTPIPE_DICOMWEB_PASSWORD or a netrc file. "
    "Exit status 3 also when some series could not be retrieved."
)


def register(sub: Any) -> None:
    run = sub.choices.get("run")
    if run is not None:
        original = run.get_default("func")
        run.epilog = RUN_EPILOG
        run.set_defaults(func=lambda args: _run_with_pacs(args, original))

    p = sub.add_parser(
        "listen",
        help="receive CT series by DICOM C-STORE and process each once (continuous)",
        description="A DICOM storage SCP (C-STORE) for CT that writes each instance durably, groups "
        "instances into series, and processes every complete series (quiet for pacs.quiet_period_s) as ctpipe "
        "run does, into the run folder RUN_DIR. Only calling AE titles named with --allow (or pacs.allowed_aets) may "
        "send, addressing it by its own AE title (--ae-title; pacs.check_called_aet); each rejection is logged with "
        "both AE titles. It listens on 127.0.0.1 (this machine only) unless --bind names another address. "
        "Restarting after a crash processes every instance received before it, none twice. Prints one line per "
        "series processed (done, with its case, or quarantined, with the reason). Exit status 0 stopped by "
        "SIGTERM (systemctl stop), SIGHUP or Ctrl-C (series received and not yet processed are processed on the next "
        "start; a second signal while it stops is noted, a third stops it at once), "
        "1 a bad configuration (--config, CTPIPE_* variables), an address or port it cannot listen on, a run folder "
        "another ctpipe process is fetching into or listening for, or one whose results were made with other "
        "options or model files, 2 bad "
        "arguments (an unknown option, a value not allowed: --ae-title, --send-to, --device, a --set item).",
    )
    p.add_argument("--out", required=True, type=out_folder, metavar="RUN_DIR", help="run folder (created; reused on restart)")
    p.add_argument("--config", metavar="FILE", help="YAML config (see configs/default.yaml, section pacs)")
    p.add_argument("--ae-title", metavar="AET", help="this listener's AE title (pacs.ae_title; default CTPIPE)")
    p.add_argument(
        "--bind",
        metavar="ADDR",
        help="address to listen on (pacs.bind; default 127.0.0.1): 127.0.0.1 takes senders on this machine only; "
        "0.0.0.0, or this machine's address on their network, senders on other machines",
    )
    p.add_argument("--port", type=number_in(int, 1, 65535), metavar="N", help="TCP port, 1..65535 (pacs.port; default 11112)")
    p.add_argument(
        "--allow", action="append", metavar="AET", help="calling AE title allowed to send (repeatable; pacs.allowed_aets)"
    )
    p.add_argument(
        "--quiet-period",
        type=number_in(float, 0.1, 86400.0),
        metavar="S",
        help="seconds without a new instance before a series is complete, 0.1..86400 (pacs.quiet_period_s; default 30)",
    )
    p.add_argument("--send-to", metavar="ADDRESS", help="send DICOM results (SR, SEG) here (pacs.send_to)")
    p.add_argument(
        "--workers",
        type=number_in(int, 0, 256),
        metavar="N",
        help="CPU worker processes, 0..256 (default: runner.workers of --config, CTPIPE_RUNNER_WORKERS or --set, else 0: "
        "every stage in this process); either way the workers and the model are started once for the listener's lifetime",
    )
    p.add_argument("--device", metavar="DEV", help=f"model device: {allowed_devices(several=True)} (runner.device; default auto)")
    p.add_argument(
        "--bundle",
        metavar="PATH",
        help="MONAI bundle folder for the detector (detector.bundle; default: the embedded demo weights)",
    )
    p.add_argument(
        "--set", action="append", default=[], type=set_item, metavar="SECTION.KEY=VALUE", help="set any option (repeatable)"
    )
    p.set_defaults(func=_listen)

    s = sub.add_parser(
        "send",
        help="send the DICOM results (SR, SEG) of a run folder's completed cases to a PACS",
        description="Send every result file of RUN_DIR's completed cases not yet sent to the destination "
        "(STOW-RS or C-STORE), retrying with backoff; what was sent is recorded and never sent twice. "
        "Exit status 0 all sent, 3 some pending or failed, or left unsent by a run killed as it recorded their cases "
        "(each named, with what to do), 1 RUN_DIR is not a run "
        "folder or no destination is given (--to, pacs.send_to), 2 bad arguments (an unknown option, a value not "
        "allowed: a --to address, a --set item).",
    )
    s.add_argument(
        "run_dir", metavar="RUN_DIR", type=in_folder, help="run folder written by ctpipe run --out or ctpipe listen --out"
    )
    s.add_argument(
        "--to", metavar="ADDRESS", help="dicomweb+http(s)://HOST:PORT/PATH or dimse://AET@HOST:PORT (default pacs.send_to)"
    )
    s.add_argument("--config", metavar="FILE", help="YAML config (see configs/default.yaml, section pacs)")
    s.add_argument("--retry-failed", action="store_true", help="try again the files recorded as failed")
    s.add_argument(
        "--retry-unconfirmed",
        action="store_true",
        help="send again the files recorded stored unconfirmed (the destination answered success and refused the "
        "confirming query), for one that may have lost them; an archive that holds them takes them as the same instances",
    )
    s.add_argument(
        "--timeout",
        type=number_in(float, 0.1),
        default=300.0,
        metavar="S",
        help="give up after this long in all, the rest staying pending for the next send (default 300 s); "
        "how long ctpipe run waits for its own results at its end is pacs.send_drain_s",
    )
    s.add_argument(
        "--set", action="append", default=[], type=set_item, metavar="SECTION.KEY=VALUE", help="set any option (repeatable)"
    )
    s.set_defaults(func=_send)


#: ``ctpipe listen``'s own defaults: below the config file, the environment and --set (see load_config)
LISTEN_DEFAULTS: dict[str, Any] = {"workers": 0}


def _config(args: argparse.Namespace, flags: dict[str, tuple[str, Any]], *, defaults_of: dict[str, Any] | None = None) -> Any:
    """The configuration of --config, the environment, --set and ``flags`` (option name → (flag, value); None: not
    given); an error in an option set on the command line names its --set item or flag."""
    from ..runner.cli_options import cli_overrides, load_cli_config

    overrides, labels = cli_overrides(getattr(args, "set", []) or [], flags)
    return load_cli_config(getattr(args, "config", None), overrides, labels, defaults_of=defaults_of)


def _run_with_pacs(args: argparse.Namespace, original: Callable[[argparse.Namespace], int]) -> int:
    from .address import is_pacs_address

    pacs_sources = [s for s in args.sources if is_pacs_address(s)]
    from ..runner.cli import load_cli_config, run_overrides

    overrides, labels = run_overrides(args)  # the same configuration as the run it wraps
    cfg = load_cli_config(args.config, overrides, labels)
    if not pacs_sources and not cfg.pacs.send_to:
        return original(args)
    from .fetch import fetch_sources, release_spool
    from .ledger import PacsLock

    lock = PacsLock(args.out, holder="ctpipe run")
    failures = 0
    try:
        if pacs_sources:
            result = fetch_sources(pacs_sources, run_dir=args.out, cfg=cfg, base=Path.cwd())
            failures = len(result.failures)
            for line in result.lines():
                print(line, file=sys.stderr if line.lstrip().startswith("PACS failure") else sys.stdout)
            args.sources = [s for s in args.sources if not is_pacs_address(s)] + [str(f) for f in result.folders]
            args.pacs_origins = result.origins
        sender = None
        if cfg.pacs.send_to:
            from .sender import ResultSender

            sender = ResultSender(args.out, cfg).start()
        try:
            if args.sources:
                rc = original(args)
            elif failures:
                print(
                    f"nothing to run: no series retrieved ({failures} PACS failure{'s' if failures > 1 else ''}, listed "
                    "above; the next run tries again)"
                )
                rc = 0
            else:
                print("nothing to run: the PACS sources selected no series to retrieve or process")
                rc = 0
        finally:
            if sender is not None:
                counts = sender.close(drain_s=cfg.pacs.send_drain_s)
                print(counts.line(sender.key))
                _print_left(args.out, sender.key)
            if pacs_sources:
                release_spool(args.out, cfg)
        return EXIT_SOME_FAILED if rc == 0 and failures else rc
    finally:
        lock.release()


def _listen(args: argparse.Namespace) -> int:
    from ..atomic import ensure_dir
    from .listener import Listener

    flags = {
        "pacs.ae_title": ("--ae-title", args.ae_title),
        "pacs.bind": ("--bind", args.bind),
        "pacs.port": ("--port", args.port),
        "pacs.allowed_aets": ("--allow", args.allow),
        "pacs.quiet_period_s": ("--quiet-period", args.quiet_period),
        "pacs.send_to": ("--send-to", args.send_to),
        "device": ("--device", args.device),
        "bundle": ("--bundle", args.bundle),
        "workers": ("--workers", args.workers),
    }
    cfg = _config(args, flags, defaults_of=LISTEN_DEFAULTS)
    ensure_dir(args.out)
    listener = Listener(args.out, cfg, on_series=print_series_outcome)
    # SIGTERM (systemctl stop), Ctrl-C and SIGHUP stop it; a second one while it stops is noted, a third stops it at once
    replaced = stop_once(
        args.out,
        note=f"ctpipe listen: already stopping: finishing the series in hand and closing the listener on {args.out} "
        "(a few seconds); Ctrl-C once more stops it at once (received series are processed on the next start)\n",
    )
    try:
        listener.start()
        print(
            f"listening as {cfg.pacs.ae_title} on {cfg.pacs.bind}:{listener.port} for {', '.join(listener.allowed)}; "
            f"run folder {listener.run_dir}",
            flush=True,
        )
        try:
            listener.serve_forever()
        except KeyboardInterrupt:
            print("stopped; received series not yet processed are processed on the next start", flush=True)
        finally:
            listener.close()
    finally:
        for signum, handler in replaced.items():  # the caller's own handling again (ctpipe main called in-process)
            signal.signal(signum, handler)
    return 0


def print_series_outcome(outcome: SeriesOutcome) -> None:
    """``ctpipe listen``'s line for each series handed to the runner: done with its case, or quarantined with why."""
    print(outcome.line(), flush=True)


def _send(args: argparse.Namespace) -> int:
    from ..errors import CtpipeError, PacsAddressError, UsageError
    from ..runner.store import DB_NAME
    from .address import parse_destination
    from .sender import ResultSender

    if args.to is not None:  # a bad address is a bad argument, refused before the run folder is looked at
        try:
            parse_destination(args.to, where="--to")
        except PacsAddressError as exc:
            raise UsageError(exc.problem, where=exc.where, fix=exc.fix) from exc
    # a bad --set is a bad argument, refused before the run folder is looked at; --to wins over pacs.send_to of
    # CTPIPE_PACS_SEND_TO and --config, as every flag over the option it sets
    cfg = _config(args, {"pacs.send_to": ("--to", args.to)})
    if not (Path(args.run_dir) / DB_NAME).is_file():
        raise CtpipeError(
            f"not a ctpipe run folder (no {DB_NAME})", where=args.run_dir, fix="pass the --out folder of a ctpipe run"
        )
    sender = ResultSender(args.run_dir, cfg, destination=args.to)
    if args.retry_failed:
        sender.retry_failed()
    if args.retry_unconfirmed:
        sender.retry_unconfirmed()
    counts = sender.close(drain_s=args.timeout)
    print(counts.line(sender.key))
    if counts.pending:  # still being retried when --timeout ran out: the next send takes them up
        print(
            f"{counts.pending} result file(s) not sent to {sender.key} within --timeout {args.timeout:g} s (each attempt's "
            f"error is logged above); run ctpipe send {args.run_dir} again once the destination answers",
            file=sys.stderr,
        )
    if counts.unconfirmed:
        _print_unconfirmed(args.run_dir, sender.key, counts.unconfirmed, retried=args.retry_unconfirmed)
    if counts.failed:
        _print_send_failures(args.run_dir, sender.key, counts.failed, retried=args.retry_failed)
    left = _print_left(args.run_dir, sender.key)
    return EXIT_SOME_FAILED if counts.pending or counts.failed or left else 0


def _print_left(run_dir: str, key: str) -> int:
    """Say the case folders whose results a killed run left uncommitted, so not sent (:mod:`pipeline.runner.left_unsent`), each with
    the command that lets them be sent; how many."""
    from ..runner.left_unsent import left_cases, left_lines

    left = left_cases(run_dir)
    for line in left_lines(str(run_dir), key, left):
        print(line, file=sys.stderr)
    return len(left)


def _print_unconfirmed(run_dir: str, key: str, n: int, *, retried: bool) -> None:
    """Why result files are recorded stored but not confirmed (the destination refused the confirming query), and
    how to send them again."""
    from .ledger import Ledger

    ledger = Ledger(run_dir)
    try:
        row = ledger.one(
            "SELECT error FROM sent WHERE destination = ? AND state = 'unconfirmed' ORDER BY updated_at LIMIT 1", (key,)
        )
    finally:
        ledger.close()
    why = f": {row['error']}" if row is not None and row["error"] else ""
    again = "" if retried else f"; if {key} may have lost them, `ctpipe send {run_dir} --retry-unconfirmed` sends them again"
    print(f"{n} result file(s) stored at {key} but not confirmed (not sent again){why}{again}", file=sys.stderr)


def _print_send_failures(run_dir: str, key: str, n: int, *, retried: bool) -> None:
    """Why result files failed for good (one line per distinct reason), and how to try them again."""
    from .ledger import Ledger

    again = "" if retried else "; add --retry-failed to try them again"
    print(f"{n} result file(s) not sent to {key}{again}:", file=sys.stderr)
    ledger = Ledger(run_dir)
    try:
        rows = ledger.rows(
            "SELECT error, COUNT(*) AS n FROM sent WHERE destination = ? AND state = 'failed' GROUP BY error ORDER BY n DESC",
            (key,),
        )
    finally:
        ledger.close()
    for r in rows[:5]:
        print(f"  {r['n']} file(s): {r['error']}", file=sys.stderr)
