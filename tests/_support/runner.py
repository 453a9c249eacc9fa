"""Helpers and fixtures for the runner tests: tiny phantom series (good, corrupt, split, without lungs, with
patient identifiers), the fault corpus, a full disk (injected writes or a small tmpfs), the command line, the store.

The fixtures (``dicom_data``, ``full_run``) reach a test module through ``pytest_plugins =
["tests._support.runner"]``; as session fixtures they are made once per pytest run. Test modules
also import the helpers directly, before pytest registers the module as a plugin, so pytest is told
not to rewrite its (absent) asserts: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.runner.stage import CaseContext, Stage
from tests._support.dicom_dates import without_dates
from tests._support.shared import build_once

# tiny but complete chests: 64 x 64 pixels of 2 mm, 24 slices of 5 mm (128 x 128 x 120 mm)
PHANTOM = {"matrix": 64, "slices": 24, "pixel_spacing": 2.0, "slice_spacing": 5.0}
GOOD_SEEDS = (11, 12, 13)
# fast settings for tests, as run_batch options: no renderings, two organs, the network's own scores (no
# false-positive reduction) reported from 0.5, in float32 on every CPU (bfloat16, where a CPU runs it natively,
# moves low scores and adds or drops a marginal finding; test_detection_precision.py compares the two); every stage
# of the runner still runs
QUICK = {
    "detector.amp": False,
    "reconstruct.renderings": False,
    "reconstruct.organs": ["lung_left", "lung_right"],
    "detector.score_threshold": 0.5,
    "detector.postprocess": False,
}


def as_cli(options: dict[str, Any]) -> list[str]:
    """``run_batch`` options as ``--set key=value`` command-line arguments (lists as YAML flow lists: ``[]``, ``[sr]``)."""
    return [x for k, v in options.items() for x in ("--set", f"{k}={'[' + ', '.join(v) + ']' if isinstance(v, list) else v}")]


# the same on the command line, with the report
FAST = [*as_cli(QUICK), "--set", "report.enabled=true"]


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
    out["corrupt_rle"] = "CorruptPixelDataError"  # its RLE header declares 0xFFFFFFFF segments
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


def _write_dicom_data(root: Path) -> dict[str, Any]:
    return {"good_uids": write_good(root / "good"), "bad_kinds": write_bad(root / "bad")}


@pytest.fixture(scope="session")
def dicom_data(tmp_path_factory) -> dict:
    """The good and the corrupt phantom cases, written once per pytest run (read-only for the tests)."""
    root, data = build_once(tmp_path_factory, "dicom", _write_dicom_data)
    return {"root": root, "good": root / "good", "bad": root / "bad", **data}


def ctpipe(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the ctpipe command line in a subprocess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=e, timeout=timeout)


def db_rows(run_dir: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of a query on a run store, through a read-only connection."""
    db = sqlite3.connect(f"file:{run_dir / 'runs.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def _content_digest(path: Path) -> str:
    """sha256 of a file; of a DICOM result (``.dcm``) without the dates and times it was made at, which differ
    between runs that make the same result (its UIDs and content do not), and of a case's manifest without its
    digests and sizes of those results."""
    if path.name == "manifest.json":  # its digests and sizes of the DICOM results are of files with their dates
        doc = json.loads(path.read_text())
        for entry in doc.get("files", []):
            if str(entry.get("path", "")).endswith(".dcm"):
                entry.pop("sha256", None)
                entry.pop("bytes", None)  # its instance UID, made from when it was made, varies in length
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    if path.suffix != ".dcm":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    buf = io.BytesIO()
    without_dates(path).save_as(buf, enforce_file_format=True)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def case_hashes(run_dir: Path) -> dict[str, dict[str, str]]:
    """{case_id: {relative file path: sha256}} of every published case folder (DICOM results without their dates)."""
    out = {}
    for case in sorted((run_dir / "cases").iterdir()):
        files = {}
        for p in sorted(case.rglob("*")):
            if p.is_file():
                files[p.relative_to(case).as_posix()] = _content_digest(p)
        out[case.name] = files
    return out


def manifest(case_dir: Path) -> dict:
    return json.loads((case_dir / "manifest.json").read_text())


@pytest.fixture(scope="session")
def full_run(dicom_data, tmp_path_factory) -> dict:
    """One uninterrupted run over the good and the corrupt cases (shared by several test modules; read-only)."""

    def run(folder: Path) -> dict[str, Any]:
        p = ctpipe(
            "run",
            str(dicom_data["good"]),
            str(dicom_data["bad"]),
            "--out",
            str(folder / "all"),
            "--workers",
            "1",
            "--quiet",
            *FAST,
        )
        return {"args": p.args, "returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    folder, p = build_once(tmp_path_factory, "full_run", run)
    return {"out": folder / "all", "proc": subprocess.CompletedProcess(**p)}


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


# -- identifiers, split series, scans without lungs, the fault corpus ------------------------------------------------
#: Patient identifiers written into test series: distinctive strings that no output may contain by default.
PATIENT = {
    "PatientID": "ZQX-PRIV-77310",
    "PatientName": "Quillfeather^Zenobia",
    "AccessionNumber": "ACCZQ55213",
    "PatientBirthDate": "19020304",
}
PRIVATE_STRINGS = ("ZQX-PRIV-77310", "Quillfeather", "Zenobia", "ACCZQ55213")


def mark_patient(paths: list[Path]) -> None:
    """Give every file the distinctive patient identifiers of :data:`PATIENT`."""
    from tests._support.fault_corpus import set_values

    set_values(paths, **PATIENT)


def _uids(path: Path) -> dict[str, str]:
    import pydicom

    ds = pydicom.dcmread(path, stop_before_pixels=True)
    return {k: str(ds[k].value) for k in ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID") if k in ds}


def write_split_scout(folder: Path, *, seed: int = 31, slices: int = 16) -> tuple[str, list[Path]]:
    """A phantom CT series plus a scout (coronal LOCALIZER image) stored under the same SeriesInstanceUID.

    Discovery splits it into ``<uid>#1`` (the axial stack, processed) and ``<uid>#2`` (the scout, not selected).
    Returns the SeriesInstanceUID and the axial stack's files.
    """
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.fault_corpus import set_values

    ph = generate_phantom(seed, n_nodules=1, **{**PHANTOM, "slices": slices})
    files = write_dicom_series(ph.volume, folder, quirks=["localizer"], seed=seed)
    main, extra = files[:slices], files[slices:]
    set_values(extra, **_uids(main[0]))
    return _uids(main[0])["SeriesInstanceUID"], main


def write_split_spacing(folder: Path, *, seed: int = 32, slices: int = 16) -> tuple[str, list[Path], list[Path]]:
    """Two phantom stacks at different pixel spacings (64 x 2 mm and 80 x 1.6 mm) under one SeriesInstanceUID.

    Discovery splits it into ``<uid>#1`` and ``<uid>#2`` (sub-stacks differ in matrix/pixel spacing); both are
    processed. Returns the SeriesInstanceUID and both stacks' files.
    """
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.fault_corpus import set_values

    a = generate_phantom(seed, n_nodules=1, **{**PHANTOM, "slices": slices})
    b = generate_phantom(seed + 1, n_nodules=1, **{**PHANTOM, "slices": slices, "matrix": 80, "pixel_spacing": 1.6})
    first = write_dicom_series(a.volume, folder / "a", seed=seed)
    second = write_dicom_series(b.volume, folder / "b", seed=seed + 1)
    set_values(second, **_uids(first[0]))
    return _uids(first[0])["SeriesInstanceUID"], first, second


def write_no_lungs(folder: Path, *, seed: int = 41, slices: int = 16) -> list[Path]:
    """A CT series of a body without lungs (soft tissue in air, e.g. an abdomen): nothing to search."""
    import numpy as np

    from pipeline.phantom.dicom_writer import write_dicom_series
    from pipeline.volume import CTVolume, Geometry

    rng = np.random.default_rng(seed)
    _, j, i = np.meshgrid(np.arange(slices), np.arange(64), np.arange(64), indexing="ij")
    hu = np.full((slices, 64, 64), -1000.0)
    hu[((i - 32) / 27.0) ** 2 + ((j - 34) / 20.0) ** 2 <= 1] = 40.0
    hu += rng.normal(0, 10, hu.shape)
    vol = CTVolume(
        hu.astype(np.int16),
        Geometry(shape=(slices, 64, 64), spacing=(2.0, 2.0, 5.0), origin=(-64.0, -64.0, -40.0), direction=np.eye(3)),
    )
    return write_dicom_series(vol, folder, seed=seed)


def write_fault_corpus(root: Path) -> dict[str, Any]:
    """Damaged and unusual inputs in one archive folder, and what a run must make of each.

    Returns ``{"skipped_files": {path: kind}, "not_selected": {folder: words in the reason},
    "quarantined": {folder: error class}, "done": {folder: number of cases}, "split": {...}}``; folders are
    relative to ``root``.
    """
    from pipeline.phantom import generate_phantom
    from pipeline.phantom.dicom_writer import write_dicom_series
    from tests._support.fault_corpus import (
        MR_IMAGE_STORAGE,
        edit,
        junk_files,
        set_values,
        symlink_loop,
        truncated_copy,
        write_phantom,
    )

    # processed: a phantom under non-ASCII folder and file names (marked with patient identifiers)
    ph = generate_phantom(51, n_nodules=1, **{**PHANTOM, "slices": 16})
    files = write_dicom_series(ph.volume, root / "Patiënt_ñandú" / "série_1", seed=51)
    renamed = []
    for n, f in enumerate(files):
        target = f.with_name(f"schicht_ä_{n:03d}.dcm")
        f.rename(target)
        renamed.append(target)
    mark_patient(renamed)
    split_uid, split_main = write_split_scout(root / "split_scout")
    mark_patient(split_main)
    spacing_uid, _, _ = write_split_spacing(root / "split_spacing")
    # named skips: files that are no DICOM images, a header cut short, link loops
    junk = junk_files(root / "junk")
    cut = truncated_copy(files[0].with_name("schicht_ä_000.dcm"), root / "junk" / "cut.dcm")
    loop, up = symlink_loop(root / "links")
    # series that are not taken (named, with the reason)
    mr = write_phantom(root / "mr", seed=4)
    set_values(mr, Modality="MR", SOPClassUID=MR_IMAGE_STORAGE)
    write_phantom(root / "one_slice", seed=5, keep=1)
    write_phantom(root / "two_slices", seed=6, keep=2)
    nopix = write_phantom(root / "no_pixels", seed=7)
    edit(nopix, lambda ds: delattr(ds, "PixelData"))
    # quarantined with its true reason: one slice of a series lacks its pixel data
    holed = write_phantom(root / "one_file_no_pixels", seed=8)
    edit(holed[5:6], lambda ds: delattr(ds, "PixelData"))
    return {
        "skipped_files": {
            junk["empty"]: "not_dicom",
            junk["random"]: "not_dicom",
            junk["text"]: "not_dicom",
            cut: "truncated",
            loop: "unreadable",
            up: "not_followed",
        },
        "not_selected": {
            "mr": "modality is MR",
            "one_slice": "min_slices",
            "two_slices": "min_slices",
            "no_pixels": "no pixel data",
            "split_scout": "localizer",
        },
        "quarantined": {"one_file_no_pixels": "MissingPixelDataError"},
        "done": {"Patiënt_ñandú/série_1": 1, "split_scout": 1, "split_spacing": 2},
        "split": {"scout": split_uid, "spacing": spacing_uid},
    }


# -- a full disk -------------------------------------------------------------------------------------------------------
@contextmanager
def disk_full_after(run_dir: Path, writes: int) -> Iterator[dict[str, int]]:
    """Inside the block the disk under ``run_dir`` is full after ``writes`` more files: every later atomic write
    (:mod:`pipeline.atomic`: cache arrays, case files, reports, quarantine files) fails with ENOSPC while writing,
    as on a full disk (its temporary file is made, but its data go to ``/dev/full``). Leaving the block frees the
    space. For runs in this process (``workers=0``); the run store and the log are not affected (a small tmpfs
    fills those too, see :func:`small_tmpfs`). Yields counts: ``writes`` (atomic writes under ``run_dir``) and
    ``failed``.
    """
    import tempfile
    import types

    import pipeline.atomic as atomic

    root = os.path.abspath(run_dir)
    counts = {"writes": 0, "failed": 0}

    def mkstemp(*, dir: Any, prefix: str, suffix: str) -> tuple[int, str]:
        fd, path = tempfile.mkstemp(dir=dir, prefix=prefix, suffix=suffix)
        if os.path.abspath(dir).startswith(root):
            counts["writes"] += 1
            if counts["writes"] > writes:
                counts["failed"] += 1
                os.close(fd)
                fd = os.open("/dev/full", os.O_WRONLY)
        return fd, path

    atomic.tempfile = types.SimpleNamespace(mkstemp=mkstemp)  # type: ignore[assignment]
    try:
        yield counts
    finally:
        atomic.tempfile = tempfile  # type: ignore[assignment]


def can_mount() -> str | None:
    """None when this process may mount a tmpfs (root with CAP_SYS_ADMIN), else why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    import tempfile

    probe = Path(tempfile.gettempdir()) / f"ctpipe-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True, text=True)
        if p.returncode != 0:
            return f"mount is not permitted here: {p.stderr.strip() or p.returncode}"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    except FileNotFoundError:
        return "no mount command"
    finally:
        probe.rmdir()


@contextmanager
def small_tmpfs(folder: Path, size_kb: int, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size_kb`` KiB mounted on ``folder`` for the block (unmounted after, whatever happens)."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = f"size={size_kb}k" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)], check=True, capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def resize_tmpfs(folder: Path, size_kb: int) -> None:
    """Give a mounted tmpfs more (or less) room."""
    subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(folder)], check=True, capture_output=True)


def record_ok_stage(
    store: Any, *, run_id: str, case_key: str, attempt: int, stage: str, worker: str, device: str, start: float, wall: float
) -> None:
    """Record in ``store`` (a RunStore) a stage attempt that ran ``wall`` seconds from ``start`` (epoch s) and succeeded,
    its memory peaks unmeasured: the run history the report and capacity tests compute their figures from."""
    store.record_attempt(
        run_id=run_id,
        case_key=case_key,
        stage=stage,
        attempt=attempt,
        status="ok",
        worker=worker,
        device=device,
        ready_at=start,
        started_at=start,
        ended_at=start + wall,
        wall_s=wall,
        peak_rss_mb=None,
        peak_cuda_mb=None,
    )
