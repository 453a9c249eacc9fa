#!/usr/bin/env python
"""Benchmark: PACS retrieval (WADO-RS, C-MOVE, C-GET) from a local Orthanc, and ``ctpipe listen`` against dcmtk's storescp.

Everything runs on 127.0.0.1 in this run, on the same phantom series, alternating the variants,
``--repeats`` times each (medians reported):

1. Retrieval: Debian's Orthanc (DICOMweb plugin on) holds the phantom CT series;
   :func:`pipeline.pacs.fetch_sources` retrieves all of them into a fresh run folder by WADO-RS
   (``dicomweb+http://...``), C-MOVE (to ctpipe's storage SCP) and C-GET (``dimse://...``), search
   included, each series published atomically into the spool. Peers, in the same loop: dcmtk's
   ``findscu`` + ``getscu`` (C-GET) and ``findscu`` + ``movescu`` (C-MOVE to its own storage SCP), one
   search and one retrieval per series into a folder (:func:`dcmtk_retrieve`). dcmtk has no DICOMweb
   client, so WADO-RS has no peer. Figure: series per minute; ratios ctpipe ÷ dcmtk, and against WADO-RS.
2. Receiving: dcmtk's ``storescu`` pushes one series (all its files) to ctpipe's listener
   (:class:`pipeline.pacs.Listener`: every instance written, fsynced and journalled before success is
   answered) and to dcmtk's ``storescp`` (writes each file, no fsync); then its first 20 instances one
   ``storescu`` (one association) each, as senders that route per image do; and the series shared between 4
   ``storescu`` sending at once (``storescp --fork``, a process per association, as its peer). Figure: instances
   per second; ratio ctpipe ÷ storescp.

Needs Orthanc, its DICOMweb plugin and dcmtk: ``bash scripts/install_pacs_tools.sh`` (root) installs them.
``--quick`` uses 3 smaller series and 3 runs instead of 6 and 5 (about a minute); ``--only retrieval`` or
``--only listener`` runs one part; ``--json PATH`` saves the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import load_config  # noqa: E402
from pipeline.pacs import Listener, fetch_sources  # noqa: E402
from tests._support.orthanc import HOST, OrthancServer, free_port, write_phantom_series  # noqa: E402

RETRIEVE_TIMEOUT_S = 120.0


def make_series(root: Path, n: int, matrix: int, slices: int) -> list[tuple[str, list[Path]]]:
    out = []
    for seed in range(n):
        spacing = min(2.0, 320.0 / matrix)
        out.append(
            write_phantom_series(
                root / f"case{seed:02d}", 900 + seed, matrix=matrix, slices=slices, pixel_spacing=spacing, slice_spacing=2.5
            )
        )
    return out


def dcmtk_retrieve(mode: str, srv: OrthancServer, uids: list[str], dest: Path) -> int:
    """The peer of ctpipe's C-GET / C-MOVE retrieval: dcmtk's command-line tools doing the same steps per series.

    ``findscu`` searches the series at SERIES level (study UID, modality, number of instances, as ctpipe's C-FIND),
    then ``getscu`` (C-GET, storage on the same association) or ``movescu`` (C-MOVE to AE title CTPIPE, received by
    its own storage SCP on the port Orthanc knows for CTPIPE) retrieves it into ``dest/<series UID>``; the number of
    files is checked against the search's count. Returns the number of files retrieved.
    """
    findscu, tool = dcmtk("findscu"), dcmtk("getscu" if mode == "get" else "movescu")
    peer = [HOST, str(srv.dicom_port)]
    total = 0
    for uid in uids:
        found = subprocess.run(
            [
                findscu,
                "-aet",
                "CTPIPE",
                "-aec",
                srv.aet,
                "-S",
                "-k",
                "QueryRetrieveLevel=SERIES",
                "-k",
                f"SeriesInstanceUID={uid}",
            ]
            + ["-k", "StudyInstanceUID", "-k", "Modality=CT", "-k", "NumberOfSeriesRelatedInstances", *peer],
            check=True,
            capture_output=True,
            text=True,
            timeout=RETRIEVE_TIMEOUT_S,
            env=dcmtk_env(),
        )
        text = found.stdout + found.stderr
        study = re.search(r"\(0020,000d\) UI \[([0-9.]+)", text)
        count = re.search(r"\(0020,1209\) IS \[(\d+)", text)
        if study is None or count is None:
            raise SystemExit(f"findscu did not find series {uid}: {text[-2000:]}")
        out = dest / uid
        out.mkdir(parents=True)
        cmd = [tool, "-aet", "CTPIPE", "-aec", srv.aet, "-S", "-k", "QueryRetrieveLevel=SERIES"]
        cmd += ["-k", f"StudyInstanceUID={study.group(1)}", "-k", f"SeriesInstanceUID={uid}", "-od", str(out)]
        if mode == "move":
            cmd += ["-aem", "CTPIPE", "--port", str(srv.move_port)]
        subprocess.run([*cmd, *peer], check=True, capture_output=True, timeout=RETRIEVE_TIMEOUT_S, env=dcmtk_env())
        got = sum(1 for p in out.iterdir() if p.is_file())
        if got != int(count.group(1)):
            raise SystemExit(f"dcmtk {tool}: {got} of {count.group(1)} instances of series {uid}")
        total += got
    return total


def bench_retrieval(srv: OrthancServer, uids: list[str], repeats: int, tmp: Path) -> dict:
    os.environ.update(srv.env)
    cfg = load_config(
        overrides={"pacs.move_port": srv.move_port, "pacs.retries": 0, "pacs.timeout_s": RETRIEVE_TIMEOUT_S}, environ={}
    )
    listed = ",".join(uids)
    sources = {
        "wado_rs": f"{srv.dicomweb}?series={listed}",
        "c_move": f"{srv.dimse}?series={listed}&retrieve=move",
        "c_get": f"{srv.dimse}?series={listed}&retrieve=get",
    }
    peers = {"dcmtk_c_move": "move", "dcmtk_c_get": "get"}  # dcmtk has no DICOMweb client: WADO-RS has no peer here
    variants = [*sources, *peers]
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        for name in variants if r % 2 == 0 else reversed(variants):
            run = tmp / f"{name}{r}"
            t0 = time.perf_counter()
            if name in sources:
                res = fetch_sources([sources[name]], run_dir=run, cfg=cfg)
                times[name].append(time.perf_counter() - t0)
                if res.fetched != len(uids) or res.failures:
                    raise SystemExit(f"{name}: retrieved {res.fetched} of {len(uids)} series: {res.lines()}")
            else:
                dcmtk_retrieve(peers[name], srv, uids, run)
                times[name].append(time.perf_counter() - t0)
            shutil.rmtree(run)
    out: dict = {"series": len(uids), "runs_s": times}
    for name, ts in times.items():
        out[f"{name}_series_per_min"] = 60.0 * len(uids) / statistics.median(ts)
    for name in ("c_move", "c_get"):
        out[f"{name}_vs_wado_rs"] = out[f"{name}_series_per_min"] / out["wado_rs_series_per_min"]
        out[f"{name}_vs_dcmtk"] = out[f"{name}_series_per_min"] / out[f"dcmtk_{name}_series_per_min"]
    return out


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def _push(storescu: str, called: str, port: int, folder: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [storescu, "-aet", "BENCH", "-aec", called, "+sd", "+r", "-xe", "127.0.0.1", str(port), str(folder)],
        check=True,
        capture_output=True,
        env=dcmtk_env(),
    )
    return time.perf_counter() - t0


def _push_each(storescu: str, called: str, port: int, files: list[Path]) -> float:
    """Seconds to push ``files`` one ``storescu`` (one association) each, as senders that route per image do."""
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(
            [storescu, "-aet", "BENCH", "-aec", called, "-xe", "127.0.0.1", str(port), str(f)],
            check=True,
            capture_output=True,
            env=dcmtk_env(),
        )
    return time.perf_counter() - t0


def _push_concurrent(storescu: str, called: str, port: int, files: list[Path], *, senders: int) -> float:
    """Seconds for ``senders`` ``storescu`` started at once, each sending its share of ``files`` (every
    ``senders``-th slice of the series) in one association, as a router's parallel queues do."""
    shares = [files[i::senders] for i in range(senders)]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [storescu, "-aet", "BENCH", "-aec", called, "-xe", "127.0.0.1", str(port), *map(str, share)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dcmtk_env(),
        )
        for share in shares
        if share
    ]
    errors = [p.communicate()[1] for p in procs]
    failed = [e.decode(errors="replace")[-500:] for p, e in zip(procs, errors) if p.returncode != 0]
    elapsed = time.perf_counter() - t0
    if failed:
        raise SystemExit(f"storescu failed: {failed[0]}")
    return elapsed


