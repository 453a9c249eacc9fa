"""A full disk during real runs (injected failing writes, a small tmpfs, the command line), then one plain rerun.

The run stops admitting cases, says so in one line, records itself as interrupted and exits 4; no case is
published incomplete; one plain rerun finishes with outputs byte-identical to an undisturbed run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import RunEnvironmentError
from pipeline.runner import open_run, run_batch
from tests._support.runner import (
    QUICK,
    as_cli,
    can_mount,
    case_hashes,
    db_rows,
    disk_full_after,
    resize_tmpfs,
    small_tmpfs,
)

pytest_plugins = ["tests._support.runner"]


# -- a full disk during real runs, then one plain rerun ----------------------------------------------------------------
@pytest.fixture(scope="module")
def two_cases(dicom_data, tmp_path_factory):
    """Two of the good phantom cases, and one undisturbed in-process run over them (the reference).

    The runs use a small RetinaNet (random weights, fixed seed): every stage and every kind of output file
    is written, a few findings with their PNGs among them, at a fraction of the demo model's cost.
    """
    import shutil

    from tests._support.detection import small_model

    root = tmp_path_factory.mktemp("full")
    src = root / "src"
    for name in ("case11", "case12"):
        shutil.copytree(dicom_data["good"] / name, src / name)
    (root / "model").mkdir()
    small_model(root / "model")
    opts = {**QUICK, "detector.bundle": str(root / "model" / "small.json"), "detector.score_threshold": 0.565}
    ref = root / "reference"
    s = run_batch([src], out=ref, workers=0, **opts)
    assert s.exit_code == 0 and s.done == 2
    assert 0 < len(open_run(ref).findings) < 30  # a few findings, each with its PNG
    return {"src": src, "ref": ref, "opts": opts, "bytes": sum(f.stat().st_size for f in ref.rglob("*") if f.is_file())}


def _check_stopped(s, out: Path, *, store_ok: bool = True) -> None:
    """A run stopped by a full disk: exit 4, one line naming the folder and the error, no case falsified."""
    assert s.exit_code == 4 and s.stopped and "No space left on device (ENOSPC)" in s.stopped, s.lines()
    assert s.quarantined == []
    text = "\n".join(s.lines())
    assert "run stopped early" in text or "could not be written" in text
    for case_dir in (out / "cases").iterdir() if (out / "cases").exists() else ():
        man = json.loads((case_dir / "manifest.json").read_text())  # published = complete
        for f in man["files"]:
            assert (case_dir / f["path"]).stat().st_size == f["bytes"]
    if store_ok:
        statuses = [r[0] for r in db_rows(out, "SELECT status FROM cases")]
        assert "failed" not in statuses
        assert s.done == statuses.count("done"), s.lines()  # the summary counts what the store holds as done


def _check_rerun(out: Path, cases: dict) -> None:
    src, ref = cases["src"], cases["ref"]
    s = run_batch([src], out=out, workers=0, **cases["opts"])
    assert s.exit_code == 0 and s.done + s.skipped == 2 and s.quarantined == [], s.lines()
    assert {r[0] for r in db_rows(out, "SELECT status FROM cases")} == {"done"}
    assert case_hashes(out) == case_hashes(ref)
    assert db_rows(out, "SELECT status FROM runs ORDER BY started_at")[-1] == ("completed",)
    assert [p for p in out.rglob("*.tmp")] == []


@pytest.mark.slow
@pytest.mark.parametrize("room", [3, 16])
def test_disk_full_injected_at_several_points_then_a_plain_rerun(two_cases, tmp_path, room):
    out = tmp_path / "run"
    with disk_full_after(out, room) as counts:
        s = run_batch([two_cases["src"]], out=out, workers=0, **two_cases["opts"])
    assert counts["failed"] >= 1, counts
    _check_stopped(s, out)
    assert db_rows(out, "SELECT status FROM runs") == [("interrupted",)]
    _check_rerun(out, two_cases)


@pytest.mark.slow
def test_disk_full_on_a_small_tmpfs_at_several_points_then_a_plain_rerun(two_cases, tmp_path):
    why = can_mount()
    if why:
        pytest.skip(f"the tmpfs variant needs to mount one: {why} (the injected variant covers the same ground)")
    total_kb = two_cases["bytes"] // 1024
    filled = []
    for fraction in (0.15, 0.45, 0.8):
        out = tmp_path / f"tmpfs_{fraction}"
        with small_tmpfs(out, max(64, int(total_kb * fraction))):
            try:
                s = run_batch([two_cases["src"]], out=out, workers=0, **two_cases["opts"])
            except RunEnvironmentError as exc:  # full before the first case: the run could not start
                assert "No space left on device (ENOSPC)" in str(exc) and str(out) in str(exc)
            else:
                if s.exit_code == 0:
                    continue  # it fitted after all (cache files come and go): nothing to check at this point
                _check_stopped(s, out, store_ok=False)
            filled.append(fraction)
            resize_tmpfs(out, 64 * 1024)  # space is back
            _check_rerun(out, two_cases)
    assert filled, "the run fitted on every tmpfs size: no full disk was exercised"


@pytest.mark.slow
def test_a_full_disk_mid_run_on_the_command_line_says_so_in_one_line(two_cases, tmp_path):
    why = can_mount()
    if why:
        pytest.skip(f"needs a small tmpfs: {why}")
    out = tmp_path / "cli"
    args = [
        str(two_cases["src"]),
        "--out",
        str(out),
        "--workers",
        "1",
        "--quiet",
        *as_cli(two_cases["opts"]),
    ]
    with small_tmpfs(out, max(64, two_cases["bytes"] // 1024 // 3)):
        p = subprocess.run([sys.executable, "-m", "pipeline", "run", *args], capture_output=True, text=True, timeout=600)
        assert p.returncode == 4, p.stdout + p.stderr
        assert "Traceback" not in p.stdout + p.stderr
        stopped = [ln for ln in p.stdout.splitlines() if "No space left on device (ENOSPC)" in ln]
        assert stopped and str(out) in stopped[0]
        resize_tmpfs(out, 64 * 1024)
        p2 = subprocess.run([sys.executable, "-m", "pipeline", "run", *args], capture_output=True, text=True, timeout=600)
        assert p2.returncode == 0, p2.stdout + p2.stderr
        assert {r[0] for r in db_rows(out, "SELECT status FROM runs")} == {"interrupted", "completed"}
