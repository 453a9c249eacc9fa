"""Helpers and fixtures for the runner tests: tiny phantom series (good and corrupt), the command line, the store.

The fixtures (``dicom_data``, ``full_run``) reach a test module through ``pytest_plugins =
["tests._support.runner"]``; as session fixtures they are made once per pytest run. Test modules
also import the helpers directly, before pytest registers the module as a plugin, so pytest is told
not to rewrite its (absent) asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner.stage import CaseContext, Stage

# tiny but complete chests: 64 x 64 pixels of 2 mm, 24 slices of 5 mm (128 x 128 x 120 mm)
PHANTOM = {"matrix": 64, "slices": 24, "pixel_spacing": 2.0, "slice_spacing": 5.0}
GOOD_SEEDS = (11, 12, 13)
# fast settings for tests: no renderings, two organs (the real stages all run)
FAST = ["--set", "reconstruct.renderings=false", "--set", "reconstruct.organs=lung_left,lung_right",
        "--set", "report.enabled=true"]


def write_good(root: Path) -> list[str]:
    """Three phantom cases (DICOM + ground truth); returns their SeriesInstanceUIDs."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_phantom_case

    uids = []
    for seed in GOOD_SEEDS:
        ph = generate_phantom(seed, n_nodules=1, **PHANTOM)
        write_phantom_case(ph, root / f"case{seed}")
        uids.append(ph.volume.series_uid)
    return uids


def write_bad(root: Path) -> dict[str, str]:
    """Corrupt cases: {folder: what is wrong}."""
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series

    out = {}
    ph = generate_phantom(21, **PHANTOM)
    write_dicom_series(ph.volume, root / "missing_slice", quirks=["missing_slice"], seed=21)
    out["missing_slice"] = "MissingSliceError"
    # RLE-compressed series whose pixel data in one file is damaged (headers fine): fails when decoded
    ph2 = generate_phantom(22, **PHANTOM)
    files = write_dicom_series(ph2.volume, root / "corrupt_rle", transfer_syntax="rle", seed=22)
    victim = sorted(files)[len(files) // 2]
    data = bytearray(victim.read_bytes())
    item = data.rfind(b"\xfe\xff\x00\xe0")  # the frame's fragment item
    data[item + 8 : item + 72] = b"\xff" * 64  # wreck its RLE header (segment count and offsets)
    victim.write_bytes(bytes(data))
    out["corrupt_rle"] = "TruncatedFileError"
    # pixel data cut short in one file of an otherwise fine series
    ph3 = generate_phantom(23, **PHANTOM)
    files = write_dicom_series(ph3.volume, root / "truncated", seed=23)
    victim = sorted(files)[len(files) // 2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 3000])
    out["truncated"] = "TruncatedFileError"
    (root / "junk").mkdir()
    (root / "junk" / "notes.txt").write_text("not a DICOM file\n")
    return out


@pytest.fixture(scope="session")
def dicom_data(tmp_path_factory) -> dict:
    """The good and the corrupt phantom cases, written once per pytest run."""
    root = tmp_path_factory.mktemp("dicom")
    good = write_good(root / "good")
    bad = write_bad(root / "bad")
    return {"root": root, "good": root / "good", "bad": root / "bad", "good_uids": good, "bad_kinds": bad}


def ctpipe(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the ctpipe command line in a subprocess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


def db_rows(run_dir: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of a query on a run store, through a read-only connection."""
    db = sqlite3.connect(f"file:{run_dir / 'runs.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def case_hashes(run_dir: Path) -> dict[str, dict[str, str]]:
    """{case_id: {relative file path: sha256}} of every published case folder."""
    out = {}
    for case in sorted((run_dir / "cases").iterdir()):
        files = {}
        for p in sorted(case.rglob("*")):
            if p.is_file():
                files[p.relative_to(case).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
        out[case.name] = files
    return out


def manifest(case_dir: Path) -> dict:
    return json.loads((case_dir / "manifest.json").read_text())


@pytest.fixture(scope="session")
def full_run(dicom_data, tmp_path_factory) -> dict:
    """One uninterrupted run over the good and the corrupt cases (shared by several test modules)."""
    out = tmp_path_factory.mktemp("runs") / "all"
    p = ctpipe("run", str(dicom_data["good"]), str(dicom_data["bad"]), "--out", str(out), "--workers", "1", "--quiet",
               *FAST)
    return {"out": out, "proc": p}


class DieOnceStage(Stage):
    """A stage whose worker process dies (SIGKILL) the first time it meets each case, then works."""

    name = "die_once"
    group = "cpu"

    def __init__(self, marker_dir: str, always: str = ""):
        self.marker_dir = marker_dir
        self.always = always  # a series UID whose worker dies on every attempt

    def process(self, ctx: CaseContext) -> dict[str, Any]:
        marker = Path(self.marker_dir) / f"{ctx.case.case_id}.seen"
        if ctx.case.series_uid == self.always or not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        (ctx.workdir / "ok.txt").write_text(ctx.case.case_id)
        return {}