def dcmtk_env() -> dict[str, str]:
    """The environment of every dcmtk tool run here: ``TCP_NODELAY=1``, dcmtk's switch that disables Nagle's
    algorithm. dcmtk leaves it on since 3.6.2 and writes a PDU's header and body in separate calls, so with it a
    message can wait for the other side's delayed ACK (about twice as slow here); pynetdicom, on ctpipe's side,
    sends each PDU in one write."""
    return {**os.environ, "TCP_NODELAY": "1"}


def dcmtk(name: str) -> str:
    """dcmtk's ``name`` (pynetdicom installs Python apps of the same names in the virtualenv: skipped)."""
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin"]:
        exe = shutil.which(name, path=folder)
        if exe is None:
            continue
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        if "dcmtk" in (out.stdout + out.stderr).lower():
            return exe
    raise SystemExit(f"dcmtk's {name} not found: bash scripts/install_pacs_tools.sh")


def bench_listener(folder: Path, n: int, repeats: int, tmp: Path, *, each: int = 20, senders: int = 4) -> dict:
    """ctpipe's listener against ``storescp``: ``n`` instances of ``folder`` in one association, then shared between
    ``senders`` ``storescu`` at once (``storescp --fork``: a process per association, so that it too takes them at
    once), then its first ``each`` instances one association each (``storescu`` started per instance, for both)."""
    storescu, storescp = dcmtk("storescu"), dcmtk("storescp")
    everything = sorted(p for p in folder.iterdir() if p.is_file())
    singles = everything[:each]
    ours: list[float] = []
    peer: list[float] = []
    ours_each: list[float] = []
    peer_each: list[float] = []
    ours_conc: list[float] = []
    peer_conc: list[float] = []
    for r in range(repeats):
        port = free_port()
        cfg = load_config(
            overrides={
                "pacs.port": port,
                "pacs.allowed_aets": ["BENCH"],
                "pacs.ae_title": "CTPIPE",
                "pacs.quiet_period_s": 3600.0,
            },
            environ={},
        )
        run = tmp / f"listen{r}"
        with Listener(run, cfg) as lst:
            ours.append(_push(storescu, "CTPIPE", lst.port, folder))
            got = lst._ledger.one("SELECT COUNT(*) AS n FROM instances")["n"] if lst._ledger else 0
        if got != n:
            raise SystemExit(f"ctpipe listen stored {got} of {n} instances")
        shutil.rmtree(run)
        with Listener(run, cfg) as lst:
            ours_each.append(_push_each(storescu, "CTPIPE", lst.port, singles))
            got = lst._ledger.one("SELECT COUNT(*) AS n FROM instances")["n"] if lst._ledger else 0
        if got != len(singles):
            raise SystemExit(f"ctpipe listen stored {got} of {len(singles)} instances sent one association each")
        shutil.rmtree(run)
        with Listener(run, cfg) as lst:
            ours_conc.append(_push_concurrent(storescu, "CTPIPE", lst.port, everything, senders=senders))
            got = lst._ledger.one("SELECT COUNT(*) AS n FROM instances")["n"] if lst._ledger else 0
        if got != n:
            raise SystemExit(f"ctpipe listen stored {got} of {n} instances from {senders} senders at once")
        shutil.rmtree(run)
        port = free_port()
        out_dir = tmp / f"storescp{r}"
        out_dir.mkdir()
        proc = subprocess.Popen(
            [storescp, "-aet", "STORESCP", "-od", str(out_dir), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dcmtk_env(),
        )
        try:
            _wait_port(port)
            peer.append(_push(storescu, "STORESCP", port, folder))
            peer_each.append(_push_each(storescu, "STORESCP", port, singles))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        got = sum(1 for p in out_dir.iterdir() if p.is_file())
        if got != n:  # the singles are the same instances again: storescp overwrites their files
            raise SystemExit(f"storescp stored {got} of {n} instances")
        shutil.rmtree(out_dir)
        port = free_port()
        out_dir.mkdir()
        proc = subprocess.Popen(
            [storescp, "--fork", "-aet", "STORESCP", "-od", str(out_dir), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dcmtk_env(),
        )
        try:
            _wait_port(port)
            peer_conc.append(_push_concurrent(storescu, "STORESCP", port, everything, senders=senders))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        got = sum(1 for p in out_dir.iterdir() if p.is_file())
        if got != n:
            raise SystemExit(f"storescp --fork stored {got} of {n} instances from {senders} senders at once")
        shutil.rmtree(out_dir)
    o, p = statistics.median(ours), statistics.median(peer)
    oc, pc = statistics.median(ours_conc), statistics.median(peer_conc)
    oe, pe = statistics.median(ours_each), statistics.median(peer_each)
    return {
        "instances": n,
        "ctpipe_runs_s": ours,
        "storescp_runs_s": peer,
        "ctpipe_instances_per_s": n / o,
        "storescp_instances_per_s": n / p,
        "ratio_vs_storescp": p / o,
        "instances_one_association_each": len(singles),
        "ctpipe_each_runs_s": ours_each,
        "storescp_each_runs_s": peer_each,
        "ctpipe_each_instances_per_s": len(singles) / oe,
        "storescp_each_instances_per_s": len(singles) / pe,
        "ratio_each_vs_storescp": pe / oe,
        "concurrent_senders": senders,
        "ctpipe_concurrent_runs_s": ours_conc,
        "storescp_concurrent_runs_s": peer_conc,
        "ctpipe_concurrent_instances_per_s": n / oc,
        "storescp_concurrent_instances_per_s": n / pc,
        "ratio_concurrent_vs_storescp": pc / oc,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller series, fewer runs (about a minute)")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each variant (default 5; 3 with --quick)")
    ap.add_argument("--only", choices=["retrieval", "listener"], default=None, help="run this part alone")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    n_series, matrix, slices = (3, 128, 40) if args.quick else (6, 256, 100)
    import logging

    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench_pacs_") as td:
        tmp = Path(td)
        series = make_series(tmp / "data", n_series if args.only != "listener" else 1, matrix, slices)
        retrieval: dict | None = None
        listener: dict | None = None
        if args.only != "listener":
            srv = OrthancServer(tmp / "orthanc").start()
            try:
                for _, files in series:
                    srv.upload(files)
                retrieval = bench_retrieval(srv, [uid for uid, _ in series], repeats, tmp / "runs")
            finally:
                srv.stop()
        if args.only != "retrieval":
            files = series[0][1]
            listener = bench_listener(files[0].parent, len(files), repeats, tmp / "listen")
    result = {
        "benchmark": "pacs",
        "quick": args.quick,
        "repeats": repeats,
        "series_shape": [matrix, matrix, slices],
        "retrieval": retrieval,
        "listener": listener,
    }
    if retrieval is not None:
        print_retrieval(retrieval, matrix, slices, repeats)
    if listener is not None:
        print_listener(listener, repeats)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def print_retrieval(r: dict, matrix: int, slices: int, repeats: int) -> None:
    print(f"Retrieval from a local Orthanc: {r['series']} series of {matrix}x{matrix}x{slices}, median of {repeats} runs")
    print("  peers: dcmtk findscu + getscu (C-GET) and findscu + movescu (C-MOVE, its own storage SCP), per series")
    print("  ratios: ctpipe's rate / the other's (> 1: ctpipe faster)")
    print(
        f"  WADO-RS (dicomweb-client)   {r['wado_rs_series_per_min']:8.1f} series/min   (no peer: dcmtk has no DICOMweb client)"
    )
    for name, label in (("c_move", "C-MOVE"), ("c_get", "C-GET")):
        print(
            f"  {label + ' (pynetdicom)':<27} {r[f'{name}_series_per_min']:8.1f} series/min   "
            f"ratio vs dcmtk {r[f'{name}_vs_dcmtk']:.2f}x, vs WADO-RS {r[f'{name}_vs_wado_rs']:.2f}x"
        )
        tool = "getscu" if name == "c_get" else "movescu"
        print(f"  {'dcmtk findscu + ' + tool + ' (peer)':<27} {r[f'dcmtk_{name}_series_per_min']:8.1f} series/min")


def print_listener(li: dict, repeats: int) -> None:
    print(
        f"Receiving {li['instances']} instances pushed by dcmtk storescu, median of {repeats} runs; "
        "ratio = ctpipe's rate / storescp's (> 1: ctpipe faster)"
    )
    print(f"  ctpipe listen (fsync + journal)  {li['ctpipe_instances_per_s']:8.1f} instances/s")
    print(
        f"  dcmtk storescp (peer, no fsync)  {li['storescp_instances_per_s']:8.1f} instances/s   "
        f"ratio {li['ratio_vs_storescp']:.2f}x"
    )
    print(f"The same {li['instances']} shared between {li['concurrent_senders']} storescu sending at once:")
    print(f"  ctpipe listen                    {li['ctpipe_concurrent_instances_per_s']:8.1f} instances/s")
    print(
        f"  dcmtk storescp --fork (peer)     {li['storescp_concurrent_instances_per_s']:8.1f} instances/s   "
        f"ratio {li['ratio_concurrent_vs_storescp']:.2f}x"
    )
    print(f"The first {li['instances_one_association_each']} of them, one storescu (one association) per instance:")
    print(f"  ctpipe listen                    {li['ctpipe_each_instances_per_s']:8.1f} instances/s")
    print(
        f"  dcmtk storescp (peer)            {li['storescp_each_instances_per_s']:8.1f} instances/s   "
        f"ratio {li['ratio_each_vs_storescp']:.2f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
